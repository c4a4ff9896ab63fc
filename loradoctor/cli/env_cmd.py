"""`loradoctor env`: check this machine (or a pasted report of another one) and name the fixes."""

from __future__ import annotations

from typing import List, Optional

import typer

from loradoctor.errors import UserError

WANT_ALIASES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "flash-attn": "flash-attn",
                "flash_attn": "flash-attn", "flash-attention": "flash-attn", "fa2": "flash-attn", "bnb": "bnb",
                "bitsandbytes": "bnb", "qlora": "bnb", "4bit": "bnb", "8bit": "bnb"}


def parse_want(text: Optional[str]) -> list[str]:
    """'bf16,flash-attn' -> ['bf16', 'flash-attn']; UserError on an unknown feature."""
    if not text:
        return []
    out = []
    for token in (t.strip().lower() for t in text.split(",")):
        if not token:
            continue
        if token not in WANT_ALIASES:
            raise UserError(f"--want: unknown feature {token!r}; use bf16, fp16, flash-attn or bnb (comma-separated)")
        out.append(WANT_ALIASES[token])
    return sorted(set(out))


def register(app: typer.Typer) -> None:
    @app.command("env")
    def env(
        deep: bool = typer.Option(False, "--deep", help="Also run a tiny bf16/fp16 matmul on each GPU (seconds)."),
        quick: bool = typer.Option(False, "--quick", help="Skip the bitsandbytes and flash-attn probes; short torch timeout."),
        from_file: Optional[str] = typer.Option(None, "--from", metavar="FILE",
                                                help="Check another machine from a saved `env --format json`, `python -m torch.utils.collect_env` text, or `nvidia-smi` / `nvidia-smi -q` text ('-' for stdin)."),
        fmt: str = typer.Option("text", "--format", help="text, json or md (Markdown for an issue; UUIDs, host and home paths redacted)."),
        strict: bool = typer.Option(False, "--strict", help="Exit 1 on warnings too."),
        timeout: Optional[float] = typer.Option(None, "--timeout", metavar="SECONDS", help="Per-probe timeout (default 60 s for the child probes, 10 s for the rest)."),
        python: Optional[str] = typer.Option(None, "--python", metavar="PATH", help="Probe another interpreter (the one you train with) instead of loradoctor's own."),
        want: Optional[str] = typer.Option(None, "--want", metavar="LIST", help="Features you will use, checked against this GPU: bf16, fp16, flash-attn, bnb (comma-separated). ACCELERATE_MIXED_PRECISION is read too."),
        check: Optional[List[str]] = typer.Option(None, "--check", metavar="NAME", help="Run only this check (repeatable); see --list-checks."),
        list_checks: bool = typer.Option(False, "--list-checks", help="List the checks and exit."),
        verbose: bool = typer.Option(False, "-v", "--verbose", help="Show info findings too."),
    ) -> None:
        """Check the machine: driver, CUDA, torch build, bf16 / flash-attn support, bitsandbytes, visible GPUs, memory
        held by other processes, GPU health. Exit 0 healthy, 1 an error finding (--strict: a warning), 2 bad usage."""
        from loradoctor.env import checks as env_checks
        from loradoctor.render import env_view

        if list_checks:
            for line in env_view.checks_table(env_checks.CHECKS):
                typer.echo(line)
            raise typer.Exit(0)
        if fmt not in ("text", "json", "md"):
            raise UserError(f"--format must be text, json or md, not {fmt!r}")
        if timeout is not None and not (0 < timeout <= 3600):
            raise UserError("--timeout must be between 0 and 3600 seconds")
        features = parse_want(want)
        if from_file is not None:
            from loradoctor.env.snapshot import load_snapshot

            snapshot = load_snapshot(from_file)
            if features:
                snapshot["requested"] = {"features": features, "source": "--want"}
        else:
            from loradoctor.env import collect_snapshot

            if python is not None:
                import os
                import shutil

                resolved = shutil.which(python) or python
                if not (os.path.isfile(resolved) and os.access(resolved, os.X_OK)):
                    raise UserError(f"--python: {python} is not an executable interpreter")
                python = resolved
            snapshot = collect_snapshot(deep=deep, quick=quick, timeout_s=timeout, want=features, python=python)
        findings = env_checks.run_checks(snapshot, only=check or None)
        _render(snapshot, findings, fmt, verbose)
        raise typer.Exit(env_view.exit_code(findings, strict=strict))


def _render(snapshot: dict, findings: list, fmt: str, verbose: bool) -> None:
    from loradoctor.env.snapshot import REPORT_SCHEMA
    from loradoctor.render import env_view

    if fmt == "json":
        from loradoctor.render.json import dumps

        typer.echo(dumps(env_view.report_document(snapshot, findings, REPORT_SCHEMA)))
    elif fmt == "md":
        typer.echo(env_view.env_markdown(snapshot, findings), nl=False)
    else:
        from loradoctor.render.terminal import console

        env_view.print_env_report(console(), snapshot, findings, verbose=verbose)
