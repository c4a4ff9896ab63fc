"""`loradoctor recommend`: a config for every preset model x card x length (or a clear 'nothing fits'
naming the smallest card that would), each read back by our own readers to the same estimate."""

import ast
import json
import subprocess
import sys
import time
from loradoctor.record import replace
from pathlib import Path

import pytest

from loradoctor.advise.emit import emit
from loradoctor.advise.recommend import recommend, table
from loradoctor.errors import UserError
from loradoctor.estimate.arch import presets, resolve_arch
from loradoctor.estimate.fit import gpu_by_name
from loradoctor.estimate.memory import estimate, validate

CARDS = ("T4", "RTX 4090", "RTX 5090", "A100 80GB")
LENGTHS = (1024, 2048, 4096)


def _read_back(path: Path):
    from loradoctor.estimate.inputs import resolve_inputs

    inputs, _ = resolve_inputs({}, [path])
    return inputs


@pytest.mark.parametrize("model", sorted(presets()))
def test_grid_round_trips_through_the_readers(model, tmp_path):
    arch = resolve_arch(model)
    for card in CARDS:
        gpu = gpu_by_name(card)
        for n in LENGTHS:
            started = time.perf_counter()
            try:
                rec = recommend(arch, gpu, seq_len=n)
            except UserError as exc:
                msg = str(exc)
                assert msg.startswith("nothing fits") and ("smallest card" in msg or "no card in the table" in msg), msg
                continue
            assert time.perf_counter() - started < 1.0
            d = rec.to_dict()
            assert d["estimate_bytes"] <= d["budget_bytes"] <= d["card_bytes"]
            for fw, name in (("axolotl", "c.yaml"), ("llamafactory", "lf.yaml")):
                p = tmp_path / f"{card}-{n}-{name}".replace(" ", "_")
                p.write_text(emit(d, fw))
                back = _read_back(p)
                again = estimate(validate(replace(back, arch=rec.inputs.arch)))
                assert again.device_used_bytes == rec.estimate.device_used_bytes, (model, card, n, fw, back, rec.inputs)


def _call_kwargs(src: str, func: str) -> dict:
    tree = ast.parse(src)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == func:
            return {k.arg: ast.literal_eval(k.value) for k in node.keywords
                    if k.arg and isinstance(k.value, (ast.Constant, ast.List, ast.Tuple, ast.UnaryOp))}
    raise AssertionError(f"{func}( not in the snippet")


@pytest.mark.parametrize("fw", ["hf", "trl", "unsloth"])
def test_python_snippets_carry_exactly_the_estimated_settings(fw):
    rec = recommend(resolve_arch("llama-3.1-8b"), gpu_by_name("RTX 4090"), seq_len=2048, framework=fw)
    src = emit(rec.to_dict(), fw)
    ast.parse(src)
    inp = rec.inputs
    args = _call_kwargs(src, "SFTConfig" if fw != "hf" else "TrainingArguments")
    assert args["per_device_train_batch_size"] == inp.batch and args["gradient_accumulation_steps"] == inp.grad_accum
    assert args["optim"] == inp.optim and args["bf16"] is (inp.precision == "bf16")
    lora = _call_kwargs(src, "get_peft_model" if fw == "unsloth" else "LoraConfig")
    assert lora["r"] == inp.rank and lora["lora_alpha"] == inp.alpha and list(lora["target_modules"]) == list(inp.targets)
    if fw != "unsloth":
        assert args["gradient_checkpointing"] is inp.gradient_checkpointing


def test_choices_follow_the_card():
    t4 = recommend(resolve_arch("qwen2.5-7b"), gpu_by_name("T4"), seq_len=1024)
    assert t4.inputs.precision == "fp16" and t4.inputs.method == "qlora" and t4.inputs.attn == "sdpa"
    big = recommend(resolve_arch("qwen2.5-7b"), gpu_by_name("A100 80GB"), seq_len=2048)
    assert big.inputs.precision == "bf16" and big.inputs.method == "lora"
    assert any(r.startswith("bf16 LoRA:") for r in big.reasons)
    assert any(r.startswith("QLoRA") and "more than the" in r for r in t4.reasons)
    for rec in (t4, big):
        assert 1e-4 <= rec.lr <= 3e-4 and rec.inputs.alpha == 2 * rec.inputs.rank
        assert 16 <= rec.effective_batch <= 32


def test_nothing_fits_names_the_smallest_card():
    with pytest.raises(UserError) as info:
        recommend(resolve_arch("qwen2.5-72b"), gpu_by_name("T4"), seq_len=2048)
    assert "smallest card" in str(info.value)


def test_table_lists_micro_batches():
    rows = table(["llama-3.2-1b"], gpu_by_name("RTX 4090"))
    assert {(r["method"], r["seq_len"]) for r in rows} == {(m, n) for m in ("lora", "qlora") for n in LENGTHS}
    assert all(r["micro_batch"] >= 1 and r["bytes"] <= gpu_by_name("RTX 4090").memory_bytes for r in rows)
    # longer sequences never fit a larger micro-batch
    lora = [r["micro_batch"] for r in rows if r["method"] == "lora"]
    assert lora == sorted(lora, reverse=True)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "loradoctor", "recommend", *args], capture_output=True, text=True, timeout=60)


def test_cli_formats_and_exit_codes():
    out = _cli("--model", "qwen2.5-7b", "--gpu", "RTX 4090", "--seq-len", "2048", "--framework", "axolotl")
    assert out.returncode == 0 and "base_model: Qwen/Qwen2.5-7B" in out.stdout and "Why:" in out.stdout
    js = json.loads(_cli("--model", "qwen2.5-7b", "--gpu", "RTX 4090", "--format", "json").stdout)
    assert js["method"] in ("lora", "qlora") and js["config"]
    y = _cli("--model", "qwen2.5-7b", "--gpu", "T4", "--seq-len", "1024", "--framework", "llamafactory", "--format", "yaml")
    assert y.returncode == 0 and y.stdout.splitlines()[2].startswith("model_name_or_path:")
    none = _cli("--model", "qwen2.5-72b", "--gpu", "T4")
    assert none.returncode == 1 and "smallest card" in none.stdout
    bad = _cli("--model", "qwen2.5-7b")
    assert bad.returncode == 2 and "--gpu" in bad.stderr and "Traceback" not in bad.stderr
