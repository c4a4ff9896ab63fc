"""The rule library against its fixtures (docs/rules.md "Fixtures"), in-process for speed.

For every built-in rule: at least two positive and one negative fixture under
fixtures/logs/<rule-id>/ and an expect.yaml beside them (tests/rule_expect.py). On each positive the
rule fires and quotes the line(s) its expectation marks; separately, the rule ranks first (or the
sibling its expectation names under `first:`), naming the rule's cause; switching any one rule off
turns its smallest positive fixture red. On each negative the first finding does not name the cause. Also: every cause id of docs/causes.md is produced by some rule, every
repro id is known, and `rules lint` passes on rules/ and fails, naming the file, on broken rules.
"""

from __future__ import annotations

import functools
import re
import textwrap
from pathlib import Path

import pytest

import rule_expect
from conftest import USER_RULE, describe
from loradoctor.logs.engine import explain
from loradoctor.logs.rules import builtin_rules_dir, lint_rules, load_rules

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "logs"
LIBRARY = load_rules()  # in load order, as explain uses them
RULES = sorted(LIBRARY, key=lambda r: r.id)
RULES_BY_ID = {r.id: r for r in RULES}


def _fixtures(rule_id: str, kind: str) -> list[Path]:
    folder = FIXTURES / rule_id
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.startswith(kind + "-") and not p.name.startswith("."))


def _cases(kind: str) -> list:
    return [
        pytest.param(rule.id, path, id=f"{rule.id}/{path.name}")
        for rule in RULES
        for path in _fixtures(rule.id, kind)
    ]


def _explain_fixture(path: Path):
    # A folder fixture (several rank logs) is explained as one input set, as the CLI would.
    return explain([str(path)])



def test_the_library_is_not_empty():
    assert len(RULES) >= 10, f"only {len(RULES)} built-in rules loaded from {builtin_rules_dir()}"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_every_rule_has_fixtures(rule):
    pos = _fixtures(rule.id, "pos")
    neg = _fixtures(rule.id, "neg")
    assert len(pos) >= 2 and len(neg) >= 1, (
        f"rule {rule.id} needs >= 2 pos-* and >= 1 neg-* fixtures under fixtures/logs/{rule.id}/; "
        f"found {len(pos)} positive, {len(neg)} negative"
    )


def test_no_fixture_folder_without_a_rule():
    # A typo in a folder name would silently drop its fixtures from the harness.
    orphans = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir() and p.name not in RULES_BY_ID)
    assert not orphans, f"fixture folders with no rule of that id: {orphans}"


_REPORTS: dict[Path, object] = {}


def _explain_positive(path: Path):
    # The fires, ranks-first, negative and wording tests read the same report; explain each fixture
    # once per worker.
    if path not in _REPORTS:
        _REPORTS[path] = _explain_fixture(path)
    return _REPORTS[path]


@functools.lru_cache(maxsize=None)
def _expectations(rule_id: str) -> dict:
    return rule_expect.read(FIXTURES / rule_id)


def _expectation(rule_id: str, path: Path):
    return _expectations(rule_id).get(rule_expect.key_of(path))


@pytest.mark.parametrize("rule_id, path", _cases("pos"))
def test_positive_fixture_fires_the_rule_and_quotes_the_marked_line(rule_id, path):
    problems = rule_expect.check_fires(_explain_positive(path), RULES_BY_ID[rule_id], path,
                                       _expectation(rule_id, path))
    if problems:
        pytest.fail(f"{path.relative_to(ROOT)}: " + "; ".join(problems) + "\n" + describe(_explain_positive(path)),
                    pytrace=False)


@pytest.mark.parametrize("rule_id, path", _cases("pos"))
def test_positive_fixture_ranks_the_rule_first(rule_id, path):
    # The rule itself first, naming its cause; `first: SIBLING` in expect.yaml names a sibling of the
    # same cause that is meant to win on this fixture.
    problems = rule_expect.check_first(_explain_positive(path), RULES_BY_ID[rule_id], path,
                                       _expectation(rule_id, path))
    if problems:
        pytest.fail(f"{path.relative_to(ROOT)}: " + "; ".join(problems) + "\n" + describe(_explain_positive(path)),
                    pytrace=False)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_expectations_cover_exactly_the_positive_fixtures(rule):
    folder = FIXTURES / rule.id
    keys = {rule_expect.key_of(p) for p in _fixtures(rule.id, "pos")}
    written = set(_expectations(rule.id)) if folder.is_dir() else set()
    assert written == keys, (f"fixtures/logs/{rule.id}/{rule_expect.EXPECT_FILE}: entries without a fixture "
                             f"{sorted(written - keys)}, fixtures without an entry {sorted(keys - written)} "
                             f"(python scripts/rule_expectations.py --bless {rule.id})")
    for key, entry in _expectations(rule.id).items() if folder.is_dir() else ():
        first = entry.get("first")
        assert first is None or (first in RULES_BY_ID and first != rule.id), (
            f"{rule.id}/{key}: `first: {first}` must name another built-in rule")
        assert first is None or RULES_BY_ID[first].cause == rule.cause, (
            f"{rule.id}/{key}: `first: {first}` names a rule of another cause "
            f"({RULES_BY_ID[first].cause}); a positive fixture's first finding names the rule's cause")


