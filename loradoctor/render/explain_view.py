"""Views specific to `loradoctor explain` and `loradoctor rules`.

The findings themselves are drawn by the shared renderers (render/terminal.py, markdown.py,
json.py); this module adds what only explain has: the one-line verdict, the inputs line, the
"nothing recognised" tail, and the rule library listings.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

from loradoctor.findings import Evidence, Finding
from loradoctor.render import json as json_render
from loradoctor.render import markdown as md_render
from loradoctor.render import terminal
from loradoctor.units import format_bytes

EXPLAIN_SCHEMA = "loradoctor.explain/1"
DIAGNOSIS_SEVERITIES = ("error", "warning")


def diagnoses(findings: Iterable[Finding]) -> list[Finding]:
    """Findings that count as a diagnosis (severity warning or error), best first."""
    return [f for f in findings if f.severity in DIAGNOSIS_SEVERITIES]


def verdict_line(findings: Sequence[Finding]) -> str:
    """'Most likely: <title> (<cause>, confidence high)' or the plain 'nothing recognised' line."""
    found = diagnoses(findings)
    if not found:
        return "Nothing recognised: no rule matched a known LoRA/QLoRA failure."
    top = found[0]
    return f"Most likely: {top.title} ({top.cause}, confidence {top.confidence_label})"


def _input_label(inp: dict[str, Any]) -> str:
    parts = []
    if inp.get("bytes") is not None:
        parts.append(format_bytes(inp["bytes"]))
    if inp.get("lines") is not None:
        parts.append(f"{inp['lines']:,} lines")
    if inp.get("compressed"):
        parts.append(str(inp["compressed"]) if isinstance(inp["compressed"], str) else "compressed")
    ranks = inp.get("ranks")
    if ranks:
        parts.append(("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in ranks))
    name = str(inp.get("path", "?"))
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
        text += f"; and {more} more file(s) ({total_lines:,} lines in all)"
    noun = "file" if len(inputs) == 1 else f"{len(inputs)} files"
    return f"Read {noun}: {text}" if len(inputs) > 1 else f"Read {text}"


def _input_dicts(inputs: Iterable[Any]) -> list[dict[str, Any]]:
    """Inputs as plain dicts, whether the engine gives dicts or reader.Input objects."""
    return [i.to_dict() if hasattr(i, "to_dict") else dict(i) for i in inputs]


def _limit(findings: Sequence[Finding], top: Optional[int]) -> list[Finding]:
    return list(findings) if top is None else list(findings)[: max(0, top)]


# ---------------------------------------------------------------------------- terminal


def print_explain(con: Any, report: Any, verbose: bool = False, top: Optional[int] = None) -> None:
    """The explain report on a terminal: verdict, inputs, the best diagnosis in full, the rest briefly."""
    from rich.markup import escape

    findings = list(report.findings)
    found = diagnoses(findings)
    con.print(f"[bold]{escape(verdict_line(findings))}[/]")
    con.print(f"[dim]{escape(inputs_line(_input_dicts(report.inputs)))}[/]")
    con.print()

    if not found:
        _print_unrecognised(con, report.unrecognised_tail)
        notes = _limit(findings, top)
        if notes:
            con.print("[dim]Notes (informational, not a diagnosis):[/]")
            for f in notes:
                terminal.print_finding(con, f, brief=not verbose)
        return

    shown = _limit(findings, top)
    best = found[0]
    briefly = 0
    for f in shown:
        full = verbose or f is best
        terminal.print_finding(con, f, brief=not full)
        if f is best and f.differential:
            con.print("   [bold]could also be[/] (the differential):")
            for line in differential_lines(f):
                con.print(f"     {escape(line)}")
        if full:
            con.print()
        else:
            briefly += 1
    hidden = len(findings) - len(shown)
    if briefly and not verbose:
        con.print(f"[dim]{briefly} more finding(s) shown briefly; -v shows all evidence and fixes.[/]")
    if hidden > 0:
        con.print(f"[dim]{hidden} lower-ranked finding(s) not shown (--top {top}); drop --top to see them.[/]")


def differential_lines(verdict: Finding) -> list[str]:
    """One line per look-alike of the verdict: rank, cause, confidence, what tells them apart."""
    return [f"#{d['rank']} {d['cause']} ({d['confidence_label']}): {d['tells_apart']}" for d in verdict.differential]


def _print_unrecognised(con: Any, tail: Sequence[Evidence]) -> None:
    from rich.markup import escape

    if tail:
        con.print("Last error-looking lines:")
        for e in tail:
            con.print(f"   [dim]{escape(e.where())}[/] {escape(e.text)}")
        con.print()
    else:
        con.print("No error-looking lines either: the log may be cut off before the failure.")
        con.print()
    con.print(
        "[dim]If this is a real failure, a rule for it helps everyone: see docs/rules.md; "
        "`loradoctor explain --rules DIR` adds your own rules.[/]"
    )


# ---------------------------------------------------------------------------- JSON / Markdown


def explain_document(report: Any, top: Optional[int] = None) -> dict[str, Any]:
    """The JSON contract: exactly schema, inputs, findings (ranked best first)."""
    return {
        "schema": EXPLAIN_SCHEMA,
        "inputs": _input_dicts(report.inputs),
        "findings": json_render.findings_data(_limit(report.findings, top)),
    }


def explain_json(report: Any, top: Optional[int] = None) -> str:
    return json_render.dumps(explain_document(report, top))


def explain_md(report: Any, top: Optional[int] = None) -> str:
    """A report ready to paste into an issue."""
    findings = _limit(report.findings, top)
    pre = [f"**{verdict_line(report.findings)}**", ""]
    pre.append("Inputs:")
    pre.append("")
    pre += [f"- `{_input_label(i).replace(chr(96), chr(39))}`" for i in _input_dicts(report.inputs)] or ["- (none)"]
    found = diagnoses(report.findings)
    if found and found[0].differential:
        pre += ["", "Could also be (the differential):", ""]
        pre += [f"- {line}" for line in differential_lines(found[0])]
    if not found:
        pre += ["", "Last error-looking lines:", "", "```"]
        pre += [f"{e.where()}: {e.text}" for e in report.unrecognised_tail] or ["(none)"]
        pre += ["```"]
    return md_render.findings_md(findings, "loradoctor explain", preamble="\n".join(pre))


# ---------------------------------------------------------------------------- rules


def _attr(rule: Any, name: str, default: Any = None) -> Any:
    value = getattr(rule, name, default)
    return default if value is None else value


def _fix_parts(fix: Any) -> tuple[str, Optional[str]]:
    if isinstance(fix, dict):
        return str(fix.get("text", "")), fix.get("command")
    if isinstance(fix, str):
        return fix, None
    return str(getattr(fix, "text", fix)), getattr(fix, "command", None)


def _confidence_text(value: Any) -> str:
    from loradoctor.findings import confidence_label, confidence_value

    try:
        number = confidence_value(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{confidence_label(number)} ({number:.2f})"


def rule_summary(rule: Any) -> dict[str, Any]:
    """One rule as plain data for `rules list --format json`."""
    return {
        "id": rule.id,
        "cause": rule.cause,
        "severity": rule.severity,
        "confidence": _attr(rule, "confidence"),
        "title": rule.title,
        "repro": _attr(rule, "repro"),
        "generic": bool(_attr(rule, "generic", False)),
        "source": str(_attr(rule, "source", "") or _attr(rule, "path", "") or "") or None,
    }


def rules_table(rules: Sequence[Any]) -> str:
    """Plain aligned columns (grep-friendly): id, cause, severity, title."""
    rows = [("ID", "CAUSE", "SEVERITY", "TITLE")] + [(r.id, r.cause, r.severity, r.title) for r in rules]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    lines = [f"{a:<{w0}}  {b:<{w1}}  {c:<{w2}}  {d}" for a, b, c, d in rows]
    lines.append(f"{len(rules)} rules")
    return "\n".join(lines)


def rule_doc(rule: Any) -> str:
    """Everything a person needs to understand one rule (`loradoctor rules show ID`)."""
    out = [f"{rule.id}: {rule.title}", ""]
    out.append(f"cause       {rule.cause}")
    out.append(f"severity    {rule.severity}")
    out.append(f"confidence  {_confidence_text(_attr(rule, 'confidence', '?'))}")
    if _attr(rule, "generic", False):
        out.append("generic     yes (a catch-all: never ranked first over a specific finding)")
    source = _attr(rule, "source", None) or _attr(rule, "path", None)
    if source:
        out.append(f"defined in  {_relative(str(source))}")
    docs = str(_attr(rule, "docs", "") or "").strip()
    out += ["", "What it means:", _indent(docs or "(no docs written for this rule)")]
    patterns = list(_attr(rule, "patterns", []) or [])
    out += ["", "Patterns (a line matching any one is a hit):"]
    out += [f"  {p}" for p in patterns] or ["  (none: fires on its condition alone)"]
    for label, name in (("Also required somewhere in the input", "require_all"), ("Silent if any of these match", "exclude")):
        values = list(_attr(rule, name, []) or [])
        if values:
            out += ["", f"{label}:"] + [f"  {v}" for v in values]
    when = _attr(rule, "when", None)
    if when:
        out += ["", "Condition (when):", f"  {when}"]
    consequence_of = list(_attr(rule, "consequence_of", []) or [])
    if consequence_of:
        out += ["", "A consequence of (ranked after): " + ", ".join(consequence_of)]
    fixes = list(_attr(rule, "fixes", []) or [])
    out += ["", "Fixes, in order:"]
    for i, fix in enumerate(fixes, 1):
        text, command = _fix_parts(fix)
        out.append(f"  {i}. {text}")
        if command:
            out.append(f"       {command}")
    if not fixes:
        out.append("  (none)")
    repro = _attr(rule, "repro", None)
    out += ["", "Confirm on this machine: " + (f"loradoctor repro run {repro}" if repro else "(no repro test)")]
    falsepositives = str(_attr(rule, "falsepositives", "") or "").strip()
    if falsepositives:
        out += ["", "False positives:", _indent(falsepositives)]
    references = list(_attr(rule, "references", []) or [])
    if references:
        out += ["", "References:"] + [f"  {r}" for r in references]
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
