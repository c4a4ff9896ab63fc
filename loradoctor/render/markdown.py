"""Markdown output, ready to paste into a GitHub issue."""

from __future__ import annotations

from typing import Iterable, Optional

from loradoctor.findings import Finding
from loradoctor.render.text import plain_why, why_label


def finding_md(f: Finding, heading_level: int = 3, verbose: bool = False) -> str:
    h = "#" * heading_level
    out = [f"{h} {f.rank or '-'}. {f.title}", ""]
    out.append(
        f"**cause** `{f.cause}` · **rule** `{f.rule}` · **severity** {f.severity} · "
        f"**confidence** {f.confidence_label} ({f.confidence:.2f})"
    )
    if f.summary:
        out += ["", f.summary]
    if f.why_rank:
        why = f.why_rank if verbose else plain_why(f.why_rank)
        out += ["", f"_{why_label(f).capitalize()}_ {why}"]
    if f.evidence:
        out += ["", "Evidence:", "", "```"]
        out += [f"{e.where()}: {e.text}" for e in f.evidence]
        out += ["```"]
    if f.facts and verbose:  # fact names are the engine's vocabulary: -v only
        out += ["", "Facts: " + ", ".join(f"`{k}={v}`" for k, v in f.facts.items())]
    if f.fixes:
        out += ["", "Fixes, in order:", ""]
        for i, fix in enumerate(f.fixes, 1):
            out.append(f"{i}. {fix.text}")
            if fix.command:  # a fenced block keeps a multi-line command's indentation and pastes as is
                out += ["", "   ```"] + [f"   {c}" for c in fix.command.splitlines()] + ["   ```"]
    if f.repro:
        out += ["", f"Confirm on this machine: `loradoctor repro run {f.repro}`"]
    return "\n".join(out)


def findings_md(findings: Iterable[Finding], title: str, preamble: Optional[str] = None, verbose: bool = False) -> str:
    findings = list(findings)
    out = [f"## {title}", ""]
    if preamble:
        out += [preamble, ""]
    if not findings:
        out.append("No findings.")
    for f in findings:
        out += [finding_md(f, verbose=verbose), ""]
    out.append("_Report by loradoctor._")
    return "\n".join(out) + "\n"
