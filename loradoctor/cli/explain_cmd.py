"""`loradoctor explain` and `loradoctor rules`: parse options, call the log engine, render.

The engine (loradoctor.logs) and rich are imported inside the command functions so that
`loradoctor --help` stays fast.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, List, Optional

import typer

from loradoctor.errors import UserError

FORMATS = ("text", "json", "md")
# Progress on stderr only for inputs this big (and only on a TTY): smaller ones finish in seconds.
PROGRESS_MIN_BYTES = 50 * 1000 * 1000

EXPLAIN_HELP = """Name the root cause of a failed LoRA / QLoRA run from its logs.

Reads plain, .gz, .bz2 and .xz logs, folders of rank logs, or - for stdin; prints the most
likely cause first with the lines it rests on, the numbers, fixes in order, and the GPU test
that confirms it. Nothing is sent anywhere.

Examples:
  loradoctor explain train.log
  python train.py 2>&1 | tee run.log; loradoctor explain run.log --env live
  loradoctor explain logs/rank*.log --format md > issue.md
  kubectl logs job/finetune | loradoctor explain - --format json

Exit codes: 0 a diagnosis was made, 1 nothing recognised, 2 bad usage or unreadable input.
"""

RULES_HELP = """The rule library behind `loradoctor explain` (YAML under rules/, see docs/rules.md).

\b
Examples:
  loradoctor rules list
  loradoctor rules show oom-fragmentation
  loradoctor rules lint my-rules/
"""

RULES_LIST_HELP = """List the rules: id, cause, severity, title.

\b
Examples:
  loradoctor rules list
  loradoctor rules list --format json | jq -r '.[].cause' | sort -u
  loradoctor rules list --rules my-rules/
"""

RULES_SHOW_HELP = """Print one rule's documentation: what it means, its patterns and conditions, fixes, repro.

\b
Examples:
  loradoctor rules show oom-fragmentation
  loradoctor rules show my-rule --rules my-rules/
"""

RULES_LINT_HELP = """Check a rule folder against the schema: ids, causes, regexes, conditions, repro ids.

Prints each problem with its file; exit 1 if there are any, 2 if the folder does not exist.

\b
Examples:
  loradoctor rules lint               (the built-in rules)
  loradoctor rules lint my-rules/
