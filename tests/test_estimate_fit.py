"""Fit verdict and the what-if search."""

from loradoctor.record import replace

import pytest

from loradoctor.errors import UserError
from loradoctor.estimate.arch import resolve_arch
from loradoctor.estimate.fit import (
    Gpu, advise, find_gpu, fit, gpu_by_name, gpu_from_snapshot, gpu_from_vram, max_batch, max_seq_len, verdict_for,
)
from loradoctor.estimate.memory import EstimateInputs, estimate

LLAMA31 = resolve_arch("meta-llama/Llama-3.1-8B")


@pytest.mark.parametrize("name, card", [
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("rtx4090", "RTX 4090"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
    ("Tesla T4", "T4"),
    ("h100", "H100 80GB"),
    ("NVIDIA GeForce RTX 5090", "RTX 5090"),
    ("1x NVIDIA A10G", "A10G"),
])
def test_gpu_names_match_loosely(name, card):
    assert find_gpu(name) == card


def test_unknown_gpu_and_vram():
    assert find_gpu("Radeon 7900") is None
    with pytest.raises(UserError):
        gpu_by_name("Radeon 7900")
    # the card-table convention: a '24 GB' card has 24 GiB, so 24GB and 24GiB are the same size
    assert gpu_from_vram("24GB").memory_bytes == gpu_from_vram("24GiB").memory_bytes == 24 * 2**30
    assert gpu_from_vram("24GB").memory_bytes >= gpu_by_name("RTX 4090").memory_bytes
    assert gpu_from_vram("22.5GiB").memory_bytes == int(22.5 * 2**30)
    for bad in ("lots", "24", "0GB", "1e999GB", "-3GB", ""):
        with pytest.raises(UserError):
            gpu_from_vram(bad)


def test_verdict_thresholds():
    est = estimate(EstimateInputs(arch=LLAMA31, method="qlora", seq_len=1024, gradient_checkpointing=True))
    low, high = est.band
    assert verdict_for(est, high + 1) == "fits"
    assert verdict_for(est, est.device_used_bytes + 1) == "tight"
    assert verdict_for(est, est.device_used_bytes - 1) == "does not fit"


def test_max_batch_and_seq_are_the_largest_that_fit():
    inp = EstimateInputs(arch=LLAMA31, method="qlora", seq_len=2048, gradient_checkpointing=True)
    budget = gpu_by_name("RTX 4090").memory_bytes
    b = max_batch(inp, budget)
    assert b is not None and b >= 1
    assert estimate(replace(inp, batch=b)).device_used_bytes <= budget < estimate(replace(inp, batch=b + 1)).device_used_bytes
    s = max_seq_len(inp, budget)
    assert s % 64 == 0
    assert estimate(replace(inp, seq_len=s)).device_used_bytes <= budget < estimate(replace(inp, seq_len=s + 64)).device_used_bytes
    assert max_batch(replace(inp, method="full", quant="none"), budget) is None


def test_advice_ordered_with_savings_and_stacking():
    inp = estimate(EstimateInputs(arch=LLAMA31, method="lora", batch=4, seq_len=2048)).inputs
    est = estimate(inp)
    budget = gpu_by_name("RTX 4090").memory_bytes
    changes = advise(inp, est, budget)
    texts = [c.text for c in changes]
    assert texts[0] == "turn on gradient checkpointing"
    assert any(t.startswith("halve the batch") for t in texts)
    assert all(c.saves_bytes > 0 for c in changes)
    assert all(c.saves_bytes > 0 for c in changes)
    stacked = [c.cumulative_bytes for c in changes]
    assert stacked == sorted(stacked, reverse=True)  # each change on top of the previous only lowers the total
    assert changes[-1].cumulative_bytes <= budget
    gc_on = advise(replace(inp, gradient_checkpointing=True), estimate(replace(inp, gradient_checkpointing=True)), budget)
    assert "turn on gradient checkpointing" not in [c.text for c in gc_on]
    # with checkpointing the weights dominate, and 4-bit weights are the big lever
    qlora = next(c for c in gc_on if "QLoRA" in c.text)
    assert qlora.saves_bytes > 3 * 2**30


def test_fit_against_local_free_memory():
    snap = {"nvidia": {"gpus": [
        {"index": 0, "name": "NVIDIA GeForce RTX 4090", "memory_total_bytes": 25757220864, "memory_free_bytes": 10 * 2**30},
        {"index": 1, "name": "NVIDIA GeForce RTX 4090", "memory_total_bytes": 25757220864, "memory_used_bytes": 2**30},
    ]}}
    gpu0 = gpu_from_snapshot(snap, 0)
    assert gpu0.memory_bytes == 10 * 2**30 and gpu0.source == "local free memory"
    assert gpu_from_snapshot(snap, 1).memory_bytes == 25757220864 - 2**30
    assert gpu_from_snapshot({"nvidia": {"error": "could not check: no driver"}}) is None
    inp = EstimateInputs(arch=LLAMA31, method="qlora", seq_len=1024, gradient_checkpointing=True)
    est = estimate(inp)
    result = fit(est.inputs, est, gpu0)
    assert result.verdict == "does not fit" and result.headroom_bytes < 0
    assert fit(est.inputs, est, Gpu("big", 80 * 2**30, "vram")).verdict == "fits"


def test_pre_ampere_card_warns_and_skips_flash_attention_advice():
    inp = EstimateInputs(arch=resolve_arch("Qwen/Qwen2.5-0.5B"), method="full", seq_len=1024, batch=4)
    est = estimate(inp)
    t4 = gpu_by_name("T4")
    result = fit(est.inputs, est, t4)
    assert any("no native bf16" in w for w in result.warnings)
    assert not any("flash_attention_2" in c.option for c in result.advice)
    a100 = fit(est.inputs, est, gpu_by_name("A100 40GB"))
    assert a100.warnings == []


def test_local_gpu_uses_the_nvidia_probe(monkeypatch):
    from loradoctor.env.probes import nvidia
    from loradoctor.estimate.inputs import gpu_budget

    section = {"driver_version": "550.54.15", "gpus": [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
         "memory_total_bytes": 85_520_809_984, "memory_free_bytes": 40 * 2**30}]}
    monkeypatch.setattr(nvidia, "probe", lambda timeout_s: section)
    gpu = gpu_budget("local", None)
    assert gpu.memory_bytes == 40 * 2**30 and gpu.source == "local free memory" and gpu.flash_attn_ok
    monkeypatch.setattr(nvidia, "probe", lambda timeout_s: {"error": "could not check: no driver"})
    with pytest.raises(UserError):
        gpu_budget("local:0", None)


def test_snapshot_gpu_by_uuid():
    snap = {"nvidia": {"gpus": [
        {"index": 0, "uuid": "GPU-aaaa-1111", "name": "NVIDIA L4", "memory_free_bytes": 20 * 2**30},
        {"index": 1, "uuid": "GPU-bbbb-2222", "name": "NVIDIA L4", "memory_free_bytes": 3 * 2**30}]}}
    assert gpu_from_snapshot(snap, "GPU-bbbb").memory_bytes == 3 * 2**30
    assert gpu_from_snapshot(snap, 0).memory_bytes == 20 * 2**30
