"""The log engine: read inputs once, extract facts, fire rules, rank findings (docs/rules.md).

Data flow: raw blocks -> candidate segments (one combined prefilter of every rule's literals and
every extractor's trigger words) -> normalised `Line`s -> facts + per-rule pattern hits ->
findings -> ranking. Lines no rule or extractor could care about are never decoded, which is
what makes a gigabyte of progress bars cheap.
"""

from __future__ import annotations

import itertools
import math
import re
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

from loradoctor.findings import Evidence, Finding
from loradoctor.logs import reader
from loradoctor.env.facts import snapshot_facts
from loradoctor.logs.facts import (METRIC_DICT_RE, PY_METRIC_DICT_RE, TABLE_HEAD, TRIGGER_LITERALS, FactCollector,
                                   Facts, RawPosition, is_errorish)
from loradoctor.logs.factnames import group_of
from loradoctor.logs.rules import Rule, format_value, load_rules, render_template
from loradoctor.logs.scan import REPLAN_MISSES, Literal, Prefilter, contained_in, is_last_segment

NUMBERS_BONUS = 0.3  # a `when` that held on numbers (from the log or the env snapshot): facts beat keywords
GUESS_CONFIDENCE = 0.2  # a rule whose numbers are all missing is labelled a guess
GENERIC_PENALTY = 1.0
SEVERITY_ADJUST = {"error": 0.0, "warning": -0.15, "info": -0.3}
MAX_MATCH_EVIDENCE = 5
LINE_CACHE_ENTRIES = 4096  # remembered per-line rule results (repeated warnings)
INERT_MAX_BYTES = 2048  # longer lines are not remembered as inert (they rarely repeat verbatim)
LINE_CACHE_MAX_CHARS = 2048
FIRST_BLOCK_BYTES = 512 << 10  # a small first block: rules that match every metric line saturate early

GROUP_NAMES = {
    "oom": "the OOM message", "memsum": "the memory summary", "metrics": "the training metrics",
    "peft": "the PEFT parameter count", "trace": "the traceback", "xid": "the kernel Xid lines",
    "dist": "the torchrun/NCCL lines", "killed": "the kernel and launcher kill lines",
    "code43": "the Code 43 line", "input": "the input", "env": "the environment snapshot",
}


@dataclass
class ExplainReport:
    """What `explain` found. `findings` are ranked (rank 1 = most likely root cause)."""

    inputs: list[dict]
    findings: list[Finding]
    unrecognised_tail: list[Evidence] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    rules_checked: int = 0
    elapsed_s: float = 0.0

    def to_dict(self) -> dict:
        return {
            "inputs": self.inputs,
            "findings": [f.to_dict() for f in self.findings],
            "unrecognised_tail": [{"file": e.file, "line": e.line, "text": e.text} for e in self.unrecognised_tail],
            "facts": {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in self.facts.items()},
            "rules_checked": self.rules_checked,
            "elapsed_s": round(self.elapsed_s, 3),
        }


# ---------------------------------------------------------------------------------------------
# matching

def _has_digit(text: str) -> bool:
    return any(c.isdigit() for c in text)


def _scan_literals(text: str, case: list, nocase: list) -> set:
    """Union of the targets of the (literal, targets) pairs whose literal is in `text`."""
    found: set = set()
    for lit, tg in case:
        if lit in text:
            found |= tg
    if nocase:
        low = text.lower()
        for lit, tg in nocase:
            if lit in low:
                found |= tg
    return found


@dataclass
class _RuleState:
    matches: list = field(default_factory=list)  # (Line, match)
    required: list = field(default_factory=list)  # bool per require_all
    excluded: bool = False


