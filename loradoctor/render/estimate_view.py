"""Rendering of `loradoctor estimate` / `preflight`: a breakdown table with a bar per component, the
total against the card, the verdict and what to change; or the `loradoctor.estimate/1` JSON document."""

from __future__ import annotations

from typing import Any, Optional

from loradoctor.units import GIB

ESTIMATE_SCHEMA = "loradoctor.estimate/1"
PREFLIGHT_SCHEMA = "loradoctor.preflight/1"
VERDICT_STYLE = {"fits": "bold green", "tight": "bold yellow", "does not fit": "bold red"}


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def config_fix(option: str, provenance: Any) -> Optional[str]:
    """The advice's command-line change in the words of the config file(s) the inputs came from, as
    'FILE: key: value, ...'; None when no config was read or none of the change has a spelling there."""
    from pathlib import Path

    from loradoctor.estimate.configs import spell_fix

    configs = list(getattr(provenance, "configs", []) or [])
    if not configs:
        return None
    origin = dict(getattr(provenance, "origin", {}) or {})
    training = [c for c in configs if c[1] != "adapter_config"] or configs
    main_fmt = training[-1][1]
    spelled = spell_fix(option, {k: fmt for k, (_, fmt) in origin.items()}, main_fmt)
    if spelled is None:
        return None
    text, formats = spelled
    names = list(dict.fromkeys(Path(p).name for p, fmt in configs if fmt in formats))
    return f"{', '.join(names)}: {text}"


def input_notes(provenance: Any) -> list[str]:
    """What the person should read about the inputs: config files that disagree (and which won), and
    combinations that were read as something else."""
    return list(getattr(provenance, "conflicts", []) or []) + list(getattr(provenance, "notes", []) or [])


def estimate_document(est: Any, fit: Optional[Any], provenance: dict[str, str], unsupported: Any = ()) -> dict[str, Any]:
    """The JSON document: schema, inputs, components (bytes), the three peaks, band, gpu, verdict, advice.
    `verdict` is 'unsupported' when the card lacks a feature the run needs (`unsupported` lists them);
    `memory_verdict` is the verdict on memory alone."""
    fit_d = fit.to_dict() if fit is not None else None
    problems = [u.to_dict() for u in unsupported]
    advice = fit_d["advice"] if fit_d else []
    for item in advice:
        spelled = config_fix(item["option"], provenance)
        if spelled:
            item["config"] = spelled
    return {
        "schema": ESTIMATE_SCHEMA,
        "inputs": est.inputs.to_dict(),
        "provenance": provenance,
        "input_notes": input_notes(provenance),
        "trainable_params": est.trainable_params,
        "total_params": est.total_params,
        "components": dict(est.components),
        "peak_allocated_bytes": est.peak_allocated_bytes,
        "peak_reserved_bytes": est.peak_reserved_bytes,
        "device_used_bytes": est.device_used_bytes,
        "band": list(est.band),
        "band_of": "device_used_bytes",
        "gpu": fit_d["gpu"] if fit_d else None,
        "verdict": ("unsupported" if problems else fit_d["verdict"]) if fit_d else None,
        "memory_verdict": fit_d["verdict"] if fit_d else None,
        "unsupported": problems,
        "headroom_bytes": fit_d["headroom_bytes"] if fit_d else None,
        "max_batch": fit_d["max_batch"] if fit_d else None,
        "max_seq_len": fit_d["max_seq_len"] if fit_d else None,
        "advice": advice,
        "notes": list(est.notes),
    }


def _inputs_line(est: Any) -> str:
    i = est.inputs
    parts = [i.method]
    if i.quant != "none":
        parts.append(i.quant + (" + double quant" if i.double_quant else ""))
    if i.method != "full":
        parts.append(f"r={i.rank} alpha={i.alpha} targets={','.join(i.targets)}")
    parts.append(f"batch {i.batch} x seq {i.seq_len}" + (f" (grad accum {i.grad_accum})" if i.grad_accum > 1 else ""))
    parts.append("gradient checkpointing" if i.gradient_checkpointing else "no gradient checkpointing")
    parts += [i.attn, i.optim, i.precision]
    if i.framework != "hf":
        parts.append(f"framework {i.framework}")
    return " · ".join(parts)