def _smallest_positive(rule_id: str) -> Path:
    def size(p: Path) -> int:
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size

    return min(_fixtures(rule_id, "pos"), key=lambda p: (size(p), p.name))


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_switching_the_rule_off_turns_its_fixture_test_red(rule):
    # The fixture tests can only catch a rotting rule if the rule's own expectation depends on it:
    # the same check that passes with the whole library must fail with this one rule removed.
    path = _smallest_positive(rule.id)
    expect = _expectation(rule.id, path)
    assert rule_expect.check_fires(_explain_positive(path), rule, path, expect) == [], f"{path} is not green to begin with"
    without = [r for r in LIBRARY if r.id != rule.id]
    report = explain([str(path)], rules=without)
    assert rule_expect.check_fires(report, rule, path, expect), (
        f"{path.relative_to(ROOT)} stays green with rule {rule.id} switched off:\n" + describe(report))


# Negatives that keep a labelled guess (rule id `guess`): each has an error line no rule explains, and the
# guess reads it as well as a line alone allows. Any other negative must have no guess at all.
GUESSING_NEGATIVES = {
    # `'list' object has no attribute 'startswith'` in the user's own script (no trainer dataset preparation in
    # the log): sft-text-column-not-string stays silent, the last-resort guess reads the one AttributeError line
    "sft-text-column-not-string/neg-own-code-startswith.log",
    # bitsandbytes cannot load libcudart: env-cuda-library-missing-bare leaves bitsandbytes to its own rules,
    # which know bnb's CUDA SETUP messages, not a bare OSError from its ctypes import; the guess reads the
    # OSError line alone (no frames reach it) as a broken install
    "env-cuda-library-missing-bare/neg-bitsandbytes-ctypes-libcudart.log",
    # `build_rows() got an unexpected keyword argument`: the script's own helper or a library function whose
    # argument was removed read the same on one line; the guess says version conflict, labelled 0.2
    "env-version-removed-argument/neg-user-helper-typo.log",
    # `'ExpConfig' object has no attribute 'lora_rnak'`: the script's own config class (not one of the library
    # dataclasses the rule names) with a typo; the guess reads the LoRA word in the last line, labelled 0.2
    "env-version-removed-argument/neg-user-own-config-no-attribute.log",
    # `failed to bind to [::]:29500 (errno: 9` cut before its code: 98 (address in use) and 99 (cannot assign the
    # address: MASTER_ADDR) are both launcher problems, so the guess names the launcher family (labelled 0.2)
    # while the port-in-use rule, which needs the code, stays silent
    "dist-port-in-use/neg-cut-before-errno-and-network.log",
    # a non-finite gradient norm in a bf16 run: no rule claims the clip error without fp16, and the
    # `Mixed precision type: bf16` line is no error line the guess sees
    "nonfinite-gradients-error/neg-bf16-clip-error.log",
    # Transformer Engine on an Ada card with a cu118 torch: `Cuda version 12.1 or higher required for FP8
    # execution on Ada` is a version requirement (the guess says version conflict, labelled 0.2), not the
    # card's missing FP8 support that env-fp8-unsupported claims
    "env-fp8-unsupported/neg-ada-cuda-too-old.log",
    # an exception raised inside a LoRA-stack library's own code that no rule reads (trace.raised_in): the last-
    # resort guess names a version conflict, with the data format and an unsupported trainer patch as its
    # look-alikes, labelled 0.2 (not for a KeyError, most often a name the user gave). On these near misses the
    # reading is a user setting the library refused (a classifier head's num_labels, a ZeRO-3 placeholder, an
    # fp16 model under bf16) or a missing file: the guess is wrong for most of them, as guesses may be
    "adapter-embedding-size-mismatch/neg-classifier-head-num-labels.log",
    "dist-sharding-zero3-mixed-dtype-gather/neg-unique-element-other-generator.log",
    "env-bf16-unsupported-unsloth/neg-a100-model-loaded-float16-by-hand.log",
    "oom-host-ram-cpu-alloc/neg-windows-os-error-2.log",
    "vllm-sync-packed-4bit-weight/neg-vllm-wrong-architecture-bf16.log",
    "vocab-size-mismatch-set-tensor/neg-zero3-empty-placeholder.log",
}


