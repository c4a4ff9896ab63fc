"""`loradoctor estimate`, `preflight` and `measure` as a user runs them (child processes)."""

import json

from conftest import run_cli

HEALTHY_SNAPSHOT = {
    "schema": "loradoctor.snapshot/1",
    "system": {"os": "Linux-5.15.0-105-generic-x86_64-with-glibc2.35", "python": "3.11.9", "wsl": False,
               "container": False, "ram_total_bytes": 134_217_728_000},
    "nvidia": {"driver_version": "550.54.15", "cuda_driver_version": "12.4", "gpus": [
        {"index": 0, "name": "NVIDIA GeForce RTX 4090", "uuid": "GPU-8f1c", "compute_capability": "8.9",
         "memory_total_bytes": 25_757_220_864, "memory_used_bytes": 452_984_832, "memory_free_bytes": 25_304_236_032,
         "processes": []}]},
    "torch": {"installed": True, "version": "2.5.1+cu124", "cuda_version": "12.4", "cuda_available": True,
              "device_count": 1, "arch_list": ["sm_80", "sm_86", "sm_89", "sm_90"]},
    "packages": {"torch": "2.5.1", "transformers": "4.46.0", "peft": "0.13.2", "accelerate": "1.1.0",
                 "bitsandbytes": "0.44.1"},
    "env_vars": {},
}


def _snapshot(tmp_path, free_bytes=None):
    snap = json.loads(json.dumps(HEALTHY_SNAPSHOT))
    if free_bytes is not None:
        gpu = snap["nvidia"]["gpus"][0]
        gpu["memory_free_bytes"] = free_bytes
        gpu["memory_used_bytes"] = gpu["memory_total_bytes"] - free_bytes
        gpu["processes"] = [{"pid": 4242, "name": "python", "used_bytes": gpu["memory_used_bytes"], "ours": False}]
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(snap))
    return path


