"""Find candidate lines in raw blocks fast, without a Python loop over every line.

A training log is mostly progress-bar redraws and metric dicts; the lines a diagnosis needs are
rare. The engine gives this module every literal that any rule or extractor cares about. Each
literal gets an *anchor*: its byte found in the fewest `\r`/`\n` segments of a sample of this
input (the engine samples the start without metric dicts, and samples again when a block needs
too many fresh checks). One `bytes.translate` deletes every other byte of a block, leaving its anchor
bytes in order, and `bytes.find` of one byte (memchr) walks from one to the next; each segment holding
one is checked once against the literals anchored on the anchor bytes it holds (the literals that hit lately first: a log repeats
its shapes), and the verdict is remembered for repeated lines.
Only segments that contain a literal are decoded and normalised. Literals whose every byte is in
many segments are searched whole, one by one (bytes.find)."""

from __future__ import annotations

import re
from bisect import bisect_right
from loradoctor.record import record
from typing import Any, Callable, Iterable, Sequence, Union

Text = Union[str, bytes]

# How common a byte is in training logs (progress bars, metric dicts, prose). Lower = rarer =
# better anchor. Rough numbers; only their order matters.
_FREQ = [5] * 256
for _b in range(128, 256):
    _FREQ[_b] = 40  # UTF-8 of tqdm's block characters
for _c in "0123456789":
    _FREQ[ord(_c)] = 50
for _c in " %|/.:,[]<>_'":
    _FREQ[ord(_c)] = 45
for _c in "etaoinsrl":
    _FREQ[ord(_c)] = 30
for _c in "cdhumpgf":
    _FREQ[ord(_c)] = 20
for _c in "bvkwy":
    _FREQ[ord(_c)] = 10
for _c in "xqjz":
    _FREQ[ord(_c)] = 6
for _c in "EINORTASL":
    _FREQ[ord(_c)] = 9
for _c in "{}()=-\"\t+":
    _FREQ[ord(_c)] = 12
for _c in "\n\r":
    _FREQ[ord(_c)] = 1000  # never an anchor

SAMPLE_BYTES = 256 << 10  # how much of a sample sets the anchors
COMMON_BYTE_SHARE = 1 / 100  # no sample: a literal whose rarest byte is this common is searched on its own
# with a sample: one segment visit (a few us of Python) costs about as much as bytes.find over
# ~5 KiB, so a byte found in more than one segment per 4 KiB makes a worse anchor than the literal
ANCHOR_MAX_SHARE = 1 / 4096
VERDICT_CACHE_ENTRIES = 4096  # remembered segment verdicts (repeated warning lines are common)
VERDICT_MAX_BYTES = 2048
RECENT_HITS = 8  # anchored literals that hit lately, tried first on a fresh segment
REPLAN_MISSES = 4096  # fresh segment checks per block beyond which the anchors are re-chosen
DEDUPE_MIN_SAMPLE = 64 << 10  # a sample at least this big: drop the literals that contain others


def contained_in(items: Sequence[tuple[Text, bool]]) -> list[set[int]]:
    """For each (text, ignore_case) item i, the indices j != i of the items found inside it: a
    case-insensitive j anywhere in i's lower-cased text, a case-sensitive j only inside a
    case-sensitive i. All texts are joined (NUL-separated) into two strings, so each item costs a
    few `find` calls in C instead of one Python `in` test per pair (n^2 for ~450 literals was a
    tenth of a second of every start-up)."""
    if not items:
        return []
    sep = b"\0" if isinstance(items[0][0], bytes) else "\0"
    texts = [t for t, _ in items]
    lows = [t.lower() for t in texts]
    big, big_low = sep.join(texts), sep.join(lows)
    starts, at = [], 0
    for t in texts:
        starts.append(at)
        at += len(t) + 1
    out: list[set[int]] = [set() for _ in items]
    for j, (text, ci) in enumerate(items):
        if not text:
            continue
        needle, hay = (lows[j], big_low) if ci else (text, big)
        pos = hay.find(needle)
        while pos != -1:
            i = bisect_right(starts, pos) - 1
            if i != j and (ci or not items[i][1]):
                out[i].add(j)
            pos = hay.find(needle, pos + 1)
    return out


