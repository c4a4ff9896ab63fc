"""`outranks:` (the declared order between sibling rules) and the confidence levels (docs/rules.md
"Ranking" and "Confidence levels"): the declared winner ranks first whatever the score, the input order
or the rule order; unknown ids, loops and a catch-all over a specific rule are refused at load time;
`rules lint` refuses a confidence outside the documented levels."""

from __future__ import annotations

import json
import os

import pytest

from loradoctor.errors import UserError
from loradoctor.findings import CONFIDENCE_LEVELS, CONFIDENCE_VALUES
from loradoctor.logs.engine import explain
from loradoctor.logs.rules import lint_rules, load_rules
from loradoctor.logs.rules import load as R

RULE = """  - id: {id}
    cause: {cause}
    title: {id}
    severity: error
    confidence: {confidence}
    patterns: ['{pattern}']
    summary: s
"""

# a strong rule and a weak one that fire on two different lines
STRONG = dict(id="zz-strong", cause="oom.capacity", confidence=0.9, pattern="ZZSTRONG fired")
WEAK = dict(id="zz-weak", cause="oom.fragmentation", confidence=0.4, pattern="ZZWEAK fired")


def _folder(tmp_path, *rules: dict, extra: dict | None = None, name: str = "r") -> "os.PathLike":
    folder = tmp_path / name
    folder.mkdir()
    body = ""
    for rule in rules:
        body += RULE.format(**rule) + (extra or {}).get(rule["id"], "")
    (folder / "mine.yaml").write_text("rules:\n" + body)
    return folder


def _log(tmp_path, *lines: str, name: str = "run.log"):
    path = tmp_path / name
    path.write_text("step 1\n" + "\n".join(lines) + "\nstep 2\n")
    return str(path)


def _order(paths, rules) -> list[str]:
    return [f.rule for f in explain(paths, rules=rules, differential_on=False).findings]


DECLARE = {"zz-weak": "    outranks: [zz-strong]\n    outranks_reason: the weak one names the root\n"}


@pytest.mark.parametrize("rule_order", ["strong-first", "weak-first"])
@pytest.mark.parametrize("line_order", ["strong-line-first", "weak-line-first"])
def test_declared_winner_ranks_first_whatever_the_score_and_the_order(tmp_path, rule_order, line_order):
    rules = [STRONG, WEAK] if rule_order == "strong-first" else [WEAK, STRONG]
    lines = ["ZZSTRONG fired", "ZZWEAK fired"]
    log = _log(tmp_path, *(lines if line_order == "strong-line-first" else lines[::-1]))
    plain = load_rules([_folder(tmp_path, *rules, name="plain")], include_builtin=False)
    assert _order([log], plain) == ["zz-strong", "zz-weak"]  # without the declaration the score decides
    declared = load_rules([_folder(tmp_path, *rules, extra=DECLARE, name="declared")], include_builtin=False)
    assert _order([log], declared) == ["zz-weak", "zz-strong"]
    assert _order([log], list(reversed(declared))) == ["zz-weak", "zz-strong"]  # not the rule list's order
    first, second = explain([log], rules=declared, differential_on=False).findings
    assert first.why_rank == ("declared to outrank #2 (zz-strong) in declared/mine.yaml: "
                              "the weak one names the root")
    assert second.why_rank.startswith("ranks below #1 (zz-weak): declared to outrank")


def test_outranks_is_transitive_through_a_rule_that_did_not_fire(tmp_path):
    middle = dict(id="zz-middle", cause="oom.leak", confidence=0.6, pattern="ZZMIDDLE fired")
    extra = {"zz-weak": "    outranks: [zz-middle]\n", "zz-middle": "    outranks: [zz-strong]\n"}
    rules = load_rules([_folder(tmp_path, STRONG, middle, WEAK, extra=extra)], include_builtin=False)
    log = _log(tmp_path, "ZZSTRONG fired", "ZZWEAK fired")
    report = explain([log], rules=rules, differential_on=False)
    assert [f.rule for f in report.findings] == ["zz-weak", "zz-strong"]
    assert report.findings[0].why_rank == "declared to outrank #2 (zz-strong) through zz-middle in r/mine.yaml"


