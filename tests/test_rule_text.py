"""Rule text that uses what the log says and never contradicts another finding (issue 12, rule side)."""

from __future__ import annotations

from conftest import explain_text
from loradoctor.logs.rules import render_template

OOM_WITH_PID = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "23.55 GiB of which 120.69 MiB is free. Process 4242 has 9.10 GiB memory in use. Including non-PyTorch "
    "memory, this process has 14.32 GiB memory in use. Of the allocated memory 13.90 GiB is allocated by "
    "PyTorch, and 120.00 MiB is reserved by PyTorch but unallocated.\n")


def test_the_other_process_fix_names_the_pid_of_the_oom_message(tmp_path):
    report = explain_text(tmp_path, OOM_WITH_PID)
    first = report.findings[0]
    assert first.rule == "oom-other-process"
    assert "kill 4242" in [f.command for f in first.fixes]


def test_the_other_process_fix_keeps_a_stand_in_when_no_pid_is_named():
    assert render_template("kill {oom.other_pids|or:PID}", {}, keep_lines=True) == "kill PID"
    assert render_template("kill {oom.other_pids|or:PID}", {"oom.other_pids": "7 9"}, keep_lines=True) == "kill 7 9"


def test_an_fp16_run_is_never_also_told_the_precision_is_not_shown(tmp_path):
    log = ("python train.py --model llama\n"
           "Using fp16 mixed precision\n"
           "{'loss': 1.2, 'learning_rate': 2e-05, 'epoch': 0.1}\n"
           + "".join(f"{{'loss': nan, 'learning_rate': 2e-05, 'epoch': 0.{i}}}\n" for i in range(2, 5)))
    report = explain_text(tmp_path, log)
    assert report.findings[0].rule == "fp16-nan-loss"
    said = [f.rule for f in report.findings if "does not show the precision" in f.summary]
    assert not said, f"{said} contradict fp16-nan-loss's evidence `Using fp16 mixed precision`"


def test_disk_full_fix_names_the_current_hf_cache_command_and_the_old_one():
    from loradoctor.logs.rules import load_rules

    rule = next(r for r in load_rules() if any("huggingface-cli delete-cache" in (f.text + (f.command or "")) for f in r.fixes))
    fix = next(f for f in rule.fixes if "delete-cache" in f.text)
    assert fix.command.startswith("hf cache") and "huggingface-cli delete-cache" in fix.text
