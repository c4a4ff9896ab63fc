"""Find candidate lines in raw blocks fast, without a Python loop over every line.

A training log is mostly progress-bar redraws and metric dicts; the lines a diagnosis needs are
rare. The engine gives this module every literal that any rule or extractor cares about. Each
literal gets an *anchor*: its rarest byte in this input (sampled from its first block). One
`bytes.translate` turns every anchor byte of a block into NUL, then `bytes.find` (memchr) walks the
NULs; around each one the enclosing segment (between `\n` / `\r`) is checked with one compiled
alternation of all literals. Only segments that contain a literal are decoded and normalised.
Literals made only of bytes that are common in the input are searched whole, one by one."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable

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

SAMPLE_BYTES = 256 << 10  # how much of an input's start sets the byte frequencies
COMMON_BYTE_SHARE = 1 / 100  # a literal whose rarest byte is this common is searched on its own


@dataclass(frozen=True)
class Literal:
    text: str
    ignore_case: bool = False


@dataclass
class Segment:
    """A candidate: [start, end) of a `\\r`/`\\n`-delimited segment inside its physical line."""

    line_start: int
    start: int
    end: int
    line_end: int


class Prefilter:
    """All literals of interest; finds the segments of a block that contain any of them."""

    def __init__(self, literals: Iterable[Literal]):
        unique: dict[tuple[bytes, bool], Literal] = {}
        for lit in literals:
            data = lit.text.encode("utf-8")
            if not data:
                continue
            key = (data.lower() if lit.ignore_case else data, lit.ignore_case)
            unique[key] = lit
        self.literals = list(unique.values())
        # a literal that contains a kept one adds nothing: every line with it is found anyway
        # (a case-insensitive literal only defers to a case-insensitive one)
        kept: list[tuple[bytes, bool]] = []
        keys = sorted(unique, key=lambda k: len(k[0]))
        for data, ci in keys:
            low = data.lower()
            if any((k_ci and k in low) or (not k_ci and not ci and k in data) for k, k_ci in kept):
                continue
            kept.append((data, ci))
        self._kept = kept
        self.plan(b"")

    def plan(self, sample: bytes) -> None:
        """Choose, for each literal, its rarest byte in `sample` (the start of the input; a
        built-in guess of byte frequencies when empty). All chosen bytes are found in ONE pass:
        the block is translated so that exactly those bytes become NUL, then memchr walks the
        NULs. A literal whose every byte is common in this input is searched on its own instead
        (bytes.find of the whole literal, on a lower-cased copy when it ignores case)."""
        sample = sample[:SAMPLE_BYTES]
        singles = Counter(sample) if sample else None

        def freq(b: int) -> float:
            if singles is None:
                return _FREQ[b] / 1000.0
            return singles[b] / max(1, len(sample))

        anchor_bytes: set[int] = set()
        by_byte: dict[int, list[tuple[bytes, bool]]] = {}
        self._alone_cs: list[bytes] = []
        self._alone_ci: list[bytes] = []
        for data, ci in self._kept:
            def weight(b: int) -> float:
                c = chr(b)
                if ci and c.isalpha():
                    return freq(ord(c.lower())) + freq(ord(c.upper()))
                return freq(b)

            best = min(data, key=weight)
            if weight(best) > COMMON_BYTE_SHARE and len(data) >= 3:
                (self._alone_ci if ci else self._alone_cs).append(data)
                continue
            c = chr(best)
            for b in ({ord(c.lower()), ord(c.upper())} if ci and c.isalpha() else {best}):
                anchor_bytes.add(b)
                by_byte.setdefault(b, []).append((data, ci))
        anchor_bytes.discard(0)
        self._by_byte = by_byte
        table = bytearray(range(256))
        table[0] = 1  # a NUL in the input must not look like a hit
        for b in anchor_bytes:
            table[b] = 0
        self._table = bytes(table) if anchor_bytes else None
        self.anchor_bytes = bytes(sorted(anchor_bytes))

    @property
    def needles(self) -> list[bytes]:
        return [bytes((b,)) for b in self.anchor_bytes] + self._alone_cs + self._alone_ci

    def candidates(self, block: bytes, masked: Iterable[tuple[int, int]] = ()) -> list[Segment]:
        """Segments of `block` that contain a literal, in order, without duplicates. Anchor bytes
        inside the `masked` (start, end) spans are ignored (the engine masks metric dicts, which
        it reads with its own regex, when no literal occurs in them)."""
        if not self._kept:
            return []
        found: dict[int, Segment] = {}
        size = len(block)
        if self._table is not None:
            mapped = block.translate(self._table)
            if masked:
                buffer = bytearray(mapped)
                for start, end in masked:
                    n = end - start
                    buffer[start:end] = _ONES[:n] if n <= len(_ONES) else b"\1" * n
                mapped = bytes(buffer)
            find = mapped.find
            by_byte = self._by_byte
            pos = find(b"\0")
            while pos != -1:
                seg = _segment(block, pos)
                if seg.start not in found:
                    # check the literals anchored on each anchor byte present in the segment
                    text = block[seg.start:seg.end]
                    low = None
                    q = pos
                    seen: set[int] = set()
                    hit = False
                    while q != -1 and not hit:
                        b = block[q]
                        if b not in seen:
                            seen.add(b)
                            for lit, ci in by_byte[b]:
                                if ci:
                                    if low is None:
                                        low = text.lower()
                                    if lit in low:
                                        hit = True
                                        break
                                elif lit in text:
                                    hit = True
                                    break
                        q = find(b"\0", q + 1, seg.end)
                    if hit:
                        found[seg.start] = seg
                pos = find(b"\0", seg.end) if seg.end < size else -1
        walks = [(block, lit) for lit in self._alone_cs]
        if self._alone_ci:
            low_block = block.lower()
            walks += [(low_block, lit) for lit in self._alone_ci]
        for haystack, needle in walks:
            find = haystack.find
            pos = find(needle)
            while pos != -1:
                seg = _segment(block, pos)
                found.setdefault(seg.start, seg)
                pos = find(needle, seg.end) if seg.end < size else -1
        return [found[k] for k in sorted(found)]

    def occurs_in(self, text: bytes) -> bool:
        """True when any literal occurs in text."""
        low = text.lower()
        return any((d in low) if ci else (d in text) for d, ci in self._kept)

_ONES = b"\1" * 4096


def _segment(block: bytes, pos: int) -> Segment:
    """The `\r`/`\n`-delimited segment around pos, and its physical line."""
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