@pytest.mark.parametrize("rule_id, path", _cases("neg"))
def test_negative_fixture_does_not_rank_the_rule_cause_first(rule_id, path):
    rule = RULES_BY_ID[rule_id]
    report = _explain_positive(path)
    # a labelled guess (rule id `guess`, confidence 0.2) counts: it may only appear on the negatives listed
    # in GUESSING_NEGATIVES (an error line no rule explains), and there it is allowed to name any cause
    key = f"{path.parent.name}/{path.name}"
    guessed = [f for f in report.findings if f.rule == "guess"]
    if key in GUESSING_NEGATIVES:
        assert guessed, f"{key} no longer gets a guess: drop it from GUESSING_NEGATIVES"
        return
    if guessed:
        pytest.fail(f"{path.relative_to(ROOT)}: a guess ({guessed[0].cause}) on a near miss for {rule_id}:\n"
                    + describe(report), pytrace=False)
    ruled = [f for f in report.findings if f.rule != "differential"]
    if ruled and ruled[0].cause == rule.cause:
        pytest.fail(f"{path.relative_to(ROOT)}: near miss for {rule_id}, but the first finding is {rule.cause}:\n"
                    + describe(report), pytrace=False)


def _cause_ids() -> list[str]:
    from loradoctor import catalogue

    ids = catalogue.cause_ids()  # loradoctor/data/causes.yaml (`loradoctor docs causes`)
    assert len(ids) >= 30, "could not read the cause catalogue"
    return ids


def test_every_cause_is_produced_by_some_rule():
    produced = {r.cause for r in RULES}
    from loradoctor.bedside.diagnose import TIMELINE_ONLY_CAUSES

    produced |= set(TIMELINE_ONLY_CAUSES)  # tested with fixtures/timelines (tests/test_bedside_diagnose.py)
    missing = [c for c in _cause_ids() if c not in produced]
    assert not missing, f"causes in docs/causes.md that no rule produces: {missing}"


def test_every_rule_cause_is_a_catalogued_cause():
    known = set(_cause_ids())
    unknown = sorted(f"{r.id} -> {r.cause}" for r in RULES if r.cause not in known)
    assert not unknown, f"rules naming causes that docs/causes.md does not list: {unknown}"


def test_schema_enums_match_the_docs():
    # rules/schema.json carries the repro ids for editors (docs/rules.md lists them); cause ids come from the
    # catalogue at load time, so a new cause edits no schema.
    from loradoctor.logs.rules import cause_ids, load_schema, repro_ids

    assert sorted(cause_ids()) == sorted(_cause_ids())
    assert load_schema()["$defs"]["rule"]["properties"]["cause"]["enum"] == _cause_ids()
    assert sorted(repro_ids()) == sorted(_repro_ids()), "rules/schema.json repro enum differs from docs/rules.md"


def _repro_ids() -> set[str]:
    text = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    section = text.split("## Repro ids", 1)[1].split("\n## ", 1)[0]
    ids = set(re.findall(r"`([a-z0-9-]+)`", section.split("A rule's `repro`")[0]))
    assert len(ids) >= 10, "could not read the repro ids of docs/rules.md"
    return ids


def test_every_repro_is_a_known_repro_id():
    known = _repro_ids()
    bad = sorted(f"{r.id} -> {r.repro}" for r in RULES if getattr(r, "repro", None) and r.repro not in known)
    assert not bad, f"rules whose repro is not a known repro id ({sorted(known)}): {bad}"


def test_lint_passes_on_the_builtin_rules():
    problems = lint_rules(builtin_rules_dir())
    assert problems == [], "rules lint on rules/:\n" + "\n".join(map(str, problems))


_GOOD_RULE = USER_RULE

BROKEN_RULES = {
    "bad-yaml": "rules:\n  - id: x\n    cause: [unclosed\n",
    "bad-regex": _GOOD_RULE.format(rid="bad-regex-rule", pattern="CUDA out of memory (Tried"),
    "unknown-cause": _GOOD_RULE.format(rid="unknown-cause-rule", pattern="boom").replace(
        "oom.capacity", "oom.not_a_cause"),
    "missing-title": _GOOD_RULE.format(rid="missing-title-rule", pattern="boom").replace(
        "    title: A test rule\n", ""),
    "bad-severity": _GOOD_RULE.format(rid="bad-severity-rule", pattern="boom").replace(
        "severity: error", "severity: fatal"),
    "bad-repro": _GOOD_RULE.format(rid="bad-repro-rule", pattern="boom") + "    repro: no-such-repro\n",
    "bad-when": _GOOD_RULE.format(rid="bad-when-rule", pattern="boom") + "    when: 'oom.requested_bytes >>> 3'\n",
    # its literal `grad_norm` is in every Trainer metric dict, which its regex matches only when nan: the
    # engine would scan every dict of a training log (rules lint says so and names `prefilter`)
    "metric-line-literal": _GOOD_RULE.format(rid="grad-norm-nan-rule", pattern=r"grad_norm\W{1,4}nan"),
    "short-exclude-prefilter": _GOOD_RULE.format(rid="short-exclude-prefilter-rule", pattern="boom")
    + "    exclude: ['not really boom']\n    exclude_prefilter: ['no']\n",
}