class Matcher:
    """Compiled literals of a rule set: the block prefilter and the per-line dispatch."""

    def __init__(self, rules: list[Rule]):
        self.rules = rules
        targets: dict[tuple[str, bool], set] = {}
        for i, rule in enumerate(rules):
            for text, ci in rule.literals:
                targets.setdefault((text.lower() if ci else text, ci), set()).add(("p", i, 0))
            for j, lits in enumerate(rule.require_literals):
                for text, ci in lits:
                    targets.setdefault((text.lower() if ci else text, ci), set()).add(("r", i, j))
            for j, lits in enumerate(rule.exclude_literals):
                for text, ci in lits:
                    targets.setdefault((text.lower() if ci else text, ci), set()).add(("x", i, j))
        # a line that contains literal K also contains every literal inside K
        keys = list(targets)
        inside = contained_in(keys)
        closed: dict[tuple[str, bool], set] = {}
        for i, key in enumerate(keys):
            acc = set(targets[key])
            for j in inside[i]:
                acc |= targets[keys[j]]
            closed[key] = acc
        self.targets = closed
        # per-line dispatch: plain substring tests are far cheaper than one big alternation. A literal
        # without digits is in a line exactly when it is in the line with every digit written as 0, so
        # its verdicts are remembered per digit-blind line: a warning repeated with a new step number,
        # byte count or timestamp is then one dict lookup; literals with digits are tested every time.
        self._case = [(text, closed[(text, ci)]) for text, ci in keys if not ci and not _has_digit(text)]
        self._nocase = [(text, closed[(text, ci)]) for text, ci in keys if ci and not _has_digit(text)]
        self._case_digits = [(text, closed[(text, ci)]) for text, ci in keys if not ci and _has_digit(text)]
        self._nocase_digits = [(text, closed[(text, ci)]) for text, ci in keys if ci and _has_digit(text)]
        self._blind_cache: dict[str, set] = {}
        self.direct = targets
        self.active = set(keys)
        self.line_cache: dict[str, list] = {}  # line text -> its (kind, i, j, match) results
        self.prefilter = self._build(self.active)

    @staticmethod
    def _build(keys: Iterable[tuple[str, bool]]) -> Prefilter:
        literals = [Literal(t, ci) for t, ci in keys] + [Literal(t, ci) for t, ci in TRIGGER_LITERALS]
        return Prefilter(literals)

    def refresh(self, states: list["_RuleState"], sample: bytes) -> None:
        """Drop the literals of rules that need no more lines (five matches, require_all met,
        exclude seen): a rule whose pattern matches every metric line then stops costing time."""
        def needed(target: tuple) -> bool:
            kind, i, j = target
            state = states[i]
            if kind == "p":
                return len(state.matches) < MAX_MATCH_EVIDENCE
            if kind == "r":
                return not state.required[j]
            return not state.excluded

        keys = {k for k, tg in self.direct.items() if any(needed(t) for t in tg)}
        if keys != self.active:
            self.active = keys
            self.prefilter = self._build(keys)
            self.prefilter.plan(sample)

    def hits(self, text: str) -> set:
        """(kind, rule index, j) targets whose literals occur in the line."""
        blind = text.translate(reader.DIGITS_BLIND)
        cached = self._blind_cache.get(blind)
        if cached is None:
            cached = _scan_literals(blind, self._case, self._nocase)
            if len(self._blind_cache) >= LINE_CACHE_ENTRIES:
                self._blind_cache.clear()
            self._blind_cache[blind] = cached
        if not (self._case_digits or self._nocase_digits):
            return set(cached)
        return cached | _scan_literals(text, self._case_digits, self._nocase_digits)


def _is_bar_bytes(raw: bytes) -> bool:
    return b"%|" in raw and reader.is_progress_bar(raw.decode("utf-8", "replace").strip())


