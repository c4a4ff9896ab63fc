"""Edge cases of the training-numerics, training-error and CUDA rules (rules/numerics.yaml,
rules/train.yaml, rules/cuda.yaml) that the fixture folders do not pin down on their own."""

from __future__ import annotations

from pathlib import Path

import pytest

from loradoctor.logs.engine import explain
from loradoctor.logs.rules import load_rules

RULES = {r.id: r for r in load_rules()}


def _fires_on_line(rule_id: str, text: str) -> bool:
    """Would this one line count as a pattern hit (prefilter literal present and a pattern matches)?"""
    rule = RULES[rule_id]
    if rule.prefilter and not any(lit in text for lit in rule.prefilter):
        return False
    return any(p.search(text) for p in rule.compiled_patterns)


@pytest.mark.parametrize("line, is_fp16", [
    ("fp16=True,", True),
    ("fp16=False,", False),                 # every TrainingArguments dump has these three
    ("fp16_backend=auto,", False),
    ("fp16_opt_level=O1,", False),
    ("bf16=True,", False),
    ("--fp16 True --bf16 False", True),
    ("--fp16=False", False),
    ("--fp16 False", False),
    ("--fp16_full_eval", False),
    ("--mixed_precision fp16", True),
    ("--mixed_precision=bf16", False),
    ("Mixed precision type: fp16", True),
    ('"fp16": {"enabled": true, "loss_scale": 0}', True),
    ('"fp16": {"enabled": false}', False),
    ("compute dtype: torch.float16", True),
    ("compute dtype: torch.bfloat16", False),
    ("Using 16bit Automatic Mixed Precision (AMP)", True),
    ("Using bfloat16 Automatic Mixed Precision (AMP)", False),
])
def test_fp16_evidence_lines(line, is_fp16):
    assert _fires_on_line("fp16-nan-loss", line) is is_fp16


def _records(losses, grad_norms=None, lr=2e-4):
    grad_norms = grad_norms or [0.5] * len(losses)
    return "\n".join(
        f"{{'loss': {l}, 'grad_norm': {g}, 'learning_rate': {lr}, 'epoch': {round((i + 1) / 100, 2)}}}"
        for i, (l, g) in enumerate(zip(losses, grad_norms))
    )


def _explain(tmp_path: Path, text: str):
    path = tmp_path / "run.log"
    path.write_text(text, encoding="utf-8")
    return explain([str(path)])


def test_nan_from_the_first_record_in_bf16_is_masking_not_fp16(tmp_path):
    text = "fp16=False,\nbf16=True,\nfp16_opt_level=O1,\n" + _records(["nan"] * 12, ["nan"] * 12)
    report = _explain(tmp_path, text)
    causes = [f.cause for f in report.findings]
    assert causes and causes[0] == "loss.zero"
    assert "nan.fp16_overflow" not in causes


def test_same_nan_run_in_fp16_is_overflow(tmp_path):
    text = "fp16=True,\nbf16=False,\n" + _records(["nan"] * 12, ["nan"] * 12)
    report = _explain(tmp_path, text)
    assert report.findings[0].cause == "nan.fp16_overflow"
    assert "loss.zero" not in [f.cause for f in report.findings]


def test_healthy_fp16_run_with_skipped_first_steps_reports_nothing_bad(tmp_path):
    losses = [round(1.8 - i * 0.01, 4) for i in range(60)]
    grads = ["inf", "nan", "inf", "nan"] + [0.4] * 56
    text = ("fp16=True,\n`use_cache=True` is incompatible with gradient checkpointing. Setting `use_cache=False`.\n"
            + _records(losses, grads))
    report = _explain(tmp_path, text)
    assert [f for f in report.findings if f.severity in ("error", "warning")] == []


def test_zero_trainable_params_outranks_the_no_grad_error_it_causes(tmp_path):
    text = ("trainable params: 0 || all params: 6,738,415,616 || trainable%: 0.0000\n"
            "Traceback (most recent call last):\n"
            '  File "train.py", line 9, in <module>\n'
            "    loss.backward()\n"
            "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn\n")
    report = _explain(tmp_path, text)
    by_rule = {f.rule: f for f in report.findings}
    assert report.findings[0].rule == "peft-zero-trainable-params"
    assert by_rule["gc-no-grad-fn"].consequence_of is not None


def test_loss_that_plateaus_in_the_fourth_decimal_is_not_flat(tmp_path):
    losses = [round(1.2345 - 0.0002 * i, 4) for i in range(40)]
    report = _explain(tmp_path, _records(losses))
    assert "loss.flat" not in [f.cause for f in report.findings]


def test_illegal_access_after_a_device_assert_is_its_consequence(tmp_path):
    text = ("../aten/src/ATen/native/cuda/Indexing.cu:1289: indexSelectLargeIndex: block: [1,0,0], thread: [0,0,0] "
            "Assertion `srcIndex < srcSelectDimSize` failed.\n"
            "RuntimeError: CUDA error: device-side assert triggered\n"
            "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    report = _explain(tmp_path, text)
    assert report.findings[0].cause == "cuda.device_assert"
    illegal = [f for f in report.findings if f.cause == "cuda.illegal_access"]
    assert illegal and illegal[0].consequence_of is not None
