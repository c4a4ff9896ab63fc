"""`loradoctor env`: probe the machine into a snapshot (probes/), judge it with pure checks (checks.py).

Public API (others call these):
    collect_snapshot(deep=False, quick=False, timeout_s=None) -> dict   the live snapshot
    loradoctor.env.checks.run_checks(snapshot) -> list[Finding]          pure
    loradoctor.env.snapshot.load_snapshot(path) -> dict                  saved JSON or pasted reports
"""

from __future__ import annotations

from typing import Any, Iterable, Optional


def collect_snapshot(deep: bool = False, quick: bool = False, timeout_s: Optional[float] = None,
                     want: Optional[Iterable[str]] = None, python: Optional[str] = None,
                     fresh: bool = False) -> dict[str, Any]:
    """Probe this machine. `quick` (used by preflight and `explain --env live`) skips the bitsandbytes and
    flash-attn children and uses a short torch timeout; `deep` adds a tiny bf16/fp16 matmul per GPU.
    `want` records requested features (bf16, fp16, flash-attn, bnb) for the checks. `python` probes another
    interpreter (a training venv) instead of this one. `fresh` ignores remembered healthy child-probe results
    (probes/remember.py). Never raises for a failing probe: that section becomes
    {"error": "could not check: ..."}."""
    import datetime as _dt  # here: `explain` imports this package for env.facts only

    from loradoctor import __version__
    from loradoctor.env.probes import collect
    from loradoctor.env.snapshot import SNAPSHOT_SCHEMA

    started = _dt.datetime.now(_dt.timezone.utc)
    sections = collect(deep=deep, quick=quick, timeout_s=timeout_s, python=python, fresh=fresh)
    snap: dict[str, Any] = {"schema": SNAPSHOT_SCHEMA}
    snap["meta"] = {
        "source": "live",
        "created": started.isoformat(timespec="seconds"),
        "loradoctor_version": __version__,
        "deep": deep,
        "quick": quick,
        "elapsed_s": sections.pop("_elapsed_s"),
        "probe_times_s": sections.pop("_probe_times_s"),
    }
    for key in ("system", "nvidia", "torch", "packages", "env_vars", "bitsandbytes", "flash_attn"):
        if key in sections:
            snap[key] = sections[key]
    if want:
        snap["requested"] = {"features": sorted(set(want)), "source": "--want"}
    return snap


__all__ = ["collect_snapshot"]
