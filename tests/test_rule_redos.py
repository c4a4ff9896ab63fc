"""Regexes and conditions that cannot run away (issue 11, items 2 and 3; docs/rules.md "Speed notes").

Built-in patterns stay linear (measured against pump strings, in CPU time, with a generous margin);
`rules lint` refuses nested and overlapping quantifiers (static) and runaway patterns (timed); a
user folder with such a rule is refused by `explain --rules DIR` instead of hanging it; the engine
abandons a search past its timeout and notes it; the condition language does arithmetic only on
numbers.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import USER_RULE  # noqa: E402

from loradoctor.errors import UserError
from loradoctor.logs.engine import explain
from loradoctor.logs.rules import Condition, ConditionError, build_rule, lint_rules, load_rules
from loradoctor.logs.rules.redos import (LINT_BUDGET_S_PER_1000, _search_time, static_problems, timed_problems,
                                         timed_regex_problems, worst_time_s)

ROOT = Path(__file__).resolve().parent.parent
BUILTIN = {r.id: r for r in load_rules()}

# measured worst on the reworked library: about 0.6 ms per 1,000 characters of pump (benchmarks/regex_pump.py);
# before, the /dev/shm df rule ran past 125 ms and the pip-conflict rule took about 80 ms. The budget is
# the one `rules lint` applies to user rules (3 ms), five times the worst built-in.
BUDGET_S_PER_1000 = LINT_BUDGET_S_PER_1000


def test_every_builtin_regex_stays_linear_on_pump_strings():
    slow = []
    for rule in BUILTIN.values():
        for fname, compiled in (("patterns", rule.compiled_patterns), ("require_all", rule.compiled_require),
                                ("exclude", rule.compiled_exclude)):
            for i, regex in enumerate(compiled):
                source = getattr(rule, fname)[i]
                per_1000, pump = worst_time_s(regex, source, length=1000, timeout_s=0.2)
                if per_1000 > BUDGET_S_PER_1000:
                    slow.append(f"{rule.id} {fname}[{i}] {per_1000 * 1000:.1f} ms/1000 chars on {pump[:30]!r}...")
    assert not slow, "built-in regexes over budget:\n" + "\n".join(slow)


def _cpu_s(regex, text: str) -> float:
    """CPU seconds of one search, in whichever engine compiled it (built-in rules: `re`; user rules: `regex`)."""
    spent = _search_time(regex, text, 2.0)
    return 2.0 if spent is None else spent


# hostile lines of the fuzzing campaign's shape, at the reader's longest line (8,192 characters);
# before the rework each took 0.5-1 s of CPU
HOSTILE = {
    "env-version-pip-conflict": ["A" * 8000 + " requires", "a 1" + "." * 8000 + " requires b>1 ",
                                 "a 1 requires b>=1" + "x" * 8000],
    "oom-shm-df-full": ["x " + "0" * 8000 + " 1 0 100% /dev/shm x", "," * 8000 + " 100% /dev/shm"],
    "oom-host-ram-killer": ["{" * 8000 + " invoked oom-killer"],
    "fp16-nan-loss": ["--fp16" + " " * 8000 + "x", "mixed precision" + " " * 8000 + "x"],
    "dist-rendezvous-timeout": ["Timed out initializing process group in store based barrier on rank: "
                                + "0" * 8000],
}


@pytest.mark.parametrize("rule_id", sorted(HOSTILE))
def test_hostile_lines_cost_milliseconds(rule_id):
    rule = BUILTIN[rule_id]
    for text in HOSTILE[rule_id]:
        for fname in ("compiled_patterns", "compiled_require", "compiled_exclude"):
            for regex in getattr(rule, fname):
                spent = _cpu_s(regex, text)
                assert spent < 0.1, f"{rule_id}: {regex.pattern[:60]!r} took {spent:.2f} s on {text[:30]!r}..."


@pytest.mark.parametrize("pattern", [
    r"boom (a|a)+$",  # the campaign's user rule
    r"boom (a+)+$",
    r"boom (\w|\d)*x",
    r"boom took \d+\.?\d* s",
    r"exit status\s*[:=]?\s*(-?\d+)",
    r"torch [\d.]+\S* requires",
])
def test_static_check_refuses_nested_and_overlapping_quantifiers(pattern):
    assert static_problems(pattern), f"{pattern!r} passed the static check"


@pytest.mark.parametrize("pattern", [
    r"CUDA out of memory\. Tried to allocate (\d+(?:\.\d+)?) (GiB|MiB)",
    r"requires the following packages: (?:[\w-]+, )*flash_attn\b",
    r"Function '(?P<fn>\w+Backward\d*)' returned nan",
    r"torch [\d.]\S* requires",
    r"exit status\s*+[:=]?\s*+(-?\d+)",
])
def test_static_check_accepts_linear_patterns(pattern):
    assert static_problems(pattern) == []


def test_timed_check_refuses_a_quadratic_pattern_the_static_check_misses():
    import regex

    pattern = r"(\S+ invoked oom-killer):"  # the built-in before the rework: an unanchored run per start
    assert static_problems(pattern) == []
    assert timed_problems(regex.compile(pattern), pattern)
    fixed = r"(?<!\S)(\S++ invoked oom-killer):"
    assert timed_problems(regex.compile(fixed), fixed) == []


_USER_RULE = USER_RULE


def test_lint_refuses_a_runaway_user_rule_and_explain_does_not_hang(tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "mine.yaml").write_text(_USER_RULE.format(rid="user-runaway", pattern="boom (a|a)+$"), encoding="utf-8")
    problems = lint_rules(rules)
    assert any("user-runaway" in p and "overlapping alternatives" in p for p in problems), problems
    log = tmp_path / "run.log"
    log.write_text("boom " + "a" * 40 + "!\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "loradoctor", "explain", "--rules", str(rules), str(log)],
                          capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert done.returncode == 2 and "user-runaway" in done.stderr and "Traceback" not in done.stderr


def test_a_search_past_its_timeout_is_abandoned_with_a_note(tmp_path):
    # A runaway rule that reached the engine anyway (built without the load-time checks): the match
    # timeout stops it, the rest of the library still runs, and the input carries a note. In a child
    # with a timeout, so that a regression fails this test instead of hanging the suite.
    script = textwrap.dedent(f"""
        import json, sys
        from loradoctor.logs.engine import explain
        from loradoctor.logs.rules import build_rule, load_rules
        rule, problems = build_rule({{"id": "user-runaway", "cause": "oom.capacity", "title": "t",
            "severity": "error", "confidence": "high", "patterns": ["boom (a|a)+$"], "prefilter": ["boom"],
            "summary": "s", "fixes": [{{"text": "f"}}], "docs": "d"}}, "test")
        assert problems, "the static check should have refused this rule"
        log = sys.argv[1]
        report = explain([log], rules=load_rules() + [rule])
        print(json.dumps({{"notes": report.inputs[0].get("notes", []),
                          "first": report.findings[0].rule if report.findings else None}}))
    """)
    log = tmp_path / "run.log"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
                   "boom " + "a" * 60 + "!\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", script, str(log)], capture_output=True, text=True,
                          timeout=120, cwd=str(ROOT))
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert any("user-runaway" in n and "line 2" in n for n in out["notes"]), out
    assert out["first"] is not None  # the built-in rules still diagnosed the OOM


@pytest.mark.parametrize("expr", [
    "'x' * 100000000000 == 'x'",          # 7.8 GB before
    "[0] * 1000000000000 == [0]",          # MemoryError traceback before
    "-'x' == 'x'",
    "(oom.count > 1) * 3 > 0",
    "oom.count + 'x' == 1",
])
def test_condition_arithmetic_only_between_numbers_at_load(expr):
    with pytest.raises(ConditionError, match="only between numbers"):
        Condition(expr)


def test_condition_arithmetic_on_a_fact_that_is_no_number_is_missing():
    # a fact holding a string (trace.location) multiplied: missing, never 'load' * n
    cond = Condition("trace.location * 3 == 'loadloadload'")
    assert cond.evaluate({"trace.location": "load"}) is False


@pytest.mark.parametrize("expr, facts", [
    ("oom.requested_bytes * 1e300 * 1e300 > 0", {"oom.requested_bytes": 5}),
    ("oom.requested_bytes * 100000000000000000000 * 100000000000000000000 > 0", {"oom.requested_bytes": 5}),
])
def test_condition_results_are_bounded(expr, facts):
    assert Condition(expr).evaluate(facts) is False


def test_lint_rejects_what_evaluation_would_refuse(tmp_path):
    body = _USER_RULE.format(rid="string-times", pattern="my own failure") + "    when: \"'x' * 100000000000 == 'x'\"\n"
    (tmp_path / "mine.yaml").write_text(body, encoding="utf-8")
    problems = lint_rules(tmp_path)
    assert any("string-times" in p and "only between numbers" in p for p in problems), problems
    with pytest.raises(UserError):
        load_rules([tmp_path])


_PLAIN_RULE = {"id": "user-plain", "cause": "oom.capacity", "title": "A test rule", "severity": "error",
               "confidence": "high", "patterns": ["CUDA out of memory"], "summary": "test",
               "fixes": [{"text": "do something"}], "docs": "test"}


def test_built_in_rules_match_with_re_and_user_rules_with_the_timed_engine():
    """The built-in library (vetted by lint in both engines) matches with the standard `re`; a user's
    rule, which nobody vetted, keeps the engine whose searches take a timeout."""
    import re

    rule = BUILTIN["dist-rendezvous-timeout"]
    assert all(isinstance(p, re.Pattern) for p in rule.compiled_patterns)
    user, problems = build_rule(dict(_PLAIN_RULE), "user.yaml")
    assert not problems
    assert user.compiled_patterns and not any(isinstance(p, re.Pattern) for p in user.compiled_patterns)
    # (that a short explain never imports regex: tests/test_startup_paths.py)


def test_lint_times_each_built_in_pattern_in_re_too():
    """A leading unbounded repeat with no boundary is linear in `regex` but quadratic in `re`: lint
    must time the engine that matches."""
    data = dict(_PLAIN_RULE, id="user-leading-repeat", patterns=[r"(\d+ pytorch allocator cache flushes since last step)"])
    rule, problems = build_rule(data, "user.yaml")
    assert rule is not None and not problems
    found = timed_regex_problems([rule])
    assert found and "runaway regex" in found[0]
    data["patterns"] = [r"(?<!\d)(\d+ pytorch allocator cache flushes since last step)"]
    rule, _ = build_rule(data, "user.yaml")
    assert timed_regex_problems([rule]) == []
