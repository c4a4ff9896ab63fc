"""Text of `loradoctor measure` (schema loradoctor.measure/1 documents, from loradoctor.repro.measure):
the setup, predicted vs measured with the error, and the steps."""

from __future__ import annotations

from typing import Any

from loradoctor.repro.measure import METRICS
from loradoctor.units import gib


def measure_text(report: dict[str, Any]) -> str:
    """The terminal view: setup, predicted vs measured with the error, steps."""
    inp = report["inputs"]
    gc = "on" if inp.get("gradient_checkpointing") else "off"
    quant = f" {inp['quant']}" if inp.get("quant") not in (None, "none") else ""
    lines = [
        f"measure: {inp['model']} {inp['method']}{quant} r{inp.get('rank')} "
        f"{','.join(inp.get('targets') or [])}, batch {inp['batch']} x {inp['seq_len']}, checkpointing {gc}, "
        f"{inp['attn']}, {inp['optim']}, {inp['precision']}",
    ]
    gpu, versions = report.get("gpu"), report.get("versions") or {}
    if gpu:
        lines.append(f"GPU: {gpu['name']} ({gib(gpu['total_bytes'])}); "
                     + ", ".join(f"{k} {v}" for k, v in versions.items() if v))
    status = report["status"]
    if status == "oom":
        lines.append(f"DOES NOT FIT: {report['reason']}")
    elif status != "measured":
        lines.append(f"could not measure: {report['reason']}")
    lines.append("")
    lines.append(f"{'':<20}{'predicted':>12}{'measured':>12}{'error':>9}")
    for key, _, label in METRICS:
        pred, got, err = report["predicted"][key], report["measured"][key], report["error"][key]
        err_text = "" if err is None else f"{err * 100:+.1f}%"
        lines.append(f"{label:<20}{gib(pred):>12}{gib(got) if got is not None else '-':>12}{err_text:>9}")
    low, high = report["band"]
    lines.append(f"{'predicted band':<20}{gib(low) + ' - ' + gib(high):>24}")
    tp = report.get("trainable_params") or {}
    if tp.get("measured") is not None:
        same = "same" if tp["measured"] == tp["predicted"] else f"predicted {tp['predicted']:,}"
        lines.append(f"trainable parameters: {tp['measured']:,} ({same})")
    if report["steps"]:
        times = ", ".join(f"{r['s']:.2f}" for r in report["steps"])
        lines.append(f"steps: {len(report['steps'])} of {report['requested_steps']} ({times} s; the first warms up)")
    lines += report["notes"]
    return "\n".join(lines)
