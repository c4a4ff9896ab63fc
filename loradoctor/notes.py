"""Side notes a command gathers while it runs and the CLI prints on stderr when it ends: a cache
folder that was not used and why (shown under -v), an input file that could not be read and was
skipped (always shown). Kept apart from findings: they say what the doctor could not look at, not
what is wrong with the machine or the run."""

from __future__ import annotations

import sys
from typing import List, Tuple

_NOTES: List[Tuple[str, str]] = []  # (level, text); level "warning" (always shown) or "verbose" (-v)


def add(text: str, level: str = "verbose") -> None:
    """Record a one-line note; the same line is kept once."""
    if (level, text) not in _NOTES:
        _NOTES.append((level, text))


def take() -> List[Tuple[str, str]]:
    """The notes so far, oldest first, and forget them."""
    out = list(_NOTES)
    _NOTES.clear()
    return out


def show(verbose: bool = False) -> None:
    """Print the notes on stderr, one line each (verbose ones only when asked) and forget them."""
    for level, text in take():
        if level == "warning" or verbose:
            try:
                print(f"loradoctor: {'warning' if level == 'warning' else 'note'}: {text}", file=sys.stderr)
            except (OSError, ValueError):
                return
