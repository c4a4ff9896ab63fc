"""The real-paste QA cases of issue 10 (fixtures/pastes/expect.yaml): each names its cause first."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from loradoctor.logs import engine

from conftest import describe  # noqa: E402

PASTES = Path(__file__).resolve().parent.parent / "fixtures" / "pastes"
EXPECT = yaml.safe_load((PASTES / "expect.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name, cause", sorted(EXPECT.items()))
def test_a_real_paste_names_its_cause_first(name, cause):
    report = engine.explain([str(PASTES / name)])
    assert report.findings and report.findings[0].cause == cause, f"{name}: want {cause}\n{describe(report)}"


def test_every_paste_has_an_expectation():
    logs = {p.name for p in PASTES.iterdir() if p.suffix == ".log"}
    assert logs == set(EXPECT)
