"""The engine skips repeats of lines that changed nothing (scan_inputs' `inert` table). These tests
run the same logs with that shortcut switched off and require the very same report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loradoctor.logs import engine

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

REPEATED = """\
/opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:86: UserWarning: an exception will be raised if use_reentrant is not passed
wandb: WARNING Step must only increase in log calls.
{'loss': 1.25, 'grad_norm': 0.8, 'learning_rate': 2e-4, 'epoch': 0.1}
/opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:86: UserWarning: an exception will be raised if use_reentrant is not passed
NCCL INFO comm 0x55d1 rank 0 nranks 2 cudaDev 0 busId 3b000 - Init COMPLETE
Traceback (most recent call last):
  File "/home/u/train.py", line 10, in <module>
    trainer.train()
/opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:86: UserWarning: an exception will be raised if use_reentrant is not passed
RuntimeError: CUDA error: an illegal memory access was encountered
/opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:86: UserWarning: an exception will be raised if use_reentrant is not passed
wandb: WARNING Step must only increase in log calls.
Killed
Killed
"""


def _report(paths: list[str]) -> dict:
    doc = engine.explain(paths).to_dict()
    doc.pop("elapsed_s", None)
    return json.loads(json.dumps(doc, default=str))


def _both(monkeypatch, paths: list[str]) -> tuple[dict, dict]:
    fast = _report(paths)
    monkeypatch.setattr(engine, "INERT_MAX_BYTES", -1)  # nothing is ever remembered as inert
    slow = _report(paths)
    return fast, slow


def test_repeats_inside_and_around_a_traceback(tmp_path, monkeypatch):
    log = tmp_path / "run.log"
    log.write_text(REPEATED * 3)
    fast, slow = _both(monkeypatch, [str(log)])
    assert fast == slow
    assert fast["findings"]


def test_repeats_across_rank_files(tmp_path, monkeypatch):
    a, b = tmp_path / "rank0.log", tmp_path / "rank1.log"
    a.write_text(REPEATED)
    b.write_text(REPEATED.replace("Killed\n", ""))
    fast, slow = _both(monkeypatch, [str(a), str(b)])
    assert fast == slow


def test_the_shortcut_is_taken(tmp_path, monkeypatch):
    log = tmp_path / "run.log"
    log.write_text(REPEATED * 3)
    calls = []
    real = engine.reader.make_line
    monkeypatch.setattr(engine.reader, "make_line", lambda *a, **k: calls.append(1) or real(*a, **k))
    engine.explain([str(log)])
    fast_calls = len(calls)
    calls.clear()
    monkeypatch.setattr(engine, "INERT_MAX_BYTES", -1)
    engine.explain([str(log)])
    assert fast_calls < len(calls)


def test_nothing_recognised_tail_keeps_the_last_error_lines(tmp_path, monkeypatch):
    warn = "/x/y.py:3: UserWarning: an exception will be raised later\n"
    log = tmp_path / "quiet.log"
    log.write_text(warn * 20 + "all good\n" + warn * 5)
    fast, slow = _both(monkeypatch, [str(log)])
    assert fast == slow
    assert [e["line"] for e in fast["unrecognised_tail"]][-1] == 26


@pytest.mark.parametrize("folder", sorted(p.name for p in (FIXTURES / "logs").iterdir())[::5])
def test_rule_fixtures_report_the_same(folder, monkeypatch):
    paths = sorted(str(p) for p in (FIXTURES / "logs" / folder).iterdir() if p.name.startswith("pos"))[:1]
    fast, slow = _both(monkeypatch, paths)
    assert fast == slow


def test_goodlogs_report_the_same(monkeypatch):
    for path in sorted((FIXTURES / "goodlogs").iterdir()):
        fast, slow = _both(monkeypatch, [str(path)])
        assert fast == slow, path.name


# --- digit-blind regexes: a require_all / exclude regex that missed a line is not searched again on a line
# that differs only in its digits (engine.digit_blind, Matcher.blind_misses) ------------------------------

def test_digit_blind_judges_patterns():
    import re

    for source, blind in [(r"\bloss\s*[=:]", True), (r"GPU 0 has", False), (r"[1-9]\d*", False),
                          (r"[0-9a-f]+", True), (r"(a)\1", False), (r"[^\d]x", True), (r"(?i)error\W+code", True),
                          (r"\d{3}", True), (r"x{2}", True), (r"(?<!\d)\d+(?=\s)", True), (r"[\w.]+", True),
                          (r"[a-z5]", False), (r"[^0-4]", False), (r"(?P<n>\d+)?x(?(n)y|z)", False)]:
        assert engine.digit_blind(re.compile(source)) is blind, source


def test_digit_blind_regexes_answer_alike_on_lines_with_other_digits():
    """Every built-in require_all / exclude regex judged digit_blind matches a fixture line exactly when it
    matches the line with its digits changed (random ones, and all written 0)."""
    import random

    from loradoctor.logs.reader import DIGITS_BLIND
    from loradoctor.logs.rules import load_rules

    rng = random.Random(5)
    lines = []
    for path in sorted((FIXTURES / "logs").rglob("*")):
        if path.is_file():
            lines += [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines()
                      if any(ch.isdigit() for ch in ln)]
    lines = rng.sample(lines, min(len(lines), 600))
    variants = [(ln, "".join(rng.choice("0123456789") if ch in "0123456789" else ch for ch in ln),
                 ln.translate(DIGITS_BLIND)) for ln in lines]
    checked = 0
    for rule in load_rules():
        for pattern in list(rule.compiled_require) + list(rule.compiled_exclude):
            if not engine.digit_blind(pattern):
                continue
            checked += 1
            for line, shuffled, blind in variants:
                want = pattern.search(line) is None
                assert (pattern.search(shuffled) is None) is want and (pattern.search(blind) is None) is want, \
                    (rule.id, pattern.pattern, line)
    assert checked > 20


def test_eval_records_report_the_same_with_blind_misses_off(tmp_path, monkeypatch):
    records = "".join(f"{{'eval_loss': {1 + i / 97:.4f}, 'eval_runtime': 41.{i % 10}, 'eval_steps_per_second': "
                      f"3.0{i % 7}, 'epoch': {i / 50:.2f}}}\n" for i in range(200))
    log = tmp_path / "evals.log"
    # the records first: REPEATED's `trainer.train()` meets a require_all the records' `loss` sends them to
    log.write_text(records + REPEATED + records[: len(records) // 2] + "torch.OutOfMemoryError: CUDA out "
                   "of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.54 GiB of which 1.12 GiB "
                   "is free.\n")
    searched = []
    real_search = engine.MatchBudget.search

    def counting(self, i, compiled, text, line):
        searched.append(i)
        return real_search(self, i, compiled, text, line)

    monkeypatch.setattr(engine.MatchBudget, "search", counting)
    fast = _report([str(log)])
    fast_searches = len(searched)
    searched.clear()
    monkeypatch.setattr(engine, "digit_blind", lambda compiled: False)
    slow = _report([str(log)])
    assert fast == slow
    assert fast["findings"]
    assert fast_searches < len(searched)
