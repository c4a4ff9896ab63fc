"""The env.* facts of a snapshot (docs/facts.md `env`): what the log engine's rules may read of
the machine a log came from (`explain --env`)."""

from __future__ import annotations

from typing import Any, Optional


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
