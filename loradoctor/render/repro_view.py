"""Text of repro results and of the repro list (JSON documents are plain data through render.json)."""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from loradoctor.render.text import Painter, plural
from loradoctor.repro.catalog import ReproSpec
from loradoctor.repro.result import STATUSES, ReproResult, overall_status, verdict

VERDICT_STYLE = {"PASS": ("bold", "green"), "NOT REPRODUCED": ("bold", "green"), "FAIL": ("bold", "red"),
                 "CONFIRMED": ("bold", "red"), "SKIPPED": ("yellow",), "ERROR": ("bold", "magenta")}
PASS_EVIDENCE_LINES = 4  # PASS is quiet; FAIL/ERROR show their evidence in full (up to EVIDENCE_LINES)
EVIDENCE_LINES = 16
LIST_SCHEMA = "loradoctor.repro-list/1"


def result_lines(p: Painter, result: ReproResult, kind: str, verbose: bool = False) -> list[str]:
    """One result: verdict, id, summary, duration; then its evidence (and numbers with verbose)."""
    word = verdict(result.status, kind)
    head = p.style(word, *VERDICT_STYLE.get(word, ())) + " " + p.style(result.id, "bold")
    lines = [head + f"  {result.summary} " + p.style(f"({result.duration_s:.1f} s)", "dim")]
    limit = EVIDENCE_LINES if (verbose or result.status in ("FAIL", "ERROR")) else PASS_EVIDENCE_LINES
    for line in result.evidence[:limit]:
        lines += p.para(line, indent=6, style=("dim",))
    if len(result.evidence) > limit:
        lines += p.para(f"... {plural(len(result.evidence) - limit, 'more line')} (-v or --format json shows all)",
                        indent=6, style=("dim",))
    if verbose and result.numbers:
        for key, value in result.numbers.items():
            lines += p.para(json.dumps(value, default=str), indent=6, label=f"{key} =", label_style=("cyan",))
    return lines


def summary_lines(p: Painter, results: Iterable[ReproResult], kinds: Mapping[str, str],
                  verbose: bool = False) -> list[str]:
    """The skipped repros, grouped by reason (one sentence said once), then the overall line."""
    results = list(results)
    lines: list[str] = []
    by_reason: dict[str, list[ReproResult]] = {}
    for r in results:
        if r.status == "SKIP":
            by_reason.setdefault(r.summary, []).append(r)
    for reason, group in by_reason.items():
        ids = ", ".join(r.id for r in group)
        lines += p.para(reason, label=f"SKIPPED {ids}:", label_style=VERDICT_STYLE["SKIPPED"], hang=8)
        if verbose:
            for r in group:
                lines += [f"      {r.id}: {e}" for e in r.evidence[:EVIDENCE_LINES]]
    overall = overall_status(results)
    counts = ", ".join(_count_word(results, kinds, s) for s in STATUSES if any(r.status == s for r in results))
    word = {"PASS": "PASS", "FAIL": "FAIL", "ERROR": "ERROR", "SKIP": "SKIPPED"}[overall]
    if overall == "SKIP":
        tail = "nothing ran here"
    else:
        tail = counts
    lines += ["", p.style(word, *VERDICT_STYLE.get(word, ())) + f" {plural(len(results), 'repro')}: {tail}"]
    return lines


def _count_word(results: list[ReproResult], kinds: Mapping[str, str], status: str) -> str:
    n = sum(1 for r in results if r.status == status)
    words = {"PASS": "passed", "FAIL": "failed", "SKIP": "skipped", "ERROR": "errored"}
    text = f"{n} {words[status]}"
    problems = sum(1 for r in results if r.status == status and kinds.get(r.id) == "problem")
    if problems and status in ("PASS", "FAIL"):
        text += f" ({problems} {'not reproduced' if status == 'PASS' else 'confirmed'})"
    return text


def list_document(specs: Iterable[ReproSpec]) -> dict[str, Any]:
    """`repro list --format json`."""
    return {"schema": LIST_SCHEMA, "repros": [{"id": s.id, "kind": s.kind, "gpu": s.gpu, "checks": s.checks,
                                                "options": dict(s.options)} for s in specs]}


def list_text(specs: Iterable[ReproSpec]) -> str:
    """The table of `loradoctor repro list`."""
    specs = list(specs)
    gpu_words = {"yes": "yes", "no": "no (CPU)", "optional": "uses one if there"}
    rows = [("ID", "NEEDS GPU", "KIND", "WHAT IT CHECKS")]
    for s in specs:
        checks = s.checks + (f"  [options: {', '.join(s.options)}]" if s.options else "")
        rows.append((s.id, gpu_words.get(s.gpu, s.gpu), s.kind, checks))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{a:<{w[0]}}  {b:<{w[1]}}  {c:<{w[2]}}  {d}" for a, b, c, d in rows]
    lines += ["", "Run: loradoctor repro run ID [ID...] | --all | --from explain.json. A check repro says PASS "
              "(works here) or FAIL; a problem repro says CONFIRMED or NOT REPRODUCED for the setup under test "
              "(loradoctor docs repro)."]
    return "\n".join(lines)
