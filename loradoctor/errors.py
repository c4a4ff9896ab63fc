"""How failures reach the user: a UserError is one line and exit 2; anything unexpected is one line
naming a saved traceback, and exit 3 (loradoctor.cli.main). Nothing prints a traceback."""

from __future__ import annotations

from typing import Sequence

REPORT_HINT = "please report it with that file attached (the loradoctor version and command line are in it)"


class UserError(Exception):
    """Bad usage or unreadable input. The CLI prints `loradoctor: error: <message>` and exits 2."""

    exit_code = 2


def one_line(text: str, limit: int = 400) -> str:
    """A message flattened to one line of at most `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def report_crash(exc: BaseException, argv: Sequence[str]) -> str:
    """Save the traceback of an unexpected exception to a file of this user's and return the line to print.

    The file is made by mkstemp in the user's temporary folder (mode 0600, a fresh name, never followed
    through a link someone planted)."""
    import os
    import tempfile
    import traceback

    from loradoctor import __version__

    command = " ".join(["loradoctor", *argv[:1]])
    what = f"{type(exc).__name__}: {one_line(str(exc), 160)}" if str(exc) else type(exc).__name__
    text = (f"loradoctor {__version__}\ncommand: loradoctor {' '.join(argv)}\n\n"
            + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    try:
        fd, path = tempfile.mkstemp(prefix="loradoctor-crash-", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as fh:
            fh.write(text)
        saved = f"the full traceback is in {path}; {REPORT_HINT}"
    except OSError as save_error:
        saved = f"the traceback could not be saved ({save_error.strerror or save_error}); please report the command line"
    return f"loradoctor: internal error in `{command}` ({what}); {saved}"