def scan_inputs(inputs: list[reader.Input], rules: list[Rule], collector: FactCollector,
                progress: Optional[Callable] = None) -> list[_RuleState]:
    """One pass over every input: feed candidate lines to the collector and the rules, and
    Trainer metric dicts (found by one regex over the raw block) to the collector's fast path."""
    matcher = Matcher(rules)
    states = [_RuleState(required=[False] * len(r.require_all)) for r in rules]
    # raw line -> its quote if it looks like an error (else ""), for lines that changed nothing: no
    # fact, no rule match (and a rule only ever needs fewer lines later, so a repeat cannot match)
    inert: dict[bytes, str] = {}
    changed = True  # some rule state changed since the last refresh of the literals
    for item in inputs:
        inert.clear()  # a line's rank can come from its file: repeats are judged per input
        base = 0
        done = 0
        ends_with_newline = True
        sample = b""
        for block, joins in reader.iter_blocks_with_joins(item, first_block_bytes=FIRST_BLOCK_BYTES):
            # joins: offsets where a hard-wrapped line was rejoined (a console copy); a physical line
            # starts at each, so line numbers add the joins before a line
            done += len(block)
            if not sample:
                # anchors that are rare in this input, outside the metric dicts (cut out below)
                sample = PY_METRIC_DICT_RE.sub(b"", block[: 1 << 20])
                matcher.prefilter.plan(sample)
            records_before = collector.records
            view = block  # what the candidate scan reads: the block, less the metric dicts
            dict_at = block.find(_DICT_START)
            json_records = dict_at < 0 and b'"loss":' in block  # JSON logs carry no Python dicts
            has_records = dict_at >= 0 or json_records
            if json_records:  # JSON records may span lines: the plain regex path, nothing cut out
                collector.feed_metric_batch(METRIC_DICT_RE.findall(block), _record_line_maker(block, base, item, joins))
            elif has_records:
                # metric dicts go to the collector in one batch per block, and are cut out of the
                # scanned view unless some literal occurs in them (checked on the first one);
                # single-line dicts hold no newline, so line numbers stay right
                first = PY_METRIC_DICT_RE.match(block, dict_at)
                cut = first is not None and not joins and not matcher.prefilter.occurs_in(first.group(0))
                records, rest_view = _split_metric_dicts(block, dict_at, cut)
                collector.feed_metric_batch(records, _record_line_maker(block, base, item, joins))
                if cut:
                    view = rest_view
            if collector.table_open or TABLE_HEAD in block:
                # notebook Trainer tables: their rows hold no literal, the collector reads the block
                collector.feed_table_block(block, lambda raw, n, base=base, item=item, block=block, joins=joins:
                                           reader.make_line(raw, item.path, base + _physical_line(block, joins, n),
                                                            item.rank, input_index=item.index))
            segments = matcher.prefilter.candidates(view)
            if matcher.prefilter.misses > REPLAN_MISSES:
                # the anchors chosen at the start became common (the log changed shape): choose
                # again from this block, for the blocks that follow
                sample = PY_METRIC_DICT_RE.sub(b"", view[: 1 << 20])
                matcher.prefilter.plan(sample)
            pos = 0
            count = 0
            for seg in segments:
                count += view.count(b"\n", pos, seg.line_start)
                pos = seg.line_start
                raw = view[seg.start:seg.end]
                if not is_last_segment(view, seg) and _is_bar_bytes(raw):
                    continue  # an intermediate progress-bar redraw
                lineno = base + count + 1 + (bisect_left(joins, seg.line_start) if joins else 0)
                quote = inert.get(raw)
                if quote is not None and collector.idle:
                    # a repeat of a line that changed nothing (a warning printed every step): only
                    # the "error-looking lines" tail wants to know where it was
                    if quote:
                        collector.error_tail.append(Evidence(file=item.path, line=lineno, text=quote))
                    continue
                was_idle = collector.idle
                focus = _literal_at(raw, matcher.prefilter) if len(raw) > reader.MAX_LINE_CHARS else 0
                line = reader.make_line(raw, item.path, lineno, item.rank, focus=focus, input_index=item.index)
                if line.rank is not None:
                    item.ranks.add(line.rank)
                position = RawPosition(view, seg.start, block, count + 1, records_before, has_records)
                touched = False
                matched = False
                for part in _lines_within(line, raw):
                    touched |= collector.feed(part, position if part is line else None)
                    matched |= _match_line(part, matcher, rules, states)
                changed |= matched
                if was_idle and not touched and not matched and len(raw) <= INERT_MAX_BYTES:
                    if len(inert) >= LINE_CACHE_ENTRIES:
                        inert.clear()
                    inert[raw] = line.quote() if is_errorish(line.text) else ""
            base += count + view.count(b"\n", pos) + len(joins)
            if changed:  # only a changed rule state can make a literal unneeded
                matcher.refresh(states, sample)
                changed = False
            ends_with_newline = block.endswith(b"\n")
            if progress is not None:
                progress(item.path, done, item.bytes if not item.compressed else None)
        item.lines = base + (0 if ends_with_newline else 1)
    return states


