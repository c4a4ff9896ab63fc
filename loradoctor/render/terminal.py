"""Terminal output with rich: colour on a TTY, plain text when piped. rich is imported lazily."""

from __future__ import annotations

import sys
from typing import Any, Iterable

from loradoctor.findings import Finding

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=not sys.stdout.isatty())


def print_finding(con: Any, f: Finding, brief: bool = False) -> None:
    from rich.markup import escape

    style = SEVERITY_STYLE.get(f.severity, "")
    head = f"[{style}]{f.rank or '-'}. {f.severity.upper()}[/] [bold]{escape(f.title)}[/]"
    con.print(head)
    con.print(
        f"   cause [bold]{f.cause}[/] · rule {f.rule} · confidence {f.confidence_label} ({f.confidence:.2f})",
        style="dim" if brief else None,
    )
    if f.summary:
        con.print("   " + escape(f.summary))
    if brief:
        return
    if f.why_rank:
        con.print("   [dim]why this rank:[/] " + escape(f.why_rank))
    for e in f.evidence[:8]:
        con.print(f"   [dim]{escape(e.where())}[/] {escape(e.text)}")
    if len(f.evidence) > 8:
        con.print(f"   [dim]... {len(f.evidence) - 8} more evidence lines (--format json shows all)[/]")
    for i, fix in enumerate(f.fixes, 1):
        line = f"   [green]fix {i}[/] {escape(fix.text)}"
        if fix.command:
            line += f"\n         [bold]{escape(fix.command)}[/]"
        con.print(line)
    if f.repro:
        con.print(f"   [dim]confirm:[/] loradoctor repro run {f.repro}")


def print_findings(con: Any, findings: Iterable[Finding], verbose: bool = False, top: int = 1) -> None:
    """The top finding(s) in full; the rest as one-liners unless verbose."""
    findings = list(findings)
    for i, f in enumerate(findings):
        if i < top or verbose:
            print_finding(con, f)
            con.print()
        else:
            print_finding(con, f, brief=True)
    hidden = len(findings) - top
    if hidden > 0 and not verbose:
        more = "1 more finding" if hidden == 1 else f"{hidden} more findings"
        con.print(f"[dim]{more} shown briefly; -v shows all evidence and fixes.[/]")
