"""Terminal output with rich for the env and estimate views: colour on a TTY, plain text when piped.
rich is imported lazily. The layout of a finding is render/text.py's, painted here through rich."""

from __future__ import annotations

import sys
from typing import Any

from loradoctor.findings import Finding

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=not sys.stdout.isatty())


def print_finding(con: Any, f: Finding, brief: bool = False) -> None:
    """One finding through a rich console, laid out by render/text.py (the one text layout of a finding)."""
    from rich.text import Text

    from loradoctor.render.text import Painter, finding_lines

    painter = Painter(color=con.is_terminal and not con.no_color, width=con.width if con.is_terminal else None)
    for line in finding_lines(painter, f, brief=brief):
        con.print(Text.from_ansi(line), soft_wrap=True)


def captured(draw: Any, *args: Any, **kwargs: Any) -> str:
    """What `draw(console, *args, **kwargs)` prints, as text (ANSI styles kept on a colour terminal), so that
    the command can hand it to render.output.write_report."""
    con = console()
    with con.capture() as cap:
        draw(con, *args, **kwargs)
    return cap.get().rstrip("\n")
