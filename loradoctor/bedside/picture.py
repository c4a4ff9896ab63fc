"""A picture of a run as one self-contained SVG (no dependency): GPU memory (this run / others),
allocated memory per step when the callback recorded it, host RSS, GPU utilisation, and the
moment of failure."""

from __future__ import annotations

from html import escape
from typing import Optional

from loradoctor.bedside.timeline import Timeline
from loradoctor.units import GIB

W, H, PAD, ROW = 900, 520, 60, 140


def _poly(points: list[tuple[float, float]], color: str, width: float = 1.5, dash: str = "") -> str:
    if len(points) < 2:
        return ""
    d = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    extra = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<polyline fill="none" stroke="{color}" stroke-width="{width}"{extra} points="{d}"/>'


def _panel(title: str, top: float, series: list[tuple[str, str, list[tuple[float, float]]]], t0: float, t1: float,
           ymax: float, unit: str, fail_t: Optional[float]) -> list[str]:
    span = max(t1 - t0, 1e-9)
    ymax = ymax or 1.0
    x = lambda t: PAD + (W - 2 * PAD) * (t - t0) / span  # noqa: E731
    y = lambda v: top + ROW - ROW * min(v, ymax) / ymax  # noqa: E731
    out = [f'<text x="{PAD}" y="{top - 8}" font-size="13" font-weight="bold">{escape(title)}</text>',
           f'<rect x="{PAD}" y="{top}" width="{W - 2 * PAD}" height="{ROW}" fill="none" stroke="#ccc"/>',
           f'<text x="{PAD - 6}" y="{top + 10}" font-size="10" text-anchor="end">{ymax:.1f}{escape(unit)}</text>',
           f'<text x="{PAD - 6}" y="{top + ROW}" font-size="10" text-anchor="end">0</text>']
    lx = W - PAD
    for label, color, pts in series:
        out.append(_poly([(x(t), y(v)) for t, v in pts], color))
        if pts:
            out.append(f'<text x="{lx}" y="{top - 8}" font-size="11" fill="{color}" text-anchor="end">{escape(label)}</text>')
            lx -= 9 * len(label) + 12
    if fail_t is not None:
        out.append(f'<line x1="{x(fail_t):.1f}" y1="{top}" x2="{x(fail_t):.1f}" y2="{top + ROW}" stroke="#d00" stroke-width="2"/>')
    return out


def svg(tl: Timeline, findings: list = ()) -> str:
    times = [r["t"] for r in tl.samples + tl.steps if isinstance(r.get("t"), (int, float))]
    t0, t1 = (min(times), max(times)) if times else (0.0, 1.0)
    used, ours, others, util, rss, alloc = [], [], [], [], [], []
    for r in tl.samples:
        t = r["t"]
        for g in (r.get("gpus") or [])[:1]:
            if g.get("used_bytes") is not None:
                used.append((t, g["used_bytes"] / GIB))
            procs = g.get("procs") or []
            if procs:
                mine = sum(p.get("used_bytes") or 0 for p in procs if p.get("ours"))
                ours.append((t, mine / GIB))
                others.append((t, sum(p.get("used_bytes") or 0 for p in procs if not p.get("ours")) / GIB))
            if g.get("util_pct") is not None:
                util.append((t, float(g["util_pct"])))
        host = r.get("host") or {}
        if host.get("rss_bytes"):
            rss.append((t, host["rss_bytes"] / GIB))
    for r in tl.steps:
        if isinstance(r.get("allocated_bytes"), (int, float)):
            alloc.append((r["t"], r["allocated_bytes"] / GIB))
    card = (tl.card_bytes() or 0) / GIB
    fail_t = None
    end = tl.end or {}
    if end.get("exit_code") not in (None, 0) or end.get("signal"):
        fail_t = end.get("t")
    for e in tl.events:
        if e.get("name") == "exception":
            fail_t = e.get("t")
    top = next((f for f in findings if getattr(f, "severity", "") in ("error", "warning")), None)
    caption = f"{top.cause}: {top.title}" if top is not None else ("finished" if fail_t is None else "failed")
    mem_max = max([card] + [v for _, v in used + ours + alloc]) if (used or alloc or card) else 1.0
    rss_max = max([v for _, v in rss] + [(tl.meta.get("host_ram_bytes") or 0) / GIB]) if rss else 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">',
             '<rect width="100%" height="100%" fill="white"/>',
             f'<text x="{PAD}" y="24" font-size="15">{escape(caption[:110])}</text>']
    parts += _panel("GPU memory (GiB)", 60, [("used (all)", "#888", used), ("this run", "#1f77b4", ours),
                                             ("others", "#d62728", others), ("allocated", "#2ca02c", alloc)],
                    t0, t1, mem_max, "", fail_t)
    parts += _panel("host RSS of the run (GiB)", 60 + ROW + 40, [("RSS", "#9467bd", rss)], t0, t1, rss_max, "", fail_t)
    parts += _panel("GPU utilisation (%)", 60 + 2 * (ROW + 40), [("util", "#ff7f0e", util)], t0, t1, 100.0, "", fail_t)
    minutes = (t1 - t0) / 60
    parts.append(f'<text x="{W - PAD}" y="{H - 8}" font-size="10" text-anchor="end">{minutes:.1f} min</text>')
    parts.append("</svg>")
    return "\n".join(p for p in parts if p) + "\n"
