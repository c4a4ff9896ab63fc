"""A fix the log shows already applied is not offered (`fixes[].unless` / `fixes[].when`): QLoRA OOMs whose
traceback runs through bitsandbytes' 4-bit path or whose log echoes load_in_4bit=True are not told to load
in 4 bit; a log that shows gradient checkpointing on is not told to turn it on. Also the schema, the lint
of a bad fix condition and the rule cache's round trip."""

import os
import shutil
from pathlib import Path

import pytest

from conftest import USER_RULE, explain_text
from loradoctor.errors import UserError
from loradoctor.logs.rules import load as R
from loradoctor.logs.rules import builtin_rules_dir

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.02 GiB. GPU 0 has a total capacity of "
       "79.25 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.18 GiB memory in "
       "use. Of the allocated memory 76.20 GiB is allocated by PyTorch, and 200.00 MiB is reserved by PyTorch "
       "but unallocated.")
STEP = """Traceback (most recent call last):
  File "/w/train.py", line 80, in <module>
    trainer.train()
  File "/venv/transformers/trainer.py", line 1885, in train
    return inner_training_loop(
  File "/venv/transformers/trainer.py", line 2216, in _inner_training_loop
    tr_loss_step = self.training_step(model, inputs)
  File "/venv/torch/nn/modules/module.py", line 1532, in _call_impl
    return forward_call(*args, **kwargs)
  File "/venv/peft/tuners/lora/bnb.py", line 467, in forward
    result = self.base_layer(x, *args, **kwargs)
"""
BNB_FRAMES = """  File "/venv/bitsandbytes/nn/modules.py", line 468, in forward
    out = bnb.matmul_4bit(x, self.weight.t(), bias=bias, quant_state=self.weight.quant_state)
  File "/venv/bitsandbytes/autograd/_functions.py", line 579, in matmul_4bit
    return MatMul4Bit.apply(A, B, out, bias, quant_state)
"""
FOUR_BIT = "Load the base model in 4 bit (QLoRA) and use a paged 8-bit optimizer"
PAGED = "The base is 4-bit already: page the optimizer state to host memory at peaks (8-bit, paged)"
CHECKPOINTING = "Recompute activations instead of storing them"


def _capacity_fixes(tmp_path, text):
    report = explain_text(tmp_path, text)
    top = report.findings[0]
    assert top.rule == "oom-capacity", [f.rule for f in report.findings]
    return [f.text for f in top.fixes]


def test_plain_capacity_oom_keeps_every_fix(tmp_path):
    fixes = _capacity_fixes(tmp_path, STEP + OOM + "\n")
    assert FOUR_BIT in fixes and CHECKPOINTING in fixes and PAGED not in fixes


def test_bnb_4bit_frames_drop_the_4bit_fix(tmp_path):
    fixes = _capacity_fixes(tmp_path, STEP + BNB_FRAMES + OOM + "\n")
    assert FOUR_BIT not in fixes and PAGED in fixes and CHECKPOINTING in fixes


@pytest.mark.parametrize("config_line", [
    'quantization_config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")',
    '  "load_in_4bit": true,',
    "load_in_4bit: true",
])
def test_a_4bit_config_line_drops_the_4bit_fix(tmp_path, config_line):
    fixes = _capacity_fixes(tmp_path, config_line + "\n" + STEP + OOM + "\n")
    assert FOUR_BIT not in fixes and PAGED in fixes


def test_load_in_4bit_false_keeps_the_4bit_fix(tmp_path):
    fixes = _capacity_fixes(tmp_path, "BitsAndBytesConfig(load_in_4bit=False, load_in_8bit=True)\n" + STEP + OOM + "\n")
    assert FOUR_BIT in fixes


@pytest.mark.parametrize("line", [
    "TrainingArguments(output_dir=out, per_device_train_batch_size=4, gradient_checkpointing=True, bf16=True)",
    "`use_cache=True` is incompatible with gradient checkpointing. Setting `use_cache=False`.",
    '  File "/venv/torch/utils/checkpoint.py", line 488, in checkpoint',
])
def test_checkpointing_already_on_drops_its_fix(tmp_path, line):
    text = STEP.replace("Traceback (most recent call last):\n", "Traceback (most recent call last):\n" + line + "\n") \
        if line.startswith("  File") else line + "\n" + STEP
    fixes = _capacity_fixes(tmp_path, text + OOM + "\n")
    assert CHECKPOINTING not in fixes and FOUR_BIT in fixes