_DICT_START = b"{'loss': "
# a plain one-line dict (PY_METRIC_DICT_RE's 4 groups) or, as group 5, any other `{'loss': ` start
# (the shared literal prefix stays outside the alternation: the regex engine then skips to it fast)
assert PY_METRIC_DICT_RE.pattern.startswith(rb"\{'loss': ")
_SPLIT_RE = re.compile(rb"\{'loss': (?:" + PY_METRIC_DICT_RE.pattern[len(rb"\{'loss': "):] + rb"|())")


def _split_metric_dicts(block: bytes, pos: int, cut: bool) -> tuple[list, bytes]:
    """The `{'loss': ...}` dicts of a block (METRIC_DICT_RE groups, in order) and, when `cut`,
    the block without them. One `re.split` (C) finds every dict and cuts it out in the same pass;
    when some `{'loss': ` start is not a plain one-line dict (the split then sees fewer dicts than
    starts), the slower walk below decides each start exactly as METRIC_DICT_RE.match does."""
    parts = _SPLIT_RE.split(block)  # no dict starts before pos
    n = (len(parts) - 1) // 6
    # split yields [text, g1, g2, g3, g4, odd, text, ...]; `odd` is a start that is no plain dict
    odd = parts[5::6]
    if n and odd.count(None) == n:
        # the JSON body group is absent (None), as in METRIC_DICT_RE.match(...).groups()
        records = list(zip(parts[1::6], parts[2::6], parts[3::6], parts[4::6], itertools.repeat(None, n)))
        return records, (b"".join(parts[::6]) if cut else block)
    if n and b'"loss":' not in block:
        # the odd starts cannot be JSON records either (METRIC_DICT_RE's other form): they are
        # text, put back into the view (split consumed their `{'loss': `)
        records = [(parts[6 * i + 1], parts[6 * i + 2], parts[6 * i + 3], parts[6 * i + 4], None)
                   for i in range(n) if odd[i] is None]
        if not cut:
            return records, block
        pieces = [parts[0]]
        for i in range(n):
            if odd[i] is not None:
                pieces.append(_DICT_START)
            pieces.append(parts[6 * i + 6])
        return records, b"".join(pieces)
    return _split_metric_dicts_slow(block, pos, cut)


def _split_metric_dicts_slow(block: bytes, pos: int, cut: bool) -> tuple[list, bytes]:
    """_split_metric_dicts for odd blocks: bytes.find finds each start; the regex checks it."""
    records: list = []
    pieces: list = []
    find = block.find
    match = METRIC_DICT_RE.match
    add = records.append
    last = 0
    while pos != -1:
        m = match(block, pos)
        if m is None:
            pos = find(_DICT_START, pos + 1)
            continue
        add(m.groups())
        end = m.end()
        if cut:
            pieces.append(block[last:pos])
            last = end
        pos = find(_DICT_START, end)
    if not cut:
        return records, block
    pieces.append(block[last:])
    return records, b"".join(pieces)


_JSON_ESCAPES = (("\\n", "\n"), ('\\"', '"'), ("\\t", "\t"), ("\\/", "/"))


# a traceback whose line breaks were lost (pasted through a form that joins lines): where its lines began
_FLATTENED_SPLIT_RE = re.compile(r"\s(?=Traceback \(most recent call last\):|File \"[^\"]+\", line \d+|"
                                 r"(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt): )")
