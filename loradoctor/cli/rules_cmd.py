"""`loradoctor rules list | show ID | lint [DIR]`: the rule library behind explain."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

from loradoctor.errors import UserError

RULES_HELP = """The rule library behind `loradoctor explain` (YAML files; `loradoctor docs rules` says how
to write one).

examples:
  loradoctor rules list
  loradoctor rules show oom-fragmentation
  loradoctor rules lint my-rules/
"""

RULES_LIST_HELP = """List the rules: id, cause, severity, title.

examples:
  loradoctor rules list
  loradoctor rules list --format json | jq -r '.[].cause' | sort -u
  loradoctor rules list --rules my-rules/
"""

RULES_SHOW_HELP = """Print one rule's documentation: what it means, its patterns and conditions, fixes, repro.

examples:
  loradoctor rules show oom-fragmentation
  loradoctor rules show my-rule --rules my-rules/
"""

RULES_LINT_HELP = """Check a rule folder against the schema: ids, causes, regexes, conditions, repro ids.

Prints each problem with its file; exit 1 if there are any, 2 if the folder does not exist or holds
no rules.

examples:
  loradoctor rules lint               (the built-in rules)
  loradoctor rules lint my-rules/
"""


def build_parser(name: str = "rules"):
    from loradoctor.cli._args import add_subcommands, format_option, new_parser, sub_parser

    p = new_parser(name, RULES_HELP)
    subs = add_subcommands(p)
    lst = sub_parser(subs, "list", RULES_LIST_HELP, lambda o: rules_list(**o))
    format_option(lst, ("text", "json"))
    lst.add_argument("--rules", action="append", type=Path, default=[], metavar="DIR",
                     help="also list a folder of your own rules (repeatable)")
    show = sub_parser(subs, "show", RULES_SHOW_HELP, lambda o: rules_show(**o))
    show.add_argument("rule_id", metavar="ID", help="a rule id from `loradoctor rules list`")
    show.add_argument("--rules", action="append", type=Path, default=[], metavar="DIR",
                      help="also search a folder of your own rules (repeatable)")
    lint = sub_parser(subs, "lint", RULES_LINT_HELP, lambda o: rules_lint(**o))
    lint.add_argument("folder", nargs="?", type=Path, metavar="DIR", help="a rule folder (default: the built-in rules)")
    return p


def rules_list(fmt: str = "text", rules: List[Path] = ()) -> int:
    from loradoctor.cli._args import check_format
    from loradoctor.render import explain_view
    from loradoctor.render.output import write_report

    fmt = check_format(fmt, ("text", "json"))
    loaded = _load_rules(rules)
    if fmt == "json":
        from loradoctor.render.json import dumps

        write_report(dumps([r.to_dict() for r in loaded]))  # Rule's one serialiser
    else:
        write_report(explain_view.rules_table(loaded))
    return 0


def rules_show(rule_id: str, rules: List[Path] = ()) -> int:
    from loradoctor.render import explain_view
    from loradoctor.render.output import write_report

    loaded = _load_rules(rules)
    by_id = {r.id: r for r in loaded}
    if rule_id not in by_id:
        import difflib

        close = difflib.get_close_matches(rule_id, list(by_id), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `loradoctor rules list` shows them all"
        raise UserError(f"no rule with id {rule_id!r}{hint}")
    write_report(explain_view.rule_doc(by_id[rule_id]), end="")
    return 0


def rules_lint(folder: Optional[Path] = None) -> int:
    """Lint a folder; 0 clean, 1 problems (listed on stdout), 2 no such folder or no rules in it."""
    from loradoctor.cli._args import check_rule_dir
    from loradoctor.logs import rules as rules_mod
    from loradoctor.render.output import write_report
    from loradoctor.render.text import plural

    target = Path(rules_mod.builtin_rules_dir()) if folder is None else Path(check_rule_dir(folder, "rules lint"))
    if not any(target.glob("*.y*ml")):
        raise UserError(f"rules lint {target}: no rule files (*.yaml) in that folder, so nothing to check")
    problems = rules_mod.lint_rules(target)
    if problems:
        write_report("\n".join(str(p) for p in problems))
        import sys

        print(f"{plural(len(problems), 'problem')} in {target}", file=sys.stderr)
        return 1
    count = _count_rules(target)
    if count == 0:
        raise UserError(f"rules lint {target}: the YAML files there define no rules, so nothing to check")
    write_report(f"{plural(count, 'rule')} OK ({target})")
    return 0


def _load_rules(extra: List[Path]) -> list[Any]:
    from loradoctor.cli._args import check_rule_dir
    from loradoctor.logs.rules import load_rules

    dirs = [check_rule_dir(d, "--rules") for d in extra]
    return list(load_rules(extra_dirs=dirs))


def _count_rules(folder: Path) -> int:
    """Rules defined in a folder that lint passed (so every file parses)."""
    import yaml

    count = 0
    for path in sorted(folder.glob("*.y*ml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        count += len(data.get("rules") or []) if isinstance(data, dict) else 0
    return count
