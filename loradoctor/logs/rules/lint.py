"""`loradoctor rules lint`: every problem of a rules folder, one line each."""

from __future__ import annotations

from pathlib import Path

from loradoctor.logs.rules.load import _collect
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
    if target.resolve() != builtin.resolve():
        builtin_rules, _ = _collect([builtin])
        ids = {r.id: r.source for r in builtin_rules}
        for r in rules:
            if r.id in ids:
                problems.append(f"{r.source}: rule {r.id}: id: duplicate id, also defined in {ids[r.id]}")
    return problems