@pytest.mark.parametrize("kind", sorted(BROKEN_RULES))
def test_lint_names_the_file_of_a_broken_rule(tmp_path, kind):
    (tmp_path / "fine.yaml").write_text(_GOOD_RULE.format(rid="fine-rule", pattern="all good"), encoding="utf-8")
    broken = tmp_path / f"broken-{kind}.yaml"
    broken.write_text(BROKEN_RULES[kind], encoding="utf-8")
    problems = [str(p) for p in lint_rules(tmp_path)]
    assert problems, f"lint found nothing wrong with a {kind} rule:\n{BROKEN_RULES[kind]}"
    assert any(broken.name in p for p in problems), f"lint problems do not name {broken.name}: {problems}"
    assert not any("fine.yaml" in p for p in problems), f"lint blamed the good file: {problems}"


def test_lint_accepts_a_good_user_rule_folder(tmp_path):
    (tmp_path / "mine.yaml").write_text(_GOOD_RULE.format(rid="my-rule", pattern="my own failure"), encoding="utf-8")
    assert lint_rules(tmp_path) == []


def test_duplicate_ids_across_files_are_reported(tmp_path):
    body = textwrap.dedent(_GOOD_RULE.format(rid="same-id", pattern="x"))
    (tmp_path / "a.yaml").write_text(body, encoding="utf-8")
    (tmp_path / "b.yaml").write_text(body, encoding="utf-8")
    problems = [str(p) for p in lint_rules(tmp_path)]
    assert any("same-id" in p for p in problems), f"duplicate id not reported: {problems}"


# A value the template could not fill (`Rank ?`, `(?)`), a `None` outside code, an `(s)` plural.
_PLACEHOLDER = re.compile(r"(?<![\w?\\])\?(?![\w?=:])|\bNone\b|\w\(s\)")
# the render layer's own counters (issue 12, its own branch), not rule text
_RENDER_BOILERPLATE = re.compile(r"more finding\(s\) shown briefly|finding\(s\) not shown|more file\(s\)")


def _placeholder_lines(report) -> list[str]:
    from loradoctor.render.explain_view import explain_md, explain_text
    from loradoctor.render.text import Painter

    quoted = [e.text[:60] for f in report.findings for e in f.evidence] + [e.text[:60] for e in report.unrecognised_tail]
    text = explain_text(report, Painter(color=False, width=None), verbose=True)
    bad = []
    for kind, out in (("text", text), ("md", explain_md(report))):
        for line in out.splitlines():
            if _RENDER_BOILERPLATE.search(line) or any(q and q in line for q in quoted):
                continue  # log lines are quoted as they are
            if _PLACEHOLDER.search(re.sub(r"`[^`]*`", "", line)):  # code (`None`) is what it is
                bad.append(f"{kind}: {line.strip()[:200]}")
    return bad


@pytest.mark.parametrize("rule_id, path", _cases("pos") + _cases("neg"))
def test_rendered_findings_have_no_placeholder_tokens(rule_id, path):
    bad = _placeholder_lines(_explain_positive(path))
    assert not bad, f"{path.relative_to(ROOT)}: placeholder tokens in the rendered report:\n" + "\n".join(bad)


def test_bless_keeps_a_recorded_quote_the_rule_still_makes():
    """--bless rewrites an expectation from the engine's output, but a reviewed quote the rule still makes
    stays as recorded (the rule quotes lines 12 and 13 here: a recorded 13 is not moved to 12); a quote the
    rule no longer makes is replaced by its first line."""
    path = FIXTURES / "adapter-checkpoint-shape-mismatch" / "pos-llava-projector-13b-into-7b.log"
    report = _explain_positive(path)
    quoted = [e for f in report.findings if f.rule == "adapter-checkpoint-shape-mismatch" for e in f.evidence]
    assert [e.line for e in quoted][:2] == [12, 13]
    second = {"line": 13, "text": quoted[1].text[:40]}
    assert rule_expect.observed(report, "adapter-checkpoint-shape-mismatch", path, keep={"quotes": [second]})["quotes"] == [second]
    gone = {"line": 3, "text": "no such line"}
    fresh = rule_expect.observed(report, "adapter-checkpoint-shape-mismatch", path, keep={"quotes": [gone]})["quotes"]
    assert [q["line"] for q in fresh] == [12]
