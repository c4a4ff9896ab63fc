"""A rule as the engine uses it: the Rule record, its lazily compiled regexes, and build_rule,
which turns one validated YAML mapping into a compiled Rule and lists its problems."""

from __future__ import annotations

import fnmatch
import re
from loradoctor.record import field, record
from typing import Optional

from loradoctor.findings import Fix, confidence_value
from loradoctor.logs.factnames import KNOWN_FACT_SET
from loradoctor.logs.rules.condition import Condition, ConditionError, compile_fix_conditions, fixes_that_apply
from loradoctor.logs.rules.redos import static_problems
from loradoctor.logs.rules.literals import _literals_for, wide_boundaries, paste_tolerant
from loradoctor.logs.rules.templates import check_template

@record(eq=False, repr=False)  # identity is a rule's equality
class Rule:
    id: str
    cause: str
    title: str
    severity: str
    confidence: float
    summary: str
    patterns: list[str] = field(default_factory=list)
    prefilter: list[str] = field(default_factory=list)
    require_all: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    # literals for the exclude regexes (as `prefilter` is for the patterns); omitted: derived from each regex
    exclude_prefilter: list[str] = field(default_factory=list)
    when: Optional[str] = None
    facts: list[str] = field(default_factory=list)
    fixes: list[Fix] = field(default_factory=list)
    repro: Optional[str] = None
    consequence_of: list[str] = field(default_factory=list)
    outranks: list[str] = field(default_factory=list)  # rule ids this one ranks above when both fire
    outranks_reason: str = ""
    generic: bool = False
    references: list[str] = field(default_factory=list)
    falsepositives: str = ""
    docs: str = ""
    source: str = ""  # the file it came from
    # compiled forms (filled by compile_rule)
    compiled_patterns: list = field(default_factory=list)
    compiled_require: list = field(default_factory=list)
    compiled_exclude: list = field(default_factory=list)
    condition: Optional[Condition] = field(default=None)
    # every rule id this one outranks, directly or through others -> the first hop (set at load)
    outranks_closure: Optional[dict] = field(default=None)
    # per fix, the sources of its optional `when:` / `unless:` (None: none), and their compiled forms
    fix_when: list = field(default_factory=list)
    fix_unless: list = field(default_factory=list)
    fix_conditions: list = field(default_factory=list)  # (when, unless) Conditions per fix
    literals: list = field(default_factory=list)  # (text, ignore_case) for patterns
    require_literals: list = field(default_factory=list)  # per require_all regex
    exclude_literals: list = field(default_factory=list)  # per exclude regex

    def is_consequence_of(self, cause: str) -> bool:
        return any(fnmatch.fnmatchcase(cause, glob) for glob in self.consequence_of)

    def outranks_rule(self, other_id: str) -> Optional[str]:
        """The id this rule declares it outranks on the way to `other_id` (other_id itself when
        declared directly), or None when it does not outrank it."""
        if self.outranks_closure is not None:
            return self.outranks_closure.get(other_id)
        return other_id if other_id in self.outranks else None

    def fixes_for(self, facts) -> list[Fix]:
        """The fixes whose `when:` holds and whose `unless:` does not (a fix already applied is dropped),
        picked by condition.fixes_that_apply, as the catalogue's are."""
        if not (any(self.fix_when) or any(self.fix_unless)):
            return list(self.fixes)
        if len(self.fix_conditions) != len(self.fixes):
            self.compile_fix_conditions()  # a cached rule parses its fix conditions on first use
        return fixes_that_apply(self.fixes, self.fix_conditions, facts)

    def compile_fix_conditions(self, problems: Optional[list] = None) -> None:
        """Fill `fix_conditions` from `fix_when` / `fix_unless` (condition.compile_fix_conditions, over the
        log's facts); a bad condition is a problem (or raises)."""
        def source(sources: list, i: int) -> Optional[str]:
            return sources[i] if i < len(sources) else None

        self.fix_conditions = compile_fix_conditions(
            [(source(self.fix_when, i), source(self.fix_unless, i)) for i in range(len(self.fixes))], problems=problems)

    def __repr__(self) -> str:
        return f"Rule({self.id!r}, cause={self.cause!r})"

    def to_dict(self) -> dict:
        return {
            "id": self.id, "cause": self.cause, "title": self.title, "severity": self.severity,
            "confidence": self.confidence, "patterns": self.patterns, "prefilter": self.prefilter,
            "require_all": self.require_all, "exclude": self.exclude, "exclude_prefilter": self.exclude_prefilter,
            "when": self.when, "facts": self.facts,
            "summary": self.summary, "fixes": [_fix_dict(f, w, u) for f, w, u in zip(self.fixes, self.fix_when or [None] * len(self.fixes),
                                                           self.fix_unless or [None] * len(self.fixes))],
            "repro": self.repro, "consequence_of": self.consequence_of, "outranks": self.outranks,
            "outranks_reason": self.outranks_reason, "generic": self.generic,
            "references": self.references, "falsepositives": self.falsepositives, "docs": self.docs,
            "source": self.source,
        }