FLATTENED_MIN_CHARS = 300


def _lines_within(line: reader.Line, raw: bytes) -> list[reader.Line]:
    """A JSON log record carrying a whole traceback in one string (`{"level": "error", "traceback":
    "Traceback ...\\n  File ...\\nImportError: ..."}`), or a traceback whose line breaks were lost,
    is read as the lines it holds, each with the record's line number; any other line is itself."""
    text = line.text
    if raw.count(b"\\n") >= 2 and (raw.lstrip()[:1] == b"{" or b'":' in raw):
        for escaped, plain in _JSON_ESCAPES:
            text = text.replace(escaped, plain)
        parts = text.split("\n")
    elif len(text) >= FLATTENED_MIN_CHARS and ("Traceback (most" in text or text.count('File "') >= 2):
        parts = _FLATTENED_SPLIT_RE.split(text)
    else:
        return [line]
    if len(parts) < 2:
        return [line]
    return [line] + [reader.make_line(part.encode("utf-8", "replace"), line.file, line.lineno, line.rank,
                                      input_index=line.input_index)
                     for part in parts if part.strip()]


def _literal_at(raw: bytes, prefilter: Prefilter) -> int:
    """Where the first literal of interest sits in an overlong line (the part make_line keeps):
    an error glued after 8 KiB of other output is then read, not cut off."""
    low = raw.lower()
    found = [(low if ci else raw).find(lit) for lit, ci in prefilter.kept]
    return min((pos for pos in found if pos >= 0), default=0)


def _physical_line(block: bytes, joins: list[int], n: int) -> int:
    """The physical line number (1-based, in the block) of the block's n-th line after joining."""
    if not joins:
        return n
    start = 0
    for _ in range(n - 1):
        start = block.find(b"\n", start) + 1
    return n + bisect_left(joins, start)


def _record_line_maker(block: bytes, base: int, item: reader.Input,
                       joins: Optional[list[int]] = None) -> Callable[[int], reader.Line]:
    """line_at(k): the Line of the k-th metric record of the block (found again only on demand)."""
    def line_at(k: int) -> reader.Line:
        m = next(itertools.islice(METRIC_DICT_RE.finditer(block), k, None))
        start = m.start()
        line_start = block.rfind(b"\n", 0, start) + 1
        lineno = base + block.count(b"\n", 0, line_start) + 1 + (bisect_left(joins, line_start) if joins else 0)
        end = block.find(b"\n", start)
        return reader.make_line(block[start:end if end >= 0 else len(block)], item.path, lineno, item.rank,
                                input_index=item.index)

    return line_at


def _match_line(line: reader.Line, matcher: Matcher, rules: list[Rule], states: list[_RuleState]) -> bool:
    """Try the line against the rules whose literals it holds; True when a match changed a rule's
    state (a new piece of evidence, a require_all met, an exclude seen). What a line's text does to
    the rules (which targets, which pattern match) is remembered for repeated lines. Rule states only
    ever saturate (more matches, require met, exclude seen), so a target skipped because its rule was
    saturated never needs to be tried again, and a match on a saturated rule changes nothing (the
    engine may then skip later repeats of the line)."""
    text = line.text
    cache = matcher.line_cache
    results = cache.get(text)
    matched = False
    if results is None:
        results = []
        for kind, i, j in matcher.hits(text):
            rule, state = rules[i], states[i]
            if kind == "p":
                if len(state.matches) >= MAX_MATCH_EVIDENCE:
                    continue
                m = None
                for pattern in rule.compiled_patterns:
                    m = pattern.search(text)
                    if m:
                        break
                results.append((kind, i, j, m))
            elif kind == "r":
                if not state.required[j]:
                    results.append((kind, i, j, rule.compiled_require[j].search(text)))
            elif not state.excluded:
                results.append((kind, i, j, rule.compiled_exclude[j].search(text)))
        if len(text) <= LINE_CACHE_MAX_CHARS:
            if len(cache) >= LINE_CACHE_ENTRIES:
                cache.clear()
            cache[text] = results
    for kind, i, j, m in results:
        if m is None:
            continue
        state = states[i]
        if kind == "p":
            if len(state.matches) < MAX_MATCH_EVIDENCE:
                state.matches.append((line, m))
                matched = True
        elif kind == "r":
            if not state.required[j]:
                state.required[j] = True
                matched = True
        elif not state.excluded:
            state.excluded = True
            matched = True
    return matched


