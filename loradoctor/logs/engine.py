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
from loradoctor.record import field, record
from typing import Any, Callable, Iterable, Iterator, Optional

from loradoctor.lazyre import is_pattern, lazy_re
from loradoctor.findings import Evidence, Finding, Fix, confidence_label
from loradoctor.logs import reader
from loradoctor.logs.rules.literals import digit_blind
from loradoctor.env.facts import snapshot_facts
from loradoctor.logs.facts import (METRIC_DICT_RE, PY_METRIC_DICT_RE, TABLE_HEAD, TRIGGER_LITERALS, FactCollector,
                                   Facts, RawPosition, is_errorish)
from loradoctor.logs.facts.metrics import RecordColumns
from loradoctor.logs import differential, timeorder
from loradoctor.logs import facts as facts_mod
from loradoctor.logs.factnames import group_of
from loradoctor.logs.rules import Rule, format_value, load_rules, render_template
from loradoctor.logs.rules.templates import has_placeholders
from loradoctor.logs.scan import REPLAN_MISSES, Literal, LiteralIndex, Prefilter, Segment, is_last_segment, segment_at

NUMBERS_BONUS = 0.3  # a `when` that held on numbers (from the log or the env snapshot): facts beat keywords
GUESS_CONFIDENCE = 0.2  # a rule whose numbers are all missing is labelled a guess
GENERIC_PENALTY = 1.0
SEVERITY_ADJUST = {"error": 0.0, "warning": -0.15, "info": -0.3}
MAX_MATCH_EVIDENCE = 5
# A rule's patterns are searched only once DEFER_LINES lines have hit its literals, or at the end
# when the rule can still fire (its require_all met, no exclude seen, its `when` true): on a short
# log most rules whose literals hit (`out of memory` is in ~20 of them) never need their regexes
# compiled. Past DEFER_LINES the pending lines are searched in order and the rule searches each
# line as it comes, so a busy rule's matches, and its saturation, are those of an eager search.
DEFER_LINES = 8
LINE_CACHE_ENTRIES = 4096  # remembered per-line rule results (repeated warnings)
INERT_MAX_BYTES = 2048  # longer lines are not remembered as inert (they rarely repeat verbatim)
LINE_CACHE_MAX_CHARS = 2048
FIRST_BLOCK_BYTES = 512 << 10  # a small first block: rules that match every metric line saturate early
# Regex time limits (built-in patterns take microseconds per line; these stop a user rule, or a
# pattern gone wrong, from hanging explain): one search, all rules on one line, one rule on one input.
MATCH_TIMEOUT_S = 0.05
LINE_BUDGET_S = 0.25
RULE_INPUT_BUDGET_S = 1.0
MAX_BUDGET_NOTES = 10

GROUP_NAMES = {
    "oom": "the OOM message", "memsum": "the memory summary", "metrics": "the training metrics",
    "peft": "the PEFT parameter count", "trace": "the traceback", "xid": "the kernel Xid lines",
    "dist": "the torchrun/NCCL lines", "killed": "the kernel and launcher kill lines",
    "code43": "the Code 43 line", "card": "the line naming the GPU", "input": "the input",
    "env": "the environment snapshot",
}


EXPLAIN_SCHEMA = "loradoctor.explain/1"
DIAGNOSIS_SEVERITIES = ("error", "warning")


@record
class ExplainReport:
    """What `explain` found. `findings` are ranked (rank 1 = most likely root cause)."""

    inputs: list[dict]
    findings: list[Finding]
    unrecognised_tail: list[Evidence] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    rules_checked: int = 0
    elapsed_s: float = 0.0

    def diagnoses(self) -> list[Finding]:
        """Findings that count as a diagnosis (severity warning or error), best first."""
        return [f for f in self.findings if f.severity in DIAGNOSIS_SEVERITIES]

    @property
    def finished(self) -> bool:
        """The log shows the training finishing (the trainer's final summary) and no diagnosis."""
        return not self.diagnoses() and bool(self.facts.get("metrics.train_finished"))

    def exit_code(self) -> int:
        """0 a diagnosis was made or the run finished cleanly; 1 nothing recognised."""
        return 0 if self.diagnoses() or self.finished else 1

    def to_dict(self, top: Optional[int] = None) -> dict:
        """The one JSON document of explain (schema loradoctor.explain/1); `top` keeps the N best findings."""
        shown = self.findings if top is None else self.findings[: max(0, top)]
        return {
            "schema": EXPLAIN_SCHEMA,
            "status": "diagnosed" if self.diagnoses() else "finished" if self.finished else "unrecognised",
            "inputs": self.inputs,
            "findings": [f.to_dict() for f in shown],
            "unrecognised_tail": [{"file": e.file, "line": e.line, "text": e.text} for e in self.unrecognised_tail],
            "facts": {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in self.facts.items()},
            "rules_checked": self.rules_checked,
            "elapsed_s": round(self.elapsed_s, 3),
        }


# ---------------------------------------------------------------------------------------------
# matching

@record(eq=False, repr=False)
class _RuleState:
    matches: list = field(default_factory=list)  # (Line, match)
    required: list = field(default_factory=list)  # bool per require_all
    excluded: bool = False
    # lines whose literals hit the rule's patterns, not searched yet (None: searched as they come)
    pending: Optional[list] = None