def test_estimate_json_document():
    out = run_cli("estimate", "--model", "meta-llama/Llama-3.1-8B", "--method", "qlora", "--seq-len", "1024",
                  "--gradient-checkpointing", "--gpu", "RTX 4090", "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["schema"] == "loradoctor.estimate/1"
    assert doc["inputs"]["method"] == "qlora" and doc["inputs"]["quant"] == "nf4"
    assert sum(doc["components"].values()) == doc["device_used_bytes"]
    assert doc["peak_allocated_bytes"] < doc["peak_reserved_bytes"] < doc["device_used_bytes"]
    low, high = doc["band"]
    assert low < doc["device_used_bytes"] < high
    assert doc["gpu"]["name"] == "RTX 4090" and doc["verdict"] in ("fits", "tight")
    assert doc["max_batch"] >= 1 and doc["max_seq_len"] >= 1024
    assert doc["provenance"]["seq_len"] == "command line" and doc["provenance"]["rank"] == "default"


def test_estimate_ia3_feedforward_and_keep_logits_options():
    args = ("estimate", "--model", "meta-llama/Llama-3.2-3B", "--peft", "ia3", "--targets", "all-linear",
            "--batch", "4", "--seq-len", "768", "--precision", "bf16-no-autocast", "--format", "json")
    plain = json.loads(run_cli(*args).stdout)
    out = run_cli(*args, "--ia3-feedforward", "gate_proj,up_proj,down_proj", "--keep-logits")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["inputs"]["ia3_feedforward"] == ["gate_proj", "up_proj", "down_proj"] and doc["inputs"]["keep_logits"]
    # PEFT's method comparison reports 630,784 trainable parameters for this IA3 (Llama-3.2-3B: 28 layers,
    # q 3072 + k 1024 + v 1024 + o 3072 out-wide, gate/up 3072 + down 8192 in-wide)
    assert doc["trainable_params"] == 28 * (3072 + 1024 + 1024 + 3072 + 3072 + 3072 + 8192) == 630_784
    assert plain["trainable_params"] == 28 * (3072 + 1024 + 1024 + 3072 + 8192 + 8192 + 8192)
    assert doc["components"]["logits kept by the training loop"] == 2 * 4 * 768 * 128256
    bad = run_cli(*args[:-2], "--ia3-feedforward", "lm_head")
    assert bad.returncode == 2 and "must be among the targets" in bad.stderr


def test_estimate_text_does_not_fit_exits_1_with_advice(fixtures_dir):
    out = run_cli("estimate", "--config", str(fixtures_dir / "configs" / "hf_checkpoint"), "--batch", "16",
                  "--no-gradient-checkpointing", "--precision", "fp16", "--gpu", "T4")
    assert out.returncode == 1, out.stderr
    assert "DOES NOT FIT on T4" in out.stdout
    assert "base weights" in out.stdout and "█" in out.stdout
    assert "turn on gradient checkpointing" in out.stdout and "--gradient-checkpointing" in out.stdout


def test_estimate_bad_usage_exits_2():
    out = run_cli("estimate", "--model", "someone/unknown-model-7b")
    assert out.returncode == 2
    assert out.stderr.startswith("loradoctor: error: unknown model") and "llama-3.1-8b" in out.stderr
    assert "Traceback" not in out.stderr
    out = run_cli("estimate", "--model", "llama-2-7b", "--gpu", "4090", "--vram", "24GB")
    assert out.returncode == 2 and "not both" in out.stderr


def test_preflight_go_and_no_go(tmp_path):
    snap = _snapshot(tmp_path)
    go = run_cli("preflight", "--snapshot", str(snap), "--model", "meta-llama/Llama-3.1-8B", "--method", "qlora",
                 "--seq-len", "1024", "--gradient-checkpointing", "--format", "json")
    assert go.returncode == 0, go.stdout + go.stderr
    doc = json.loads(go.stdout)
    assert doc["go"] is True and doc["estimate"]["gpu"]["source"] == "local free memory"
    # another process holds all but 6 GiB: the same run cannot start
    busy = _snapshot(tmp_path, free_bytes=6 * 2**30)
    nogo = run_cli("preflight", "--snapshot", str(busy), "--model", "meta-llama/Llama-3.1-8B", "--method", "qlora",
                   "--seq-len", "1024", "--gradient-checkpointing")
    assert nogo.returncode == 1, nogo.stdout + nogo.stderr
    assert "NO GO" in nogo.stdout and "out of memory" in nogo.stdout and "first fix" in nogo.stdout


def test_measure_validates_like_estimate():
    out = run_cli("measure", "--model", "llama-2-7b", "--steps", "0")
    assert out.returncode == 2 and "--steps" in out.stderr
    out = run_cli("measure", "--help")
    assert out.returncode == 0 and "--seq-len" in out.stdout and "--timeout" in out.stdout


def test_preflight_core_no_gpu_and_env_error():
    from loradoctor.estimate.preflight import run_preflight
    from loradoctor.estimate.arch import resolve_arch
    from loradoctor.estimate.memory import EstimateInputs

    inputs = EstimateInputs(arch=resolve_arch("Qwen/Qwen2.5-0.5B"), seq_len=512)
    no_gpu = json.loads(json.dumps(HEALTHY_SNAPSHOT))
    no_gpu["nvidia"] = {"error": "could not check: NVML Shared Library Not Found"}
    out = run_preflight(inputs, no_gpu, 0)
    assert out["go"] is False and out["first_fix"]
    # a T4 asked for bf16: the env checks' error comes first, with its fix
    t4 = json.loads(json.dumps(HEALTHY_SNAPSHOT))
    t4["nvidia"]["gpus"][0].update({"name": "Tesla T4", "compute_capability": "7.5",
                                    "memory_total_bytes": 16_106_127_360, "memory_free_bytes": 15_600_000_000})
    t4["torch"]["arch_list"] = ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90"]
    out = run_preflight(inputs, t4, 0)
    assert out["go"] is False
    assert "bf16" in out["reason"] and out["first_fix"]
    healthy = run_preflight(inputs, HEALTHY_SNAPSHOT, 0)
    assert healthy["go"] is True and healthy["fit"].verdict == "fits"