env_facts = snapshot_facts  # the old name (loradoctor.env.facts owns the mapping)


# ---------------------------------------------------------------------------------------------
# findings and ranking

@dataclass
class _Candidate:
    rule: Rule
    finding: Finding
    score: float
    numbers: bool  # the rule's when held on numbers from the log (or env)
    earliest: tuple  # (time_s or None, input index, line)
    where: str
    groups: list[str]
    values: dict = field(default_factory=dict)  # every fact, for explaining the condition


def _earliest(keys: Iterable[tuple]) -> tuple:
    keys = list(keys)
    if not keys:
        return (None, math.inf, math.inf)
    return min(keys, key=lambda k: (k[1], k[2]))


def _build_finding(rule: Rule, state: _RuleState, facts: Facts, values: dict[str, Any]) -> _Candidate:
    first_match = state.matches[0][1] if state.matches else None
    evidence = [Evidence(file=ln.file, line=ln.lineno, text=ln.quote()) for ln, _ in state.matches]
    groups: list[str] = []
    value_facts: list[str] = []
    if rule.condition is not None:
        for name in rule.condition.facts:
            g = group_of(name)
            if g not in groups:
                groups.append(g)
        value_facts = rule.condition.value_facts
    seen = {(e.file, e.line) for e in evidence}
    for g in groups:
        if g == "env":
            for name in (rule.condition.facts if rule.condition else []):
                if name.startswith("env.") and name in values:
                    evidence.append(Evidence(file="env snapshot", line=None,
                                             text=f"{name} = {format_value(name, values[name])}"))
            continue
        for e in facts.evidence(g):
            if (e.file, e.line) not in seen:
                seen.add((e.file, e.line))
                evidence.append(e)
    copied = {n: values[n] for n in rule.facts if n in values}
    for n in value_facts:
        if n in values and n not in copied:
            copied[n] = values[n]
    confidence = rule.confidence
    wanted = [n for n in dict.fromkeys(rule.facts + value_facts) if not n.startswith("input.")]
    if rule.facts and not any(n in values for n in wanted):
        confidence = min(confidence, GUESS_CONFIDENCE)  # the rule's numbers are not in the input
    log_numbers = [n for n in value_facts if n in values and not n.startswith(("env.", "input."))]
    env_numbers = [n for n in value_facts if n in values and n.startswith("env.")]
    numbers = bool(log_numbers) or bool(env_numbers)
    score = confidence + SEVERITY_ADJUST.get(rule.severity, 0.0)
    if numbers:
        score += NUMBERS_BONUS  # env facts count as evidence like the log's own numbers
    if rule.generic:
        score -= GENERIC_PENALTY
    keys = [(ln.time_s, ln.input_index, ln.lineno) for ln, _ in state.matches]
    if not keys:
        keys = [facts.first_seen[g] for g in groups if g in facts.first_seen]
    earliest = _earliest(keys)
    where = evidence[0].where() if evidence else "the facts"
    finding = Finding(
        cause=rule.cause, rule=rule.id, severity=rule.severity, confidence=confidence,
        title=render_template(rule.title, values, first_match),
        summary=render_template(rule.summary, values, first_match), evidence=evidence, facts=copied,
        fixes=list(rule.fixes), repro=rule.repro, references=list(rule.references),
        area=rule.cause.split(".", 1)[0],
    )
    return _Candidate(rule, finding, round(score, 3), numbers, earliest, where,
                      [group_of(n) for n in log_numbers + env_numbers], values)


