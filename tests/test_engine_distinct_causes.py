"""Distinct causes in the top three (docs/explain.md "Ranking"): a finding whose cause is already listed
above it moves below the next diagnosis of a cause not yet listed, so the first three findings name three
causes whenever the list has three. Nothing is dropped, the first finding never changes, a consequence stays
below its cause, a declared `outranks` holds, and every why_rank names the finding that now follows it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loradoctor.logs.engine import explain
from loradoctor.logs.rules import load_rules

ROOT = Path(__file__).resolve().parent.parent

RULE = """  - id: {id}
    cause: {cause}
    title: {id}
    severity: {severity}
    confidence: {confidence}
    patterns: ['{pattern}']
    summary: s
"""


def _rule(id: str, cause: str, confidence: float, severity: str = "error", extra: str = "") -> dict:
    return dict(id=id, cause=cause, confidence=confidence, severity=severity, pattern=f"{id.upper()} fired",
                extra=extra)


def _rules(tmp_path, *rules: dict):
    folder = tmp_path / "r"
    folder.mkdir()
    body = "".join(RULE.format(**r) + r["extra"] for r in rules)
    (folder / "mine.yaml").write_text("rules:\n" + body)
    return load_rules([folder], include_builtin=False)


def _log(tmp_path, *rules: dict) -> str:
    path = tmp_path / "run.log"
    path.write_text("step 1\n" + "".join(r["pattern"] + "\n" for r in rules) + "step 2\n")
    return str(path)


def _labels_are_true(findings) -> None:
    """Every `#k (rule or cause)` a why_rank names is the finding at rank k, and a finding's why (unless it is a
    consequence's, a look-alike's or a guess's own text, or the last one's) names the finding that follows."""
    by_rank = {f.rank: (f.rule, f.cause) for f in findings}  # a look-alike's own text names #1 by its cause
    assert [f.rank for f in findings] == list(range(1, len(findings) + 1))
    for f in findings:
        for k, rule in re.findall(r"#(\d+) \(([^)]+)\)", f.why_rank):
            assert rule in by_rank.get(int(k), ()), f"#{f.rank} {f.rule}: {f.why_rank!r} names #{k} ({rule})"
    for f, nxt in zip(findings, findings[1:]):
        if f.rule in ("differential", "guess") or f.consequence_of is not None:
            continue
        assert f"#{nxt.rank} ({nxt.rule})" in f.why_rank, (f.rule, f.why_rank)


# two rules of one cause score highest; the third cause scores lowest
A1 = _rule("zz-a1", "oom.capacity", 0.9)
A2 = _rule("zz-a2", "oom.capacity", 0.8)
B = _rule("zz-b", "oom.fragmentation", 0.6)
C = _rule("zz-c", "oom.leak", 0.4)


def test_two_rules_of_one_cause_do_not_push_the_third_cause_out_of_the_top_three(tmp_path):
    rules = _rules(tmp_path, A1, A2, B, C)
    report = explain([_log(tmp_path, A1, A2, B, C)], rules=rules, differential_on=False)
    assert [f.rule for f in report.findings] == ["zz-a1", "zz-b", "zz-c", "zz-a2"]  # was a1, a2, b, c
    assert [f.cause for f in report.findings[:3]] == ["oom.capacity", "oom.fragmentation", "oom.leak"]
    _labels_are_true(report.findings)
    promoted, repeat = report.findings[2], report.findings[3]
    assert promoted.why_rank == ("a cause not yet listed ranks before #4 (zz-a2), a further finding of "
                                 "oom.capacity (already #1): the first three findings name distinct causes")
    assert repeat.why_rank.startswith("ranks below #3 (zz-c): a cause not yet listed")


def test_the_order_stays_when_the_top_three_already_name_distinct_causes_or_no_third_cause_exists(tmp_path):
    rules = _rules(tmp_path, A1, A2, B, C)
    assert [f.rule for f in explain([_log(tmp_path, A1, B, C, A2)], rules=rules, differential_on=False).findings] \
        == ["zz-a1", "zz-b", "zz-c", "zz-a2"]
    only_two = explain([_log(tmp_path, A1, A2, B)], rules=rules, differential_on=False).findings
    assert [f.rule for f in only_two] == ["zz-a1", "zz-b", "zz-a2"]  # b moves up; nothing is dropped
    same = explain([_log(tmp_path, A1, A2)], rules=rules, differential_on=False).findings
    assert [f.rule for f in same] == ["zz-a1", "zz-a2"]


def test_a_note_is_not_moved_up_as_a_cause(tmp_path):
    note = _rule("zz-note", "train.use_cache_conflict", 0.9, severity="info")
    rules = _rules(tmp_path, A1, A2, note)
    report = explain([_log(tmp_path, A1, A2, note)], rules=rules, differential_on=False)
    assert [f.rule for f in report.findings] == ["zz-a1", "zz-a2", "zz-note"]


def test_a_consequence_is_not_moved_above_the_finding_it_follows_from(tmp_path):
    # a1 is a warning, so the error a2 of the same cause is the root of the timeout
    warn = _rule("zz-a1", "oom.capacity", 0.95, severity="warning")
    after = _rule("zz-after", "dist.nccl_timeout", 0.9, extra="    consequence_of: [oom.capacity]\n")
    rules = _rules(tmp_path, warn, A2, after, C)
    report = explain([_log(tmp_path, warn, A2, after, C)], rules=rules, differential_on=False)
    order = [f.rule for f in report.findings]
    assert report.findings[order.index("zz-after")].consequence_of == "zz-a2"
    assert order.index("zz-after") > order.index("zz-a2")
    assert order == ["zz-a1", "zz-c", "zz-a2", "zz-after"]
    _labels_are_true(report.findings)


def test_a_declared_outranks_holds_over_distinct_causes(tmp_path):
    a2 = dict(A2, confidence=0.5, extra="    outranks: [zz-b]\n")
    b = dict(B, confidence=0.8)
    rules = _rules(tmp_path, A1, a2, b, C)
    report = explain([_log(tmp_path, A1, a2, b, C)], rules=rules, differential_on=False)
    order = [f.rule for f in report.findings]
    assert order.index("zz-a2") < order.index("zz-b")
    assert order == ["zz-a1", "zz-c", "zz-a2", "zz-b"]  # c, not declared against, still moves up
    _labels_are_true(report.findings)


# fixture logs of the built-in rules where one cause took two of the first three slots and a third cause
# was listed lower (before this change); the third cause is in the top three now, the first finding is the same
FIXTURES = [
    ("fixtures/logs/dist-nccl-error-return-trail/neg-trail-after-cuda-oom.log", "oom.non_pytorch", "oom.capacity"),
    ("fixtures/cascades/nccl-cuda-failure-out-of-memory", "oom.non_pytorch", "oom.capacity"),
    ("fixtures/logs/oom-model-load-frames/pos-raw-cuda-error-set-module-tensor.log", "oom.model_load",
     "oom.non_pytorch"),
]


@pytest.mark.parametrize("path,first,third", FIXTURES, ids=[p for p, _, _ in FIXTURES])
def test_a_fixture_with_two_findings_of_one_cause_shows_its_third_cause_in_the_top_three(path, first, third):
    findings = explain([str(ROOT / path)]).findings
    assert findings[0].cause == first
    causes = [f.cause for f in findings[:3]]
    assert third in causes and len(set(causes)) == 3
    _labels_are_true(findings)


def test_why_rank_names_the_finding_that_follows_after_the_look_alikes_are_placed():
    """A look-alike placed after the verdict: the verdict's why names it, and the rule finding after it
    is named by the rank it now has (before, the texts named ranks from before the look-alike came in)."""
    path = ROOT / "fixtures/logs/env-flash-attn-build-failed/pos-nvcc-too-old.log"
    findings = explain([str(path)]).findings
    assert [f.rule for f in findings] == ["env-flash-attn-build-failed", "differential", "env-extension-build-failed"]
    _labels_are_true(findings)
    assert "outranks #3 (env-extension-build-failed)" in findings[0].why_rank
    assert findings[0].differential[0]["rank"] == 2


def test_the_differential_entries_carry_the_final_rank_of_their_look_alike():
    path = ROOT / "fixtures/logs/env-bnb-broken/pos-041-cuda-setup.log"
    findings = explain([str(path)]).findings
    assert [f.rule for f in findings] == ["env-bnb-broken", "differential", "env-bnb-load-warning"]
    assert findings[2].consequence_of == "env-bnb-broken"  # the consequence stays below its cause
    entry = findings[0].differential[0]
    assert findings[entry["rank"] - 1].cause == entry["cause"] == "env.driver_too_old"
    _labels_are_true(findings)


def test_a_note_after_a_guess_and_its_alternatives_names_them_not_the_only_finding(tmp_path):
    log = tmp_path / "g.log"
    log.write_text("step 1\n`use_cache=True` is incompatible with gradient checkpointing. Setting `use_cache=False`.\n"
                   "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
                   "RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'\n")
    findings = explain([str(log)]).findings
    assert [f.rule for f in findings] == ["guess", "differential", "differential", "use-cache-gradient-checkpointing"]
    assert findings[-1].why_rank == ("ranks below #3 (differential): a guess and its alternatives come first when "
                                     "no rule finding is a diagnosis")  # was "the only finding; ..."
    _labels_are_true(findings)


def test_a_catch_all_of_a_new_cause_moves_up_past_a_repeat_but_never_first(tmp_path):
    generic = _rule("zz-generic", "dist.launcher", 0.9, extra="    generic: true\n")
    rules = _rules(tmp_path, A1, A2, generic)
    report = explain([_log(tmp_path, generic, A1, A2)], rules=rules, differential_on=False)
    assert [f.rule for f in report.findings] == ["zz-a1", "zz-generic", "zz-a2"]
    _labels_are_true(report.findings)