"""


def register(app: typer.Typer) -> None:
    """Add `explain` and the `rules` group to the root app."""
    from loradoctor.cli._args import mount

    mount(app, "explain", EXPLAIN_HELP.split("\n\n")[0], build_parser, lambda opts: explain(**opts),
          help_when_empty=True)
    rules_app = typer.Typer(
        name="rules", help=RULES_HELP, no_args_is_help=True, add_completion=False, rich_markup_mode=None
    )
    rules_app.command("list", help=RULES_LIST_HELP)(rules_list)
    rules_app.command("show", help=RULES_SHOW_HELP, no_args_is_help=True)(rules_show)
    rules_app.command("lint", help=RULES_LINT_HELP)(rules_lint)
    app.add_typer(rules_app, name="rules")


# ---------------------------------------------------------------------------- explain


def build_parser():
    """argparse for `loradoctor explain` (see loradoctor/cli/_args.py for why not typer options)."""
    from loradoctor.cli._args import new_parser

    def positive(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise UserError(f"--top {text!r}: give a whole number of at least 1")
        return value

    p = new_parser("explain", EXPLAIN_HELP)
    p.add_argument("paths", nargs="+", metavar="FILE", help="log files, folders of logs, or - for stdin")
    p.add_argument("-f", "--format", dest="fmt", default="text", metavar="FMT", help="text (default) | json | md")
    p.add_argument("-v", "--verbose", action="store_true", help="show every finding in full")
    p.add_argument("--rules", action="append", type=Path, default=[], metavar="DIR",
                   help="add a folder of your own rules (repeatable)")
    p.add_argument("--env", metavar="SNAPSHOT.json|live",
                   help="machine facts: a saved `loradoctor env --format json` file, or 'live' to check this machine now")
    p.add_argument("--top", type=positive, metavar="N", help="show only the N best findings")
    p.add_argument("--timeline", metavar="FILE|DIR",
                   help="a timeline recorded by `loradoctor run` (its folder) or the Trainer callback: its memory, "
                        "utilisation and host-RAM findings are ranked in with the log's")
    return p


def explain(paths: List[str], fmt: str = "text", verbose: bool = False, rules: List[Path] = (),
            env: Optional[str] = None, top: Optional[int] = None, timeline: Optional[str] = None) -> int:
    """`loradoctor explain` with parsed options; returns the exit code."""
    fmt = _check_format(fmt, FORMATS)
    rule_dirs = [_check_rule_dir(d, "--rules") for d in rules]
    snapshot = load_env_snapshot(env) if env else None

    from loradoctor.logs.engine import explain as run_explain
    from loradoctor.render import explain_view

    progress = make_progress(paths)
    try:
        if timeline:
            from loradoctor.bedside.report import explain_with_timeline

            report = explain_with_timeline(list(paths), timeline, extra_rule_dirs=rule_dirs, env=snapshot,
                                           progress=progress)
        else:
            report = run_explain(list(paths), extra_rule_dirs=rule_dirs, env=snapshot, progress=progress)
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        # The reader should raise UserError itself; this keeps a traceback away from the user if not.
        raise UserError(f"cannot read {exc.filename or exc}: {exc.strerror or exc}") from None
    finally:
        if progress is not None:
            progress.close()

    if fmt == "json":
        _echo(explain_view.explain_json(report, top))
    elif fmt == "md":
        _echo(explain_view.explain_md(report, top))
    else:
        from loradoctor.render.terminal import console

        explain_view.print_explain(console(), report, verbose=verbose, top=top)
    return 0 if explain_view.diagnoses(report.findings) else 1


def load_env_snapshot(spec: str) -> dict[str, Any]:
    """`--env FILE|live` -> the snapshot dict (docs/snapshot.md). Raises UserError on bad input."""
    if spec == "live":
        try:
            from loradoctor.env import collect_snapshot  # type: ignore[attr-defined]
        except ImportError:
            raise UserError(
                "--env live is not available in this build (no loradoctor.env.collect_snapshot); "
                "save one with `loradoctor env --format json > env.json` and pass --env env.json"
            ) from None
        snapshot = collect_snapshot(quick=True)
        return snapshot.to_dict() if hasattr(snapshot, "to_dict") else dict(snapshot)
    # The env family's one snapshot reader: `loradoctor env --format json` output (the snapshot sits
    # under "snapshot"), a bare snapshot, or pasted collect_env / nvidia-smi text.
    from loradoctor.env.snapshot import load_snapshot

    try:
        return load_snapshot(spec)
    except UserError as exc:
        raise UserError(f"--env: {exc}") from None


class _StderrProgress:
    """A one-line progress meter on stderr, redrawn at most a few times a second.

    Called by the engine as progress(path, done_bytes, total_bytes_or_None) per input file
    (total is None for compressed input, whose decompressed size is unknown)."""

    def __init__(self) -> None:
        self._last_draw_s = 0.0
        self._drawn = False

    def __call__(self, path: Any, done_bytes: Any, total_bytes: Any = None, *args: Any) -> None:
        if not isinstance(done_bytes, (int, float)):
            return  # the meter must never break a diagnosis
        now = time.monotonic()
        finished = bool(total_bytes) and done_bytes >= total_bytes
        if now - self._last_draw_s < 0.2 and not finished:
            return
        self._last_draw_s = now
        from loradoctor.units import format_bytes

        if total_bytes:
            pct = min(100.0, 100.0 * done_bytes / total_bytes)
            text = f"reading {path}: {pct:5.1f}% ({format_bytes(done_bytes)} of {format_bytes(total_bytes)})"
        else:
            text = f"reading {path}: {format_bytes(done_bytes)} decompressed"
        sys.stderr.write("\r\033[K" + text)
        sys.stderr.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def make_progress(paths: List[str]) -> Optional[_StderrProgress]:
    """A progress callback for big inputs on a terminal; None otherwise (pipes stay clean)."""
    if not sys.stderr.isatty():
        return None
    total = sum(_size_on_disk(p) for p in paths)
    return _StderrProgress() if total >= PROGRESS_MIN_BYTES else None


def _size_on_disk(path: str) -> int:
    if path == "-":
        return 0
    try:
        if os.path.isdir(path):
            return sum(
                os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names
            )
        return os.path.getsize(path)
    except OSError:
        return 0  # the reader reports unreadable input properly


# ---------------------------------------------------------------------------- rules


def rules_list(
    fmt: str = typer.Option("text", "--format", "-f", help="text | json"),
    rules: List[Path] = typer.Option([], "--rules", metavar="DIR", help="Also list a folder of your own rules."),
) -> None:
    fmt = _check_format(fmt, ("text", "json"))
    from loradoctor.render import explain_view

    loaded = _load_rules(rules)
    if fmt == "json":
        from loradoctor.render.json import dumps

        _echo(dumps([explain_view.rule_summary(r) for r in loaded]))
    else:
        _echo(explain_view.rules_table(loaded))


def rules_show(
    rule_id: str = typer.Argument(..., metavar="ID", help="A rule id from `loradoctor rules list`."),
    rules: List[Path] = typer.Option([], "--rules", metavar="DIR", help="Also search a folder of your own rules."),
) -> None:
    from loradoctor.render import explain_view

    loaded = _load_rules(rules)
    by_id = {r.id: r for r in loaded}
    if rule_id not in by_id:
        import difflib

        close = difflib.get_close_matches(rule_id, list(by_id), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `loradoctor rules list` shows them all"
        raise UserError(f"no rule with id {rule_id!r}{hint}")
    _echo(explain_view.rule_doc(by_id[rule_id]), end="")


def rules_lint(
    folder: Optional[Path] = typer.Argument(None, metavar="[DIR]", help="A rule folder (default: the built-in rules)."),
) -> None:
    from loradoctor.logs import rules as rules_mod

    target = Path(rules_mod.builtin_rules_dir()) if folder is None else _check_rule_dir(folder, "rules lint")
    problems = rules_mod.lint_rules(target)
    if problems:
        for p in problems:
            _echo(str(p))
        _echo(f"{len(problems)} problem(s) in {target}", err=True)
        raise typer.Exit(1)
    _echo(f"{_count_rules(Path(target))} rules OK ({target})")


def _load_rules(extra: List[Path]) -> list:
    from loradoctor.logs.rules import load_rules

    dirs = [_check_rule_dir(d, "--rules") for d in extra]
    return list(load_rules(extra_dirs=dirs))


def _count_rules(folder: Path) -> int:
    """Rules defined in a folder that lint passed (so every file parses)."""
    import yaml

    count = 0
    for path in sorted(folder.glob("*.y*ml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        count += len(data.get("rules") or []) if isinstance(data, dict) else 0
    return count


# ---------------------------------------------------------------------------- helpers


def _check_format(fmt: str, allowed: tuple) -> str:
    value = fmt.strip().lower()
    if value not in allowed:
        raise UserError(f"--format {fmt!r}: use one of {', '.join(allowed)}")
    return value


def _check_rule_dir(path: Path, option: str) -> str:
    if not path.exists():
        raise UserError(f"{option} {path}: no such folder")
    if not path.is_dir():
        raise UserError(f"{option} {path}: not a folder (give the folder that holds your rule .yaml files)")
    return str(path)


def _echo(text: str, err: bool = False, end: str = "\n") -> None:
    stream = sys.stderr if err else sys.stdout
    stream.write(text + end)
    stream.flush()