def _fix_dict(fix: Fix, when: Optional[str], unless: Optional[str]) -> dict:
    data = {"text": fix.text, "command": fix.command}
    if when:
        data["when"] = when
    if unless:
        data["unless"] = unless
    return data


def _compile_regex(pattern: str):
    """A regex of a user's rule folder (or of `rules lint`): the `regex` engine, whose searches take a
    timeout, so a pattern nobody vetted cannot stall a run."""
    import regex

    return regex.compile(wide_boundaries(paste_tolerant(pattern)), regex.V0)


def _compile_vetted(pattern: str):
    """A regex of the built-in library: the standard `re` engine. Every built-in pattern passed the
    static and timed runaway checks (`rules lint`, run in CI, times it in both engines) and a line is
    at most reader.MAX_LINE_CHARS long, so no search needs a timeout; `re` is there already, where
    importing `regex` costs ~20 ms of every start-up (docs/rules.md, "Speed notes")."""
    return re.compile(wide_boundaries(paste_tolerant(pattern)))


class LazyRegexes:
    """A rule's compiled regexes, compiled on first use. The built-in rules (linted in CI) load this
    way, so `explain` on a short log does not pay for ~360 compilations it never needs; user rule
    folders and `rules lint` compile eagerly, so a bad regex is reported at load time."""

    __slots__ = ("sources", "_compiled")

    def __init__(self, sources: list[str]) -> None:
        self.sources = list(sources)
        self._compiled: list = [None] * len(self.sources)

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, i: int):
        compiled = self._compiled[i]
        if compiled is None:
            compiled = self._compiled[i] = _compile_vetted(self.sources[i])
        return compiled

    def __iter__(self):
        return (self[i] for i in range(len(self.sources)))


def _catalogue_fixes(cause: str) -> list[Fix]:
    """A rule that gives no fixes takes its cause's next steps from the catalogue (loradoctor/data/causes.yaml);
    a rule's own title, summary and fixes override the catalogue's wording."""
    from loradoctor import catalogue

    if cause not in catalogue.causes():
        return []  # reported by the schema check
    return [Fix(text=text, command=command) for text, command in catalogue.fixes_for(cause, {}, "explain")]


