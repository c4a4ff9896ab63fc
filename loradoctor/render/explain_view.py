"""Views of `loradoctor explain` and `loradoctor rules`: text, Markdown and JSON of an ExplainReport,
and the rule library listings. Each returns a string; the command writes it (render.output).

A finding's own layout is shared (render/text.py for text, render/markdown.py); this module adds what
only explain has: the one-line verdict, the inputs line, and the tail for a log nothing recognised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

from loradoctor.findings import Evidence, Finding
from loradoctor.render import markdown as md_render
from loradoctor.render.text import Painter, evidence_lines, finding_lines, plural
from loradoctor.units import format_bytes

if TYPE_CHECKING:  # the engine is imported only by the commands that run it (start-up)
    from loradoctor.logs.engine import ExplainReport
    from loradoctor.logs.rules import Rule

RULES_HINT = ("If this is a real failure, a rule for it helps everyone: `loradoctor docs rules` says how to write "
              "one, and `loradoctor explain --rules DIR` adds your own rules.")


def verdict_line(report: "ExplainReport") -> str:
    """'Most likely: <title> (<cause>, confidence high)', the finished-run line, or 'nothing recognised'."""
    found = report.diagnoses()
    if found:
        top = found[0]
        return f"Most likely: {top.title} ({top.cause}, confidence {top.confidence_label})"
    if report.finished:
        return "The run finished without a failure: the trainer's end-of-training record (train_runtime) is there and no rule matched a failure."
    return "Nothing recognised: no rule matched a known LoRA/QLoRA failure."


def _input_label(inp: dict[str, Any]) -> str:
    parts = []
    if inp.get("bytes") is not None:
        parts.append(format_bytes(inp["bytes"]))
    if inp.get("lines") is not None:
        parts.append(plural(int(inp["lines"]), "line"))
    if inp.get("compressed"):
        parts.append(str(inp["compressed"]) if isinstance(inp["compressed"], str) else "compressed")
    ranks = inp.get("ranks")
    if ranks:
        parts.append(("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in ranks))
    name = str(inp.get("path") or "stdin")
    return f"{name} ({', '.join(parts)})" if parts else name


def inputs_line(inputs: Sequence[dict[str, Any]], max_listed: int = 4) -> str:
    """'Read crash.log (1.20 MiB, 10,234 lines)'; long lists are shortened with a count."""
    if not inputs:
        return "Read nothing."
    labels = [_input_label(i) for i in inputs[:max_listed]]
    more = len(inputs) - max_listed
    text = "; ".join(labels)
    if more > 0:
        total_lines = sum(int(i.get("lines") or 0) for i in inputs)
        text += f"; and {plural(more, 'more file')} ({plural(total_lines, 'line')} in all)"
    return f"Read {len(inputs)} files: {text}" if len(inputs) > 1 else f"Read {text}"


def input_notes(inputs: Sequence[dict[str, Any]]) -> list[str]:
    """What the engine skipped, per input (a rule past its regex time budget)."""
    return [f"{i.get('path')}: {note}" for i in inputs for note in i.get("notes") or ()]


def _limit(findings: Sequence[Finding], top: Optional[int]) -> list[Finding]:
    return list(findings) if top is None else list(findings)[: max(0, top)]


# ---------------------------------------------------------------------------- text


def explain_text(report: "ExplainReport", painter: Painter, verbose: bool = False, top: Optional[int] = None) -> str:
    """The explain report as text: verdict, inputs, the best diagnosis in full, the rest briefly."""
    p = painter
    findings = list(report.findings)
    found = report.diagnoses()
    out = p.para(verdict_line(report), style=("bold",), hang=2)
    out += p.para(inputs_line(report.inputs), style=("dim",), hang=2)
    for note in input_notes(report.inputs):
        out += p.para(f"Note: {note}", style=("yellow",), hang=2)
    out.append("")

    if not found:
        if not report.finished:
            out += _unrecognised_lines(p, report.unrecognised_tail)
        notes = _limit(findings, top)
        if notes:
            out.append(p.style("Notes (informational, not a diagnosis):", "dim"))
            for f in notes:
                out += finding_lines(p, f, brief=not verbose, verbose=verbose)
        return "\n".join(out).rstrip("\n")

    shown = _limit(findings, top)
    best = found[0]
    briefly = 0
    for f in shown:
        full = verbose or f is best
        out += finding_lines(p, f, brief=not full, verbose=verbose)
        if f is best and f.differential:
            out.append("   " + p.style("could also be", "bold") + " (the differential):")
            for line in differential_lines(f):
                out += p.para(line, indent=5)
        if full:
            out.append("")
        else:
            briefly += 1
    hidden = len(findings) - len(shown)
    if briefly and not verbose:
        out += p.para(f"{plural(briefly, 'more finding')} shown briefly; -v shows all evidence and fixes.",
                      style=("dim",))
    if hidden > 0:
        out += p.para(f"{plural(hidden, 'lower-ranked finding')} not shown (--top {top}); drop --top to see them.",
                      style=("dim",))
    return "\n".join(out).rstrip("\n")


def differential_lines(verdict: Finding) -> list[str]:
    """One line per look-alike of the verdict: rank, cause, confidence, what tells them apart."""
    return [f"#{d['rank']} {d['cause']} ({d['confidence_label']}): {d['tells_apart']}" for d in verdict.differential]


def _unrecognised_lines(p: Painter, tail: Sequence[Evidence]) -> list[str]:
    out: list[str] = []
    if tail:
        out.append("Last error-looking lines:")
        for e in tail:
            out += evidence_lines(p, e.where(), e.text)
    else:
        out.append("No error-looking lines either: the log may be cut off before the failure.")
    out.append("")
    out += p.para(RULES_HINT, style=("dim",))
    return out


# ---------------------------------------------------------------------------- JSON / Markdown


def explain_md(report: "ExplainReport", top: Optional[int] = None, verbose: bool = False) -> str:
    """A report ready to paste into an issue."""
    findings = _limit(report.findings, top)
    pre = [f"**{verdict_line(report)}**", ""]
    pre.append("Inputs:")
    pre.append("")
    pre += [f"- `{_input_label(i).replace(chr(96), chr(39))}`" for i in report.inputs] or ["- (none)"]
    notes = input_notes(report.inputs)
    if notes:
        pre += [""] + [f"Note: {n}" for n in notes]
    found = report.diagnoses()
    if found and found[0].differential:
        pre += ["", "Could also be (the differential):", ""]
        pre += [f"- {line}" for line in differential_lines(found[0])]
    if not found and not report.finished:
        pre += ["", "Last error-looking lines:", "", "```"]
        pre += [f"{e.where()}: {e.text}" for e in report.unrecognised_tail] or ["(none)"]
        pre += ["```"]
    return md_render.findings_md(findings, "loradoctor explain", preamble="\n".join(pre), verbose=verbose)


# ---------------------------------------------------------------------------- rules


def rules_table(rules: Sequence["Rule"]) -> str:
    """Plain aligned columns (grep-friendly): id, cause, severity, title."""
    rows = [("ID", "CAUSE", "SEVERITY", "TITLE")] + [(r.id, r.cause, r.severity, r.title) for r in rules]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    lines = [f"{a:<{w0}}  {b:<{w1}}  {c:<{w2}}  {d}" for a, b, c, d in rows]
    lines.append(plural(len(rules), "rule"))
    return "\n".join(lines)


def rule_doc(rule: "Rule") -> str:
    """Everything a person needs to understand one rule (`loradoctor rules show ID`)."""
    from loradoctor.findings import confidence_label

    out = [f"{rule.id}: {rule.title}", ""]
    out.append(f"cause       {rule.cause}")
    out.append(f"severity    {rule.severity}")
    out.append(f"confidence  {confidence_label(rule.confidence)} ({rule.confidence:.2f})")
    if rule.generic:
        out.append("generic     yes (a catch-all: never ranked first over a specific finding)")
    if rule.source:
        out.append(f"defined in  {_relative(rule.source)}")
    docs = rule.docs.strip()
    out += ["", "What it means:", _indent(docs or "(no docs written for this rule)")]
    out += ["", "Patterns (a line matching any one is a hit):"]
    out += [f"  {p}" for p in rule.patterns] or ["  (none: fires on its condition alone)"]
    for label, values in (("Also required somewhere in the input", rule.require_all),
                          ("Silent if any of these match", rule.exclude)):
        if values:
            out += ["", f"{label}:"] + [f"  {v}" for v in values]
    if rule.when:
        out += ["", "Condition (when):", f"  {rule.when}"]
    if rule.consequence_of:
        out += ["", "A consequence of (ranked after): " + ", ".join(rule.consequence_of)]
    if rule.outranks:
        out += ["", "Ranks above, when both fire (outranks): " + ", ".join(rule.outranks)
                + (f" ({rule.outranks_reason})" if rule.outranks_reason else "")]
    out += ["", "Fixes, in order:"]
    for i, fix in enumerate(rule.fixes, 1):
        out.append(f"  {i}. {fix.text}")
        if fix.command:
            out += [f"       {line}" for line in fix.command.splitlines()]
        when = rule.fix_when[i - 1] if i <= len(rule.fix_when) else None
        unless = rule.fix_unless[i - 1] if i <= len(rule.fix_unless) else None
        if when:
            out.append(f"       (offered only when: {when})")
        if unless:
            out.append(f"       (left out when: {unless})")
    if not rule.fixes:
        out.append("  (none)")
    out += ["", "Confirm on this machine: " + (f"loradoctor repro run {rule.repro}" if rule.repro else "(no repro test)")]
    if rule.falsepositives.strip():
        out += ["", "False positives:", _indent(rule.falsepositives.strip())]
    if rule.references:
        out += ["", "References:"] + [f"  {r}" for r in rule.references]
    return "\n".join(out) + "\n"


def _relative(path: str) -> str:
    """A path relative to the working directory when it lies inside it (shorter to read)."""
    import os

    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path
    return path if rel.startswith("..") else rel


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line if line else line for line in text.splitlines())
