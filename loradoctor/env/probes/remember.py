"""Remembering healthy child-probe results, so that `loradoctor env` on every launch does not pay a
full `import torch` (about 2 s) each time.

What is remembered: only the result of a child probe that ended well (status ok) and, for torch, saw
CUDA when the machine has NVIDIA device nodes (or has none at all). A broken, hung, crashed or
CUDA-less result is never remembered, so a problem is always found by a fresh probe; only a healthy
verdict is ever reused.

When it is reused: only while its key is unchanged. The key is everything that decides what the child
would see, cheap to read without importing anything:
- the interpreter (path, size, mtime, version) and the working directory (a local `torch/` shadows);
- the mtime of every folder on sys.path (installing, removing or upgrading any package rewrites the
  site-packages folder) and the files of the probed package itself (`torch/__init__.py`, `version.py`,
  `_C*`, every file in `torch/lib`; for an extension, the files of its package folder);
- environment variables that change an import or CUDA (CUDA_*, NVIDIA_*, PYTORCH_*, TORCH_*, LD_*,
  PYTHON*, HIP_* / ROCR_*, BNB_*);
- the driver: /proc/driver/nvidia/version, the GPUs the driver lists, the NVIDIA device nodes and the
  libcuda.so.1 it would load (path, size, mtime); the boot id (a reboot forgets everything);
- the probe script itself and loradoctor's version.
And for at most MAX_AGE_S. `loradoctor env --fresh` (or LORADOCTOR_NO_CACHE=1) skips it; `--deep`
never uses it (its GPU matmul is a live test). What it cannot see: a file edited in place inside
another package that torch imports (no folder mtime changes). That is the price of the speed, and
the report says when a result was remembered.
"""

from __future__ import annotations

import datetime as _dt
import glob
import importlib.util
import os
import sys
from typing import Any, Callable, Optional

from loradoctor import cache

MAX_AGE_S = 24 * 3600
KIND = "probe"
_ENV_PREFIXES = ("CUDA_", "NVIDIA_", "PYTORCH_", "TORCH_", "LD_", "PYTHON", "HIP_", "ROCR_", "BNB_", "ROCM_")
_LIBCUDA_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu", "/usr/lib/wsl/lib",
                 "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib")


def _stat(path: str) -> Optional[list]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _read(path: str, limit: int = 4096) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def _package_files(module: str) -> Optional[list]:
    """(name, stat) of the files that make up a package, without importing it; None if not found."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    folder = os.path.dirname(spec.origin)
    names = [spec.origin]
    if module == "torch":
        names += [os.path.join(folder, "version.py")] + glob.glob(os.path.join(folder, "_C*"))
        names += glob.glob(os.path.join(folder, "lib", "*"))
    else:
        names += glob.glob(os.path.join(folder, "*.so")) + glob.glob(os.path.join(folder, "*.pyd"))
    return [[n, _stat(n)] for n in sorted(set(names))]


def _driver_state() -> list:
    libcuda = []
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d] + list(_LIBCUDA_DIRS)
    for d in dirs:
        path = os.path.join(d, "libcuda.so.1")
        if os.path.exists(path):
            real = os.path.realpath(path)
            libcuda = [real, _stat(real)]
            break
    return [
        _read("/proc/driver/nvidia/version"),
        sorted(os.listdir("/proc/driver/nvidia/gpus")) if os.path.isdir("/proc/driver/nvidia/gpus") else None,
        sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/dxg")),
        libcuda,
        _read("/proc/sys/kernel/random/boot_id"),
    ]


def has_nvidia_nodes() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/dxg"))


def probe_key(script_source: str, args: list[str], module: str) -> Optional[str]:
    """The key of a child probe of this interpreter for `module`; None when it should not be remembered."""
    if not cache.enabled():
        return None
    from loradoctor import __version__

    files = _package_files(module)
    if files is None:
        return None  # not installed: the child answers in milliseconds anyway
    cwd = os.getcwd()
    exe = os.path.realpath(sys.executable)
    path_dirs = [[p, _stat(p)] for p in [cwd] + sys.path if p and os.path.isdir(p)]
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES))
    parts = [__version__, script_source, args, module, exe, _stat(exe), sys.version, path_dirs, files,
             env, _driver_state()]
    if module != "torch":
        parts.append(_package_files("torch"))
    return cache.digest(parts)


def recall(key: Optional[str]) -> Optional[dict[str, Any]]:
    """The remembered section for `key`, marked as remembered; None when absent or too old."""
    if key is None:
        return None
    entry = cache.read_json(KIND, key)
    if not isinstance(entry, dict) or not isinstance(entry.get("section"), dict):
        return None
    try:
        created = _dt.datetime.fromisoformat(entry["created"])
    except (KeyError, TypeError, ValueError):
        return None
    age_s = (_dt.datetime.now(_dt.timezone.utc) - created).total_seconds()
    if not 0 <= age_s <= MAX_AGE_S:
        return None
    section = entry["section"]
    probe = section.setdefault("probe", {})
    probe["remembered"] = {"created": entry["created"], "age_s": round(age_s)}
    probe["elapsed_s"] = 0.0
    return section


def worth_remembering(module: str, section: dict[str, Any]) -> bool:
    """Only healthy results: status ok, nothing marked as an error, and (torch) CUDA seen where the
    machine has NVIDIA devices."""
    probe = section.get("probe") if isinstance(section.get("probe"), dict) else {}
    if probe.get("status") != "ok" or section.get("error"):
        return False
    if module == "torch":
        if any(k in section for k in ("cuda_error", "arch_error", "cudnn_error", "deep")):
            return False
        if has_nvidia_nodes() and not section.get("cuda_available"):
            return False
        if any("error" in d for d in section.get("devices") or [] if isinstance(d, dict)):
            return False
    if module == "bitsandbytes" and has_nvidia_nodes() and not section.get("cuda"):
        return False
    return True


def remember(key: Optional[str], module: str, section: dict[str, Any]) -> bool:
    if key is None or not worth_remembering(module, section):
        return False
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return cache.write_json(KIND, key, {"created": created, "module": module, "section": section})


class CachedProbe:
    """A child probe through the cache: the remembered healthy result for `key`, else a fresh child
    (`start()`, a ChildProbe) whose result is remembered when it is healthy. `result()` as ChildProbe's.
    key=None (--fresh, --deep, --python, cache off) always runs the child."""

    def __init__(self, key: Optional[str], module: str, start: Callable[[], Any]) -> None:
        self._key, self._module = key, module
        self._section = recall(key)
        self._child = start() if self._section is None else None

    def running(self) -> bool:
        """True while a child started for this probe has not ended (the env status line)."""
        return self._section is None and self._child is not None and self._child.running()

    def result(self) -> dict[str, Any]:
        if self._section is None:
            self._section = self._child.result()
            remember(self._key, self._module, self._section)
        return self._section
