"""The real-paste QA rounds of issue 10: every folder fixtures/pastes/<round>/ with an expect.yaml (its header says
what the round aimed at). Each case names its cause first, as pasted and lower-cased (an issue title or a search
snippet lower-cases the whole paste); a case the round left unsolved carries `known_miss: REASON` and is a strict
xfail, so fixing it turns the test red; where the numbers allow two readings, `also:` names the causes the top three
must keep. A new round is a new folder: nothing here changes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from loradoctor.logs import engine

from conftest import describe  # noqa: E402

PASTES = Path(__file__).resolve().parent.parent / "fixtures" / "pastes"
ROUNDS = {p.parent.name: yaml.safe_load(p.read_text(encoding="utf-8")) for p in sorted(PASTES.glob("*/expect.yaml"))}


def _cases(with_also: bool = False) -> list:
    out = []
    for rnd, expect in ROUNDS.items():
        for name, entry in sorted(expect.items()):
            if with_also and not entry.get("also"):
                continue
            marks = [pytest.mark.xfail(strict=True, reason=entry["known_miss"])] \
                if entry.get("known_miss") and not with_also else []
            out.append(pytest.param(rnd, name, marks=marks, id=f"{rnd}/{name}"))
    return out


def _first_cause(path: Path, rnd: str, name: str, how: str = "") -> None:
    cause = ROUNDS[rnd][name]["cause"]
    report = engine.explain([str(path)])
    assert report.findings and report.findings[0].cause == cause, f"{rnd}/{name}{how}: want {cause}\n{describe(report)}"


def test_the_rounds_are_found():
    assert {"round-env-dist-hw", "round-5", "round-6", "round-7", "round-8"} <= set(ROUNDS)


@pytest.mark.parametrize("rnd", sorted(ROUNDS))
def test_every_paste_of_a_round_has_an_expectation_and_a_source(rnd):
    logs = {p.name for p in (PASTES / rnd).iterdir() if p.suffix == ".log"}
    assert logs == set(ROUNDS[rnd])
    assert all(str(v.get("source", "")).startswith("https://") for v in ROUNDS[rnd].values())


@pytest.mark.parametrize("rnd, name", _cases())
def test_a_round_paste_names_its_cause_first(rnd, name):
    _first_cause(PASTES / rnd / name, rnd, name)


@pytest.mark.parametrize("rnd, name", _cases())
def test_a_round_paste_lower_cased_still_names_its_cause_first(rnd, name, tmp_path):
    low = tmp_path / name
    low.write_text((PASTES / rnd / name).read_text(encoding="utf-8").lower(), encoding="utf-8")
    _first_cause(low, rnd, name, " (lower-cased)")


@pytest.mark.parametrize("rnd, name", _cases(with_also=True))
def test_a_paste_with_two_readings_keeps_the_other_in_the_top_three(rnd, name):
    report = engine.explain([str(PASTES / rnd / name)])
    top3 = [f.cause for f in report.findings[:3]]
    for cause in ROUNDS[rnd][name]["also"]:
        assert cause in top3, f"{rnd}/{name}: want {cause} in the top 3\n{describe(report)}"
