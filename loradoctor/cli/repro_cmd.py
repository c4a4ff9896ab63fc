"""`loradoctor repro list | show | run`: small programs that confirm a diagnosis on this machine.

Parse options, call the runner, render. Exit codes: 0 all PASS/SKIP, 1 any FAIL or ERROR,
2 bad usage (unknown id, unreadable --from file).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, List, Optional

import typer

from loradoctor.errors import UserError


def parse_opt(text: str) -> tuple[str, Any]:
    """'head_dim=64' -> ('head_dim', 64); values are read as JSON when they parse (numbers, true/false)."""
    if "=" not in text:
        raise UserError(f"--opt takes KEY=VALUE, not {text!r}")
    key, _, raw = text.partition("=")
    key = key.strip().replace("-", "_")
    if not key:
        raise UserError(f"--opt takes KEY=VALUE, not {text!r}")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


def ids_from_explain(path: str) -> list[str]:
    """The repro ids the findings of an `explain --format json` document name, deduplicated, in rank order."""
    from loradoctor.repro.catalog import REPROS

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise UserError(f"{path} is not JSON ({exc}); make it with loradoctor explain LOG --format json > explain.json") from None
    if not isinstance(document, dict) or not isinstance(document.get("findings"), list):
        raise UserError(f"{path} is not an explain document (no \"findings\" list; schema loradoctor.explain/1)")
    schema = str(document.get("schema", ""))
    if schema and not schema.startswith("loradoctor.explain/"):
        raise UserError(f"{path} has schema {schema!r}, expected loradoctor.explain/1")
    findings = [f for f in document["findings"] if isinstance(f, dict)]
    # rank order: by "rank" where given (1..n), keeping the file's order for ties and missing ranks
    order = sorted(range(len(findings)), key=lambda i: (
        findings[i].get("rank") if isinstance(findings[i].get("rank"), int) and findings[i].get("rank") > 0 else 10**9, i))
    ids: list[str] = []
    for i in order:
        repro = findings[i].get("repro")
        if not repro or repro in ids:
            continue
        if repro not in REPROS:
            print(f"loradoctor: warning: {path}: finding {findings[i].get('rule', '?')} names unknown repro "
                  f"{repro!r}; skipped", file=sys.stderr)
            continue
        ids.append(repro)
    return ids


def register(app: typer.Typer) -> None:
    repro_app = typer.Typer(
        help="Small programs that confirm a diagnosis on this machine: PASS / FAIL / SKIP.",
        no_args_is_help=True,
    )
    app.add_typer(repro_app, name="repro")

    @repro_app.command("list")
    def list_cmd(
        fmt: str = typer.Option("text", "--format", help="text or json"),
    ) -> None:
        """List the repros: id, whether it needs a GPU, what it checks."""
        from loradoctor.render import json as json_render
        from loradoctor.render.repro_view import list_data, print_list
        from loradoctor.render.terminal import console
        from loradoctor.repro.catalog import REPROS

        if fmt == "json":
            typer.echo(json_render.dumps({"schema": "loradoctor.repro-list/1", "repros": list_data(REPROS.values())}))
        elif fmt == "text":
            print_list(console(), REPROS.values())
        else:
            raise UserError(f"unknown --format {fmt!r}; use text or json")

    @repro_app.command("show")
    def show_cmd(
        repro_id: str = typer.Argument(..., metavar="ID", help="a repro id (loradoctor repro list)"),
        source: bool = typer.Option(False, "--source", help="print the whole script (to run or paste it elsewhere)"),
    ) -> None:
        """Show what a repro does, how PASS/FAIL are decided, and where its script is."""
        import ast

        from loradoctor.repro.catalog import get_spec

        spec = get_spec(repro_id)
        text = spec.script.read_text(encoding="utf-8")
        if source:
            typer.echo(text, nl=False)
            return
        typer.echo((ast.get_docstring(ast.parse(text)) or spec.checks).rstrip())
        typer.echo("")
        typer.echo(f"script: {spec.script}")
        typer.echo(f"run it alone: {Path(sys.executable).name} {spec.script} '{{\"option\": value}}'")

    @repro_app.command("run")
    def run_cmd(
        ids: Optional[List[str]] = typer.Argument(None, metavar="[ID]...", help="repro ids (loradoctor repro list)"),
        run_all: bool = typer.Option(False, "--all", help="run every repro"),
        from_file: Optional[str] = typer.Option(None, "--from", metavar="EXPLAIN.json",
                                                help="run the repros named by `loradoctor explain --format json` (- for stdin)"),
        fmt: str = typer.Option("text", "--format", help="text or json"),
        timeout_s: float = typer.Option(180.0, "--timeout", metavar="S", help="seconds per repro before it counts as hung"),
        dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16 / fp16 for flash-attn and sdpa-backends"),
        head_dim: Optional[int] = typer.Option(None, "--head-dim", help="your model's head dim (flash-attn, sdpa-backends)"),
        opts: Optional[List[str]] = typer.Option(None, "--opt", metavar="KEY=VALUE",
                                                 help="a repro option (see loradoctor repro show ID); repeatable"),
        verbose: bool = typer.Option(False, "-v", "--verbose", help="all evidence lines and the numbers"),
    ) -> None:
        """Run repros in child processes of this Python; exit 0 all PASS/SKIP, 1 any FAIL/ERROR, 2 bad usage."""
        from loradoctor.render import json as json_render
        from loradoctor.render.repro_view import print_result, print_summary
        from loradoctor.render.terminal import console
        from loradoctor.repro.catalog import REPRO_IDS, get_spec
        from loradoctor.repro.result import exit_code, run_document
        from loradoctor.repro.runner import run_repro

        if fmt not in ("text", "json"):
            raise UserError(f"unknown --format {fmt!r}; use text or json")
        if timeout_s <= 0:
            raise UserError("--timeout must be a positive number of seconds")
        chosen: list[str] = []
        for repro_id in ids or []:
            get_spec(repro_id)  # unknown id -> UserError before anything runs
            if repro_id not in chosen:
                chosen.append(repro_id)
        if run_all:
            chosen += [i for i in REPRO_IDS if i not in chosen]
        if from_file is not None:
            chosen += [i for i in ids_from_explain(from_file) if i not in chosen]
        if not chosen:
            if from_file is not None:
                print("loradoctor: no finding in that explain document names a repro; nothing to run", file=sys.stderr)
                raise typer.Exit(0)
            raise UserError("name repro ids, or use --all or --from explain.json (loradoctor repro list shows the ids)")
        options: dict[str, Any] = dict(parse_opt(o) for o in opts or [])
        if dtype is not None:
            options["dtype"] = dtype
        if head_dim is not None:
            options["head_dim"] = head_dim

        out = console()
        err = console(stderr=True)
        show_progress = sys.stderr.isatty()
        results = []
        for n, repro_id in enumerate(chosen, 1):
            if show_progress:
                err.print(f"[dim][{n}/{len(chosen)}] running {repro_id} (up to {timeout_s:g} s) ...[/]")
            result = run_repro(repro_id, timeout_s=timeout_s, options=options)
            results.append(result)
            if fmt == "text":
                print_result(out, result, verbose=verbose)
        if fmt == "json":
            typer.echo(json_render.dumps(run_document(results)))
        else:
            print_summary(out, results)
        raise typer.Exit(exit_code(results))
