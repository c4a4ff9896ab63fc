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
