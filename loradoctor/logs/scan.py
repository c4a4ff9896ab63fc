"""Find candidate lines in raw blocks fast, without a Python loop over every line.

A training log is mostly progress-bar redraws and metric dicts; the lines a diagnosis needs are
rare. The engine gives this module every literal that any rule or extractor cares about. Each
literal gets an *anchor*: its rarest byte in typical logs (an upper-case letter, a bracket, ...).
Per block, `bytes.find` (memchr speed) walks the occurrences of each anchor byte; around each one
the enclosing segment (between `\\n` / `\\r`) is checked with one compiled alternation of all
literals. Only segments that contain a literal are decoded and normalised. An anchor byte that turns
out to be frequent in a block falls back to a regex search over that block for its literals.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

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

FREQUENT_ANCHOR_HITS = 4096  # more hits than this per block: use the regex fallback for the anchor


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
        # drop literals that contain another literal of the same or looser case rule
        kept: list[tuple[bytes, bool]] = []
        keys = sorted(unique, key=lambda k: len(k[0]))
        for data, ci in keys:
            low = data.lower()
            if any((k_ci and k in low) or (not k_ci and k in data) for k, k_ci in kept):
                continue
            kept.append((data, ci))
        self._kept = kept
        alternatives = []
        for data, ci in sorted(kept, key=lambda k: -len(k[0])):
            pat = re.escape(data)
            alternatives.append(b"(?i:" + pat + b")" if ci else pat)
        self.regex: Optional[re.Pattern] = re.compile(b"|".join(alternatives)) if alternatives else None
        # anchors: byte -> literals anchored on it
        self._anchors: dict[int, list[bytes]] = {}
        for data, ci in kept:
            best = min(range(len(data)), key=lambda i: (_FREQ[data[i]], -i))
            byte = data[best]
            bytes_to_walk = {byte}
            if ci and chr(byte).isalpha():
                bytes_to_walk = {ord(chr(byte).lower()), ord(chr(byte).upper())}
            for b in bytes_to_walk:
                self._anchors.setdefault(b, []).append(data)
        self._anchor_fallback: dict[int, re.Pattern] = {}
        for b, datas in self._anchors.items():
            alts = []
            for data in datas:
                ci = (data, True) in set(kept)
                pat = re.escape(data)
                alts.append(b"(?i:" + pat + b")" if ci else pat)
            self._anchor_fallback[b] = re.compile(b"|".join(alts))

    def candidates(self, block: bytes) -> list[Segment]:
        """Segments of `block` that contain a literal, in order, without duplicates."""
        if self.regex is None:
            return []
        found: dict[int, Segment] = {}
        verify = self.regex.search
        find = block.find
        rfind = block.rfind
        size = len(block)
        for byte, _datas in self._anchors.items():
            needle = bytes((byte,))
            pos = find(needle)
            hits = 0
            while pos != -1:
                hits += 1
                if hits > FREQUENT_ANCHOR_HITS:
                    # frequent anchor: let the regex walk the rest of the block for its literals
                    for m in self._anchor_fallback[byte].finditer(block, pos):
                        self._add(block, m.start(), found, verify)
                    break
                seg = self._add(block, pos, found, verify)
                pos = find(needle, seg if seg > pos else pos + 1) if seg < size else -1
        return [found[k] for k in sorted(found)]

    @staticmethod
    def _add(block: bytes, pos: int, found: dict, verify) -> int:
        """Register the segment around pos if it holds a literal; return the segment end."""
        line_start = block.rfind(b"\n", 0, pos) + 1
        cr = block.rfind(b"\r", line_start, pos)
        start = cr + 1 if cr >= 0 else line_start
        line_end = block.find(b"\n", pos)
        if line_end < 0:
            line_end = len(block)
        end = block.find(b"\r", pos, line_end)
        if end < 0:
            end = line_end
        if start in found:
            return end
        if verify(block, start, end) is not None:
            found[start] = Segment(line_start, start, end, line_end)
        return end

    def matched(self, segment: bytes) -> set[bytes]:
        """The (kept) literals present in a segment, lower-cased for case-insensitive ones."""
        if self.regex is None:
            return set()
        return {m.group(0) for m in self.regex.finditer(segment)}


def is_last_segment(block: bytes, seg: Segment) -> bool:
    """True when nothing but whitespace follows the segment on its physical line."""
    if seg.end >= seg.line_end:
        return True
    return not block[seg.end:seg.line_end].strip()


def iter_segment_texts(block: bytes, segs: list[Segment]) -> Iterator[tuple[Segment, bytes]]:
    for seg in segs:
        yield seg, block[seg.start:seg.end]
