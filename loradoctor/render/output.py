"""The one place a command writes its report to stdout (and where report-wide filters such as
redaction belong: every command's text, JSON and Markdown passes through `write_report`).

A reader that goes away (`loradoctor ... | head`) must not turn into a traceback or an exit code of
its own: the first BrokenPipeError sends the rest of the output to /dev/null, and the command
finishes and exits with the code it would have had.
"""

from __future__ import annotations

import os
import sys

_pipe_closed = False


def write_report(text: str, end: str = "\n") -> None:
    """Write (part of) a command's report to stdout and flush it."""
    global _pipe_closed
    if _pipe_closed:
        return
    try:
        sys.stdout.write(text + end)
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_closed()


def stdout_closed() -> None:
    """The reader of stdout went away: discard what is still to come (Python would otherwise report
    the failed flush at exit)."""
    global _pipe_closed
    _pipe_closed = True
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # stdout is not a real file (an in-process caller captured it): nothing to silence


def terminal_columns(fallback: int = 80) -> int:
    """The terminal's width as shutil.get_terminal_size gives it ($COLUMNS first, then the terminal of
    stdout, else `fallback`), without importing shutil: with bz2 and lzma it is ~3 ms of every start,
    and argparse's help formatter imports it for this alone."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    try:
        columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
    except (AttributeError, ValueError, OSError):
        columns = 0
    return columns if columns > 0 else fallback
