"""The env.* facts of a snapshot (docs/facts.md `env`): what the log engine's rules may read of
the machine a log came from (`explain --env`)."""

from __future__ import annotations

from typing import Any, Optional

GIB = 1 << 30
UNLISTED_MIN_BYTES = GIB  # a display, a CUDA context or the driver's own reserve stay below this
UNLISTED_MIN_SHARE = 0.05  # ... and below this share of the card


def unlisted_bytes(gpu: Any) -> Optional[int]:
    """Memory in use on a GPU that no listed process accounts for: used minus the listed processes'
    memory. None when the GPU's used memory or its process listing is not shown, when a listed process's
    memory is not shown (Windows WDDM prints N/A), or under MIG (per-instance memory). The env check
    (`other_process`, variant `unlisted`) and the log's pasted nvidia-smi tables (facts `smi.*`) both read it."""
    if not isinstance(gpu, dict) or str(gpu.get("mig_mode", "")).lower() == "enabled":
        return None
    used, procs = gpu.get("memory_used_bytes"), gpu.get("processes")
    if not isinstance(used, int) or not isinstance(procs, list):
        return None
    listed = 0
    for proc in procs:
        size = proc.get("used_bytes") if isinstance(proc, dict) else None
        if not isinstance(size, int):
            return None
        listed += size
    return max(0, used - listed)


def unlisted_is_large(unlisted: Optional[int], total: Any) -> bool:
    """Enough unaccounted memory to matter: at least UNLISTED_MIN_BYTES and UNLISTED_MIN_SHARE of the card."""
    if unlisted is None:
        return False
    share = UNLISTED_MIN_SHARE * total if isinstance(total, int) and total > 0 else 0
    return unlisted >= max(UNLISTED_MIN_BYTES, share)


def snapshot_facts(snapshot: Optional[dict], device_index: Optional[int] = None) -> dict[str, Any]:
    """Map a loradoctor snapshot (docs/snapshot.md) to the env.* facts; tolerates missing keys
    and `{"error": ...}` sections."""
    if not isinstance(snapshot, dict):
        return {}
    out: dict[str, Any] = {"env.present": True}
    nvidia = snapshot.get("nvidia") if isinstance(snapshot.get("nvidia"), dict) else {}
    gpus = [g for g in (nvidia.get("gpus") or []) if isinstance(g, dict)]
    if nvidia.get("driver_version"):
        out["env.driver_version"] = str(nvidia["driver_version"])
    if gpus:
        gpu = next((g for g in gpus if g.get("index") == device_index), gpus[0])
        if gpu.get("name"):
            out["env.gpu_name"] = gpu["name"]
        try:
            if gpu.get("compute_capability") is not None:
                out["env.compute_capability"] = float(gpu["compute_capability"])
        except (TypeError, ValueError):
            pass
        if isinstance(gpu.get("memory_total_bytes"), int):
            out["env.gpu_total_bytes"] = gpu["memory_total_bytes"]
        others = [p.get("used_bytes") for g in gpus for p in (g.get("processes") or [])
                  if isinstance(p, dict) and not p.get("ours") and isinstance(p.get("used_bytes"), int)]
        if any("processes" in g and isinstance(g.get("processes"), list) for g in gpus):
            out["env.other_process_bytes"] = sum(others)
    torch = snapshot.get("torch") if isinstance(snapshot.get("torch"), dict) else {}
    if "cuda_available" in torch and isinstance(torch.get("cuda_available"), bool):
        out["env.torch_cuda_available"] = torch["cuda_available"]
    if torch.get("cuda_version"):
        out["env.torch_cuda_version"] = str(torch["cuda_version"])
    return out