def test_checkpointing_off_or_advised_keeps_its_fix(tmp_path):
    for line in ("gradient_checkpointing=False,", "Consider enabling gradient checkpointing to save memory."):
        assert CHECKPOINTING in _capacity_fixes(tmp_path, line + "\n" + STEP + OOM + "\n")


def test_every_oom_rule_with_the_checkpointing_fix_drops_it():
    rules = [r for r in R.load_rules() if r.source.endswith("oom.yaml")]
    with_fix = [(r, i) for r in rules for i, f in enumerate(r.fixes) if f.command == "gradient_checkpointing: true"]
    assert len(with_fix) >= 7
    for rule, i in with_fix:
        assert rule.fix_unless[i] == "config.gradient_checkpointing == True", rule.id
        assert rule.fixes[i] not in rule.fixes_for({"config.gradient_checkpointing": True})
        assert rule.fixes[i] in rule.fixes_for({})


# the schema, the lint and the cache -------------------------------------------------------------------

# conftest's user rule with three fixes: unconditional, `unless: {cond}`, and `when:` 4-bit
RULE = USER_RULE.replace("{pattern}", "zzq fix condition test").replace("      - text: do something\n", """\
      - text: always
      - text: only without checkpointing
        unless: {cond}
      - text: only with 4 bit
        when: config.load_in_4bit == True
""")


def test_a_user_rule_with_fix_conditions_loads_and_filters(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "r.yaml").write_text(RULE.format(rid="user-fix-conditions", cond="config.gradient_checkpointing == True"))
    rule = next(r for r in R.load_rules(extra_dirs=[folder]) if r.id == "user-fix-conditions")
    assert [f.text for f in rule.fixes_for({})] == ["always", "only without checkpointing"]
    assert [f.text for f in rule.fixes_for({"config.gradient_checkpointing": True, "config.load_in_4bit": True})] == \
        ["always", "only with 4 bit"]


@pytest.mark.parametrize("cond,message", [("no_such.fact == 1", "fixes[1].unless"), ("__import__('os')", "fixes[1].unless")])
def test_a_bad_fix_condition_is_a_load_error(tmp_path, cond, message):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "r.yaml").write_text(RULE.format(rid="user-bad-fix-condition", cond=f'"{cond}"'))
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")):
        R.load_rules(extra_dirs=[folder])


def test_an_unknown_fix_field_is_refused(tmp_path):
    folder = tmp_path / "typo"
    folder.mkdir()
    (folder / "r.yaml").write_text(RULE.format(rid="user-fix-typo", cond="config.load_in_4bit == True")
                                   .replace("        unless:", "        unles:"))
    with pytest.raises(UserError, match="unless"):
        R.load_rules(extra_dirs=[folder])


def test_the_rule_cache_keeps_the_fix_conditions(tmp_path, monkeypatch):
    monkeypatch.setenv("LORADOCTOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LORADOCTOR_NO_CACHE", raising=False)
    target = tmp_path / "rules"
    shutil.copytree(builtin_rules_dir(), target, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    first, problems = R._builtin_rules(target)
    assert not problems and list(Path(os.environ["LORADOCTOR_CACHE_DIR"]).glob("rules-*.json"))
    second, _ = R._builtin_rules(target)  # read back from the cache
    cap = {r.id: r for r in second}["oom-capacity"]
    assert any(cap.fix_unless) and any(cap.fix_when)
    assert [f.text for f in cap.fixes_for({"trace.bnb_4bit": True})] == \
        [f.text for f in {r.id: r for r in first}["oom-capacity"].fixes_for({"trace.bnb_4bit": True})]
    assert FOUR_BIT not in [f.text for f in cap.fixes_for({"trace.bnb_4bit": True})]


MICRO_BATCH = "Smaller micro-batch, same effective batch"


@pytest.mark.parametrize("line,kept", [
    ("  Instantaneous batch size per device = 1", False),
    ("TrainingArguments(per_device_train_batch_size=1, gradient_accumulation_steps=16)", False),
    ("micro_batch_size: 1", False),
    ("  Instantaneous batch size per device = 4", True),
    ("per_device_eval_batch_size=1", True),
])
def test_micro_batch_of_one_drops_the_smaller_batch_fix(tmp_path, line, kept):
    assert (MICRO_BATCH in _capacity_fixes(tmp_path, line + "\n" + STEP + OOM + "\n")) is kept
