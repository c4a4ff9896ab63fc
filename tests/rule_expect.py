"""The expectations of the rule fixtures (fixtures/logs/<rule-id>/expect.yaml): reading, writing and
checking them against an explain report. Used by tests/test_rule_fixtures.py and
scripts/rule_expectations.py (which blesses them from the engine's output); docs/rules.md "Fixtures".

A positive fixture's entry says which line(s) the rule must quote (file for folder fixtures, line
number, the start of the quoted text) and, optionally, `first:` a sibling rule meant to rank first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

EXPECT_FILE = "expect.yaml"
TEXT_CHARS = 120  # the start of the quote kept in the file (quotes of long lines are long)


def positive_fixtures(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith("pos-"))


def key_of(fixture: Path) -> str:
    """The expectation key of a fixture: its name, with a trailing / for a folder of rank logs."""
    return fixture.name + ("/" if fixture.is_dir() else "")


def read(folder: Path) -> dict[str, dict]:
    import yaml

    path = folder / EXPECT_FILE
    if not path.is_file():
        return {}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of fixture name -> expectation")
    return data


def _quote_file(evidence_file: str, fixture: Path) -> Optional[str]:
    """The quote's file as written in expect.yaml: None for a single-file fixture, else the path
    inside the fixture folder."""
    if not fixture.is_dir():
        return None
    path = Path(evidence_file)
    try:
        return str(path.resolve().relative_to(fixture.resolve()))
    except ValueError:
        return path.name


def _finding(report: Any, rule_id: str):
    return next((f for f in report.findings if f.rule == rule_id), None)


def _quoted(found: Any, fixture: Path) -> list[tuple]:
    """(file, line, text) of every line a finding quotes."""
    return [(_quote_file(e.file, fixture), e.line, e.text) for e in found.evidence]


def _holds(quote: dict, quoted: list[tuple]) -> bool:
    """The recorded quote is among the lines quoted now (same file and line, the text begins the same)."""
    want_file, want_line, want_text = quote.get("file"), quote.get("line"), str(quote.get("text", ""))
    return any(f == want_file and ln == want_line and text.startswith(want_text) for f, ln, text in quoted)


def observed(report: Any, rule_id: str, fixture: Path, keep: Optional[dict] = None) -> dict:
    """The expectation of a fixture as the engine sees it now (for --bless): the first line the
    rule quotes and, when another rule ranks first, that rule. Recorded quotes the rule still makes
    are kept as they are (a bless that only adds fixtures moves no reviewed quote to another line the
    rule also quotes). Keys of `keep` other than quotes and first (`first_why`, the reviewer's note on
    why the sibling wins) survive."""
    entry: dict = {k: v for k, v in (keep or {}).items() if k not in ("quotes", "first")}
    found = _finding(report, rule_id)
    kept = (keep or {}).get("quotes") or []
    if found is not None and kept and all(_holds(q, _quoted(found, fixture)) for q in kept):
        entry["quotes"] = [dict(q) for q in kept]
    elif found is not None and found.evidence:
        e = found.evidence[0]
        quote: dict = {}
        name = _quote_file(e.file, fixture)
        if name is not None:
            quote["file"] = name
        quote["line"] = e.line
        quote["text"] = e.text[:TEXT_CHARS]
        entry["quotes"] = [quote]
    else:
        entry["quotes"] = []  # does not fire: a failing expectation to review, never a silent pass
    if report.findings and report.findings[0].rule != rule_id:
        entry["first"] = report.findings[0].rule
        # a note for the reviewer (not checked): the engine's own reason, until someone writes a better one
        entry.setdefault("first_why", report.findings[0].why_rank)
    else:
        entry.pop("first_why", None)
    return entry


def write(folder: Path, rule_id: str, entries: dict[str, dict]) -> None:
    import yaml

    head = (f"# What fixtures/logs/{rule_id}/pos-* must produce (docs/rules.md \"Fixtures\"): the lines rule\n"
            f"# {rule_id} quotes, and `first:` where a sibling rule is meant to rank first.\n"
            "# Regenerate: python scripts/rule_expectations.py --bless RULE-ID, then review the diff.\n")
    body = yaml.safe_dump(entries, sort_keys=True, allow_unicode=True, width=200, default_flow_style=None)
    (folder / EXPECT_FILE).write_text(head + body, encoding="utf-8")


def check_fires(report: Any, rule: Any, fixture: Path, expect: Optional[dict]) -> list[str]:
    """Problems with "the rule fires and quotes the marked lines"; [] when it holds."""
    if not expect or not expect.get("quotes"):
        return [f"no expectation with quotes for this fixture in {EXPECT_FILE}"]
    found = _finding(report, rule.id)
    if found is None:
        fired = ", ".join(f.rule for f in report.findings[:5]) or "nothing"
        return [f"rule {rule.id} did not fire (findings: {fired})"]
    problems = []
    quoted = _quoted(found, fixture)
    for q in expect["quotes"]:
        want_file, want_line, want_text = q.get("file"), q.get("line"), str(q.get("text", ""))
        if not _holds(q, quoted):
            shown = "; ".join(f"{f + ':' if f else ''}{ln}: {text[:80]}" for f, ln, text in quoted[:5])
            where = f"{want_file}:" if want_file else ""
            problems.append(f"rule {rule.id} does not quote {where}{want_line} {want_text[:80]!r}; it quotes: {shown}")
    return problems


def check_first(report: Any, rule: Any, fixture: Path, expect: Optional[dict]) -> list[str]:
    """Problems with "this rule (or the sibling named by `first:`) ranks first, naming the rule's
    cause"; [] when it holds."""
    want = (expect or {}).get("first", rule.id)
    if not report.findings:
        return [f"no findings; expected {want} first"]
    top = report.findings[0]
    problems = []
    if top.cause != rule.cause:
        problems.append(f"the first finding is {top.cause} ({top.rule}), not the rule's cause {rule.cause}")
    elif top.rule != want:
        hint = "" if "first" in (expect or {}) else f" (if {top.rule} is meant to win, say `first: {top.rule}` in {EXPECT_FILE})"
        problems.append(f"the first finding is rule {top.rule}, expected {want}{hint}")
    return problems
