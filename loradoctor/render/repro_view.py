"""Rendering of repro results and of the repro list (terminal text; JSON goes through render.json)."""

from __future__ import annotations

import json
from typing import Any, Iterable

from loradoctor.repro.catalog import ReproSpec
from loradoctor.repro.result import STATUSES, ReproResult, overall_status

STATUS_STYLE = {"PASS": "bold green", "FAIL": "bold red", "SKIP": "yellow", "ERROR": "bold magenta"}
PASS_EVIDENCE_LINES = 4  # PASS/SKIP are quiet; FAIL/ERROR show their evidence in full (up to EVIDENCE_LINES)
EVIDENCE_LINES = 16


def print_result(con: Any, result: ReproResult, verbose: bool = False) -> None:
    """One result: status, id, summary, duration; then its evidence (and numbers with verbose)."""
    from rich.markup import escape

    style = STATUS_STYLE.get(result.status, "")
    con.print(f"[{style}]{result.status:<5}[/] [bold]{escape(result.id)}[/]  {escape(result.summary)} "
              f"[dim]({result.duration_s:.1f} s)[/]")
    limit = EVIDENCE_LINES if (verbose or result.status in ("FAIL", "ERROR")) else PASS_EVIDENCE_LINES
    for line in result.evidence[:limit]:
        con.print(f"      [dim]{escape(line)}[/]")
    if len(result.evidence) > limit:
        con.print(f"      [dim]... {len(result.evidence) - limit} more lines (-v or --format json shows all)[/]")
    if verbose and result.numbers:
        for key, value in result.numbers.items():
            con.print(f"      [cyan]{escape(key)}[/] = {escape(json.dumps(value, default=str))}")


def print_summary(con: Any, results: Iterable[ReproResult]) -> None:
    results = list(results)
    counts = ", ".join(f"{sum(1 for r in results if r.status == s)} {s}" for s in STATUSES)
    overall = overall_status(results)
    con.print()
    con.print(f"[{STATUS_STYLE[overall]}]{overall}[/] {len(results)} repro(s): {counts}")


def list_data(specs: Iterable[ReproSpec]) -> list[dict[str, Any]]:
    return [{"id": s.id, "kind": s.kind, "gpu": s.gpu, "checks": s.checks, "options": dict(s.options)} for s in specs]


def print_list(con: Any, specs: Iterable[ReproSpec]) -> None:
    """The table of `loradoctor repro list`."""
    from rich.table import Table

    table = Table(box=None, pad_edge=False, show_edge=False)
    table.add_column("id", style="bold", no_wrap=True)
    table.add_column("needs GPU", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("what it checks")
    gpu_words = {"yes": "yes", "no": "no (CPU)", "optional": "uses one if there"}
    for s in specs:
        checks = s.checks
        if s.options:
            checks += "  [options: " + ", ".join(s.options) + "]"
        table.add_row(s.id, gpu_words.get(s.gpu, s.gpu), s.kind, checks)
    con.print(table)
    con.print()
    con.print("[dim]Run: loradoctor repro run ID [ID...] | --all | --from explain.json.  "
              "check: PASS = it works here.  problem: PASS = the setup under test is free of the problem "
              "(docs/repro.md).[/]")
