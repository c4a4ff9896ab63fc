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


# QA round 4 (benchmarks/data/pastes_r4.yaml, scored by benchmarks/real_pastes.py): every case names its cause first
ROUND4 = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "pastes_r4.yaml"
ROUND4_CASES = yaml.safe_load(ROUND4.read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", ROUND4_CASES["cases"], ids=lambda c: c["file"])
def test_a_round4_paste_names_its_cause_first(case):
    report = engine.explain([str(ROUND4.parent / ROUND4_CASES["folder"] / case["file"])])
    assert report.findings and report.findings[0].cause == case["cause"], (
        f"{case['file']}: want {case['cause']}\n{describe(report)}")


def test_every_round4_case_has_a_file_a_cause_and_a_source():
    folder = ROUND4.parent / ROUND4_CASES["folder"]
    assert {p.name for p in folder.iterdir()} == {c["file"] for c in ROUND4_CASES["cases"]}
    for case in ROUND4_CASES["cases"]:
        assert case["source"].startswith("https://") and case["cause"] and case["shape"], case
