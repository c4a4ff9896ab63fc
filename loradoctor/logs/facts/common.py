"""What every extractor shares: number parsing, the Facts result, and the Extractor base that
the collector composes (a family's trigger literals, its feed, its close and publish steps)."""

from __future__ import annotations

import math
from loradoctor.record import field, record
from typing import Any, Optional

from loradoctor.findings import Evidence
from loradoctor.units import parse_size_or_none

TriggerLiterals = tuple[tuple[str, bool], ...]  # (literal, ignore_case) pairs

# A size as printed. It starts where a run of digits starts: searched unanchored (`_SIZE + " allowed;"`)
# over a line padded with thousands of digits, a start inside the run would rescan the rest of it
# from every digit (quadratic: 7,950 digits took 13.5 s).
_SIZE = r"(?<![\d.])(\d+(?:\.\d+)?\s*(?:bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB))"
# (Lightning's progress bar prints a nan loss as `train_loss=nan.0`: the `.0` belongs to the value; `\.\d+`, not
# `\.0`, so that the metric regex stays blind to which digit it is, see rules.literals.digit_blind)
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|NaN|NAN|inf|Inf|INF|infinity|Infinity)(?:\.\d+)?"


def _size(text: Optional[str]) -> Optional[int]:
    """A plausible byte count or None (WDDM prints values like 17179869184.00 GiB; `1e999` or 400
    digits are past a float)."""
    if not text:
        return None
    try:
        return parse_size_or_none(text)
    except OverflowError:
        return None


# Bounds of the integers a log prints; a larger one is no real value (and one past 4,300 digits
# would not even convert): it is dropped as implausible.
MAX_RANK = 1 << 20  # ranks, world sizes, device indexes
MAX_ID = 1 << 32  # pids, Xid numbers, exit codes, counters, milliseconds go through _bounded_int(.., MAX_MS)
MAX_MS = 10 ** 12  # about 30 years


def says_oom(text: str) -> bool:
    """The line says out of memory (any case; `outof memory` as a retyped title or OCR writes it)."""
    return "ut of memory" in text or "UT OF MEMORY" in text or "utof memory" in text


def _bounded_int(text: Optional[str], most: int) -> Optional[int]:
    """The integer a regex group holds (digits, maybe a leading `-`), or None when the group is
    absent or the value's magnitude is beyond `most`."""
    if not text or len(text.lstrip("-")) > len(str(most)):
        return None
    value = int(text)
    return value if abs(value) <= most else None


def _float(text: str) -> float:
    low = text.lower().lstrip("+")
    if "." in low and low[-1:].isdigit() and low.lstrip("-")[:1] in ("n", "i"):  # `nan.0`, `-inf.0`
        low = low[:low.index(".")]
    if low in ("nan", "-nan"):
        return math.nan
    if low in ("inf", "infinity"):
        return math.inf
    if low in ("-inf", "-infinity"):
        return -math.inf
    return float(text)


def _int(text: str) -> Optional[int]:
    try:
        return int(float(text.replace(",", "")))
    except (ValueError, OverflowError):  # OverflowError: past a float (inf)
        return None


MAX_GROUP_EVIDENCE = 6


@record
class Facts:
    """The extracted facts: flat values, and source lines per group."""

    values: dict[str, Any] = field(default_factory=dict)
    groups: dict[str, list[Evidence]] = field(default_factory=dict)
    first_seen: dict[str, tuple] = field(default_factory=dict)  # group -> (time_s, input, lineno)

    def flat(self) -> dict[str, Any]:
        """Fact name -> value, with exactly the names of docs/facts.md (absent facts are absent)."""
        return dict(self.values)

    def evidence(self, group: str) -> list[Evidence]:
        return list(self.groups.get(group, []))

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)


class Sink:
    """Where extractors put what they find: fact values, evidence lines per group, and when each
    group was first seen. The FactCollector is one."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.groups: dict[str, list[Evidence]] = {}
        self.first_seen: dict[str, tuple] = {}

    def _evidence(self, group: str, line: Any) -> None:
        items = self.groups.setdefault(group, [])
        if len(items) < MAX_GROUP_EVIDENCE and not any(e.line == line.lineno and e.file == line.file for e in items):
            items.append(Evidence(file=line.file, line=line.lineno, text=line.quote()))
        if group not in self.first_seen:
            self.first_seen[group] = (line.time_s, line.input_index, line.lineno)

    def _set_first(self, values: dict[str, Any]) -> None:
        for k, v in values.items():
            if v is not None and k not in self.values:
                self.values[k] = v


class Extractor:
    """One family of facts. `TRIGGERS` are the words that make a line interesting to it (the
    engine's prefilter decodes only lines that hold one of them, or a rule's literal); `feed` takes
    every decoded line and returns True when feeding the same text again could change what is
    collected; `open` is True while a multi-line record (a traceback, a table) is unfinished."""

    TRIGGERS: TriggerLiterals = ()
    # True: while `open`, the engine hands over every line, not only the lines that hold a literal (a
    # table whose rows share no word worth a literal of its own; see FactCollector.wants_every_line)
    EVERY_LINE_WHILE_OPEN = False

    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    @property
    def triggers(self) -> TriggerLiterals:
        """What dispatches lines to this extractor: its TRIGGERS (an instance fed differently may
        declare more)."""
        return self.TRIGGERS

    @property
    def open(self) -> bool:
        return False

    def feed(self, line: Any) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        """End any open record (the end of the input)."""

    def publish(self, values: dict[str, Any]) -> None:
        """Add the facts that are only known at the end (counts, aggregates)."""
