"""Healthy runs (fixtures/goodlogs/, described in its README): no rule may report a warning or an error.

Like Sigma's goodlog baseline: real LoRA/QLoRA runs are full of scary-looking but harmless lines
(use_cache, use_reentrant, TF32, NCCL INFO, early fp16 overflow skips). An info finding is allowed.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

from loradoctor.logs.engine import explain

GOODLOGS = Path(__file__).resolve().parent.parent / "fixtures" / "goodlogs"
LOGS = sorted(p for p in GOODLOGS.iterdir() if p.name != "README.md" and not p.name.startswith("."))


@lru_cache(maxsize=None)
def _report(path: Path):
    return explain([str(path)])


def test_there_are_enough_goodlogs():
    assert len(LOGS) >= 6, f"only {len(LOGS)} goodlogs in {GOODLOGS}"


def test_every_goodlog_is_described_in_the_readme():
    readme = (GOODLOGS / "README.md").read_text(encoding="utf-8")
    undocumented = [p.name for p in LOGS if f"`{p.name}`" not in readme]
    assert not undocumented, f"describe these in fixtures/goodlogs/README.md: {undocumented}"


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_no_warning_or_error_on_a_healthy_run(path):
    report = _report(path)
    loud = [f for f in report.findings if f.severity in ("warning", "error")]
    if loud:
        details = "\n".join(
            f"  {f.severity} {f.cause} [{f.rule}]: {f.title}\n"
            + "\n".join(f"      {e.where()}: {e.text[:160]}" for e in f.evidence[:3])
            for f in loud
        )
        pytest.fail(f"{path.name} is a healthy run, but rules fired:\n{details}", pytrace=False)


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_the_engine_really_read_the_run(path):
    # Guards the test above against passing vacuously: the training records were parsed.
    report = _report(path)
    assert report.inputs and report.inputs[0]["lines"] > 50
    assert report.facts.get("metrics.steps", 0) >= 10, f"metrics.steps = {report.facts.get('metrics.steps')}"
    assert report.facts.get("metrics.train_finished") is True
    assert report.facts.get("metrics.loss_nan_count", 0) == 0
    assert report.facts["metrics.last_loss"] < report.facts["metrics.first_loss"]
