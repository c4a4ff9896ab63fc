"""preflight as a launch gate (issue 12): never GO without a GPU to run on unless told to judge another card,
and then it says so; card features count; bad option values and combinations exit 2."""

import json

import pytest

from loradoctor.errors import UserError
from loradoctor.estimate.arch import resolve_arch
from loradoctor.estimate.fit import gpu_by_name
from loradoctor.estimate.memory import EstimateInputs
from loradoctor.estimate.preflight import gpu_index_for_run, run_preflight

from conftest import run_cli
from test_estimate_cli import HEALTHY_SNAPSHOT

NO_GPU = {"schema": "loradoctor.snapshot/1", "system": {"os": "Linux-6.8.0-x86_64-with-glibc2.39", "python": "3.11.9"},
          "nvidia": {"error": "could not check: NVML: NVML Shared Library Not Found; nvidia-smi not found"},
          "torch": {"installed": False}, "packages": {}, "env_vars": {}}
SMALL = EstimateInputs(arch=resolve_arch("Qwen/Qwen2.5-0.5B"), seq_len=512)


def _write(tmp_path, snap, name="snap.json"):
    path = tmp_path / name
    path.write_text(json.dumps(snap))
    return path


def test_no_gpu_here_is_never_go_and_says_why_and_what_to_do():
    out = run_preflight(SMALL, NO_GPU, 0)
    assert out.go is False
    assert "no NVIDIA GPU is visible on this machine" in out.reason and "NVML Shared Library Not Found" in out.reason
    assert "--gpu NAME" in out.first_fix and "--vram" in out.first_fix


def test_judging_another_card_on_a_machine_without_gpu_says_so():
    out = run_preflight(SMALL, NO_GPU, 0, gpu_by_name("H100"))
    assert out.go is True
    assert out.judged_against == "judged against an H100 80GB (79.65 GiB, card table), not this machine"
    assert out.judged_against in out.reason


def test_torch_missing_next_to_a_gpu_is_not_go():
    snap = json.loads(json.dumps(HEALTHY_SNAPSHOT))
    snap["torch"] = {"installed": False}
    out = run_preflight(SMALL, snap, 0)
    assert out.go is False and "torch is not installed" in out.reason


def test_a_named_card_is_judged_on_its_features():
    out = run_preflight(SMALL, NO_GPU, 0, gpu_by_name("T4"))
    assert out.go is False and [u.feature for u in out.unsupported] == ["bf16"]
    assert out.first_fix == "--precision fp16" and "not this machine" in out.reason
    # the healthy 4090 machine judged against a full T4: not its free memory, and said so
    out = run_preflight(SMALL, HEALTHY_SNAPSHOT, 0, gpu_by_name("T4"))
    assert out.go is False and "not the free memory of this machine's NVIDIA GeForce RTX 4090" in out.judged_against


def test_gpu_index_is_checked():
    with pytest.raises(UserError, match="0 or more"):
        gpu_index_for_run(-1)
    assert gpu_index_for_run(None, {"CUDA_VISIBLE_DEVICES": "2,3"}) == 2
    with pytest.raises(UserError, match="this machine has GPU 0"):
        run_preflight(SMALL, HEALTHY_SNAPSHOT, 3, index_given=True)


def test_cli_no_gpu_with_and_without_a_card(tmp_path):
    snap = _write(tmp_path, NO_GPU)
    args = ("preflight", "--snapshot", str(snap), "--model", "meta-llama/Llama-3.1-8B")
    alone = run_cli(*args)
    assert alone.returncode == 1, alone.stdout + alone.stderr
    assert "NO GO cannot judge this run here: no NVIDIA GPU is visible" in alone.stdout and "GO the run" not in alone.stdout
    h100 = run_cli(*args, "--gpu", "H100")
    assert h100.returncode == 0, h100.stdout + h100.stderr
    go_line = next(line for line in h100.stdout.splitlines() if line.startswith("GO "))
    assert "judged against an H100 80GB" in go_line and "not this machine" in go_line
    t4 = run_cli(*args, "--gpu", "T4", "--format", "json")
    assert t4.returncode == 1
    doc = json.loads(t4.stdout)
    assert doc["go"] is False and doc["unsupported"][0]["feature"] == "bf16" and "not this machine" in doc["judged_against"]
    assert doc["estimate"]["verdict"] == "unsupported" and doc["estimate"]["memory_verdict"] == "does not fit"


