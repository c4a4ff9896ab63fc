"""On a machine with an NVIDIA GPU and a CUDA torch (skipped elsewhere): the live probes agree with each other."""

import json

import pytest

from conftest import run_cli


@pytest.mark.gpu
def test_live_deep_snapshot_on_a_gpu():
    res = run_cli("env", "--deep", "--format", "json", timeout=300)
    doc = json.loads(res.stdout)
    snap = doc["snapshot"]
    assert snap["nvidia"]["source"] in ("nvml", "nvidia-smi")
    gpus = snap["nvidia"]["gpus"]
    assert gpus and all(g.get("compute_capability") for g in gpus)
    assert all(g["memory_total_bytes"] > 0 for g in gpus)
    t = snap["torch"]
    assert t["probe"]["status"] == "ok" and t["cuda_available"] and t["device_count"] >= 1
    assert t["arch_list"]
    # NVML and torch agree on the first visible device's compute capability
    assert t["devices"][0]["capability"] in {g["compute_capability"] for g in gpus}
    for r in t["deep"]:
        assert r["fp16"]["ok"], r
        cap = t["devices"][r["index"]]["capability"]
        if float(cap) >= 8.0:
            assert r["bf16"]["ok"], r
    assert not [f for f in doc["findings"] if f["cause"] in ("env.torch_broken", "env.torch_cpu_only", "env.arch_unsupported")]
