"""measure: the config the child builds, the report (prediction vs measurement), the exit codes, the
relay of progress from a stand-in child, and (with transformers + peft installed) the real child on
the CPU with a tiny model."""

import json
import sys

import pytest

from loradoctor.estimate.inputs import resolve_inputs
from loradoctor.estimate.memory import estimate
from loradoctor.repro import measure as measure_mod
from loradoctor.render.measure_view import measure_text as render_text
from loradoctor.repro.measure import build_report, child_spec, compare, config_for_child, exit_code_for, run_measure

from conftest import run_cli


def _inputs(**cli):
    base = {"model": "Qwen/Qwen2.5-0.5B", "seq_len": 512}
    base.update(cli)
    return resolve_inputs(base)[0]


def test_preset_becomes_a_config_with_its_sizes():
    qwen = _inputs().arch
    cfg, note = config_for_child(qwen, 512)
    assert cfg["model_type"] == "qwen2" and note is None  # Qwen2 has q/k/v biases
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["vocab_size"]) == \
        (qwen.hidden, qwen.layers, qwen.kv_heads, qwen.vocab)
    assert cfg["tie_word_embeddings"] is True
    llama, _ = config_for_child(_inputs(model="meta-llama/Llama-3.1-8B").arch, 8192)
    assert llama["model_type"] == "llama" and llama["max_position_embeddings"] == 8192
    assert llama["intermediate_size"] == 14336


def test_a_config_json_of_a_canonical_type_is_used_as_is(tmp_path):
    cfg = {"model_type": "mistral", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "sliding_window": 128}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    got, note = config_for_child(_inputs(model=str(tmp_path)).arch, 512)
    assert got == cfg and note is None


def test_other_layouts_are_approximated_with_a_note(tmp_path):
    cfg = {"model_type": "phi", "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 2,
           "num_attention_heads": 4, "vocab_size": 1000}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    got, note = config_for_child(_inputs(model=str(tmp_path), targets="q_proj,v_proj").arch, 512)
    assert got["model_type"] == "llama" and "measured as a llama model" in note


def test_child_spec_carries_the_training_setup():
    inp = estimate(_inputs(method="qlora", gradient_checkpointing=True, targets="all-linear", batch=2)).inputs
    spec = child_spec(inp, 3)
    assert spec["quant"] == "nf4" and spec["method"] == "qlora" and spec["steps"] == 3
    assert spec["gradient_checkpointing"] is True and spec["batch"] == 2 and spec["seq_len"] == 512
    assert "gate_proj" in spec["targets"] and "lm_head" not in spec["targets"]
    json.dumps(spec)  # travels as one JSON argument


def test_compare_and_report():
    assert compare({"allocated": 110}, {"allocated": 100}) == {"allocated": pytest.approx(0.10)}
    assert compare({"allocated": 110}, {"allocated": None}) == {"allocated": None}
    inp = _inputs()
    est = estimate(inp)
    child = {"status": "measured", "peak_allocated_bytes": est.peak_allocated_bytes // 2,
             "peak_reserved_bytes": est.peak_reserved_bytes, "device_used_bytes": None,
             "steps": [{"step": 1, "s": 0.5, "loss": 12.0, "peak_allocated_bytes": 1, "peak_reserved_bytes": 2}],
             "gpu": {"name": "NVIDIA H200", "total_bytes": 150 * 2**30}, "versions": {"torch": "2.5.1"},
             "trainable_params": est.trainable_params}
    report = build_report(est.inputs, est, child, 1, None)
    assert report["schema"] == "loradoctor.measure/1" and report["status"] == "measured"
    assert report["error"]["allocated"] == pytest.approx(1.0, abs=1e-6)
    assert report["error"]["reserved"] == 0 and report["error"]["device"] is None
    assert exit_code_for(report) == 0
    text = render_text(report)
    assert "peak allocated" in text and "+100.0%" in text and "NVIDIA H200" in text
    oom = build_report(est.inputs, est, {**child, "status": "oom", "reason": "CUDA out of memory during train (step 1)"}, 1, None)
    assert exit_code_for(oom) == 1 and "DOES NOT FIT" in render_text(oom)
    assert all(v is None for v in oom["error"].values())
    skipped = build_report(est.inputs, est, {"status": "skip", "reason": "no CUDA GPU"}, 1, None)
    assert skipped["status"] == "skipped" and exit_code_for(skipped) == 2
    failed = build_report(est.inputs, est, None, 1, None, failure="timed out")
    assert failed["status"] == "error" and exit_code_for(failed) == 2