@pytest.mark.parametrize("extra, words", [
    (("--gpu-index", "-1"), "0 or more"),
    (("--gpu-index", "0", "--gpu", "H100"), "pass one of them"),
    (("--gpu", "local"), "drop --gpu local"),
    (("--gpu", "V100"), "V100 16GB"),
    (("--vram", "24"), "24GB or 24GiB"),
    (("--method", "qlora", "--quant", "none"), "--quant none"),
])
def test_cli_bad_usage_exits_2_with_one_line(tmp_path, extra, words):
    snap = _write(tmp_path, HEALTHY_SNAPSHOT)
    out = run_cli("preflight", "--snapshot", str(snap), "--model", "Qwen/Qwen2.5-0.5B", *extra)
    assert out.returncode == 2, out.stdout + out.stderr
    assert words in out.stderr and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_cli_hostile_configs_exit_2_quickly(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    bomb.write_text("\n".join(lines + ["base_model: meta-llama/Llama-3.1-8B", "lora_target_modules: *a9"]) + "\n")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    two = tmp_path / "two.yaml"
    two.write_text("base_model: meta-llama/Llama-3.1-8B\nadapter: lora\nmicro_batch_size: two\n")
    for path, words in ((bomb, "alias"), (binary, "not a text file"), (two, "micro_batch_size: 'two'")):
        out = run_cli("estimate", "--config", str(path), timeout=30)
        assert out.returncode == 2, out.stderr
        assert str(path) in out.stderr and words in out.stderr and "Traceback" not in out.stderr


def test_cli_conflicting_configs_and_framework_keys_in_the_output(tmp_path):
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text("base_model: meta-llama/Llama-3.1-8B\nadapter: lora\nmicro_batch_size: 2\nsequence_len: 2048\n")
    second.write_text("base_model: meta-llama/Llama-3.1-8B\nadapter: lora\nmicro_batch_size: 16\n")
    out = run_cli("estimate", "--config", str(first), "--config", str(second), "--gpu", "RTX 4090")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "note: batch: 2 in first.yaml, 16 in second.yaml; second.yaml wins" in out.stdout
    assert "micro_batch_size: 8, gradient_accumulation_steps: 2" in out.stdout  # the fix in axolotl's words


def test_a_reader_that_stops_early_does_not_change_the_exit_code(tmp_path):
    """`loradoctor preflight ... | head -1` under pipefail: the verdict decides the code, not the pipe."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    snap = _write(tmp_path, NO_GPU)
    for args, code in ((("preflight", "--snapshot", str(snap), "--model", "Qwen/Qwen2.5-0.5B", "--gpu", "H100"), 0),
                       (("preflight", "--snapshot", str(snap), "--model", "Qwen/Qwen2.5-0.5B", "--gpu", "H100",
                         "--format", "json"), 0),
                       (("estimate", "--model", "Qwen/Qwen2.5-0.5B", "--gpu", "T4", "--no-what-if"), 1)):
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before anything is written
        try:
            out = subprocess.run([sys.executable, "-m", "loradoctor", *args], stdout=write_end, stderr=subprocess.PIPE,
                                 text=True, cwd=str(ROOT), timeout=120, env={**os.environ, "NO_COLOR": "1"})
        finally:
            os.close(write_end)
        assert out.returncode == code, (args, out.stderr)
        assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr


def test_preflight_states_the_gradient_checkpointing_default(tmp_path):
    snap = _write(tmp_path, HEALTHY_SNAPSHOT)
    out = run_cli("preflight", "--snapshot", str(snap), "--model", "meta-llama/Llama-3.1-8B", "--method", "qlora")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "gradient_checkpointing (on, as PEFT's prepare_model_for_kbit_training" in out.stdout