def test_a_winner_moves_up_to_its_losers_place_and_others_keep_theirs(tmp_path):
    other = dict(id="zz-other", cause="oom.leak", confidence=0.6, pattern="ZZOTHER fired")
    rules = load_rules([_folder(tmp_path, STRONG, other, WEAK, extra=DECLARE)], include_builtin=False)
    for lines in (["ZZSTRONG fired", "ZZOTHER fired", "ZZWEAK fired"], ["ZZWEAK fired", "ZZOTHER fired", "ZZSTRONG fired"]):
        assert _order([_log(tmp_path, *lines)], rules) == ["zz-weak", "zz-strong", "zz-other"]


def test_consequences_still_follow_their_cause_and_catch_alls_stay_last(tmp_path):
    consequence = dict(id="zz-after", cause="dist.nccl_timeout", confidence=0.9, pattern="ZZAFTER fired")
    generic = dict(id="zz-generic", cause="dist.launcher", confidence=0.9, pattern="ZZGENERIC fired")
    extra = {"zz-weak": "    outranks: [zz-strong]\n", "zz-after": "    consequence_of: [oom.*]\n",
             "zz-generic": "    generic: true\n"}
    folder = _folder(tmp_path, STRONG, WEAK, consequence, generic, extra=extra)
    rules = load_rules([folder], include_builtin=False)
    log = _log(tmp_path, "ZZGENERIC fired", "ZZSTRONG fired", "ZZAFTER fired", "ZZWEAK fired")
    order = _order([log], rules)
    assert order[0] == "zz-weak" and order[-1] == "zz-generic"
    assert order.index("zz-after") == order.index(
        next(f.consequence_of for f in explain([log], rules=rules, differential_on=False).findings
             if f.rule == "zz-after")) + 1


def test_a_user_rule_may_outrank_a_builtin_one(tmp_path):
    mine = dict(id="zz-mine", cause="oom.capacity", confidence=0.3, pattern="CUDA out of memory")
    folder = _folder(tmp_path, mine, extra={"zz-mine": "    outranks: [oom-capacity-no-numbers]\n"})
    rules = load_rules([folder])
    log = _log(tmp_path, "torch.OutOfMemoryError: CUDA out of memory.")
    order = _order([log], rules)
    assert "oom-capacity-no-numbers" in order and order.index("zz-mine") < order.index("oom-capacity-no-numbers")
    assert lint_rules(folder) == []


@pytest.mark.parametrize("extra,needle", [
    ({"zz-weak": "    outranks: [zz-nowhere]\n"}, "rule zz-weak: outranks: unknown rule id 'zz-nowhere'"),
    ({"zz-weak": "    outranks: [zz-strong]\n", "zz-strong": "    outranks: [zz-weak]\n"},
     "outranks: cycle zz-"),
    ({"zz-weak": "    outranks: [zz-weak]\n"}, "rule zz-weak: outranks: a rule cannot outrank itself"),
    ({"zz-weak": "    outranks: [zz-strong, zz-strong]\n"}, "rule zz-weak: outranks: zz-strong listed twice"),
    ({"zz-weak": "    outranks_reason: why\n"}, "rule zz-weak: outranks_reason: given without an `outranks` list"),
    ({"zz-weak": "    generic: true\n    outranks: [zz-strong]\n"},
     "rule zz-weak: outranks: a generic catch-all cannot outrank the specific rule zz-strong"),
])
def test_bad_outranks_is_refused_in_one_line(tmp_path, extra, needle):
    folder = _folder(tmp_path, STRONG, WEAK, extra=extra)
    with pytest.raises(UserError) as exc:
        load_rules([folder], include_builtin=False)
    message = str(exc.value)
    assert "\n" not in message and needle in message and "mine.yaml" in message, message
    assert any(needle in p for p in lint_rules(folder))


