"""The result of one repro (schema `loradoctor.repro/1`) and of a run of several (`loradoctor.repro-run/1`)."""

from __future__ import annotations

from loradoctor.record import asdict, field, record
from typing import Any, Iterable, Optional

SCHEMA = "loradoctor.repro/1"
RUN_SCHEMA = "loradoctor.repro-run/1"
STATUSES = ("PASS", "FAIL", "SKIP", "ERROR")


@record
class ReproResult:
    """PASS: the suspected problem is absent; FAIL: reproduced (evidence says how); SKIP: cannot run
    here (summary says why); ERROR: the repro itself could not complete."""

    id: str
    status: str
    summary: str
    evidence: list[str] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    python: Optional[str] = None
    torch: Optional[str] = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ReproResult":
        known = {k: v for k, v in data.items() if k in cls.__record_fields__}
        known["evidence"] = [str(e) for e in known.get("evidence") or []]
        known["numbers"] = dict(known.get("numbers") or {})
        return cls(**known)


def overall_status(results: Iterable[ReproResult]) -> str:
    """FAIL if any failed, else ERROR if any errored, else SKIP if nothing ran (every repro skipped, or
    none at all), else PASS (a skip beside a pass counts as nothing wrong seen)."""
    statuses = {r.status for r in results}
    if "FAIL" in statuses:
        return "FAIL"
    if "ERROR" in statuses:
        return "ERROR"
    if statuses <= {"SKIP"}:
        return "SKIP"
    return "PASS"


def exit_code(results: Iterable[ReproResult]) -> int:
    """0 when everything is PASS or SKIP, 1 when anything FAILed or ERRORed."""
    return 0 if overall_status(results) in ("PASS", "SKIP") else 1


def verdict(status: str, kind: str) -> str:
    """What a status means for a repro of this kind (catalog.KINDS): a check PASSes or FAILs; a problem
    repro is CONFIRMED (FAIL: the problem reproduces) or NOT REPRODUCED (PASS); SKIPPED when it did not run."""
    if status == "SKIP":
        return "SKIPPED"
    if kind == "problem":
        return {"FAIL": "CONFIRMED", "PASS": "NOT REPRODUCED"}.get(status, status)
    return status


def run_document(results: list[ReproResult]) -> dict[str, Any]:
    """What `loradoctor repro run --format json` prints."""
    counts = {s: sum(1 for r in results if r.status == s) for s in STATUSES}
    return {"schema": RUN_SCHEMA, "status": overall_status(results), "counts": counts,
            "results": [r.to_dict() for r in results]}
