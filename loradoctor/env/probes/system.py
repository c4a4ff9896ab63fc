"""System probe: OS, kernel, Python, WSL2 / container, host RAM and swap, /dev/shm, free disk, CUDA libs on LD_LIBRARY_PATH."""

from __future__ import annotations

import glob
import os
import platform
import re
import shutil
import socket
import sys
from pathlib import Path
from typing import Any, Optional

# Libraries a torch wheel ships itself; a copy earlier on LD_LIBRARY_PATH wins and can mismatch.
SHADOW_LIBS = re.compile(r"^lib(cudart|cudnn|nccl|cublas|cublasLt|cusparse|cufft|nvrtc)\.so(\.\d+)*$")


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def os_name() -> str:
    rel = _read("/etc/os-release")
    m = re.search(r'^PRETTY_NAME="?([^"\n]+)"?', rel, re.M)
    if m:
        return f"{m.group(1)} ({platform.machine()})"
    return f"{platform.system()} {platform.release()} ({platform.machine()})"


def container_kind() -> Optional[str]:
    if os.path.exists("/.dockerenv"):
        return "docker"
    if os.path.exists("/run/.containerenv"):
        return "podman"
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    cgroup = _read("/proc/1/cgroup")
    for needle, kind in (("kubepods", "kubernetes"), ("docker", "docker"), ("containerd", "containerd"), ("lxc", "lxc"), ("libpod", "podman")):
        if needle in cgroup:
            return kind
    return None


def free_bytes(path: str) -> tuple[Optional[int], str]:
    """Free space where `path` lives (or its nearest existing parent, since the cache may not exist yet)."""
    p = Path(path).expanduser()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free, str(Path(path).expanduser())
    except OSError:
        return None, str(Path(path).expanduser())


def ld_library_path_cuda_dirs(value: str) -> list[dict[str, Any]]:
    out = []
    for d in [x for x in value.split(":") if x]:
        try:
            names = sorted(n for n in os.listdir(d) if SHADOW_LIBS.match(n))
        except OSError:
            continue
        if names:
            out.append({"dir": d, "libs": names[:12]})
    return out


def probe() -> dict[str, Any]:
    """The `system` section."""
    import psutil

    version_text = _read("/proc/version")
    kind = container_kind()
    hf_home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    cwd_free, cwd_path = free_bytes(os.getcwd())
    hf_free, hf_path = free_bytes(hf_home)
    vm, swap = psutil.virtual_memory(), psutil.swap_memory()
    try:
        st = os.statvfs("/dev/shm")
        shm: Optional[int] = st.f_frsize * st.f_blocks
    except (OSError, AttributeError):
        shm = None
    wsl = "microsoft" in version_text.lower()
    return {
        "os": os_name(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "hostname": socket.gethostname(),
        "wsl": wsl,
        "wsl_libcuda": os.path.exists("/usr/lib/wsl/lib/libcuda.so") if wsl else None,
        "container": kind is not None,
        "container_kind": kind,
        "dev_nvidia": sorted(os.path.basename(p) for p in glob.glob("/dev/nvidia*")),
        "cpu_count": os.cpu_count(),
        "ram_total_bytes": int(vm.total),
        "ram_available_bytes": int(vm.available),
        "swap_total_bytes": int(swap.total),
        "shm_bytes": shm,
        "disk_free_cwd_bytes": cwd_free,
        "path_cwd": cwd_path,
        "disk_free_hf_cache_bytes": hf_free,
        "path_hf_cache": hf_path,
        "ld_library_path_cuda_dirs": ld_library_path_cuda_dirs(os.environ.get("LD_LIBRARY_PATH", "")),
    }
