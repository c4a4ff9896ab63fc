"""`loradoctor explain`: parse options, call the log engine, render, write.

The engine (loradoctor.logs) is imported inside the command function so that `loradoctor --help`
stays fast.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, List, Optional

from loradoctor.errors import UserError

FORMATS = ("text", "json", "md")
# Progress on stderr only for inputs this big (and only on a TTY): smaller ones finish in seconds.
PROGRESS_MIN_BYTES = 50 * 1000 * 1000

EXPLAIN_HELP = """Name the root cause of a failed LoRA / QLoRA run from its logs.

Reads plain, .gz, .bz2 and .xz logs, folders of rank logs, or - for stdin; prints the most
likely cause first with the lines it rests on, the numbers, fixes in order, and the GPU test
that confirms it. A log that ends with the trainer's final summary and no failure is reported
as a finished run. Nothing is sent anywhere.

examples:
  loradoctor explain train.log
  loradoctor explain logs/rank*.log --format md > issue.md
  kubectl logs job/finetune | loradoctor explain - --format json

in a launch script (bash; pipefail makes the pipeline's status the training's, not tee's):
  set -o pipefail
  python train.py 2>&1 | tee run.log || { status=$?; loradoctor explain run.log --env live; exit $status; }

exit codes: 0 a diagnosis was made, or the run finished without a failure; 1 nothing recognised;
2 bad usage or unreadable input; 3 loradoctor itself failed.
"""


def build_parser(name: str = "explain"):
    """argparse for `loradoctor explain`."""
    from loradoctor.cli._args import format_option, new_parser

    def positive(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise UserError(f"--top {text!r}: give a whole number of at least 1")
        return value

    p = new_parser(name, EXPLAIN_HELP, func=lambda opts: explain(**opts))
    p.add_argument("paths", nargs="+", metavar="FILE", help="log files, folders of logs, or - for stdin")
    format_option(p, FORMATS)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show every finding in full, with the ranking's working and the facts")
    p.add_argument("--rules", action="append", type=Path, default=[], metavar="DIR",
                   help="add a folder of your own rules (repeatable)")
    p.add_argument("--env", metavar="SNAPSHOT.json|live",
                   help="machine facts: a saved `loradoctor env --format json` file, or 'live' to check this machine now")
    p.add_argument("--top", type=positive, metavar="N", help="show only the N best findings")
    p.add_argument("--max-decompressed", metavar="SIZE",
                   help="read compressed logs up to SIZE decompressed (default 1GiB, and at most 100x the "
                        "file's size past 16 MiB: a compression bomb); 0 lifts the limit")
    p.add_argument("--timeline", metavar="FILE|DIR",
                   help="a timeline recorded by `loradoctor run` (its folder) or the Trainer callback: its memory, "
                        "utilisation and host-RAM findings are ranked in with the log's")
    return p


def explain(paths: List[str], fmt: str = "text", verbose: bool = False, rules: List[Path] = (),
            env: Optional[str] = None, top: Optional[int] = None, max_decompressed: Optional[str] = None,
            timeline: Optional[str] = None) -> int:
    """`loradoctor explain` with parsed options; returns the exit code."""
    from loradoctor.cli._args import check_format, check_rule_dir

    fmt = check_format(fmt, FORMATS)
    if max_decompressed is not None:
        from loradoctor.logs import reader
        from loradoctor.units import parse_size

        try:
            reader.set_decompressed_limit(parse_size(max_decompressed))
        except (ValueError, OverflowError):
            raise UserError(f"--max-decompressed {max_decompressed!r}: give a size such as 4GiB (0: no limit)") from None
    rule_dirs = [check_rule_dir(d, "--rules") for d in rules]
    snapshot = load_env_snapshot(env) if env else None

    from loradoctor.cli import startup_done
    from loradoctor.logs.engine import explain as run_explain
    from loradoctor.logs.rules import load_rules
    from loradoctor.render import explain_view
    from loradoctor.render.output import write_report

    progress = make_progress(paths)
    from loradoctor.logs import reader

    reader.PROCESS_IS_OURS = True  # this process is the command's: big inputs may tune its allocator
    try:
        if timeline:
            from loradoctor.bedside.report import explain_with_timeline

            startup_done()
            report = explain_with_timeline(list(paths), timeline, extra_rule_dirs=rule_dirs, env=snapshot,
                                           progress=progress)
        else:
            rules = load_rules(rule_dirs)
            startup_done()
            report = run_explain(list(paths), extra_rule_dirs=rule_dirs, env=snapshot, progress=progress, rules=rules)
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        # The reader should raise UserError itself; this keeps a traceback away from the user if not.
        raise UserError(f"cannot read {exc.filename or exc}: {exc.strerror or exc}") from None
    finally:
        if progress is not None:
            progress.close()

    if fmt == "json":
        from loradoctor.render.json import dumps

        write_report(dumps(report.to_dict(top)))
    elif fmt == "md":
        write_report(explain_view.explain_md(report, top, verbose=verbose), end="")
    else:
        from loradoctor.render.text import Painter

        write_report(explain_view.explain_text(report, Painter.for_stdout(), verbose=verbose, top=top))
    return report.exit_code()


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