FAKE_CHILD = r'''
import json, sys, time
spec = json.loads(sys.argv[1])
for step in range(1, spec["steps"] + 1):
    print(json.dumps({"schema": "loradoctor.measure-progress/1", "message": f"step {step}/{spec['steps']}"}), flush=True)
if spec.get("hang"):
    time.sleep(60)
print(json.dumps({"schema": "loradoctor.measure-child/1", "status": "measured", "peak_allocated_bytes": 1000,
                  "peak_reserved_bytes": 2000, "device_used_bytes": 3000, "steps": [], "gpu": None,
                  "versions": {}, "echo_seq_len": spec["seq_len"]}), flush=True)
'''


def test_run_measure_relays_progress_and_reads_the_result(tmp_path, monkeypatch):
    fake = tmp_path / "fake_child.py"
    fake.write_text(FAKE_CHILD)
    monkeypatch.setattr(measure_mod, "CHILD_SCRIPT", fake)
    seen = []
    report = run_measure(_inputs(), steps=3, timeout_s=30, on_progress=seen.append)
    assert seen == ["step 1/3", "step 2/3", "step 3/3"]
    assert report["status"] == "measured" and report["measured"] == {"allocated": 1000, "reserved": 2000, "device": 3000}


def test_run_measure_times_out(tmp_path, monkeypatch):
    fake = tmp_path / "fake_child.py"
    fake.write_text(FAKE_CHILD)
    monkeypatch.setattr(measure_mod, "CHILD_SCRIPT", fake)
    monkeypatch.setattr(measure_mod, "child_spec", lambda inputs, steps: {"steps": 1, "seq_len": 1, "note": None, "hang": True})
    report = run_measure(_inputs(), steps=1, timeout_s=2, on_progress=None)
    assert report["status"] == "error" and "no result within 2 s" in report["reason"]


def _torch_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.version.cuda) and torch.cuda.is_available()


def test_cli_without_a_gpu_exits_2_with_the_reason():
    if _torch_gpu():
        pytest.skip("this machine has a GPU")
    out = run_cli("measure", "--model", "Qwen/Qwen2.5-0.5B", "--seq-len", "128", "--steps", "1")
    assert out.returncode == 2
    assert "measure needs a CUDA GPU and transformers + peft" in out.stderr and "Traceback" not in out.stderr
    js = run_cli("measure", "--model", "Qwen/Qwen2.5-0.5B", "--steps", "1", "--format", "json")
    assert js.returncode == 2 and json.loads(js.stdout)["status"] == "skipped"


def test_the_real_child_on_the_cpu_with_a_tiny_model():
    """Build + LoRA + checkpointing + a step through transformers and peft, on the CPU (no memory numbers)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from loradoctor.repro.runner import parse_result_line, run_child

    inp = estimate(_inputs(gradient_checkpointing=True, targets="q_proj,v_proj")).inputs
    spec = child_spec(inp, 1)
    spec["config"].update({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300})
    spec["seq_len"] = 32
    spec["device"] = "cpu"
    run = run_child([sys.executable, str(measure_mod.CHILD_SCRIPT), json.dumps(spec)], timeout_s=300)
    result = parse_result_line(run.stdout_lines, "loradoctor.measure-child/1")
    assert result is not None, run.stderr_lines[-10:]
    assert result["status"] == "measured", result
    # LoRA r8 (PEFT's default, what the estimate assumed) on q (64 -> 64) and v (64 -> 32) in 2 layers
    assert inp.rank == 8
    assert result["trainable_params"] == 2 * 8 * ((64 + 64) + (64 + 32))
    assert len(result["steps"]) == 1 and result["steps"][0]["loss"] > 0


@pytest.mark.gpu
def test_measure_on_the_gpu_is_close_to_the_estimate():
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    report = run_measure(_inputs(seq_len=512), steps=2, timeout_s=600)
    assert report["status"] == "measured", report["reason"]
    assert abs(report["error"]["allocated"]) < 0.5
