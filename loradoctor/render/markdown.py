"""Markdown output, ready to paste into a GitHub issue."""

from __future__ import annotations

from typing import Iterable, Optional

from loradoctor.findings import Finding


def _md_escape_inline(text: str) -> str:
    return text.replace("`", "'")


def finding_md(f: Finding, heading_level: int = 3) -> str:
    h = "#" * heading_level
    out = [f"{h} {f.rank or '-'}. {f.title}", ""]
    out.append(
        f"**cause** `{f.cause}` · **rule** `{f.rule}` · **severity** {f.severity} · "
        f"**confidence** {f.confidence_label} ({f.confidence:.2f})"
    )
    if f.summary:
        out += ["", f.summary]
    if f.why_rank:
        out += ["", f"_Why this rank:_ {f.why_rank}"]
    if f.evidence:
        out += ["", "Evidence:", "", "```"]
        out += [f"{e.where()}: {e.text}" for e in f.evidence]
        out += ["```"]
    if f.facts:
        out += ["", "Facts: " + ", ".join(f"`{k}={v}`" for k, v in f.facts.items())]
    if f.fixes:
        out += ["", "Fixes, in order:", ""]
        for i, fix in enumerate(f.fixes, 1):
            line = f"{i}. {fix.text}"
            if fix.command:
                line += f" `{_md_escape_inline(fix.command)}`"
            out.append(line)
    if f.repro:
        out += ["", f"Confirm on this machine: `loradoctor repro run {f.repro}`"]
    return "\n".join(out)


def findings_md(findings: Iterable[Finding], title: str, preamble: Optional[str] = None) -> str:
    findings = list(findings)
    out = [f"## {title}", ""]
    if preamble:
        out += [preamble, ""]
    if not findings:
        out.append("No findings.")
    for f in findings:
        out += [finding_md(f), ""]
    out.append("_Report by loradoctor._")
    return "\n".join(out) + "\n"