# (bytes, ignore_case) literal -> the literals found inside it (contained_in), over every literal in
# _CONTAINED_OVER
_CONTAINED: dict[tuple[bytes, bool], frozenset] = {}
_CONTAINED_OVER: set[tuple[bytes, bool]] = set()


class LiteralIndex:
    """Which of a set of literals a line holds, as the union (`|`) of their payloads: the engine's rule
    targets (sets) and the collector's extractor bits (ints) alike. A literal without digits is in a line
    exactly when it is in the line with every digit written 0, so its verdict is remembered per digit-blind
    line (a warning repeated with a new step number, byte count or timestamp is one dict lookup); a literal
    with digits can only be there where its digit-blind form is in the digit-blind line, so those few are
    kept with the verdict and tested on the line itself. Plain substring tests: far cheaper per line than
    one big alternation."""

    def __init__(self, items: Iterable[tuple[str, bool, Any]], empty: Callable[[], Any],
                 cache_entries: int = 4096) -> None:
        from loradoctor.logs.reader import DIGITS_BLIND, digits_blind

        self._blind = digits_blind
        merged: dict[tuple[str, bool], Any] = {}
        for text, ignore_case, payload in items:
            key = (text.lower() if ignore_case else text, ignore_case)
            merged[key] = merged[key] | payload if key in merged else payload
        self.empty = empty
        self._case: list = []
        self._nocase: list = []
        self._case_digits: list = []
        self._nocase_digits: list = []
        for (t, ci), v in merged.items():
            blind = t.translate(DIGITS_BLIND)
            if blind == t and "0" not in t:  # no digit
                (self._nocase if ci else self._case).append((t, v))
            else:
                (self._nocase_digits if ci else self._case_digits).append((t, v, blind))
        self._cache: dict[str, tuple] = {}
        self._cache_entries = cache_entries

    def find(self, text: str) -> Any:
        """The union of the payloads of the literals in `text` (do not modify it: it may be remembered)."""
        blind = self._blind(text)
        cached = self._cache.get(blind)
        if cached is None:
            low = blind.lower() if self._nocase_digits else ""
            cached = (self._union(blind, self._case, self._nocase),
                      [(t, v) for t, v, t_blind in self._case_digits if t_blind in blind],
                      [(t, v) for t, v, t_blind in self._nocase_digits if t_blind in low])
            if len(self._cache) >= self._cache_entries:
                self._cache.clear()
            self._cache[blind] = cached
        found, case, nocase = cached
        if not (case or nocase):
            return found
        return found | self._union(text, case, nocase)

    def _union(self, text: str, case: list, nocase: list) -> Any:
        found = self.empty()
        for literal, payload in case:
            if literal in text:
                found |= payload
        if nocase:
            low = text.lower()
            for literal, payload in nocase:
                if literal in low:
                    found |= payload
        return found


@record(frozen=True)
class Literal:
    text: str
    ignore_case: bool = False


@record(eq=False, repr=False)
class Segment:
    """A candidate: [start, end) of a `\\r`/`\\n`-delimited segment inside its physical line."""

    line_start: int
    start: int
    end: int
    line_end: int
    newlines: "int | None" = None  # newlines in the block before line_start, when the anchor walk counted them


