"""The differential: the causes a verdict can be confused with, and a labelled guess where no rule fired.

A verdict such as `oom.capacity` rests on numbers that are often missing or near a boundary (a request
larger than free memory but smaller than free + cached: capacity or fragmentation). For each cause the
table in `loradoctor/data/differential.yaml` lists its look-alikes, a condition (docs/rules.md) under
which each stays plausible, and one line on what tells them apart. `alternatives()` turns the plausible
ones into low-confidence findings placed after the verdict (rule id `differential`), and fills the
verdict's `differential` field. `guess()` names a cause, labelled a guess, for an input whose last
error-looking lines name a family that no rule recognised (rule id `guess`): such a log is never
"nothing recognised". Pure functions of the findings and facts; no I/O but reading the table once.
"""

from __future__ import annotations

import functools
import re
from loradoctor.record import field, record
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from loradoctor.lazyre import lazy_re
from loradoctor.findings import Evidence, Finding
from loradoctor.logs.reader import fold_fullwidth_colon

ALTERNATIVE_CONFIDENCE = 0.3  # below any rule's own confidence: "low"
GUESS_CONFIDENCE = 0.2  # "guess"
MAX_ALTERNATIVES = 2  # the second and third candidates
TABLE = Path(__file__).resolve().parent.parent / "data" / "differential.yaml"

# a line that says a run failed: an exception line (`RuntimeError: ...`, `torch.OutOfMemoryError: ...`,
# lower-cased too, also behind torchrun's `[rank1]: ` prefix), a launcher / kernel / shell failure, or torch's
# dispatch refusal pasted without its exception class (`"addmm_impl_cpu_" not implemented for 'Half'`, an
# issue title); a warning that quotes an error is none
_RANK = r"(?:\[rank\d+\]:\s*)?"
_FAILURE_RE = lazy_re(r"^" + _RANK + r"(?:[\w.]*\.)?[A-Za-z]\w*(?:error|exception|interrupt)\b(?!\w)|^" + _RANK + r"Traceback \(most recent|"
                         r"\bKilled\b|Segmentation fault|core dumped|Bus error|\bCUDA error\b|exitcode: -?\d|"
                         r"\bexit(?:ed with)? (?:code|status) -?[1-9]|^(?:\w+: )?error: |\bFAILED\b|\bAborted\b|"
                         r"\" not implemented for '", re.I)
# (and a glog-style warning or info line, as torch's c10d and NCCL print them: `[W305 12:01:46.541 socket.cpp:752]`)
_WARNING_RE = lazy_re(r"warning\b|\bwarn\b|^\s*" + _RANK + r"\[?[WI]\d{3,4} \d\d:\d\d:\d\d", re.I)
# a line that names no family whatever words it holds: a NameError's name is an identifier of the script
# (`name 'LoraConfig' is not defined` is a missing import, not LoRA), and an index error of a Python
# container is a bug in the script's data handling, not a kernel's index
_NO_FAMILY_RE = lazy_re(r"^" + _RANK + r"(?:[\w.]*\.)?NameError: |\b(?:list|tuple|string) index out of range", re.I)


@record(eq=False, repr=False)
class Alternative:
    cause: str
    when: Any  # a compiled Condition, or None (always plausible)
    tells_apart: str


@record(eq=False, repr=False)
class Guess:
    cause: str
    match: re.Pattern
    alternatives: list[str] = field(default_factory=list)
    tells_apart: str = ""
    unless: Any = None  # a compiled regex: any error-looking line it finds rules the guess out
    when: Any = None  # a compiled Condition on the facts under which the guess stays plausible


@functools.lru_cache(maxsize=1)
def _data(path: Path = TABLE) -> dict[str, Any]:
    """The table file, parsed once per process (kept as JSON in the user's cache: loradoctor.cache.yaml_data)."""
    from loradoctor import cache

    return cache.yaml_data(path, "differential")


@functools.lru_cache(maxsize=None)
def _alternatives_for(cause: str, path: Path = TABLE) -> list[Alternative]:
    """The look-alikes of one verdict cause, their conditions compiled on first need."""
    from loradoctor.logs.rules import Condition

    entries = (_data(path).get("alternatives") or {}).get(cause) or []
    return [Alternative(a["cause"], Condition(a["when"]) if a.get("when") else None, a["tells_apart"])
            for a in entries]


@functools.lru_cache(maxsize=1)
def _guesses(path: Path = TABLE) -> list[Guess]:
    from loradoctor.logs.rules import Condition

    return [Guess(g["cause"], re.compile(g["match"], re.I), list(g.get("alternatives", [])), g.get("tells_apart", ""),
                  re.compile(g["unless"], re.I) if g.get("unless") else None,
                  Condition(g["when"]) if g.get("when") else None)
            for g in _data(path).get("guesses") or []]


def load_table(path: Path = TABLE) -> tuple[dict[str, list[Alternative]], list[Guess]]:
    """The alternatives per verdict cause and the guesses, compiled (once; titles: `cause_titles`).
    `explain` compiles only what it uses: the verdict's alternatives, the guesses when no rule fired."""
    causes = (_data(path).get("alternatives") or {})
    return {cause: _alternatives_for(cause, path) for cause in causes}, _guesses(path)


def entry(f: Finding, tells_apart: str) -> dict[str, Any]:
    return {"cause": f.cause, "confidence": round(f.confidence, 3), "confidence_label": f.confidence_label,
            "rank": f.rank, "tells_apart": tells_apart,
            "evidence": [{"file": e.file, "line": e.line, "text": e.text} for e in f.evidence[:2]]}