def print_estimate(con: Any, est: Any, fit: Optional[Any], provenance: dict[str, str], assumed: list[str],
                   unsupported: Any = ()) -> None:
    """The breakdown with bars, the three numbers and band, the verdict, the what-ifs and the advice."""
    from rich.markup import escape
    from rich.table import Table

    arch = est.inputs.arch
    con.print(f"[bold]{escape(arch.name)}[/] · {est.total_params / 1e9:.2f}B params · "
              f"{est.trainable_params:,} trainable · shapes from {escape(arch.source)}")
    con.print("   " + escape(_inputs_line(est)))
    if assumed:
        con.print(f"   [yellow]assumed defaults:[/] {escape(', '.join(assumed))} (pass them or --config to be exact)")
    for note in input_notes(provenance):
        con.print(f"   [yellow]note:[/] {escape(note)}")
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("component")
    table.add_column("GiB", justify="right")
    table.add_column("", no_wrap=True)
    total = sum(est.components.values()) or 1
    biggest = max(est.components.values()) or 1
    for name, n in est.components.items():
        if n <= 0:
            continue
        width = max(1, round(30 * n / biggest)) if n >= 0.002 * total else 0
        table.add_row(escape(name), f"{n / GIB:.2f}", "█" * width)
    con.print(table)
    low, high = est.band
    con.print(f"peak allocated {_gib(est.peak_allocated_bytes)} (torch.cuda.max_memory_allocated) · "
              f"peak reserved {_gib(est.peak_reserved_bytes)} (max_memory_reserved)")
    con.print(f"[bold]device memory in use {_gib(est.device_used_bytes)}[/] (nvidia-smi) · band {_gib(low)} - {_gib(high)}")
    for note in est.notes:
        con.print(f"   [dim]note: {escape(note)}[/]")
    if fit is None:
        con.print("[dim]pass --gpu NAME or --vram 24GB for a verdict and what to change[/]")
        return
    style = VERDICT_STYLE.get(fit.verdict, "")
    head = fit.headroom_bytes
    room = f"{_gib(head)} headroom" if head >= 0 else f"short by {_gib(-head)}"
    card = f"{escape(fit.gpu.name)} ({_gib(fit.gpu.memory_bytes)}, {fit.gpu.source})"
    if unsupported:
        con.print(f"[bold red]CANNOT RUN AS CONFIGURED[/] on {card}; memory alone: [{style}]{fit.verdict}[/], {room}")
        for u in unsupported:
            con.print(f"   [red]unsupported:[/] {escape(u.text)}")
        changes = " ".join(u.option for u in unsupported)
        con.print(f"      [bold]{escape(changes)}[/]")
        spelled = config_fix(changes, provenance)
        if spelled:
            con.print(f"      in {escape(spelled)}")
    else:
        con.print(f"[{style}]{fit.verdict.upper()}[/] on {card}: {room}")
        if fit.gpu.source == "vram":
            from loradoctor.estimate.cards import required_features

            if required_features(est.inputs):
                con.print("   [dim]note: --vram gives a size only: whether the card has bf16 / FlashAttention 2 was not "
                          "checked (pass --gpu NAME for that)[/]")
    if fit.max_batch is not None or fit.max_seq_len is not None:
        mb = fit.max_batch if fit.max_batch is not None else "none (batch 1 does not fit)"
        ms = fit.max_seq_len if fit.max_seq_len is not None else "none"
        con.print(f"   largest batch that fits at seq {est.inputs.seq_len}: {mb} · longest sequence at batch {est.inputs.batch}: {ms}")
    if fit.advice:
        con.print("[bold]what to change[/], in the order people tune (saving alone on this config; total with the changes above it):")
        budget = fit.gpu.memory_bytes
        for i, c in enumerate(fit.advice, 1):
            mark = "[green]fits alone[/]" if c.fits else ("[green]fits with 1-%d[/]" % i if c.cumulative_bytes <= budget else "")
            con.print(f"   {i}. {escape(c.text)}: saves {_gib(c.saves_bytes)}; with 1-{i}: {_gib(c.cumulative_bytes)} {mark}")
            con.print(f"      [bold]{escape(c.option)}[/]")
            spelled = config_fix(c.option, provenance)
            if spelled:
                con.print(f"      in {escape(spelled)}")


