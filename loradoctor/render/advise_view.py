"""Text for `recommend` (one config, or the --table of micro-batches) and `lint`: pure functions from
the advice's plain data to strings. The commands in loradoctor/cli/ only choose the format and print."""
from __future__ import annotations

from typing import Any

from loradoctor.units import gib


def recommend_text(d: dict[str, Any], config: str, reasons: list[str], gpu_name: str) -> str:
    """The recommendation: a one-line verdict, the config to copy, why, and the estimate's parts."""
    out = [f"loradoctor recommend: {d['model']} on {gpu_name} ({gib(d['card_bytes'])}): {d['method']}, "
           f"{d['seq_len']} tokens, micro-batch {d['micro_batch']} x {d['grad_accum']}; estimate "
           f"{gib(d['estimate_bytes'])}, {gib(d['card_bytes'] - d['estimate_bytes'])} free", "",
           config.rstrip("\n"), "", "Why:"]
    out += [f"  - {r}" for r in reasons]
    out += ["", "Estimate of this config:"]
    out += [f"  {name:<28} {value / 2**30:8.2f} GiB" for name, value in d["components"].items() if value]
    return "\n".join(out)


def recommend_table_text(rows: list[dict[str, Any]], gpu_name: str, headroom: float) -> str:
    """Per model: method x max length -> the micro-batch that fits and the memory it uses ('-': none fits)."""
    out = [f"Micro-batch that fits on {gpu_name} (gradient checkpointing on, {headroom:.0%} kept free), "
           "and the memory it uses:", ""]
    lengths = sorted({r["seq_len"] for r in rows})
    cell = {(r["model"], r["method"], r["seq_len"]): r for r in rows}
    for model in dict.fromkeys(r["model"] for r in rows):
        out.append(model)
        out.append("  " + f"{'method':<8}" + "".join(f"{n:>18}" for n in lengths))
        for method in ("lora", "qlora"):
            cells = []
            for n in lengths:
                r = cell[(model, method, n)]
                text = "-" if not r["micro_batch"] else f"{r['micro_batch']:>5} @ {r['bytes'] / 2**30:5.1f} GiB"
                cells.append(text.rjust(18))
            out.append("  " + f"{method:<8}" + "".join(cells))
        out.append("")
    return "\n".join(out) + "\n"


def lint_text(findings: list, configs: list[str]) -> str:
    """lint's report: a count by severity, then each finding with its evidence, fix and what ignoring it leads to."""
    if not findings:
        n = len(configs)
        return f"loradoctor lint: no problems found in {n} config{'s' if n != 1 else ''}"
    counts: dict[str, int] = {}
    for f in findings:
        counts[f.severity] = counts.get(f.severity, 0) + 1
    head = ", ".join(f"{n} {sev}{'s' if n != 1 else ''}" for sev, n in counts.items())
    out = [f"loradoctor lint: {head}", ""]
    for f in findings:
        where = f.evidence[0].where() if f.evidence else ""
        out.append(f"{f.rank}. [{f.severity}] {f.title} ({f.rule})  {where}")
        out.append(f"   {f.summary}")
        for e in f.evidence:
            out.append(f"   {e.where()}: {e.text}")
        for fx in f.fixes:
            out.append("   fix:")
            out += [f"     {line}" for line in (fx.command or fx.text).splitlines()]
        leads = f.facts.get("lint.leads_to")
        if leads and leads != "none":
            out.append(f"   if ignored: {leads}")
        out.append("")
    return "\n".join(out).rstrip("\n")
