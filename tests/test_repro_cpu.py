"""The repros on a machine without a GPU (like CI): every one SKIPs with a reason or runs its CPU
logic, and `repro run --all` exits 0. Needs torch (CPU is enough); skipped cleanly without it."""

import json

import pytest

pytest.importorskip("torch")

from loradoctor.repro import REPRO_IDS, REPROS  # noqa: E402
from loradoctor.repro.runner import run_repro  # noqa: E402

from conftest import run_cli  # noqa: E402

CPU_RUNNABLE = {"fp16-overflow", "gc-require-grad", "device-assert", "nccl-allreduce"}


def _cuda_available() -> bool:
    import torch

    return bool(torch.version.cuda) and torch.cuda.is_available()


@pytest.fixture(scope="module")
def all_run():
    """One `repro run --all --format json` for the whole module (each repro is a child that imports torch)."""
    out = run_cli("repro", "run", "--all", "--format", "json", "--timeout", "120", timeout=600)
    return out


def test_all_exits_0_and_reports_every_repro(all_run):
    if _cuda_available():
        pytest.skip("this test describes a machine without a GPU")
    assert all_run.returncode == 0, all_run.stdout + all_run.stderr
    doc = json.loads(all_run.stdout)
    assert doc["schema"] == "loradoctor.repro-run/1" and doc["status"] == "PASS"
    results = {r["id"]: r for r in doc["results"]}
    assert list(results) == list(REPRO_IDS)
    for rid, r in results.items():
        assert r["schema"] == "loradoctor.repro/1"
        assert set(r) >= {"id", "status", "summary", "evidence", "numbers", "duration_s", "python", "torch"}
        if rid in CPU_RUNNABLE:
            assert r["status"] == "PASS", r
        else:
            assert r["status"] == "SKIP", r
            assert "GPU" in r["summary"] or "NVIDIA" in r["summary"], r["summary"]
    assert REPROS["gc-require-grad"].gpu == "no"


def _from_all(all_run, repro_id):
    return next(r for r in json.loads(all_run.stdout)["results"] if r["id"] == repro_id)


def test_gc_require_grad_reproduces_the_error_and_the_fixes_work(all_run):
    # the user's unfixed setup, through the CLI: FAIL and exit 1
    out = run_cli("repro", "run", "gc-require-grad", "--opt", "use_reentrant=true", "--opt", "input_require_grads=false",
                  "--format", "json")
    assert out.returncode == 1, out.stderr
    bad = json.loads(out.stdout)["results"][0]
    assert bad["status"] == "FAIL"
    assert "element 0 of tensors does not require grad and does not have a grad_fn" in bad["summary"]
    arms = {(a["use_reentrant"], a["input_require_grads"]): a for a in bad["numbers"]["arms"]}
    assert arms[(True, False)]["error"] and arms[(True, False)]["adapters_with_grad"] == 0
    for fixed in ((True, True), (False, False), (False, True)):
        assert arms[fixed]["error"] is None and arms[fixed]["adapters_with_grad"] == arms[fixed]["adapters"] > 0
    # the default setup under test is the fix: PASS, with the unfixed error shown as evidence
    good = _from_all(all_run, "gc-require-grad")
    assert good["status"] == "PASS" and good["numbers"]["reproduced_unfixed"] is True
    assert any("does not require grad" in e for e in good["evidence"])


def test_fp16_overflow_on_cpu_tensors():
    plain = run_repro("fp16-overflow", timeout_s=120, options={"setup": "fp16", "device": "cpu"})
    assert plain.status == "FAIL" and plain.numbers["device"] == "cpu"
    assert plain.numbers["cast_fp16"][1] == float("inf") and plain.numbers["cast_bf16"][1] == pytest.approx(70144.0)
    arms = plain.numbers["arms"]
    assert arms["fp16"]["weights_finite"] is False
    assert arms["fp16-scaled"]["weights_finite"] is True and arms["fp16-scaled"]["applied_steps"] == 0
    assert arms["bf16"]["weights_finite"] and arms["bf16"]["loss_finite"]
    scaled = run_repro("fp16-overflow", timeout_s=120, options={"setup": "fp16-scaled", "device": "cpu"})
    assert scaled.status == "FAIL" and "skips every step" in scaled.summary
    small = run_repro("fp16-overflow", timeout_s=120, options={"setup": "fp16", "value": 100, "device": "cpu"})
    assert small.status == "PASS" and small.numbers["overflow_expected"] is False


def test_device_assert_logic_on_cpu(all_run):
    bad = run_repro("device-assert", timeout_s=120, options={"vocab_size": 32000, "token_id": 32001, "device": "cpu"})
    assert bad.status == "FAIL" and "index out of range" in bad.summary and "resize_token_embeddings" in bad.summary
    good = _from_all(all_run, "device-assert") if not _cuda_available() else \
        run_repro("device-assert", timeout_s=120, options={"device": "cpu"}).to_dict()
    assert good["status"] == "PASS" and good["numbers"]["reproduced_unresized"] is True
    assert "IndexError" in good["numbers"]["arms"]["unresized"]["error"]


def test_gloo_allreduce_between_two_processes(all_run):
    if _cuda_available():
        result = run_repro("nccl-allreduce", timeout_s=90, options={"backend": "gloo"})
        numbers, status = result.numbers, result.status
    else:  # on a CPU machine --all already ran the gloo path: read it there
        r = _from_all(all_run, "nccl-allreduce")
        numbers, status = r["numbers"], r["status"]
    assert status == "PASS"
    assert numbers["backend"] == "gloo" and len(numbers["ranks"]) == 2
    assert all(r["value"] == r["expected"] == 3.0 for r in numbers["ranks"])


def test_nccl_without_two_gpus_is_a_skip():
    if _cuda_available():
        pytest.skip("describes a machine without GPUs")
    result = run_repro("nccl-allreduce", timeout_s=60, options={"backend": "nccl"})
    assert result.status == "SKIP" and "two GPUs" in result.summary