def preflight_document(out: Any, provenance: dict[str, str]) -> dict[str, Any]:
    """`loradoctor.preflight/1`: go, reason, first_fix, judged_against ('' = this machine's GPU, its free
    memory now), unsupported card features, env findings and the estimate document."""
    est = out.estimate
    return {
        "schema": PREFLIGHT_SCHEMA,
        "go": out.go,
        "reason": out.reason,
        "first_fix": out.first_fix,
        "judged_against": out.judged_against,
        "unsupported": [u.to_dict() for u in out.unsupported],
        "notes": list(out.notes),
        "env_findings": [f.to_dict() for f in out.findings],
        "lint_findings": [f.to_dict() for f in getattr(out, "lint", [])],
        "estimate": estimate_document(est, out.fit, provenance, out.unsupported) if est is not None else None,
    }


def print_preflight(con: Any, out: Any, provenance: Any = None) -> None:
    """One screen: env problems (errors first, one line each), the estimate vs the GPU, go / no-go."""
    from rich.markup import escape

    from loradoctor.render.terminal import SEVERITY_STYLE

    est, fit = out.estimate, out.fit
    shown = [f for f in out.findings if f.severity in ("error", "warning")]
    if shown:
        con.print("[bold]environment[/]")
        for f in shown[:8]:
            con.print(f"   [{SEVERITY_STYLE[f.severity]}]{f.severity.upper()}[/] {escape(f.title)} [dim]({f.cause})[/]")
            if f.fixes and f.severity == "error":
                fx = f.fixes[0]
                con.print(f"      fix: {escape(fx.text)}" + (f" [bold]{escape(fx.command)}[/]" if fx.command else ""))
        if len(shown) > 8:
            con.print(f"   [dim]... {len(shown) - 8} more (loradoctor env)[/]")
    else:
        con.print("[bold]environment[/] [green]no problems found by the quick checks[/]")
    lint = [f for f in getattr(out, "lint", []) if f.severity in ("error", "warning")]
    if lint:
        con.print("[bold]config[/] (loradoctor lint)")
        for f in lint[:8]:
            where = f.evidence[0].where() if f.evidence else ""
            con.print(f"   [{SEVERITY_STYLE[f.severity]}]{f.severity.upper()}[/] {escape(f.title)} [dim]({f.rule}, {escape(where)})[/]")
            if f.fixes and f.fixes[0].command:
                con.print(f"      fix: [bold]{escape(f.fixes[0].command.splitlines()[0])}[/]")
        if len(lint) > 8:
            con.print(f"   [dim]... {len(lint) - 8} more (loradoctor lint)[/]")
    elif getattr(out, "linted", False):
        con.print("[bold]config[/] [green]no pitfalls found by loradoctor lint[/]")
    if est is not None:
        con.print(f"[bold]memory[/] {escape(est.inputs.arch.name)}: {escape(_inputs_line(est))}")
        if provenance is not None:
            from loradoctor.estimate.inputs import assumed

            defaults = assumed(provenance, est.inputs.method)
            if defaults:
                con.print(f"   [yellow]assumed defaults:[/] {escape(', '.join(defaults))}")
        for note in input_notes(provenance) + list(out.notes):
            con.print(f"   [yellow]note:[/] {escape(note)}")
        low, high = est.band
        con.print(f"   needs {_gib(est.device_used_bytes)} (band {_gib(low)} - {_gib(high)})", end="")
        if fit is not None:
            style = VERDICT_STYLE.get(fit.verdict, "")
            con.print(f"; {escape(fit.gpu.name)} has {_gib(fit.gpu.memory_bytes)} -> [{style}]{fit.verdict}[/]")
        else:
            con.print()
        for u in out.unsupported:
            con.print(f"   [red]unsupported:[/] {escape(u.text)}")
    verdict = "[bold green]GO[/]" if out.go else "[bold red]NO GO[/]"
    con.print(f"{verdict} {escape(out.reason)}")
    if out.first_fix:
        con.print(f"   first fix: [bold]{escape(out.first_fix)}[/]")
        spelled = config_fix(out.fix_option, provenance) if out.fix_option else None
        if spelled:
            con.print(f"   in {escape(spelled)}")