def test_a_longer_cycle_is_named_in_full(tmp_path):
    middle = dict(id="zz-middle", cause="oom.leak", confidence=0.6, pattern="ZZMIDDLE fired")
    extra = {"zz-strong": "    outranks: [zz-middle]\n", "zz-middle": "    outranks: [zz-weak]\n",
             "zz-weak": "    outranks: [zz-strong]\n"}
    with pytest.raises(UserError, match=r"outranks: cycle zz-strong -> zz-middle -> zz-weak -> zz-strong"):
        load_rules([_folder(tmp_path, STRONG, middle, WEAK, extra=extra)], include_builtin=False)


def test_a_builtin_id_is_not_a_known_id_without_the_builtin_rules(tmp_path):
    folder = _folder(tmp_path, WEAK, extra={"zz-weak": "    outranks: [oom-capacity]\n"})
    load_rules([folder])  # with the built-in rules: fine
    with pytest.raises(UserError, match="unknown rule id 'oom-capacity'"):
        load_rules([folder], include_builtin=False)


def test_outranks_survives_the_rule_cache(tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("LORADOCTOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LORADOCTOR_NO_CACHE", raising=False)
    target = tmp_path / "rules"
    shutil.copytree(R.builtin_rules_dir(), target, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    first, problems = R._builtin_rules(target)
    second, _ = R._builtin_rules(target)  # read back from the JSON
    assert not problems
    declared = {r.id: (r.outranks, r.outranks_reason, r.outranks_closure) for r in first if r.outranks}
    assert declared and declared == {r.id: (r.outranks, r.outranks_reason, r.outranks_closure) for r in second if r.outranks}


def test_builtin_rules_use_only_the_documented_confidence_levels():
    levels = set(CONFIDENCE_LEVELS)
    assert set(CONFIDENCE_VALUES.values()) <= levels  # high / medium / low / guess are levels too
    off = [(r.id, r.confidence) for r in load_rules() if round(r.confidence, 3) not in levels]
    assert off == []


def test_docs_list_the_confidence_levels():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "rules.md").read_text(encoding="utf-8")
    for level in CONFIDENCE_LEVELS:
        assert f"| {level:g} |" in text, level


@pytest.mark.parametrize("value,ok", [(0.83, False), (0.91, False), (0.8, True), ("medium", True), ("high", True)])
def test_lint_refuses_a_confidence_outside_the_levels(tmp_path, value, ok):
    folder = _folder(tmp_path, dict(STRONG, confidence=value))
    load_rules([folder], include_builtin=False)  # explain still accepts any number in [0, 1]
    problems = lint_rules(folder)
    if ok:
        assert problems == []
    else:
        assert problems == [f"{folder / 'mine.yaml'}: rule zz-strong: confidence: {value:g} is not a documented level "
                            f"({', '.join(f'{v:g}' for v in CONFIDENCE_LEVELS)}); order sibling rules with "
                            "`outranks`, not with decimals"]


def test_schema_describes_outranks():
    from loradoctor.logs.rules import load_schema

    props = load_schema()["$defs"]["rule"]["properties"]
    assert props["outranks"]["type"] == "array" and props["outranks_reason"]["type"] == "string"
    assert json.dumps(props["outranks"])  # plain data


def test_rules_show_names_what_a_rule_outranks(capsys):
    from loradoctor.cli import main

    assert main(["rules", "show", "oom-other-process"]) == 0
    out = capsys.readouterr().out
    assert "Ranks above, when both fire (outranks): oom-other-process-unaccounted" in out


def test_a_builtin_declaration_decides_a_real_fixture_and_says_so():
    from pathlib import Path

    log = Path(__file__).resolve().parent.parent / "fixtures" / "logs" / "oom-eval-or-save-fsdp-clone" / \
        "pos-fsdp-clone-warning-after-training.log"
    report = explain([str(log)], differential_on=False)
    first, second = report.findings[:2]
    assert (first.rule, second.rule) == ("oom-eval-or-save-fsdp-clone", "oom-other-process-unaccounted")
    assert first.confidence == second.confidence == 0.9  # the confidence no longer orders them
    assert first.why_rank.startswith("declared to outrank #2 (oom-other-process-unaccounted) in rules/oom.yaml: ")
