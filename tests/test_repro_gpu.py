"""The GPU paths of the repros (skipped without an NVIDIA GPU and a CUDA torch). None of them may end
in ERROR (a bug in the repro) or SKIP for want of a GPU on a machine that has one."""

import pytest

from loradoctor.repro.runner import run_repro

GPU_REPROS = ("cuda-init", "bf16", "fp16", "sdpa-backends", "free-memory", "fragmentation", "fp16-overflow",
              "device-assert")


@pytest.mark.gpu
@pytest.mark.parametrize("repro_id", GPU_REPROS)
def test_gpu_repro_gives_a_verdict(repro_id):
    result = run_repro(repro_id, timeout_s=300)
    assert result.status in ("PASS", "FAIL"), (result.summary, result.evidence)


@pytest.mark.gpu
def test_cuda_init_passes_on_a_working_gpu():
    result = run_repro("cuda-init", timeout_s=300)
    assert result.status == "PASS", result.evidence
    assert result.numbers["devices"] and result.numbers["devices"][0]["max_rel_error"] < 1e-4


@pytest.mark.gpu
def test_device_assert_on_the_gpu_is_a_device_side_assert():
    result = run_repro("device-assert", timeout_s=300, options={"device": "cuda"})
    assert result.status == "PASS"
    assert "device-side assert" in (result.numbers["arms"]["unresized"]["error"] or "")


@pytest.mark.gpu
def test_fragmentation_arms_differ():
    result = run_repro("fragmentation", timeout_s=300)
    assert result.status in ("PASS", "FAIL")
    setup, other = result.numbers["setup"], result.numbers["other_arm"]
    assert other is not None and setup["expandable_segments"] != other["expandable_segments"]


@pytest.mark.gpu
@pytest.mark.parametrize("repro_id", ("flash-attn", "bnb-4bit", "bnb-8bit-optim"))
def test_optional_packages_pass_or_skip_for_a_missing_package(repro_id):
    result = run_repro(repro_id, timeout_s=300)
    assert result.status != "ERROR", (result.summary, result.evidence)
    if result.status == "SKIP":
        assert "not installed" in result.summary