def _order_key(c: _Candidate, use_time: bool) -> tuple:
    """Where a candidate's earliest evidence sits: (time, input, line) when every candidate has a
    time, else (input, line). One rule for the whole ranking keeps the order transitive (comparing
    by time only when both of a pair have one could make A < B < C < A)."""
    t, index, lineno = c.earliest[0], c.earliest[1], c.earliest[2]
    return (t, index, lineno) if use_time else (index, lineno)


def _uses_time(cands: list[_Candidate]) -> bool:
    return bool(cands) and all(c.earliest[0] is not None for c in cands)


def rank_candidates(cands: list[_Candidate]) -> list[_Candidate]:
    """Order: generic last, higher score first, earliest evidence first; then consequences placed
    right after the finding whose cause they follow from; each finding gets a why_rank. Only an
    error can be the root of a consequence: a warning or a note (the `use_cache` notice in every
    LoRA log, a dtype warning 2000 healthy steps earlier) does not make a run die."""
    use_time = _uses_time(cands)
    ordered = sorted(cands, key=lambda c: (c.rule.generic, -c.score, _order_key(c, use_time)))
    parent: dict[int, _Candidate] = {}
    # latest evidence first: when two findings name each other, the earlier one is the root
    for c in sorted(ordered, key=lambda c: _order_key(c, use_time), reverse=True):
        for p in ordered:
            if p is c or p.rule.severity != "error" or not c.rule.is_consequence_of(p.rule.cause):
                continue
            if parent.get(id(p)) is c or _descends(p, c, parent):
                continue
            parent[id(c)] = p
            break
    children: dict[int, list[_Candidate]] = {}
    roots = []
    for c in ordered:
        if id(c) in parent:
            children.setdefault(id(parent[id(c)]), []).append(c)
        else:
            roots.append(c)
    final: list[_Candidate] = []

    def emit(c: _Candidate) -> None:
        final.append(c)
        for child in children.get(id(c), []):
            emit(child)

    for r in roots:
        emit(r)
    # a generic finding never comes first while a specific one exists
    if final and final[0].rule.generic:
        specific = next((c for c in final if not c.rule.generic), None)
        if specific is not None:
            final.remove(specific)
            final.insert(0, specific)
    for i, c in enumerate(final, 1):
        c.finding.rank = i
        if id(c) in parent:
            c.finding.consequence_of = parent[id(c)].rule.id
    for i, c in enumerate(final):
        c.finding.why_rank = _why(c, final, i, parent)
    return final


def _label(c: _Candidate) -> str:
    return f"#{c.finding.rank} ({c.rule.id})"


MAX_WHY_PARTS = 3


def _numbers_text(c: _Candidate, values: Optional[dict] = None) -> str:
    """The parts of the rule's `when` that held and carry numbers, at most MAX_WHY_PARTS, then "…"
    (a catch-all's condition is hundreds of words; listing all of it explains nothing)."""
    cond = c.rule.condition
    if cond is None:
        return ""
    parts, more = cond.held_parts(c.values if values is None else values, MAX_WHY_PARTS)
    if not parts:
        return cond.describe(c.finding.facts) if len(cond.expr) <= 120 else ""
    return "; ".join(parts) + ("; …" if more else "")


def _why(c: _Candidate, final: list[_Candidate], i: int, parent: dict[int, _Candidate]) -> str:
    """One sentence: why c sits at position i, naming the next finding down."""
    nxt = final[i + 1] if i + 1 < len(final) else None
    prev = final[i - 1] if i > 0 else None
    total = len(final)
    if id(c) in parent:
        p = parent[id(c)]
        globs = ", ".join(g for g in c.rule.consequence_of)
        return (f"placed after {_label(p)} because it is a consequence of it "
                f"({p.rule.cause} matches consequence_of {globs}); the root cause comes first")
    basis = ""
    if c.numbers:
        names = ", ".join(GROUP_NAMES.get(g, g) for g in dict.fromkeys(c.groups))
        shown = _numbers_text(c)
        basis = f"numbers in {names}" + (f" ({shown})" if shown else "")
    if nxt is None:
        if total == 1:
            return "the only finding; " + (f"it rests on {basis}" if basis else "it rests on a keyword match only")
        assert prev is not None
        return f"ranks below {_label(prev)}: " + _reason(prev, c, "")
    text = _reason(c, nxt, basis)
    if nxt.finding.consequence_of == c.rule.id:
        later = next((o for o in final[i + 1:] if not _descends(o, c, parent)), None)
        if later is not None:
            text += "; against the next root: " + _reason(c, later, basis)
    return text