class MatchBudget:
    """Regex time on one input: a search past MATCH_TIMEOUT_S is abandoned (the rule is skipped
    for that line), a line past LINE_BUDGET_S skips its remaining rules, and a rule past
    RULE_INPUT_BUDGET_S on this input is skipped for the rest of it. Each skip becomes a note on
    the input (shown in the report)."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self.spent_s: dict[int, float] = {}
        self.skipped: set[int] = set()
        self.notes: list[str] = []
        self._more = 0
        self.line_spent = 0.0  # CPU seconds of the searches since the caller last set this to 0

    def note(self, text: str) -> None:
        if len(self.notes) < MAX_BUDGET_NOTES:
            self.notes.append(text)
        else:
            self._more += 1

    def finished_notes(self) -> list[str]:
        return self.notes + ([f"... and {self._more} more skip(s) of the same kind"] if self._more else [])

    def search(self, i: int, compiled, text: str, line: reader.Line):
        """compiled.search(text) within the budgets; None when skipped. Budgets count this process's
        CPU time, so a busy machine does not make a linear pattern look slow."""
        started = cpu_before = time.process_time()  # (each clock read is a system call: ~6 us)
        try:
            for attempt in range(2):
                if attempt:
                    cpu_before = time.process_time()
                try:
                    if compiled.__class__ is _VETTED:
                        return compiled.search(text)  # a built-in regex (model._compile_vetted)
                    return compiled.search(text, timeout=MATCH_TIMEOUT_S)
                except TimeoutError:
                    # the timeout is wall-clock: try once more when the search itself used little CPU
                    if time.process_time() - cpu_before >= MATCH_TIMEOUT_S / 2:
                        break
            self.note(f"rule {self.rules[i].id} skipped on line {line.lineno}: its regex ran past "
                      f"{MATCH_TIMEOUT_S * 1000:.0f} ms (linear patterns take microseconds)")
            return None
        finally:
            took = time.process_time() - started
            self.line_spent += took
            spent = self.spent_s.get(i, 0.0) + took
            self.spent_s[i] = spent
            if spent > RULE_INPUT_BUDGET_S and i not in self.skipped:
                self.skipped.add(i)
                self.note(f"rule {self.rules[i].id} skipped from line {line.lineno} on: its regexes took "
                          f"{spent:.1f} s on this input (budget {RULE_INPUT_BUDGET_S:.0f} s)")


CROSS_CHARS = 2000  # of the line after a full-width one, for Matcher.crosses


class Matcher:
    """Compiled literals of a rule set: the block prefilter and the per-line dispatch."""

    def __init__(self, rules: list[Rule], nocase: bool = False):
        self.rules = rules
        self.budget = MatchBudget(rules)
        self.budgets: dict[int, MatchBudget] = {}  # per input (its index): the budget of its lines
        # nocase: for an input pasted lower-cased (reader.is_lowered), every literal and every pattern of
        # the rules is matched ignoring case; the Recaser gives back what the fact extractors need
        self.nocase = nocase
        self.lowered: set[int] = set()  # indexes of the lower-cased inputs (shared by both matchers)
        targets: dict[tuple[str, bool], set] = {}

        def key(text: str, ci: bool) -> tuple[str, bool]:
            ci = ci or nocase
            return (text.lower() if ci else text, ci)

        for i, rule in enumerate(rules):
            for text, ci in rule.literals:
                targets.setdefault(key(text, ci), set()).add(("p", i, 0))
            for j, lits in enumerate(rule.require_literals):
                for text, ci in lits:
                    targets.setdefault(key(text, ci), set()).add(("r", i, j))
            for j, lits in enumerate(rule.exclude_literals):
                for text, ci in lits:
                    targets.setdefault(key(text, ci), set()).add(("x", i, j))
        # Each literal keeps its own targets: `hits` tests every literal, so a line that holds K
        # finds the literals inside K by themselves (a digit-free J inside K is in the digit-blind
        # line wherever K is in the line). No containment closure is needed (it was ~20 ms a start).
        keys = list(targets)
        self._index = LiteralIndex(((text, ci, tg) for (text, ci), tg in targets.items()), set, LINE_CACHE_ENTRIES)
        self.direct = targets
        self.active = set(keys)
        self.line_cache: dict[str, list] = {}  # line text -> its (kind, i, j, match) results
        # digit-blind line text -> the require_all / exclude targets whose digit_blind regex missed it
        self.blind_misses: dict[str, set] = {}
        self._prefilter = self._build(self.active)
        self._replan: Optional[bytes] = None  # the sample of a rebuild that waits for the next block

    @property
    def prefilter(self) -> Prefilter:
        """The block prefilter of the literals still needed. A refresh rebuilds it when it is next
        used (the next block), so a log that ends first (a short one) never pays for the rebuild."""
        if self._replan is not None:
            self._prefilter = self._build(self.active, self._replan)
            self._replan = None
        return self._prefilter

    @staticmethod
    def _build(keys: Iterable[tuple[str, bool]], sample: bytes = b"") -> Prefilter:
        literals = [Literal(t, ci) for t, ci in keys] + [Literal(t, ci) for t, ci in TRIGGER_LITERALS]
        # the notebook table header: found by the candidate scan instead of a pass of its own per block
        literals.append(Literal(TABLE_HEAD.decode("ascii")))
        return Prefilter(literals, sample)

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
            self._replan = sample

    def crosses(self, left: str, right: str) -> bool:
        """True when a rule's pattern matches the lines `left` + `right` joined across the cut and neither
        line alone: a line hard-wrapped through a rule's message (`... To avoid da` + `ta inconsistency, we
        are taking ...`, or a cut that fell just after a space: `... TensileLibrary.dat: No ` + `such file
        ...`, or just before one: `... Error loading` + ` "C:\\...\\torch\\lib"`), or a required frame cut in two.
        `right` starts with text or one space; `left` ends with text or one space after it (more is padding).
        The lines are read as the rules read them, with the paste's prefixes (`> `, `trainer-1  | `) peeled.
        Asked by reader.detect_wrap_width about the one or two full-width lines of a short paste; `right`
        is looked at up to CROSS_CHARS."""
        if not left or not right or left[-1:].isspace() and left[-2:-1].isspace():
            return False
        if right[0].isspace() and (right[0] != " " or right[1:2].isspace() or not right[1:2] or left[-1:].isspace()):
            return False  # indented, not a wrap that fell just before one space (reader._one_space_head)
        right = right[:CROSS_CHARS]
        joined = left + right
        hits = self.hits(joined)
        if not any(kind in "pr" for kind, _, _ in hits):
            return False
        # the patterns read lines as the engine does, with the paste's prefixes peeled (a reply's `> `,
        # compose's `trainer-1  | `: added before the console wrapped, so only `left` carries them)
        text = reader.normalise(joined)[0]
        tail = right.rstrip()
        cut = len(text) - len(tail) if tail and text.endswith(tail) else -1
        if cut > 0:
            left, joined = text[:cut], text
        for kind, i, j in hits:
            if kind == "p":
                patterns = self.rules[i].compiled_patterns
            elif kind == "r":  # a required line (a library frame) cut in two: `.../cross_entro` + `py_loss.py in f()`
                patterns = [self.rules[i].compiled_require[j]]
            else:
                continue
            for pattern in patterns:
                m = pattern.search(joined)
                if m and m.start() < len(left) < m.end() and not pattern.search(left) \
                        and not pattern.search(right):
                    return True
        return False

    def hits(self, text: str) -> set:
        """(kind, rule index, j) targets whose literals occur in the line (scan.LiteralIndex; not to be modified)."""
        return self._index.find(text)


def _is_bar_bytes(raw: bytes) -> bool:
    return b"%|" in raw and reader.is_progress_bar(raw.decode("utf-8", "replace").strip())


_RECASERS: dict[tuple, reader.Recaser] = {}


def _extractor_patterns() -> list[str]:
    """The regex sources of every extractor module (loradoctor/logs/facts/)."""
    import importlib
    import pkgutil

    modules = [facts_mod] + [importlib.import_module(f"{facts_mod.__name__}.{info.name}")
                             for info in pkgutil.iter_modules(getattr(facts_mod, "__path__", []))]
    return [v.pattern if isinstance(v.pattern, str) else v.pattern.decode("latin-1")
            for mod in modules for v in vars(mod).values() if is_pattern(v)]


def recaser_for(rules: list[Rule]) -> reader.Recaser:
    """The vocabulary of these rules and of the extractors (their regexes and trigger words), whose
    case a lower-cased paste gets back; built once per rule set, on the first lower-cased input."""
    key = tuple(r.id for r in rules)
    found = _RECASERS.get(key)
    if found is None:
        patterns = [p for r in rules for p in (*r.patterns, *r.require_all)]
        patterns += _extractor_patterns()
        patterns += [re.escape(t) for t, ci in TRIGGER_LITERALS if not ci]
        found = reader.Recaser(patterns, extra=reader.CASED_WORDS)
        _RECASERS.clear()
        _RECASERS[key] = found
    return found


def quote_as_pasted(inputs: list[reader.Input], rules: list[Rule], evidence: list[Evidence]) -> None:
    """Evidence from a paste whose case the reader gave back (a lower-cased paste, or its lower-cased or
    Title-Cased title line) quotes the line as it was pasted: the title as the reader kept it; a line of
    a lower-cased paste lower-case again, when giving the lower-cased quote its case back yields the
    quote (a line of a later block that kept its own capitals, or a quote cut inside a word, stays as
    read)."""
    items = {item.path: item for item in inputs if item.lowered or item.recased_title}
    if not items:
        return
    case = recaser_for(rules)
    for ev in evidence:
        item = items.get(ev.file)
        if item is None or ev.line is None:
            continue
        if ev.line == item.recased_title and item.title_as_pasted:
            title = reader.Line(file=ev.file, lineno=ev.line, text="", raw=item.title_as_pasted.strip()).quote()
            if title.lower() == ev.text.lower():
                ev.text = title
            continue
        if not item.lowered:
            continue
        low = ev.text.lower()
        if low != ev.text and case.recase(low.encode("utf-8")) == ev.text.encode("utf-8"):
            ev.text = low


def scan_inputs(inputs: list[reader.Input], rules: list[Rule], collector: FactCollector,
                progress: Optional[Callable] = None,
                resolve: Optional[Callable[[Rule, "_RuleState"], bool]] = None) -> list[_RuleState]:
    """One pass over every input: feed candidate lines to the collector and the rules, and
    Trainer metric dicts (found by one regex over the raw block) to the collector's fast path.
    Lines still pending for a rule at the end (DEFER_LINES) are searched when `resolve(rule,
    state)` says the rule can still fire (all of them when `resolve` is None); the others are
    dropped: such a rule has no match and cannot fire anyway."""
    if reader.PROCESS_IS_OURS and sum(item.bytes for item in inputs) >= reader.RETAIN_FROM_BYTES:
        reader.retain_freed_memory()  # a big log: its freed blocks are reused, not faulted in again
    plain = matcher = Matcher(rules)
    nocase: Optional[Matcher] = None  # built on the first lower-cased input
    states = [_RuleState(required=[False] * len(r.require_all), pending=[] if r.patterns else None) for r in rules]
    # raw line -> its quote if it looks like an error (else ""), for lines that changed nothing: no
    # fact, no rule match (and a rule only ever needs fewer lines later, so a repeat cannot match)
    inert: dict[bytes, str] = {}
    changed = True  # some rule state changed since the last refresh of the literals
    for item in inputs:
        inert.clear()  # a line's rank can come from its file: repeats are judged per input
        matcher.budget = matcher.budgets[item.index] = MatchBudget(rules)
        matcher.line_cache.clear()  # a result the budget cut short is not carried to another input
        base = 0
        done = 0
        ends_with_newline = True
        sample = b""
        long_lines = False  # the last block's lines were LONG_LINE_BYTES or more on average
        for block, joins in reader.iter_blocks_with_joins(item, first_block_bytes=FIRST_BLOCK_BYTES,
                                                          recaser=lambda: recaser_for(rules),
                                                          crosses=plain.crosses):
            # joins: offsets where a hard-wrapped line was rejoined (a console copy); a physical line
            # starts at each, so line numbers add the joins before a line
            done += len(block)
            if not sample:
                # the first block: it told whether the input was pasted lower-cased
                chosen = plain
                if item.lowered:
                    if nocase is None:
                        nocase = Matcher(rules, nocase=True)
                        nocase.budgets, nocase.lowered = plain.budgets, plain.lowered
                    plain.lowered.add(item.index)
                    chosen = nocase
                if chosen is not matcher:
                    matcher = chosen
                    matcher.budget = matcher.budgets[item.index] = MatchBudget(rules)
                    matcher.line_cache.clear()
                    matcher.refresh(states, b"")
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
            segments = matcher.prefilter.candidates(view)
            counted = matcher.prefilter.newlines  # the view's newlines when the anchor walk counted them
            if matcher.prefilter.misses > REPLAN_MISSES:
                # the anchors chosen at the start became common (the log changed shape): choose
                # again from this block, for the blocks that follow
                sample = PY_METRIC_DICT_RE.sub(b"", view[: 1 << 20])
                matcher.prefilter.plan(sample)
            # a header is in a candidate segment (TABLE_HEAD is a prefilter literal); the metric
            # dicts cut out of the view hold none (a header starts its line)
            find_in_view = view.find
            if collector.table_open or any(find_in_view(TABLE_HEAD, s.start, s.end) >= 0 for s in segments):
                # notebook Trainer tables: their rows hold no literal, the collector reads the block
                collector.feed_table_block(block, lambda raw, n, base=base, item=item, block=block, joins=joins:
                                           reader.make_line(raw, item.path, base + _physical_line(block, joins, n),
                                                            item.rank, input_index=item.index))
            pos = 0
            count = 0
            # line numbers: newlines counted up to each candidate (one pass over the view in all); in a
            # log of long lines (progress-bar redraws) a memchr walk from line to line beats bytes.count
            # (the anchor walk numbered most segments; the others are counted from the last one)
            newlines = view.count if not long_lines else _LineWalk(view).count
            for seg in _with_every_line(segments, view, lambda: collector.wants_every_line):
                if seg.newlines is not None:
                    count = seg.newlines
                else:
                    count += newlines(b"\n", pos, seg.line_start)
                pos = seg.line_start
                raw = view[seg.start:seg.end]
                if seg.end < seg.line_end and not is_last_segment(view, seg) and _is_bar_bytes(raw):
                    continue  # an intermediate progress-bar redraw
                lineno = base + count + 1 + (bisect_left(joins, seg.line_start) if joins else 0)
                quote = inert.get(raw)
                was_idle = collector.idle
                if quote is not None and was_idle:
                    # a repeat of a line that changed nothing (a warning printed every step): only
                    # the "error-looking lines" tail wants to know where it was
                    if quote:
                        collector.error_tail.append(Evidence(file=item.path, line=lineno, text=quote))
                    continue
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
            block_lines = counted if counted is not None else count + newlines(b"\n", pos, len(view))
            base += block_lines + len(joins)
            long_lines = block_lines * LONG_LINE_BYTES < len(view)
            # nothing of this block is held while the next one is read and split (peak RSS)
            newlines = position = first = rest_view = None
            if changed:  # only a changed rule state can make a literal unneeded
                matcher.refresh(states, sample)
                changed = False
            ends_with_newline = block.endswith(b"\n")
            if progress is not None:
                progress(item.path, done, item.bytes if not item.compressed else None)
        item.lines = base + (0 if ends_with_newline else 1)
    for i, (rule, state) in enumerate(zip(rules, states)):
        if state.pending and (resolve is None or resolve(rule, state)):
            _flush_pending(i, matcher, rules, states)
        state.pending = None
    for item in inputs:
        item.notes.extend(matcher.budgets[item.index].finished_notes())
    return states


def _with_every_line(segments: list[Segment], view: bytes, wants: Callable[[], bool]) -> Iterator[Segment]:
    """The candidate segments in order and, after one, while `wants()` (an open record reads every line:
    FactCollector.wants_every_line), the lines that follow it up to the next candidate's line (each as its
    first `\r` segment). Asked after the caller has processed each segment: the generator is lazy."""
    size = len(view)
    n = len(segments)
    k = 0
    while k < n:
        seg = segments[k]
        k += 1
        yield seg
        at = seg.line_end + 1
        upto = segments[k].line_start if k < n else size
        while at < upto and wants():
            line = segment_at(view, at)
            yield line
            at = line.line_end + 1


LONG_LINE_BYTES = 512  # lines this long on average: counted by walking from newline to newline


class _LineWalk:
    """bytes.count(b"\\n", start, end) of one text by memchr (bytes.find) from newline to newline:
    ~0.1 us a line against ~0.35 ns a byte for bytes.count, the faster of the two for long lines."""

    __slots__ = ("find",)

    def __init__(self, text: bytes) -> None:
        self.find = text.find

    def count(self, sub: bytes, start: int, end: int) -> int:
        find = self.find
        n = 0
        at = find(sub, start, end)
        while at >= 0:
            n += 1
            at = find(sub, at + 1, end)
        return n


_DICT_START = b"{'loss': "
# a plain one-line dict (PY_METRIC_DICT_RE's 4 groups) or, as group 5, any other `{'loss': ` start
# (the shared literal prefix stays outside the alternation: the regex engine then skips to it fast)
assert PY_METRIC_DICT_RE.pattern.startswith(rb"\{'loss': ")
_SPLIT_RE = lazy_re(rb"\{'loss': (?:" + PY_METRIC_DICT_RE.pattern[len(rb"\{'loss': "):] + rb"|())")


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
        records = RecordColumns(parts[1::6], parts[2::6], parts[3::6], parts[4::6], [None] * n)
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
_FLATTENED_SPLIT_RE = lazy_re(r"\s(?=Traceback \(most recent call last\):|File \"[^\"]+\", line \d+|"
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


FOCUS_WINDOW_BYTES = 64 << 10
FOCUS_SEARCH_BYTES = 1 << 20


def _literal_at(raw: bytes, prefilter: Prefilter) -> int:
    """Where the first literal of interest sits in an overlong line (the part make_line keeps):
    an error glued after 8 KiB of other output is then read, not cut off."""
    # window by window from the start, within the first FOCUS_SEARCH_BYTES: every literal is searched in
    # each window, so the cost follows where the first literal is, not how long the line is (a 20 MB
    # line and ~1,700 literals were seconds; a literal further in than that leaves the focus at the start)
    kept = prefilter.kept
    longest = max((len(lit) for lit, _ in kept), default=0)
    for start in range(0, min(len(raw), FOCUS_SEARCH_BYTES), FOCUS_WINDOW_BYTES):
        window = raw[start:start + FOCUS_WINDOW_BYTES + longest]
        low = window.lower()
        found = [(low if ci else window).find(lit) for lit, ci in kept]
        hits = [pos for pos in found if 0 <= pos < FOCUS_WINDOW_BYTES]  # starting here (later: next window)
        if hits:
            return start + min(hits)
    return 0


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


_GATES: dict[tuple, list] = {}


def _pattern_gates(rule: Rule) -> list:
    """Per pattern of the rule, the literals one of which every match of it holds (derived from the
    pattern as for the prefilter: rules/literals.py), or None when none can be derived. A pattern
    none of whose literals is in a line cannot match it, and is neither compiled nor searched."""
    key = tuple(rule.patterns)
    gates = _GATES.get(key)
    if gates is None:
        known = getattr(rule, "pattern_literals", None)  # derived when the rule cache was written
        if known is None or len(known) != len(rule.patterns):
            from loradoctor.logs.rules.literals import derive_literals

            known = [derive_literals(pattern) for pattern in rule.patterns]
        gates = [None if not derived else ([t for t, ci in derived if not ci], [t.lower() for t, ci in derived if ci])
                 for derived in known]
        _GATES[key] = gates
    return gates


def _pattern_search(i: int, rule: Rule, line: reader.Line, budget: MatchBudget, lowered: bool = False):
    """The first match of the rule's patterns in the line, or None (also when the budget skips it).
    `lowered`: the line comes from a lower-cased paste; every literal and pattern ignores case."""
    if i in budget.skipped:
        return None
    text = line.text
    low = None
    compiled = rule.compiled_patterns
    for k, gate in enumerate(_pattern_gates(rule)):
        if gate is not None:
            case, nocase = gate
            if lowered:
                if low is None:
                    low = text.lower()
                if not any(lit.lower() in low for lit in case) and not any(lit in low for lit in nocase):
                    continue
            elif not any(lit in text for lit in case):
                if not nocase:
                    continue
                if low is None:
                    low = text.lower()
                if not any(lit in low for lit in nocase):
                    continue
        m = budget.search(i, _ignoring_case(compiled[k]) if lowered else compiled[k], text, line)
        if m:
            return m
    return None


def _flush_pending(i: int, matcher: "Matcher", rules: list[Rule], states: list[_RuleState]) -> None:
    """Search the lines pending for rule i, in input order, and search its later lines as they come."""
    state = states[i]
    pending, state.pending = state.pending or [], None
    matcher.line_cache.clear()  # cached results say "pending" for this rule
    for line in pending:
        if len(state.matches) >= MAX_MATCH_EVIDENCE:
            break
        m = _pattern_search(i, rules[i], line, matcher.budgets.get(line.input_index, matcher.budget),
                            line.input_index in matcher.lowered)
        if m is not None:
            state.matches.append((line, m))


_VETTED = re.Pattern  # the class of a built-in rule's compiled regex (rules.model._compile_vetted)
_NOCASE: dict[tuple, Any] = {}


def _ignoring_case(compiled):
    """The same regex ignoring case (for a lower-cased paste), compiled once per pattern."""
    key = (compiled.pattern, compiled.flags)
    found = _NOCASE.get(key)
    if found is None:
        if compiled.__class__ is _VETTED:
            found = _NOCASE[key] = re.compile(compiled.pattern, compiled.flags | re.IGNORECASE)
        else:
            import regex

            found = _NOCASE[key] = regex.compile(compiled.pattern, compiled.flags | regex.IGNORECASE)
    return found


def _search_shaped(matcher: "Matcher", target: tuple, i: int, pattern, text: str, blind: list, line: reader.Line):
    """budget.search of a require_all / exclude regex, skipped when the regex is digit_blind and missed a
    line of the same digit-blind text before (the answer would be the same: no match). `blind` holds the
    line's digit-blind text once worked out (shared by the line's searches)."""
    if matcher.nocase:
        pattern = _ignoring_case(pattern)
    shaped = digit_blind(pattern)
    if shaped:
        if not blind:
            blind.append(reader.digits_blind(text))
        misses = matcher.blind_misses.get(blind[0])
        if misses is not None and target in misses:
            return None
    m = matcher.budget.search(i, pattern, text, line)
    if m is None and shaped and len(text) <= LINE_CACHE_MAX_CHARS:
        cache = matcher.blind_misses
        misses = cache.get(blind[0])
        if misses is None:
            if len(cache) >= LINE_CACHE_ENTRIES:
                cache.clear()
            misses = cache[blind[0]] = set()
        misses.add(target)
    return m


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
        blind: list = []  # the line's digit-blind text, once a search needs it
        budget = matcher.budget
        budget.line_spent = 0.0  # the regex time of this line's searches
        for kind, i, j in matcher.hits(text):
            if i in budget.skipped:
                continue
            if budget.line_spent > LINE_BUDGET_S:
                budget.note(f"line {line.lineno}: rules skipped after {LINE_BUDGET_S * 1000:.0f} ms of matching")
                break
            rule, state = rules[i], states[i]
            if kind == "p":
                if len(state.matches) >= MAX_MATCH_EVIDENCE:
                    continue
                if state.pending is not None:
                    results.append(("d", i, j, None))  # searched later (DEFER_LINES)
                    continue
                results.append((kind, i, j, _pattern_search(i, rule, line, budget, matcher.nocase)))
            elif kind == "r":
                if not state.required[j]:
                    results.append((kind, i, j, _search_shaped(matcher, (kind, i, j), i, rule.compiled_require[j],
                                                               text, blind, line)))
            elif not state.excluded:
                results.append((kind, i, j, _search_shaped(matcher, (kind, i, j), i, rule.compiled_exclude[j],
                                                           text, blind, line)))
        if len(text) <= LINE_CACHE_MAX_CHARS:
            if len(cache) >= LINE_CACHE_ENTRIES:
                cache.clear()
            cache[text] = results
    for kind, i, j, m in results:
        if kind == "d":
            state = states[i]
            if len(state.matches) >= MAX_MATCH_EVIDENCE:
                continue
            if state.pending is not None:
                if len(state.pending) < DEFER_LINES:
                    state.pending.append(line)
                    matched = True  # it may match: its repeats must not be skipped as inert
                    continue
                _flush_pending(i, matcher, rules, states)
            m = _pattern_search(i, rules[i], line, matcher.budget, matcher.nocase)
            if m is not None and len(state.matches) < MAX_MATCH_EVIDENCE:
                state.matches.append((line, m))
                matched = True
            continue
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


# ---------------------------------------------------------------------------------------------
# findings and ranking

@record(eq=False, repr=False)
class _Candidate:
    rule: Rule
    finding: Finding
    score: float
    numbers: bool  # the rule's when held on numbers from the log (or env)
    earliest: tuple  # (time_s or None, input index, line)
    where: str
    groups: list[str]
    values: dict = field(default_factory=dict)  # every fact, for explaining the condition
    seen: list = field(default_factory=list)  # timeorder.Seen of each matched line (rank, time, place)


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
        fixes=[_filled_fix(f, values, first_match) for f in rule.fixes_for(values)], repro=rule.repro, references=list(rule.references),
        area=rule.cause.split(".", 1)[0],
    )
    seen = [timeorder.Seen(ln.rank, ln.time_s, ln.timestamp, ln.input_index, ln.lineno, e.where(), ln.text)
            for (ln, _), e in zip(state.matches, evidence)]
    return _Candidate(rule, finding, round(score, 3), numbers, earliest, where,
                      [group_of(n) for n in log_numbers + env_numbers], values, seen)


def _filled_fix(fix: Fix, values: dict[str, Any], match: Any) -> Fix:
    """A fix with what the log names filled in (`kill {oom.other_pids|or:PID}` -> `kill 4242`);
    line breaks and indentation of commands are kept."""
    if not (has_placeholders(fix.text) or has_placeholders(fix.command)):
        return fix
    return Fix(text=render_template(fix.text, values, match),
               command=render_template(fix.command, values, match, keep_lines=True) if fix.command else fix.command)


def _order_key(c: _Candidate, use_time: bool) -> tuple:
    """Where a candidate's earliest evidence sits: (time, input, line) when every candidate has a
    time, else (input, line). One rule for the whole ranking keeps the order transitive (comparing
    by time only when both of a pair have one could make A < B < C < A)."""
    t, index, lineno = c.earliest[0], c.earliest[1], c.earliest[2]
    return (t, index, lineno) if use_time else (index, lineno)


def _uses_time(cands: list[_Candidate]) -> bool:
    return bool(cands) and all(c.earliest[0] is not None for c in cands)


def rank_candidates(cands: list[_Candidate]) -> list[_Candidate]:
    """Order: generic last, a rule's declared `outranks` honoured, then higher score first, earliest
    evidence first; then consequences placed
    right after the finding whose cause they follow from; each finding gets a why_rank. Only an
    error can be the root of a consequence: a warning or a note (the `use_cache` notice in every
    LoRA log, a dtype warning 2000 healthy steps earlier) does not make a run die."""
    use_time = _uses_time(cands)
    ordered = _declared_first(sorted(cands, key=lambda c: (c.rule.generic, -c.score, _order_key(c, use_time))))
    parent: dict[int, _Candidate] = {}
    # latest evidence first: when two findings name each other, the earlier one is the root
    for c in sorted(ordered, key=lambda c: _order_key(c, use_time), reverse=True):
        for p in ordered:
            if p is c or p.rule.severity != "error" or not _follows(c, p):
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
            p = parent[id(c)]
            if _first_in_time(p, c) is not None and not any(e["cause"] == c.rule.cause for e in p.finding.differential):
                # the order in time put the NCCL failure first: say what would tell the two apart
                seen = timeorder.first(c.seen)
                rank = seen.rank if seen is not None else None
                p.finding.differential.append(differential.entry(c.finding, timeorder.tells_apart(c.rule.cause, rank)))
    _set_whys(_Order([c.finding for c in final], final))
    return final


def _first_in_time(dist: _Candidate, event: _Candidate) -> Optional[str]:
    """Why `dist` (an NCCL failure or timeout) is the first failure in time and `event` (a rank's CUDA
    error, OOM or exception) its consequence, in words; None when the order does not say so."""
    if not timeorder.applies(dist.rule.cause, event.rule.cause) or not dist.rule.is_consequence_of(event.rule.cause):
        return None
    return timeorder.first_failure(dist.rule.cause, dist.seen, event.rule.cause, event.seen)


def _order_note(event: _Candidate, dist: _Candidate) -> str:
    """For an event ranked as the root of an NCCL finding: what the order in time says, when it is
    known and the ranks differ ("" otherwise)."""
    if not timeorder.applies(dist.rule.cause, event.rule.cause):
        return ""
    waited = timeorder.waited_for(dist.rule.cause, dist.seen, event.rule.cause, event.seen)
    if waited:
        return waited
    e, d = timeorder.first(event.seen), timeorder.first(dist.seen)
    if e is None or d is None or e.rank is None or d.rank is None or e.rank == d.rank or not timeorder.before(e, d):
        return ""
    return f"rank {e.rank}'s error ({e.where}) comes first in time, rank {d.rank}'s NCCL failure ({d.where}) after it"


def _follows(c: _Candidate, p: _Candidate) -> bool:
    """c is placed as a consequence of p: c's rule names p's cause in `consequence_of`, unless c is an
    NCCL failure seen first in time (loradoctor/logs/timeorder.py); or p is that NCCL failure and c the
    later error."""
    if c.rule.is_consequence_of(p.rule.cause):
        return _first_in_time(c, p) is None
    return _first_in_time(p, c) is not None


def _outranks(a: _Candidate, b: _Candidate) -> bool:
    """a's rule declares (directly or through other rules) that it ranks above b's; a catch-all never
    outranks a specific finding (the loader refuses that too)."""
    return a.rule.outranks_rule(b.rule.id) is not None and (b.rule.generic or not a.rule.generic)


def _declared_first(ordered: list[_Candidate]) -> list[_Candidate]:
    """`ordered` with every declared `outranks` honoured: a rule that outranks another takes the
    loser's place when it sits lower (the winner moves up, right before it, with anything that in turn
    outranks the winner); without declarations this is `ordered` itself. The result is one total
    order that depends only on the candidates (a loop, which the loader refuses, is cut where found)."""
    beaten_by = {id(b): [a for a in ordered if a is not b and _outranks(a, b)] for b in ordered}
    if not any(beaten_by.values()):
        return ordered
    out: list[_Candidate] = []
    placed: set[int] = set()
    visiting: set[int] = set()

    def place(c: _Candidate) -> None:
        if id(c) in placed or id(c) in visiting:
            return
        visiting.add(id(c))
        for winner in beaten_by[id(c)]:  # in `ordered` order: the best-scored winner first
            place(winner)
        visiting.discard(id(c))
        placed.add(id(c))
        out.append(c)

    for c in ordered:
        place(c)
    return out


def _declared_text(a: _Candidate, b: _Candidate) -> str:
    """How a's rule declares it outranks b's, in words (file, the rule it goes through, the reason)."""
    from pathlib import Path

    hop = a.rule.outranks_rule(b.rule.id)
    source = Path(a.rule.source) if a.rule.source else None
    where = f" in {source.parent.name}/{source.name}" if source is not None else ""
    through = f" through {hop}" if hop != b.rule.id else ""
    reason = f": {a.rule.outranks_reason}" if a.rule.outranks_reason else ""
    return f"declared to outrank {_label(b)}{through}{where}{reason}"


def _label(c: _Candidate) -> str:
    return _flabel(c.finding)


MAX_WHY_PARTS = 3
TOP_DISTINCT = 3  # the first three findings name three distinct causes whenever the list has three (why texts say "three")


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


class _Order:
    """A final order of findings and what their why_rank texts need: the candidate of each rule finding
    (a look-alike or a guess has none), which finding each is a consequence of, and the findings that
    `distinct_causes_first` moved up with the positions everything had before it ran."""

    def __init__(self, findings: list[Finding], cands: list[_Candidate], before: Optional[dict[int, int]] = None,
                 promoted: Iterable[int] = ()) -> None:
        self.findings = findings
        self.cand = {id(c.finding): c for c in cands}
        by_rule = {c.rule.id: c for c in cands}
        self.parent = {id(c): by_rule[c.finding.consequence_of] for c in cands
                       if c.finding.consequence_of in by_rule and by_rule[c.finding.consequence_of] is not c}
        self.before = before or {}
        self.promoted = set(promoted)

    def jumped(self, a: Finding, b: Finding) -> bool:
        """a was moved up over b to give the top findings distinct causes."""
        return id(a) in self.promoted and self.before.get(id(a), 0) > self.before.get(id(b), 0)

    def descends(self, f: Finding, root: _Candidate) -> bool:
        c = self.cand.get(id(f))
        return c is not None and _descends(c, root, self.parent)

    def pair(self, a: Finding, b: Finding, basis: str) -> str:
        """Why a ranks above b, naming b; a or b may be a look-alike or a guess."""
        if self.jumped(a, b):
            first = next(f for f in self.findings if f.cause == b.cause)
            return (f"a cause not yet listed ranks before {_flabel(b)}, a further finding of {b.cause} "
                    f"(already #{first.rank}): the first three findings name distinct causes")
        ca, cb = self.cand.get(id(a)), self.cand.get(id(b))
        if cb is None:
            return f"{_flabel(b)} is a look-alike: the same lines read as {b.cause}, at lower confidence"
        if ca is None:
            at = self.findings.index(a)
            anchor = next((self.cand[id(f)] for f in reversed(self.findings[:at]) if id(f) in self.cand), None)
            if anchor is None:
                return "a guess and its alternatives come first when no rule finding is a diagnosis"
            return (f"the verdict's look-alikes come right after it and its consequences; against "
                    f"{_label(anchor)}: " + self.pair(anchor.finding, b, ""))
        return _reason(ca, cb, basis)


def _flabel(f: Finding) -> str:
    return f"#{f.rank} ({f.rule})"


def _set_whys(order: _Order) -> None:
    """The why_rank of every rule finding in `order` (look-alikes and guesses keep their own)."""
    for i, f in enumerate(order.findings):
        if id(f) in order.cand:
            f.why_rank = _why(order, i)


def _why(order: _Order, i: int) -> str:
    """One sentence: why the i-th finding sits there, naming the next finding down."""
    final = order.findings
    f = final[i]
    c = order.cand[id(f)]
    nxt = final[i + 1] if i + 1 < len(final) else None
    prev = final[i - 1] if i > 0 else None
    total = len(final)
    if id(c) in order.parent:
        p = order.parent[id(c)]
        later = _first_in_time(p, c)
        if later is not None:
            return (f"placed after {_label(p)} because it came later: {later}; the first failure in time is "
                    f"the likelier root (what would tell them apart: #{p.finding.rank}'s differential)")
        globs = ", ".join(g for g in c.rule.consequence_of)
        text = (f"placed after {_label(p)} because it is a consequence of it "
                f"({p.rule.cause} matches consequence_of {globs}); the root cause comes first")
        order_note = _order_note(p, c)
        return text + (f"; {order_note}" if order_note else "")
    basis = ""
    if c.numbers:
        names = ", ".join(GROUP_NAMES.get(g, g) for g in dict.fromkeys(c.groups))
        shown = _numbers_text(c)
        basis = f"numbers in {names}" + (f" ({shown})" if shown else "")
    rests = f"it rests on {basis}" if basis else "it rests on a keyword match only"
    if nxt is None:
        if total == 1:
            return "the only finding; " + rests
        assert prev is not None
        return f"ranks below {_flabel(prev)}: " + order.pair(prev, f, "")
    if len(order.cand) == 1 and all(o.rule == "differential" for o in final[i + 1:]):
        return "the only rule that fired (the look-alikes after it read the same lines another way); " + rests
    text = order.pair(f, nxt, basis)
    if nxt.consequence_of == c.rule.id:
        later = next((o for o in final[i + 1:] if not order.descends(o, c)), None)
        if later is not None:
            text += "; against the next root: " + order.pair(f, later, basis)
    elif id(nxt) not in order.cand:
        later = next((o for o in final[i + 1:] if id(o) in order.cand), None)
        if later is not None:
            text += "; against the next rule finding: " + order.pair(f, later, basis)
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
        later = _first_in_time(a, b)
        if later is not None:
            return f"{_label(b)} came after this failure in time ({later}), so this is the likelier root"
        note = _order_note(a, b)
        return f"{_label(b)} is a consequence of this finding, so this is the root" + (f"; {note}" if note else "")
    if b.finding.consequence_of is not None:
        return f"root causes rank before consequences such as {_label(b)}"
    if b.rule.generic and not a.rule.generic:
        return f"a specific finding ranks above the generic catch-all {_label(b)}"
    if _outranks(a, b):
        return _declared_text(a, b)
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

def _cause_titles(rules: list[Rule]) -> dict[str, str]:
    """A title per cause: the first rule of that cause whose title has no placeholder."""
    titles: dict[str, str] = {}
    for rule in rules:
        if "{" not in rule.title:
            titles.setdefault(rule.cause, rule.title)
    return titles


def _stronger_than_a_look_alike(f: Finding) -> bool:
    """An error of a rule (not a guess or a look-alike) with at least medium confidence."""
    return f.severity == "error" and f.rule not in ("differential", "guess") and confidence_label(f.confidence) in ("high", "medium")


def add_differential(findings: list[Finding], values: dict[str, Any], tail: list[Evidence],
                     rules: list[Rule]) -> list[Finding]:
    """The verdict's look-alikes (loradoctor/logs/differential.py) placed right after it, its consequences
    and the other errors of at least medium confidence that follow it, or, when nothing is a diagnosis but
    the last failure lines name a family, a labelled guess and its alternatives first. Ranks, why_rank and
    the verdict's `differential` are set."""
    verdict = next((f for f in findings if f.severity in ("error", "warning")), None)
    titles = _cause_titles(rules)
    if verdict is None:
        if values.get("metrics.train_finished"):
            return findings  # the run trained to the end: its error-looking lines did not stop it
        alts = differential.guess(tail, titles, values)
        if not alts:
            return findings
        verdict = alts[0][0]
        verdict.why_rank = "a guess: no rule matched, but the last failure line names this family"
        alts = alts[1:]
        out = [verdict] + [f for f, _ in alts] + findings
    else:
        alts = differential.alternatives(verdict, (f.cause for f in findings), values, titles)
        if not alts:
            return findings
        at = findings.index(verdict) + 1
        while at < len(findings) and (findings[at].consequence_of is not None
                                      or _stronger_than_a_look_alike(findings[at])):
            # the verdict's consequences stay right after it, and so does another error that rests on its
            # own evidence with at least medium confidence (a look-alike only rereads the verdict's lines)
            at += 1
        out = findings[:at] + [f for f, _ in alts] + findings[at:]
    for f, tells in alts:
        f.why_rank = (f"a look-alike of #1 ({verdict.cause}), lower confidence; "
                      f"what tells them apart: {tells}")
    for i, f in enumerate(out, 1):
        f.rank = i
    verdict.differential = verdict.differential + differential.differential_field(alts)
    return out


def distinct_causes_first(findings: list[Finding], cands: list[_Candidate],
                          top: int = TOP_DISTINCT) -> tuple[list[Finding], set[int]]:
    """`findings` reordered so that the first `top` name distinct causes where the list has them: a
    finding whose cause is already listed above it moves below the next diagnosis (error or warning) of
    a cause not yet listed, which moves up into its place. Nothing is dropped and the first finding never
    changes. A finding is not moved above its own cause (a consequence stays below it) nor above a
    finding whose rule declares it `outranks` the moved one's. Returns the new list and the ids of the
    findings moved up."""
    cand = {id(c.finding): c for c in cands}
    out = list(findings)
    promoted: set[int] = set()
    for i in range(1, min(top, len(out))):
        listed = {f.cause for f in out[:i]}
        if out[i].cause not in listed:
            continue
        above = {f.rule for f in out[:i]}
        for j in range(i + 1, len(out)):
            f = out[j]
            if f.cause in listed or f.severity not in DIAGNOSIS_SEVERITIES:
                continue
            if f.consequence_of is not None and f.consequence_of not in above:
                continue  # a consequence stays below the finding it follows from
            c = cand.get(id(f))
            if c is not None and any(id(g) in cand and _outranks(cand[id(g)], c) for g in out[i:j]):
                continue  # a declared `outranks` holds
            out.insert(i, out.pop(j))
            promoted.add(id(f))
            break
    return out, promoted


def finish_order(findings: list[Finding], cands: list[_Candidate]) -> list[Finding]:
    """The final order (distinct causes first, see distinct_causes_first), numbered 1..n, with every rule
    finding's why_rank naming the finding that now follows it and the verdict's `differential` entries
    carrying their look-alikes' final ranks."""
    before = {id(f): i for i, f in enumerate(findings)}
    out, promoted = distinct_causes_first(findings, cands)
    for i, f in enumerate(out, 1):
        f.rank = i
    _set_whys(_Order(out, cands, before, promoted))
    alike = {f.cause: f.rank for f in out if f.rule == "differential"}
    first = {}
    for f in out:
        first.setdefault(f.cause, f.rank)
    for f in out:
        for entry in f.differential:
            entry["rank"] = alike.get(entry["cause"], first.get(entry["cause"], entry["rank"]))
    return out


def explain(paths: list[str], extra_rule_dirs: Iterable[str] = (), env: Optional[dict] = None,
            progress: Optional[Callable[[str, int, Optional[int]], None]] = None,
            rules: Optional[list[Rule]] = None, differential_on: bool = True) -> ExplainReport:
    """Explain crash logs: `paths` are files, folders or `-` (stdin). `env` is a snapshot dict
    (`loradoctor env --format json` -> "snapshot") whose facts count as evidence. `progress` is
    called after each block with (path, bytes done, total bytes or None). Raises UserError for
    unreadable input or broken rules. `differential_on=False` leaves out the look-alikes and the guess
    (tests of the rules' own ranking)."""
    started = time.perf_counter()
    rules = load_rules(extra_rule_dirs) if rules is None else rules
    inputs = reader.resolve_inputs(list(paths))
    collector = FactCollector(block_metrics=True)
    finished: list[Facts] = []

    def final_facts() -> Facts:
        """The facts of every input with the env snapshot's (once, after the pass)."""
        if not finished:
            done = collector.finish(inputs)
            done.values.update(snapshot_facts(env, done.values.get("oom.device_index")))
            finished.append(done)
        return finished[0]

    def can_fire(rule: Rule, state: _RuleState) -> bool:
        """All but the rule's pattern matches hold: only then are its pending lines searched."""
        if not all(state.required) or state.excluded:
            return False
        return rule.condition is None or bool(rule.condition.evaluate(final_facts().values))

    states = scan_inputs(inputs, rules, collector, progress, resolve=can_fire)
    facts = final_facts()
    values = facts.values
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
    quote_as_pasted(inputs, rules, [e for f in findings for e in f.evidence] + tail)
    if differential_on:
        findings = add_differential(findings, values, tail, rules)
    findings = finish_order(findings, ranked)
    return ExplainReport(inputs=[i.to_dict() for i in inputs], findings=findings, unrecognised_tail=tail,
                         facts=dict(values), rules_checked=len(rules),
                         elapsed_s=time.perf_counter() - started)
