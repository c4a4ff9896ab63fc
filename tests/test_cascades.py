"""Cascades: logs where the first error is not the root cause (issue 2, "Ranking").

Each case is a folder `fixtures/cascades/<case>/` holding one or more log files (rank logs,
a dmesg excerpt, a launcher's output) and an `expect.yaml`:

    first: oom.capacity                 # the cause id the FIRST finding must name
    not_first: [dist.nccl_timeout]      # optional: causes that must not come first
    why: one line, what the cascade is
    known_wrong: "..."                  # optional: the engine gets it wrong today; the case is
                                        # an xfail with this reason, strict so that a fix is noticed

The folder is explained as one input set, exactly as `loradoctor explain DIR` would (the reader
only picks log-like names, so expect.yaml is not read as a log). In-process, with the rule
library loaded once, to stay fast.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import describe
from loradoctor.logs.engine import explain
from loradoctor.logs.rules import load_rules

ROOT = Path(__file__).resolve().parent.parent
CASES_DIR = ROOT / "fixtures" / "cascades"
RULES = load_rules()
EXPECT_KEYS = {"first", "not_first", "why", "known_wrong"}
MIN_CASES = 30


def _known_causes() -> set[str]:
    """Cause ids of the cause catalogue (loradoctor/data/causes.yaml, `loradoctor docs causes`)."""
    from loradoctor import catalogue

    return set(catalogue.cause_ids())


CAUSES = _known_causes()


def _case_dirs() -> list[Path]:
    return sorted(p for p in CASES_DIR.iterdir() if p.is_dir() and not p.name.startswith("."))


def _expect(case: Path) -> dict:
    return yaml.safe_load((case / "expect.yaml").read_text(encoding="utf-8")) or {}


def _params() -> list:
    out = []
    for case in _case_dirs():
        exp = _expect(case) if (case / "expect.yaml").is_file() else {}
        marks = []
        if exp.get("known_wrong"):
            marks.append(pytest.mark.xfail(reason=str(exp["known_wrong"]), strict=True))
        out.append(pytest.param(case, id=case.name, marks=marks))
    return out





def test_there_are_enough_cases():
    assert len(_case_dirs()) >= MIN_CASES, f"only {len(_case_dirs())} cascade cases under {CASES_DIR}"


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in _case_dirs()])
def test_case_is_well_formed(case: Path):
    """expect.yaml exists, names real cause ids, says why; the folder holds at least one log."""
    assert (case / "expect.yaml").is_file(), f"{case.name}: no expect.yaml"
    exp = _expect(case)
    assert set(exp) <= EXPECT_KEYS, f"{case.name}: unknown keys {sorted(set(exp) - EXPECT_KEYS)}"
    assert exp.get("first") in CAUSES, f"{case.name}: first={exp.get('first')!r} is not an id of docs/causes.md"
    not_first = exp.get("not_first") or []
    assert isinstance(not_first, list) and all(c in CAUSES for c in not_first), f"{case.name}: bad not_first"
    assert exp["first"] not in not_first, f"{case.name}: first is also in not_first"
    assert isinstance(exp.get("why"), str) and exp["why"].strip(), f"{case.name}: a one-line why is needed"
    if "known_wrong" in exp:
        assert isinstance(exp["known_wrong"], str) and len(exp["known_wrong"]) > 20, f"{case.name}: say what goes wrong"
    logs = [p for p in case.iterdir() if p.is_file() and p.name != "expect.yaml"]
    assert logs, f"{case.name}: no log files"


@pytest.mark.parametrize("case", _params())
def test_cascade_first_finding(case: Path):
    """The first finding names the expected root cause, and none of the not_first causes."""
    exp = _expect(case)
    report = explain([str(case)], rules=RULES)
    # every log of the case was read (a misnamed file would silently drop a rank)
    logs = sorted(p.name for p in case.iterdir() if p.is_file() and p.name != "expect.yaml")
    read = sorted(Path(i["path"]).name for i in report.inputs)
    assert read == logs, f"{case.name}: the reader took {read}, the folder has {logs}"
    assert report.findings, f"{case.name}: nothing recognised\n{describe(report, 4)}"
    first = report.findings[0]
    # a consequence that won is the typical cascade failure: say so before the generic mismatch
    assert first.cause not in (exp.get("not_first") or []), (
        f"{case.name}: a consequence came first: {first.cause} ({first.rule}), expected {exp['first']}\n"
        f"  case: {exp['why']}\n{describe(report, 4)}")
    assert first.cause == exp["first"], (
        f"{case.name}: first finding is {first.cause} ({first.rule}), expected {exp['first']}\n"
        f"  case: {exp['why']}\n{describe(report, 4)}")