def _descends(node: _Candidate, root: _Candidate, parent: dict[int, _Candidate]) -> bool:
    """True if root is an ancestor of node (so linking node as root's parent would make a cycle)."""
    p = parent.get(id(node))
    while p is not None:
        if p is root:
            return True
        p = parent.get(id(p))
    return False


def _reason(a: _Candidate, b: _Candidate, basis: str) -> str:
    """Why a ranks above b, naming b."""
    if b.finding.consequence_of == a.rule.id:
        return f"{_label(b)} is a consequence of this finding, so this is the root"
    if b.finding.consequence_of is not None:
        return f"root causes rank before consequences such as {_label(b)}"
    if b.rule.generic and not a.rule.generic:
        return f"a specific finding ranks above the generic catch-all {_label(b)}"
    if a.numbers and not b.numbers:
        shown = _numbers_text(a)
        basis = basis or ("numbers" + (f" ({shown})" if shown else ""))
        return f"{basis} support this more than keyword-only finding {_label(b)}"
    if a.score > b.score:
        extra = "; both rest on numbers" if a.numbers and b.numbers else ""
        return (f"{a.finding.confidence_label} confidence, severity {a.rule.severity} outranks {_label(b)} "
                f"({b.finding.confidence_label}, {b.rule.severity}){extra}")
    if a.score == b.score:
        return (f"as strong as {_label(b)}, but its evidence comes first ({a.where} before {b.where}): "
                f"the earliest failure is the likelier root")
    return f"ranked above {_label(b)}"  # pragma: no cover - generic-first fix-up only


# ---------------------------------------------------------------------------------------------
# the entry point

def explain(paths: list[str], extra_rule_dirs: Iterable[str] = (), env: Optional[dict] = None,
            progress: Optional[Callable[[str, int, Optional[int]], None]] = None,
            rules: Optional[list[Rule]] = None) -> ExplainReport:
    """Explain crash logs: `paths` are files, folders or `-` (stdin). `env` is a snapshot dict
    (`loradoctor env --format json` -> "snapshot") whose facts count as evidence. `progress` is
    called after each block with (path, bytes done, total bytes or None). Raises UserError for
    unreadable input or broken rules."""
    started = time.perf_counter()
    rules = load_rules(extra_rule_dirs) if rules is None else rules
    inputs = reader.resolve_inputs(list(paths))
    collector = FactCollector(block_metrics=True)
    states = scan_inputs(inputs, rules, collector, progress)
    facts = collector.finish(inputs)
    values = facts.values
    values.update(snapshot_facts(env, values.get("oom.device_index")))
    cands = []
    for rule, state in zip(rules, states):
        if rule.patterns and not state.matches:
            continue
        if not all(state.required) or state.excluded:
            continue
        if rule.condition is not None and not rule.condition.evaluate(values):
            continue
        cands.append(_build_finding(rule, state, facts, values))
    ranked = rank_candidates(cands)
    findings = [c.finding for c in ranked]
    # the last error-looking lines whenever nothing is a diagnosis (an info note such as the
    # use_cache one does not explain a `KeyError: 'input_ids'` traceback)
    diagnosed = any(f.severity in ("error", "warning") for f in findings)
    tail = list(collector.error_tail) if not diagnosed else []
    return ExplainReport(inputs=[i.to_dict() for i in inputs], findings=findings, unrecognised_tail=tail,
                         facts=dict(values), rules_checked=len(rules),
                         elapsed_s=time.perf_counter() - started)
