"""`loradoctor rules lint`: every problem of a rules folder, one line each."""

from __future__ import annotations

from pathlib import Path

from loradoctor.findings import CONFIDENCE_LEVELS
from loradoctor.logs.rules.load import _collect, link_outranks
from loradoctor.logs.rules.redos import timed_regex_problems
from loradoctor.logs.rules.schema import builtin_rules_dir



def lint_rules(folder: "str | Path | None" = None) -> list[str]:
    """Every problem in a rules folder (default: the built-in one), one line each; [] when clean.
    A user folder is also checked for ids that clash with the built-in rules."""
    target = Path(folder) if folder is not None else builtin_rules_dir()
    if not target.is_dir():
        return [f"{target}: not a folder"]
    rules, problems = _collect([target])
    problems += timed_regex_problems(rules)
    builtin = builtin_rules_dir()
    known = rules
    if target.resolve() != builtin.resolve():
        builtin_rules, _ = _collect([builtin])
        ids = {r.id: r.source for r in builtin_rules}
        for r in rules:
            if r.id in ids:
                problems.append(f"{r.source}: rule {r.id}: id: duplicate id, also defined in {ids[r.id]}")
        known = rules + [r for r in builtin_rules if r.id not in {x.id for x in rules}]
    problems += link_outranks(known)  # a user rule may outrank a built-in one
    problems += confidence_problems(rules)
    return problems


def confidence_problems(rules: list) -> list[str]:
    """Confidence means only how sure a rule is: one of the documented levels (docs/rules.md,
    findings.CONFIDENCE_LEVELS). Decimals that only order sibling rules are refused; say `outranks`."""
    levels = ", ".join(f"{v:g}" for v in CONFIDENCE_LEVELS)
    return [f"{r.source}: rule {r.id}: confidence: {r.confidence:g} is not a documented level ({levels}); "
            f"order sibling rules with `outranks`, not with decimals"
            for r in rules if round(r.confidence, 3) not in CONFIDENCE_LEVELS]