class Prefilter:
    """All literals of interest; finds the segments of a block that contain any of them."""

    def __init__(self, literals: Iterable[Literal], sample: bytes = b""):
        unique: dict[tuple[bytes, bool], Literal] = {}
        for lit in literals:
            data = lit.text.encode("utf-8")
            if not data:
                continue
            key = (data.lower() if lit.ignore_case else data, lit.ignore_case)
            unique[key] = lit
        self.literals = list(unique.values())
        # a literal that contains another adds nothing: every line with it is found anyway (a
        # case-insensitive literal only defers to a case-insensitive one). Of equal literals the first
        # in (length, order) stays; containment is transitive, so "contains no earlier literal" is
        # the same as "contains no kept literal".
        # The containment test costs ~20 ms, so it waits for an input big enough to repay it (a plan
        # on a sample of DEDUPE_MIN_SAMPLE bytes or more); until then every literal is searched, which
        # finds the same segments.
        self._unique = sorted(unique, key=lambda k: len(k[0]))
        self._minimal: "list[tuple[bytes, bool]] | None" = None
        self._kept = self._unique
        # planned now with a sample, else on first use: the engine plans on the input's first block
        # anyway, so a plan from the built-in byte guesses here (~5 ms) would be thrown away
        self._planned = False
        self.newlines: "int | None" = None  # of the last block candidates() walked, when it counted them
        if sample:
            self.plan(sample)

    def _minimal_literals(self) -> list[tuple[bytes, bool]]:
        if self._minimal is None:
            keys = self._unique
            if not _CONTAINED_OVER.issuperset(keys):
                # containment is a relation between two literals: worked out once over every literal
                # seen, it serves the smaller sets the engine rebuilds with as rules saturate
                universe = list(_CONTAINED_OVER.union(keys))
                inside = contained_in(universe)
                _CONTAINED.clear()
                _CONTAINED.update({k: frozenset(universe[j] for j in inside[i]) for i, k in enumerate(universe)})
                _CONTAINED_OVER.update(universe)
            order = {key: i for i, key in enumerate(keys)}
            self._minimal = [key for i, key in enumerate(keys)
                             if not any(order.get(other, i) < i for other in _CONTAINED[key])]
        return self._minimal

    def plan(self, sample: bytes) -> None:
        """Choose, for each literal, its rarest byte in `sample` (the start of the input, ideally
        without the metric dicts the engine cuts out; a built-in guess of byte frequencies when
        empty). All chosen bytes are found in ONE pass: the block is translated with every other
        byte deleted, then memchr walks from anchor to anchor. Every anchor costs a few microseconds of
        Python, while one bytes.find of a whole literal costs about as much as an anchor every few
        KiB; so a literal whose rarest byte is commoner than that (`loss`, `torch`, `nan` in a
        busy log) is searched on its own instead (bytes.find of the whole literal, on a
        lower-cased copy when it ignores case)."""
        sample = sample[:SAMPLE_BYTES]
        if len(sample) >= DEDUPE_MIN_SAMPLE:
            self._kept = self._minimal_literals()
        # the walk visits each *segment* holding an anchor byte once, so what matters is how
        # many segments hold the byte: a letter that fills every warning line but never occurs
        # in progress bars or metric dicts is a fine anchor. Counted per byte, capped (cheap).
        segs = _segment_counts(sample, {b for d, _ in self._kept for b in d}) if sample else {}

        def freq(b: int) -> float:
            if not sample:
                return _FREQ[b] / 1000.0
            return segs.get(b, 0) / max(1, len(sample))

        # how common each byte is, as a case-sensitive and as a case-insensitive literal sees it
        # (one table per plan: a weight per byte of every literal was thousands of calls)
        weight_cs = [freq(b) for b in range(256)]
        weight_ci = list(weight_cs)
        for b in range(256):
            c = chr(b)
            if c.isalpha() and b < 128:
                weight_ci[b] = weight_cs[ord(c.lower())] + weight_cs[ord(c.upper())]
        anchor_bytes: set[int] = set()
        by_byte: dict[int, list[tuple[bytes, bool]]] = {}
        self._alone_cs: list[bytes] = []
        self._alone_ci: list[bytes] = []
        for data, ci in self._kept:
            weight = (weight_ci if ci else weight_cs).__getitem__
            best = min(data, key=weight)
            limit = ANCHOR_MAX_SHARE if sample else COMMON_BYTE_SHARE
            if weight(best) > limit and len(data) >= 3:
                (self._alone_ci if ci else self._alone_cs).append(data)
                continue
            c = chr(best)
            # only ASCII letters have a case pair among bytes (bytes.lower() folds nothing else):
            # chr(0xB5).upper() is U+039C, far outside the byte table (a CJK paste can make a
            # UTF-8 continuation byte of a literal its rarest byte)
            for b in ({ord(c.lower()), ord(c.upper())} if ci and c.isalpha() and best < 128 else {best}):
                anchor_bytes.add(b)
                by_byte.setdefault(b, []).append((data, ci))
        anchor_bytes.discard(0)
        self._by_byte = by_byte
        # segment bytes -> (holds a literal, how many anchor bytes it holds) (this plan)
        self._verdicts: dict[bytes, tuple[bool, int]] = {}
        self._recent: list[tuple[bytes, bool]] = []  # anchored literals that hit lately, latest first
        self.misses = 0
        self._drop = bytes(b for b in range(256) if b not in anchor_bytes)  # translate(None, drop) keeps anchors
        # the walk's sequence keeps the newlines too (they count the lines), unless a newline is an anchor
        self._count_lines = 10 not in anchor_bytes
        self._drop_lines = self._drop.replace(b"\n", b"") if self._count_lines else self._drop
        self.anchor_bytes = bytes(sorted(anchor_bytes))
        self._planned = True

    def _ensure_planned(self) -> None:
        if not self._planned:
            self.plan(b"")

    @property
    def kept(self) -> list[tuple[bytes, bool]]:
        """The literals of interest, as (bytes, ignore_case); ignore_case ones are lower-cased; none
        that contains another (a line holding it holds the other)."""
        return self._minimal_literals()

    @property
    def needles(self) -> list[bytes]:
        self._ensure_planned()
        return [bytes((b,)) for b in self.anchor_bytes] + self._alone_cs + self._alone_ci

    def candidates(self, block: bytes) -> list[Segment]:
        """Segments of `block` that contain a literal, in order, without duplicates. Afterwards
        `self.misses` says how many segments had to be checked afresh: many more than REPLAN_MISSES
        means the anchors chosen from the input's start have become common, and the caller should
        plan() again on a sample of this block; `self.newlines` is the number of newlines in the block
        when the walk counted them (else None), and each segment the walk found has its `newlines`."""
        self.newlines = None
        if not self._kept:
            return []
        self._ensure_planned()
        found: dict[int, Segment] = {}
        size = len(block)
        self.misses = 0
        drop = self._drop
        # the anchor bytes of the block, in order: one bytes.translate that deletes every other byte
        # (about half the cost of mapping every byte to a NUL-or-not copy of the block, and the result
        # is small). The walk goes from anchor to anchor with memchr (bytes.find of one byte): the
        # next anchor after a segment is the byte `sequence[k]`, k the anchors counted so far, and no
        # anchor lies between the segment's end and that byte's next occurrence.
        # The sequence keeps every newline as well (a small price: one byte a line): the newlines before
        # an anchor are its index in the sequence less the anchors before it, so the walk numbers the
        # lines of its segments and the block's line count is sequence.count(b"\n"); the engine then
        # needs no pass of its own from candidate to candidate.
        lines = self._count_lines
        sequence = block.translate(None, self._drop_lines) if self.anchor_bytes else b""
        if lines and self.anchor_bytes:
            self.newlines = sequence.count(b"\n")
        at = _NOT_NEWLINE.search(sequence) if lines else (0 if sequence else None)
        if at is not None:
            index = at if not lines else at.start()  # of the anchor at `pos`, in the sequence
            bfind, brfind = block.find, block.rfind
            by_byte = self._by_byte
            verdicts = self._verdicts
            recent = self._recent
            misses = 0
            total = len(sequence)
            seen = 0  # anchors before `pos`
            search = _NOT_NEWLINE.search
            pos = bfind(sequence[index])
            # inlined segment_at: this loop runs once per segment that holds an anchor byte
            while True:
                line_start = brfind(b"\n", 0, pos) + 1
                cr = brfind(b"\r", line_start, pos)
                start = cr + 1 if cr >= 0 else line_start
                line_end = bfind(b"\n", pos)
                if line_end < 0:
                    line_end = size
                end = bfind(b"\r", pos, line_end)
                if end < 0:
                    end = line_end
                # no anchor lies in [start, pos): the walk came from the end of an earlier segment
                text = block[start:end]
                known = verdicts.get(text)
                if known is not None:  # a repeated line (warnings repeat verbatim): known
                    hit, count = known
                else:
                    anchors = text.translate(None, drop)
                    count = len(anchors)
                    low = None
                    hit = False
                    # the literals that hit lately first (a log repeats its shapes: every eval
                    # record holds `loss`), then the literals anchored on the anchor bytes this
                    # segment holds; the verdict is the same in any order
                    for lit, ci in recent:
                        if ci:
                            if low is None:
                                low = text.lower()
                            if lit in low:
                                hit = True
                                break
                        elif lit in text:
                            hit = True
                            break
                    else:
                        for b in set(anchors):
                            for key in by_byte[b]:
                                lit, ci = key
                                if ci:
                                    if low is None:
                                        low = text.lower()
                                    if lit in low:
                                        hit = True
                                        break
                                elif lit in text:
                                    hit = True
                                    break
                            if hit:
                                recent.insert(0, key)
                                del recent[RECENT_HITS:]
                                break
                    misses += 1
                    if len(text) <= VERDICT_MAX_BYTES:
                        if len(verdicts) >= VERDICT_CACHE_ENTRIES:
                            verdicts.clear()  # the log changed shape: remember the new lines
                        verdicts[text] = (hit, count)
                if lines:
                    before = index - seen  # newlines before pos: none lies between line_start and pos
                    if hit:
                        found[start] = Segment(line_start, start, end, line_end, before)
                    seen += count
                    # the segment holds no newline: the sequence's elements before `end` are the anchors
                    # and the newlines before it; the next anchor is the first non-newline after those
                    nxt = search(sequence, seen + before)
                    if nxt is None:
                        break
                    index = nxt.start()
                else:
                    if hit:
                        found[start] = Segment(line_start, start, end, line_end)
                    seen += count
                    if seen >= total:
                        break
                    index = seen
                pos = bfind(sequence[index], end)
            self.misses = misses
        walks = [(block, lit) for lit in self._alone_cs]
        if self._alone_ci:
            low_block = block.lower()
            walks += [(low_block, lit) for lit in self._alone_ci]
        for haystack, needle in walks:
            find = haystack.find
            pos = find(needle)
            while pos != -1:
                seg = segment_at(block, pos)
                found.setdefault(seg.start, seg)
                pos = find(needle, seg.end) if seg.end < size else -1
        return [found[k] for k in sorted(found)]

    def occurs_in(self, text: bytes) -> bool:
        """True when any literal occurs in text."""
        low = text.lower()
        return any((d in low) if ci else (d in text) for d, ci in self._kept)


