"""Terminal text without rich: ANSI styles on a colour terminal, plain when piped, and wrapping at
the terminal width that keeps each paragraph's indentation and never splits a command (a command
sits on its own line and is never wrapped, so it can be copied as printed).

The findings' text layout lives here once (`finding_lines`); explain, repro and rules print with it
directly, and render/terminal.py paints the same lines through rich for the env and estimate views.
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from typing import Optional, Sequence

from loradoctor.findings import Finding

ANSI = {"bold": "1", "dim": "2", "underline": "4", "red": "31", "green": "32", "yellow": "33",
        "magenta": "35", "cyan": "36"}
SEVERITY_STYLE = {"error": ("bold", "red"), "warning": ("yellow",), "info": ("cyan",)}
MAX_EVIDENCE_LINES = 8


class Painter:
    """Styles and wraps lines. width None: no wrapping (output to a pipe or a file)."""

    def __init__(self, color: bool = False, width: Optional[int] = None) -> None:
        self.color = color
        self.width = width if width is None else max(40, width)

    @classmethod
    def for_stdout(cls) -> "Painter":
        """Colour and the terminal's width on a TTY (NO_COLOR and TERM=dumb respected); plain otherwise."""
        try:
            tty = sys.stdout.isatty()
        except (AttributeError, ValueError):
            tty = False
        if not tty:
            return cls()
        color = not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        from loradoctor.render.output import terminal_columns

        return cls(color=color, width=terminal_columns(100))

    def style(self, text: str, *styles: str) -> str:
        codes = [ANSI[s] for s in styles if s in ANSI]
        if not self.color or not codes or not text:
            return text
        return f"\033[{';'.join(codes)}m{text}\033[0m"

    def para(self, text: str, indent: int = 0, hang: Optional[int] = None, label: str = "",
             label_style: Sequence[str] = ("dim",), style: Sequence[str] = ()) -> list[str]:
        """One paragraph: `label` + `text`, wrapped to the width; continuation lines start at `hang`
        (default: under the text after the label), never at column 0."""
        head = " " * indent + (label + " " if label else "")
        rest_indent = " " * (len(head) if hang is None else hang)
        if self.width is None or len(head) + len(text) <= self.width:
            lines = [head + text]
        else:
            # a long token (a path, a URL) overflows rather than being split: it stays copyable
            lines = textwrap.wrap(text, width=self.width, initial_indent=head, subsequent_indent=rest_indent,
                                  break_on_hyphens=False, break_long_words=False) or [head]
        out = []
        for i, line in enumerate(lines):
            if i == 0 and label:
                body = line[len(head):]
                out.append(" " * indent + self.style(label, *label_style) + " " + self.style(body, *style))
            else:
                stripped = line.lstrip(" ")
                out.append(line[: len(line) - len(stripped)] + self.style(stripped, *style))
        return out

    def command(self, text: str, indent: int = 0, style: Sequence[str] = ("bold",)) -> list[str]:
        """A paste-ready command: each of its lines at `indent` plus its own indentation, never wrapped."""
        return [" " * indent + self.style(line, *style) if line.strip() else "" for line in text.splitlines() or [""]]


def plural(n: int, word: str, many: Optional[str] = None) -> str:
    """'1 line', '3 lines', '2 processes'."""
    if n == 1:
        return f"{n} {word}"
    if many is None:
        many = word + ("es" if word.endswith(("s", "sh", "ch", "x")) else "s")
    return f"{n:,} {many}"


# Parentheses that hold the engine's working (fact names, comparisons, rule globs): shown with -v only.
_INTERNAL_RE = re.compile(r"[a-z0-9]_[a-z0-9]|consequence_of|\.\*|[<>]=?|==|\b[a-z]+\.[a-z_]+\b| in \[")


def plain_why(text: str) -> str:
    """The ranking reason in words: drops parenthesised working such as
    '(reserved_unallocated_bytes 7.72 GiB >= requested_bytes 2.00 GiB; ...)' or
    '(oom.cuda matches consequence_of oom.*)'; `-v` and JSON keep the full text."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "(":
            depth, j = 0, i
            while j < len(text):
                if text[j] == "(":
                    depth += 1
                elif text[j] == ")":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            group = text[i + 1:j]
            if _INTERNAL_RE.search(group):
                while out and out[-1] == " ":
                    out.pop()
                i = j + 1
                continue
            out.append(text[i:j + 1])
            i = j + 1
            continue
        out.append(ch)
        i += 1
    return "".join(out).strip()


def evidence_lines(p: Painter, where: str, text: str) -> list[str]:
    """A quoted line after its file:line; on a narrow terminal a long location gets a line of its own."""
    if p.width is not None and len(where) > p.width // 3:
        return p.para(where, indent=3, style=("dim",)) + p.para(text, indent=6)
    return p.para(text, indent=3, label=where, hang=6)


def why_label(f: Finding) -> str:
    return "why first:" if f.rank == 1 else "why here:"


def finding_lines(p: Painter, f: Finding, brief: bool = False, verbose: bool = False) -> list[str]:
    """One finding: heading, cause line, summary; unless brief, why it ranks where it does, the
    evidence, the fixes (commands on their own lines) and the repro that confirms it."""
    lines = p.para(f.title, label=f"{f.rank or '-'}. {f.severity.upper()}",
                   label_style=SEVERITY_STYLE.get(f.severity, ()), style=("bold",), hang=3)
    meta = f"cause {f.cause} · rule {f.rule} · confidence {f.confidence_label} ({f.confidence:.2f})"
    lines += p.para(meta, indent=3, style=("dim",) if brief else ())
    if f.summary:
        lines += p.para(f.summary, indent=3)
    if brief:
        return lines
    if f.why_rank:
        why = f.why_rank if verbose else plain_why(f.why_rank)
        lines += p.para(why, indent=3, label=why_label(f))
    limit = len(f.evidence) if verbose else MAX_EVIDENCE_LINES
    for e in f.evidence[:limit]:
        lines += evidence_lines(p, e.where(), e.text)
    if len(f.evidence) > limit:
        more = len(f.evidence) - limit
        lines += p.para(f"... {plural(more, 'more evidence line')} (-v or --format json shows all)", indent=3,
                        style=("dim",))
    for i, fix in enumerate(f.fixes, 1):
        lines += p.para(fix.text, indent=3, label=f"fix {i}", label_style=("green",))
        if fix.command:
            lines += p.command(fix.command, indent=9)
    if f.repro:
        lines += p.para("confirm on this machine:", indent=3, style=("dim",))
        lines += p.command(f"loradoctor repro run {f.repro}", indent=9, style=())
    return lines
