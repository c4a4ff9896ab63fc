"""NVIDIA probe: NVML through pynvml (imported lazily), `nvidia-smi` as the fallback, and the kernel
module version from /proc/driver/nvidia/version next to the user-space library version (a
difference is the 'Driver/library version mismatch' state)."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from typing import Any, Callable, Optional

from loradoctor.units import MIB

# nvmlClocksEventReasons bits (nvidia.md §5.1).
THROTTLE_BITS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
    0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/lib/aarch64-linux-gnu", "/usr/lib/wsl/lib",
            "/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu/nvidia/current")


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


def kernel_module_version() -> Optional[str]:
    try:
        text = open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace").read()
    except OSError:
        return None
    m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


def library_version() -> Optional[str]:
    """Version of the user-space NVML library, from its file name (libnvidia-ml.so.550.54.15)."""
    for d in LIB_DIRS:
        for path in sorted(glob.glob(os.path.join(d, "libnvidia-ml.so.*.*"))):
            m = re.search(r"\.so\.(\d+\.\d+(?:\.\d+)?)$", path)
            if m:
                return m.group(1)
    return None


def _s(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _try(fn: Callable, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and friends: the field is simply absent
        return None


def _ancestors() -> set[int]:
    pids = {os.getpid()}
    try:
        import psutil

        pids.update(p.pid for p in psutil.Process().parents())
    except Exception:
        pids.add(os.getppid())
    return pids


def _process_info(pid: int, ours: set[int]) -> dict[str, Any]:
    info: dict[str, Any] = {"pid": pid, "ours": pid in ours}
    try:
        import psutil

        p = psutil.Process(pid)
        info["name"] = p.name()
        status = p.status()
        info["status"] = status
        info["alive"] = status != psutil.STATUS_ZOMBIE
    except Exception:
        info["alive"] = None  # another pid namespace (container) or gone: we cannot tell
    return info


def probe_nvml() -> dict[str, Any]:
    """The `nvidia` section from NVML. Raises on failure (the runner records 'could not check')."""
    import pynvml as n  # nvidia-ml-py; imported here so a missing or broken one only fails this probe

    n.nvmlInit()
    try:
        out: dict[str, Any] = {"source": "nvml", "driver_version": _s(n.nvmlSystemGetDriverVersion())}
        cuda = _try(n.nvmlSystemGetCudaDriverVersion_v2) or _try(n.nvmlSystemGetCudaDriverVersion)
        if cuda:
            out["cuda_driver_version"] = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        ours = _ancestors()
        gpus = []
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            g: dict[str, Any] = {"index": i, "name": _s(n.nvmlDeviceGetName(h)), "uuid": _try(lambda: _s(n.nvmlDeviceGetUUID(h)))}
            pci = _try(n.nvmlDeviceGetPciInfo, h)
            if pci is not None:
                g["bus_id"] = _s(pci.busId)
            cc = _try(n.nvmlDeviceGetCudaComputeCapability, h)
            if cc:
                g["compute_capability"] = f"{cc[0]}.{cc[1]}"
            mem = _try(n.nvmlDeviceGetMemoryInfo, h)
            if mem is not None:
                g.update(memory_total_bytes=int(mem.total), memory_used_bytes=int(mem.used), memory_free_bytes=int(mem.free))
            procs = []
            for p in _try(n.nvmlDeviceGetComputeRunningProcesses, h) or []:
                info = _process_info(int(p.pid), ours)
                used = getattr(p, "usedGpuMemory", None)
                info["used_bytes"] = int(used) if isinstance(used, int) and used < (1 << 50) else None
                procs.append(info)
            g["processes"] = procs
            g["temperature_c"] = _try(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)
            g["slowdown_temp_c"] = _try(n.nvmlDeviceGetTemperatureThreshold, h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
            g["shutdown_temp_c"] = _try(n.nvmlDeviceGetTemperatureThreshold, h, n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
            reasons_fn = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons
            mask = _try(reasons_fn, h)
            if mask is not None:
                g["throttle_reasons"] = throttle_names(int(mask))
            power = _try(n.nvmlDeviceGetPowerUsage, h)
            limit = _try(n.nvmlDeviceGetEnforcedPowerLimit, h)
            g["power_draw_w"] = round(power / 1000, 1) if power is not None else None
            g["power_limit_w"] = round(limit / 1000, 1) if limit is not None else None
            g["pcie_gen_current"] = _try(n.nvmlDeviceGetCurrPcieLinkGeneration, h)
            g["pcie_gen_max"] = _try(n.nvmlDeviceGetMaxPcieLinkGeneration, h)
            g["pcie_width_current"] = _try(n.nvmlDeviceGetCurrPcieLinkWidth, h)
            g["pcie_width_max"] = _try(n.nvmlDeviceGetMaxPcieLinkWidth, h)
            ecc = _try(n.nvmlDeviceGetEccMode, h)
            if ecc:
                g["ecc_mode"] = "Enabled" if ecc[0] else "Disabled"
                if ecc[0]:
                    unc, cor = n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_MEMORY_ERROR_TYPE_CORRECTED
                    g["ecc_uncorrected_volatile"] = _try(n.nvmlDeviceGetTotalEccErrors, h, unc, n.NVML_VOLATILE_ECC)
                    g["ecc_uncorrected_aggregate"] = _try(n.nvmlDeviceGetTotalEccErrors, h, unc, n.NVML_AGGREGATE_ECC)
                    g["ecc_corrected_volatile"] = _try(n.nvmlDeviceGetTotalEccErrors, h, cor, n.NVML_VOLATILE_ECC)
            sbe = _try(n.nvmlDeviceGetRetiredPages, h, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
            dbe = _try(n.nvmlDeviceGetRetiredPages, h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
            if sbe is not None:
                g["retired_pages_sbe"] = len(sbe)
            if dbe is not None:
                g["retired_pages_dbe"] = len(dbe)
            pending = _try(n.nvmlDeviceGetRetiredPagesPendingStatus, h)
            if pending is not None:
                g["retired_pages_pending"] = bool(pending)
            rows = _try(n.nvmlDeviceGetRemappedRows, h)
            if rows:
                g.update(remapped_rows_correctable=int(rows[0]), remapped_rows_uncorrectable=int(rows[1]),
                         remapped_rows_pending=bool(rows[2]), remapped_rows_failure=bool(rows[3]))
            mig = _try(n.nvmlDeviceGetMigMode, h)
            if mig:
                g["mig_mode"] = "Enabled" if mig[0] else "Disabled"
            pm = _try(n.nvmlDeviceGetPersistenceMode, h)
            if pm is not None:
                g["persistence_mode"] = "Enabled" if pm else "Disabled"
            gpus.append({k: v for k, v in g.items() if v is not None})
        out["gpus"] = gpus
        return out
    finally:
        _try(n.nvmlShutdown)


SMI_FIELDS = [
    "index", "name", "uuid", "pci.bus_id", "compute_cap", "memory.total", "memory.used", "memory.free", "temperature.gpu",
    "power.draw", "power.limit", "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current",
    "pcie.link.width.max", "clocks_throttle_reasons.active", "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total", "mig.mode.current", "persistence_mode", "driver_version",
]


def probe_nvidia_smi(timeout_s: float) -> dict[str, Any]:
    """The `nvidia` section from `nvidia-smi --query-gpu` (when NVML is unusable from Python)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise RuntimeError("nvidia-smi not found")
    fields = list(SMI_FIELDS)
    run = lambda args: subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout_s)  # noqa: E731
    res = run([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    if res.returncode != 0 and "compute_cap" in (res.stdout + res.stderr):
        fields.remove("compute_cap")  # older drivers do not know the field
        res = run([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    if res.returncode != 0:
        raise RuntimeError((res.stdout + res.stderr).strip().splitlines()[0] if (res.stdout + res.stderr).strip() else f"nvidia-smi exit {res.returncode}")
    out: dict[str, Any] = {"source": "nvidia-smi", "gpus": []}
    for line in res.stdout.strip().splitlines():
        vals = dict(zip(fields, (v.strip() for v in line.split(","))))
        out["driver_version"] = vals.get("driver_version")
        g: dict[str, Any] = {"index": int(vals["index"]), "name": vals.get("name"), "uuid": vals.get("uuid"), "bus_id": vals.get("pci.bus_id"),
                             "compute_capability": vals.get("compute_cap")}
        num = lambda k: float(vals[k]) if re.fullmatch(r"\d+(\.\d+)?", vals.get(k, "") or "") else None  # noqa: E731
        for k, key in (("memory.total", "memory_total_bytes"), ("memory.used", "memory_used_bytes"), ("memory.free", "memory_free_bytes")):
            if num(k) is not None:
                g[key] = int(num(k) * MIB)
        g["temperature_c"] = int(num("temperature.gpu")) if num("temperature.gpu") is not None else None
        g["power_draw_w"], g["power_limit_w"] = num("power.draw"), num("power.limit")
        for k, key in (("pcie.link.gen.current", "pcie_gen_current"), ("pcie.link.gen.max", "pcie_gen_max"),
                       ("pcie.link.width.current", "pcie_width_current"), ("pcie.link.width.max", "pcie_width_max"),
                       ("ecc.errors.uncorrected.volatile.total", "ecc_uncorrected_volatile"),
                       ("ecc.errors.uncorrected.aggregate.total", "ecc_uncorrected_aggregate")):
            if num(k) is not None:
                g[key] = int(num(k))
        mask = vals.get("clocks_throttle_reasons.active", "")
        if mask.startswith("0x"):
            g["throttle_reasons"] = throttle_names(int(mask, 16))
        g["mig_mode"], g["persistence_mode"] = vals.get("mig.mode.current"), vals.get("persistence_mode")
        g["processes"] = []
        out["gpus"].append({k: v for k, v in g.items() if v not in (None, "", "[N/A]", "N/A")})
    apps = run(["--query-compute-apps=gpu_uuid,pid,process_name,used_memory", "--format=csv,noheader,nounits"])
    ours = _ancestors()
    if apps.returncode == 0:
        for line in apps.stdout.strip().splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) < 4 or not parts[1].isdigit():
                continue
            info = _process_info(int(parts[1]), ours)
            info.setdefault("name", parts[2])
            info["used_bytes"] = int(parts[3]) * MIB if parts[3].isdigit() else None
            for g in out["gpus"]:
                if g.get("uuid") == parts[0]:
                    g["processes"].append(info)
    header = run([])
    m = re.search(r"CUDA Version:\s*([\d.]+)", header.stdout)
    if m:
        out["cuda_driver_version"] = m.group(1)
    return out


def probe(timeout_s: float) -> dict[str, Any]:
    """The `nvidia` section: NVML first, nvidia-smi second, plus kernel module / library versions either way."""
    km, lib = kernel_module_version(), library_version()
    extra = {k: v for k, v in (("kernel_module_version", km), ("library_version", lib)) if v}
    try:
        section = probe_nvml()
    except Exception as nvml_exc:
        reason = _nvml_reason(nvml_exc)
        if shutil.which("nvidia-smi") is None:
            section = {"error": f"could not check: {reason}; nvidia-smi not found"}
        else:
            try:
                section = probe_nvidia_smi(timeout_s)
                section["nvml_error"] = reason
            except Exception as smi_exc:
                section = {"error": f"could not check: {reason}; nvidia-smi: {smi_exc}"}
    section.update(extra)
    if "library_version" not in section and section.get("driver_version"):
        section["library_version"] = section["driver_version"]
    return section


def _nvml_reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, ImportError):
        return f"pynvml (nvidia-ml-py) not importable: {text}"
    if "Driver/library version mismatch" in text or "Driver Not Loaded" in text or "not found" in text.lower():
        return f"NVML: {text}"
    return f"NVML: {text}"
