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
    problems += metric_line_literal_problems(rules)
    problems += prefilter_gap_problems(rules)
    return problems


# The lines a training log holds by the million: the Trainer's metric dicts and tqdm bars. The engine cuts the
# dicts out of the scanned text only while no prefilter literal occurs in them (docs/rules.md, speed notes).
METRIC_LINES = (
    "{'loss': 2.1572, 'grad_norm': 0.530979, 'learning_rate': 0.00019999801368965095, 'epoch': 0.0}",
    "{'loss': 0.8123, 'grad_norm': 1.25, 'learning_rate': 2e-05, 'num_tokens': 1234567.0, "
    "'mean_token_accuracy': 0.71, 'entropy': 1.3, 'epoch': 1.5}",
    "{'loss': 1.9, 'learning_rate': 0.0001, 'epoch': 0.25}",
    " 42%|\u2588\u2588\u2588\u2588\u258f     | 420/1000 [01:02<01:30,  2.01s/it]",
    "  0%|          | 11/1006892 [0:00:22<574:31:49, 2.05s/it]",
)


def metric_line_literal_problems(rules: list) -> list[str]:
    """A literal (of the patterns, a require_all or an exclude regex) that occurs in a plain metric dict or a
    progress bar must belong to a regex that matches that line: a pattern then has its five matches and a
    require_all is met within a few lines, and the literal leaves the prefilter. Otherwise it stays for the
    whole log (an exclude literal stays until it matches), every dict line is scanned, and explain on a big
    log takes several times as long."""
    out = []
    for r in rules:
        groups = [("patterns", "prefilter", r.literals, list(r.compiled_patterns))]
        groups += [(f"require_all[{j}]", f"require_all[{j}]", lits, [r.compiled_require[j]])
                   for j, lits in enumerate(r.require_literals)]
        groups += [(f"exclude[{j}]", "exclude_prefilter", lits, [r.compiled_exclude[j]])
                   for j, lits in enumerate(r.exclude_literals)]
        for where, remedy, lits, regexes in groups:
            for line in METRIC_LINES:
                low = line.lower()
                hit = [t for t, ci in lits if (t.lower() in low if ci else t in line)]
                if hit and not any(rx.search(line) for rx in regexes):
                    out.append(f"{r.source}: rule {r.id}: {where}: literal {hit[0]!r} occurs in every metric line like "
                               f"{line[:40]!r}... which the regex does not match: the engine would scan every such "
                               f"line of a training log; give `{remedy}` with words every match contains")
                    break
    return out


def confidence_problems(rules: list) -> list[str]:
    """Confidence means only how sure a rule is: one of the documented levels (docs/rules.md,
    findings.CONFIDENCE_LEVELS). Decimals that only order sibling rules are refused; say `outranks`."""
    levels = ", ".join(f"{v:g}" for v in CONFIDENCE_LEVELS)
    return [f"{r.source}: rule {r.id}: confidence: {r.confidence:g} is not a documented level ({levels}); "
            f"order sibling rules with `outranks`, not with decimals"
            for r in rules if round(r.confidence, 3) not in CONFIDENCE_LEVELS]



def prefilter_gap_problems(rules: list) -> list[str]:
    """An explicit `prefilter` (or `exclude_prefilter`) must hold a literal of every match of its regexes: a
    line without one is never tried, so the alternative it would match is dead (and an exclude that never
    fires lets its rule fire). Checked on random matches drawn from each regex (rules/samples.py, seeded by
    the rule id); the first match found without a literal is named."""
    from loradoctor.logs.rules.samples import prefilter_gap

    out = []
    for r in rules:
        groups = []
        if r.prefilter:
            groups.append(("prefilter", r.prefilter, list(zip(r.patterns, r.compiled_patterns))))
        if r.exclude_prefilter:
            groups.append(("exclude_prefilter", r.exclude_prefilter, list(zip(r.exclude, r.compiled_exclude))))
        for name, literals, regexes in groups:
            for j, (pattern, compiled) in enumerate(regexes):
                gap = prefilter_gap(pattern, compiled, literals, f"{r.id}/{name}/{j}")
                if gap is not None:
                    out.append(f"{r.source}: rule {r.id}: {name}: the regex matches {gap!r}, which holds none of "
                               f"its literals: such a line is never tried; add a literal every match contains")
    return out
