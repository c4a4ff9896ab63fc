"""The shared vocabulary of loradoctor: one Finding type used by every command.

A Finding names a root cause (an id from docs/causes.md), the rule or check that produced
it, how bad it is (severity), how sure we are (confidence), the evidence lines it rests on
(file:line + text), the numbers (facts), ordered fixes a person can paste, and a repro id.
Findings round-trip through plain dicts so they travel as JSON.
"""

from __future__ import annotations

from loradoctor.record import asdict, field, record
from typing import Any, Iterable, Optional

SEVERITIES = ("error", "warning", "info")
SEVERITY_WEIGHT = {"error": 3, "warning": 2, "info": 1}

# Confidence is a number in [0, 1]; its label is what people read.
CONFIDENCE_LABELS = ((0.8, "high"), (0.5, "medium"), (0.25, "low"), (0.0, "guess"))
CONFIDENCE_VALUES = {"high": 0.9, "medium": 0.65, "low": 0.4, "guess": 0.2}
# The levels a rule's confidence may take (docs/rules.md says what each means); `rules lint` refuses
# others. Confidence says how sure a rule is, never which of two sibling rules wins: that is `outranks`.
CONFIDENCE_LEVELS = (0.95, 0.9, 0.8, 0.7, 0.65, 0.6, 0.5, 0.4, 0.3, 0.2)


def confidence_label(value: float) -> str:
    """'high' / 'medium' / 'low' / 'guess' for a confidence in [0, 1]."""
    for floor, label in CONFIDENCE_LABELS:
        if value >= floor:
            return label
    return "guess"


def confidence_value(value: "float | str") -> float:
    """Accept 0.7 or 'medium'; return a float in [0, 1]."""
    if isinstance(value, str):
        if value not in CONFIDENCE_VALUES:
            raise ValueError(f"unknown confidence {value!r}; use one of {', '.join(CONFIDENCE_VALUES)} or a number")
        return CONFIDENCE_VALUES[value]
    return max(0.0, min(1.0, float(value)))


@record
class Evidence:
    """One quoted input line. line is 1-based; None when the evidence is not a line (a probe value)."""

    file: str
    line: Optional[int]
    text: str

    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else self.file


@record
class Fix:
    """One remedy, in the order a person should try them. command is pasteable (shell or config line)."""

    text: str
    command: Optional[str] = None


@record
class Finding:
    cause: str
    rule: str
    severity: str
    confidence: float
    title: str
    summary: str = ""
    evidence: list[Evidence] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    fixes: list[Fix] = field(default_factory=list)
    repro: Optional[str] = None
    references: list[str] = field(default_factory=list)
    rank: int = 0
    why_rank: str = ""
    consequence_of: Optional[str] = None  # rule id of the finding this one is a consequence of
    area: str = ""  # grouping for reports (env: "gpu", "torch", ...; logs: cause family)
    # the verdict's look-alikes (explain): cause, confidence, rank, evidence, what tells them apart
    differential: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")
        self.confidence = confidence_value(self.confidence)

    @property
    def confidence_label(self) -> str:
        return confidence_label(self.confidence)

    @property
    def is_guess(self) -> bool:
        return self.confidence_label == "guess"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["confidence"] = round(self.confidence, 3)
        data["confidence_label"] = self.confidence_label
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Finding":
        known = {k: v for k, v in data.items() if k in cls.__record_fields__}
        known["evidence"] = [Evidence(**e) for e in data.get("evidence", [])]
        known["fixes"] = [Fix(**f) if isinstance(f, dict) else Fix(text=str(f)) for f in data.get("fixes", [])]
        return cls(**known)


def sort_key(f: Finding) -> tuple:
    """Default order: root causes before consequences, then severity, then confidence."""
    return (f.consequence_of is not None, -SEVERITY_WEIGHT[f.severity], -f.confidence)


def assign_ranks(findings: Iterable[Finding]) -> list[Finding]:
    """Sort with sort_key (stable) and number the findings 1..n. Engines that rank with more
    knowledge (the log engine) sort themselves and call this only for the numbering."""
    ordered = sorted(findings, key=sort_key)
    for i, f in enumerate(ordered, 1):
        f.rank = i
    return ordered


def worst_severity(findings: Iterable[Finding]) -> Optional[str]:
    worst = None
    for f in findings:
        if worst is None or SEVERITY_WEIGHT[f.severity] > SEVERITY_WEIGHT[worst]:
            worst = f.severity
    return worst


def exit_code(findings: Iterable[Finding], strict: bool = False) -> int:
    """The exit policy of a report made of findings (env, preflight's checks): 1 when any is an error, or a
    warning under `strict`; else 0."""
    worst = worst_severity(findings)
    return 1 if worst == "error" or (strict and worst == "warning") else 0