def build_rule(data: dict, source: str, eager: bool = True) -> tuple[Optional[Rule], list[str]]:
    """A compiled Rule from one validated YAML mapping, and the problems (field: message).
    eager=False defers regex compilation to first use (LazyRegexes)."""
    problems: list[str] = []
    try:
        confidence = confidence_value(data.get("confidence", "medium"))
    except (ValueError, TypeError) as exc:
        problems.append(f"confidence: {exc}")
        confidence = 0.5
    rule = Rule(
        id=data["id"], cause=data["cause"], title=data["title"], severity=data["severity"],
        confidence=confidence, summary=data["summary"], patterns=list(data.get("patterns", [])),
        prefilter=list(data.get("prefilter", [])), require_all=list(data.get("require_all", [])),
        exclude=list(data.get("exclude", [])), exclude_prefilter=list(data.get("exclude_prefilter", [])),
        when=data.get("when"), facts=list(data.get("facts", [])),
        fixes=[Fix(text=f["text"], command=f.get("command")) for f in data.get("fixes", [])] or _catalogue_fixes(data["cause"]),
        fix_when=[f.get("when") for f in data.get("fixes", [])],
        fix_unless=[f.get("unless") for f in data.get("fixes", [])],
        repro=data.get("repro"), consequence_of=list(data.get("consequence_of", [])),
        outranks=list(data.get("outranks", [])), outranks_reason=data.get("outranks_reason", "") or "",
        generic=bool(data.get("generic", False)), references=list(data.get("references", [])),
        falsepositives=data.get("falsepositives", "") or "", docs=data.get("docs", "") or "", source=source,
    )
    for fname in ("patterns", "require_all", "exclude"):
        if not eager:
            setattr(rule, {"patterns": "compiled_patterns", "require_all": "compiled_require",
                           "exclude": "compiled_exclude"}[fname], LazyRegexes(getattr(rule, fname)))
            continue
        compiled = []
        for i, p in enumerate(getattr(rule, fname)):
            try:
                compiled.append(_compile_regex(p))
            except Exception as exc:
                problems.append(f"{fname}[{i}]: regex {p!r} does not compile: {exc}")
                continue
            problems.extend(f"{fname}[{i}]: {problem}" for problem in static_problems(p))
        setattr(rule, {"patterns": "compiled_patterns", "require_all": "compiled_require",
                       "exclude": "compiled_exclude"}[fname], compiled)
    if not rule.patterns and not rule.when:
        problems.append("patterns: a rule needs patterns, a when condition, or both")
    if rule.patterns:
        rule.literals, found = _literals_for(rule.patterns, rule.prefilter, "patterns")
        problems.extend(found)
    if rule.exclude_prefilter and not rule.exclude:
        problems.append("exclude_prefilter: there is no exclude regex to prefilter")
    for fname, target in (("require_all", "require_literals"), ("exclude", "exclude_literals")):
        per = []
        explicit = rule.exclude_prefilter if fname == "exclude" else []
        for i, p in enumerate(getattr(rule, fname)):
            lits, found = _literals_for([p], explicit, f"{fname}[{i}]", "exclude_prefilter")
            if i == 0 or not explicit:  # (an explicit list is checked once, not once per regex)
                problems.extend(found)
            per.append(lits)
        setattr(rule, target, per)
    if rule.when:
        try:
            rule.condition = Condition(rule.when)
        except ConditionError as exc:
            problems.append(f"when: {exc}")
    rule.compile_fix_conditions(problems)
    for name in rule.facts:
        if name not in KNOWN_FACT_SET:
            problems.append(f"facts: unknown fact {name!r} (see docs/facts.md)")
    problems.extend(f"summary: {p}" for p in check_template(rule.summary))
    for i, fix in enumerate(rule.fixes):
        problems.extend(f"fixes[{i}]: {p}" for p in check_template(fix.text) + check_template(fix.command or ""))
    problems.extend(f"title: {p}" for p in check_template(rule.title))
    if rule.id in rule.outranks:
        problems.append("outranks: a rule cannot outrank itself")
    dupes = sorted({x for x in rule.outranks if rule.outranks.count(x) > 1})
    if dupes:
        problems.append(f"outranks: {', '.join(dupes)} listed twice")
    if rule.outranks_reason and not rule.outranks:
        problems.append("outranks_reason: given without an `outranks` list")
    return rule, problems

