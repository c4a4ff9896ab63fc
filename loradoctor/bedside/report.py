"""The bedside report: the log's diagnosis and the timeline's, ranked together, as report.md and
run.svg in the run folder."""

from __future__ import annotations

import os
from typing import Any, Optional

from loradoctor.bedside.diagnose import combine, timeline_findings
from loradoctor.bedside.timeline import Timeline, read_timeline


def explain_with_timeline(paths: list[str], timeline: "str | Timeline", **kw: Any) -> Any:
    """`explain` on the logs, with the timeline's findings ranked in. Returns the ExplainReport."""
    from loradoctor.logs.engine import explain

    tl = timeline if isinstance(timeline, Timeline) else read_timeline(timeline)
    report = explain(paths, **kw) if paths else _empty_report()
    report.findings = combine(report.findings, timeline_findings(tl))
    report.inputs = list(report.inputs) + [{"path": tl.path, "kind": "timeline", "lines": _lines(tl), "bytes": _size(tl.path)}]
    return report


def _empty_report() -> Any:
    from loradoctor.logs.engine import ExplainReport

    return ExplainReport(inputs=[], findings=[])


def _size(path: str) -> Optional[int]:
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def _lines(tl: Timeline) -> int:
    return max([r.get("_line", 0) for r in tl.samples[-1:] + tl.steps[-1:] + tl.events[-1:]] + [(tl.end or {}).get("_line", 0)])


def write_report(out_dir: str, log_path: str, tl_path: str) -> list:
    """Write report.md and run.svg; return the ranked findings."""
    from loradoctor.bedside.picture import svg
    from loradoctor.render import explain_view

    tl = read_timeline(tl_path)
    logs = [log_path] if os.path.exists(log_path) and os.path.getsize(log_path) else []
    report = explain_with_timeline(logs, tl)
    with open(os.path.join(out_dir, "run.svg"), "w", encoding="utf-8") as fh:
        fh.write(svg(tl, report.findings))
    text = explain_view.explain_md(report)
    text = text.replace("## loradoctor explain", "## loradoctor run\n\n![memory, host RAM and utilisation over the run](run.svg)", 1)
    with open(os.path.join(out_dir, "report.md"), "w", encoding="utf-8") as fh:
        fh.write(text)
    return report.findings