@functools.lru_cache(maxsize=1)
def cause_titles(path: Path = TABLE) -> dict[str, str]:
    """A generic title per cause id (the table's `titles`)."""
    return dict(_data(path).get("titles") or {})


def _title(cause: str, titles: dict[str, str]) -> str:
    """The table's title, else a rule's for the cause, else the catalogue's (a cause no loaded rule names)."""
    found = cause_titles().get(cause) or titles.get(cause)
    if found:
        return found
    from loradoctor import catalogue

    try:
        return catalogue.get(cause).title
    except KeyError:
        return cause


def _alternative_confidence(verdict_confidence: float, index: int) -> float:
    """The confidence of the verdict's index-th look-alike: `low` (0.3, then 0.25), and always below the
    verdict's own, so that a guess verdict (0.2) is not followed by a look-alike that claims more."""
    top = min(ALTERNATIVE_CONFIDENCE, round(verdict_confidence - 0.05, 3))
    return max(round(top - 0.05 * index, 3), 0.05)


def alternatives(verdict: Finding, present: Iterable[str], values: dict[str, Any],
                 titles: dict[str, str]) -> list[tuple[Finding, str]]:
    """(finding, what tells it apart) for the causes the verdict can be confused with, plausible on these
    facts and not already found; each quotes the verdict's own evidence (the same lines read another way).
    `titles` gives a title per cause (the engine passes those of the rules)."""
    have = set(present) | {verdict.cause}
    out: list[tuple[Finding, str]] = []
    for alt in _alternatives_for(verdict.cause):
        if alt.cause in have or (alt.when is not None and not alt.when.evaluate(values)):
            continue
        have.add(alt.cause)
        finding = Finding(
            cause=alt.cause, rule="differential", severity="error" if verdict.severity == "error" else "warning",
            confidence=_alternative_confidence(verdict.confidence, len(out)), title=f"Could also be: {_title(alt.cause, titles)}",
            summary=f"The same evidence can be read as {alt.cause}: the numbers or frames that would rule it out "
                    f"are missing or near the boundary. What tells them apart: {alt.tells_apart}.",
            evidence=list(verdict.evidence[:2]), area=alt.cause.split(".", 1)[0])
        out.append((finding, alt.tells_apart))
        if len(out) >= MAX_ALTERNATIVES:
            break
    return out


def _body(text: str) -> str:
    """A tail line (quoted as pasted) without the prefixes a collector or a paste put before the log's
    own text: a timestamp, kubelet's CRI tag, docker compose's `trainer-1  | `, a rank, a reply's `> `
    (the guesses' patterns anchor at the message's start)."""
    from loradoctor.logs.reader import strip_prefixes

    text = text.strip()
    for _ in range(3):
        peeled = strip_prefixes(text)[0].lstrip()
        if peeled[:1] == ">":
            peeled = peeled.lstrip("> ")
        if peeled == text:
            break
        text = peeled
    return text


def failure_lines(tail: Sequence[Evidence]) -> list[Evidence]:
    """The error-looking lines that say a run failed."""
    bodies = ((e, _body(e.text)) for e in tail)
    return [e for e, text in bodies if _FAILURE_RE.search(text) and not _WARNING_RE.search(text)]


def guess(tail: Sequence[Evidence], titles: dict[str, str], values: Optional[dict[str, Any]] = None) -> list[tuple[Finding, str]]:
    """For an input no rule recognised: a guess and its alternatives, (finding, what would confirm or
    tell it apart), from the last failure lines; [] when they name no family. A guess is left out when
    an error-looking line rules it out (`unless`: a Slurm time limit explains a `task 0: Killed`) or the
    facts do (`when`: a run that trained steps did not die of a broken torch install)."""
    lines = failure_lines(tail)
    if not lines:
        return []
    guesses = _guesses()
    values = values or {}
    for line in reversed(lines[-5:]):  # the last failure line is the one the run died of
        text = fold_fullwidth_colon(_body(line.text))  # the quote is as pasted (`错误信息：Killed`)
        if _NO_FAMILY_RE.search(text):
            continue
        for g in guesses:
            if not g.match.search(text):
                continue
            if g.unless is not None and any(g.unless.search(_body(e.text)) for e in tail):
                continue
            if g.when is not None and not g.when.evaluate(values):
                continue
            out = [(Finding(
                cause=g.cause, rule="guess", severity="warning", confidence=GUESS_CONFIDENCE,
                title=f"Guess: {_title(g.cause, titles)}",
                summary=f"No rule recognised this failure; its last error line reads like {g.cause}. "
                        f"What would confirm it: {g.tells_apart}.",
                evidence=[line], area=g.cause.split(".", 1)[0]), g.tells_apart)]
            for cause in g.alternatives[:MAX_ALTERNATIVES]:
                out.append((Finding(
                    cause=cause, rule="differential", severity="warning", confidence=GUESS_CONFIDENCE - 0.05 * len(out),
                    title=f"Could also be: {_title(cause, titles)}",
                    summary=f"Another reading of the same line ({cause}); {g.tells_apart}.", evidence=[line],
                    area=cause.split(".", 1)[0]), g.tells_apart))
            return out
    return []


def differential_field(alts: Sequence[tuple[Finding, str]]) -> list[dict[str, Any]]:
    """The verdict's `differential`: its alternatives with their rank, confidence, evidence and what
    tells each apart (call after the findings are numbered)."""
    return [entry(f, tells) for f, tells in alts]