_NOT_NEWLINE = re.compile(rb"[^\n]")


def _segment_counts(sample: bytes, wanted: set[int]) -> dict[int, int]:
    """For each byte in `wanted` (lower and upper case both counted separately): in how many
    `\r`/`\n` segments of `sample` it occurs, counting at most ANCHOR_MAX_SHARE * len + 1 (past
    that the byte is common anyway; the cap keeps this at a few ms)."""
    cap = int(len(sample) * ANCHOR_MAX_SHARE) + 1
    find = sample.find
    out: dict[int, int] = {}
    extra = {ord(chr(b).lower()) for b in wanted if b < 128} | {ord(chr(b).upper()) for b in wanted if b < 128}
    for b in wanted | extra:
        if b in (10, 13):
            continue
        needle = bytes((b,))
        n = 0
        pos = find(needle)
        while pos != -1 and n < cap:
            n += 1
            nl = find(b"\n", pos)
            cr = find(b"\r", pos, nl if nl >= 0 else len(sample))
            end = cr if cr >= 0 else nl
            if end < 0:
                break
            pos = find(needle, end)
        out[b] = n
    return out


def segment_at(block: bytes, pos: int) -> Segment:
    """The `\r`/`\n`-delimited segment around pos, and its physical line (at a line's start: its first
    segment, the text of a CRLF line)."""
    line_start = block.rfind(b"\n", 0, pos) + 1
    cr = block.rfind(b"\r", line_start, pos)
    start = cr + 1 if cr >= 0 else line_start
    line_end = block.find(b"\n", pos)
    if line_end < 0:
        line_end = len(block)
    end = block.find(b"\r", pos, line_end)
    if end < 0:
        end = line_end
    return Segment(line_start, start, end, line_end)


def is_last_segment(block: bytes, seg: Segment) -> bool:
    """True when nothing but whitespace follows the segment on its physical line."""
    if seg.end >= seg.line_end:
        return True
    return not block[seg.end:seg.line_end].strip()
