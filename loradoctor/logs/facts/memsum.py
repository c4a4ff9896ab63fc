"""memsum: the numbers of a `torch.cuda.memory_summary()` table."""

from __future__ import annotations

from loradoctor.record import asdict, record
from typing import Any, Iterable, Optional

from loradoctor.lazyre import lazy_re
from loradoctor.logs.facts.common import MAX_ID, Extractor, Sink, _bounded_int, _size


@record
class MemorySummary:
    allocated_bytes: Optional[int] = None
    peak_allocated_bytes: Optional[int] = None
    reserved_bytes: Optional[int] = None
    peak_reserved_bytes: Optional[int] = None
    non_releasable_bytes: Optional[int] = None
    reserved_unallocated_bytes: Optional[int] = None
    alloc_retries: Optional[int] = None
    oom_count: Optional[int] = None

    def facts(self) -> dict[str, Any]:
        return {f"memsum.{k}": v for k, v in asdict(self).items() if v is not None}


# (units in either case: a lower-cased paste keeps `mb`, which no vocabulary gives its case back)
_MEMSUM_ROW_RE = lazy_re(r"^\|?\s*(Allocated memory|GPU reserved memory|Non-releasable memory)\s*\|\s*"
                            r"(\d+(?:\.\d+)?\s*[KMGTkmgt]?i?[Bb])\s*\|\s*(\d+(?:\.\d+)?\s*[KMGTkmgt]?i?[Bb])\s*\|")
_MEMSUM_COUNTERS_RE = lazy_re(r"CUDA OOMs:\s*(\d+)\s*\|\s*cudaMalloc retries:\s*(\d+)")


def parse_memory_summary(lines: Iterable[str]) -> Optional[MemorySummary]:
    """Numbers of one `torch.cuda.memory_summary()` table (docs/reference/pytorch.md §2);
    None when the lines hold no such table."""
    summary = MemorySummary()
    seen = False
    for text in lines:
        text = text.strip()
        c = _MEMSUM_COUNTERS_RE.search(text)
        if c:
            summary.oom_count, summary.alloc_retries = _bounded_int(c.group(1), MAX_ID), _bounded_int(c.group(2), MAX_ID)
            seen = True
            continue
        m = _MEMSUM_ROW_RE.match(text)
        if not m:
            continue
        cur, peak = _size(m.group(2)), _size(m.group(3))
        label = m.group(1)
        if label == "Allocated memory" and summary.allocated_bytes is None:
            summary.allocated_bytes, summary.peak_allocated_bytes = cur, peak
        elif label == "GPU reserved memory" and summary.reserved_bytes is None:
            summary.reserved_bytes, summary.peak_reserved_bytes = cur, peak
        elif label == "Non-releasable memory" and summary.non_releasable_bytes is None:
            summary.non_releasable_bytes = cur
        seen = True
    if not seen:
        return None
    if summary.reserved_bytes is not None and summary.allocated_bytes is not None:
        summary.reserved_unallocated_bytes = max(0, summary.reserved_bytes - summary.allocated_bytes)
    return summary


class MemsumExtractor(Extractor):
    """Collects the table's lines from its header (or its `CUDA OOMs` counter line) for up to 80
    lines; the first table's numbers are published, and how many tables there were."""

    TRIGGERS = (("memory summary", False), ("CUDA OOMs", False), ("Allocated memory", False),
                ("GPU reserved memory", False), ("Non-releasable memory", False))

    def __init__(self, sink: Sink) -> None:
        super().__init__(sink)
        self._memsum_lines: Optional[list[str]] = None
        self._memsum_start = 0
        self._memsum_count = 0
        self._memsum_first: Optional[MemorySummary] = None

    @property
    def open(self) -> bool:
        return self._memsum_lines is not None

    def feed(self, line: Any) -> bool:
        if self._memsum_lines is not None:
            self._memsum_feed(line)
        text = line.text
        if "memory summary" in text and "PyTorch" in text:
            self._memsum_open(line)
            return True
        if "CUDA OOMs" in text and self._memsum_lines is None:
            self._memsum_open(line)
            self._memsum_feed(line)
            return True
        return False

    def _memsum_open(self, line: Any) -> None:
        self.close()
        self._memsum_lines = []
        self._memsum_start = line.lineno
        self.sink._evidence("memsum", line)

    def _memsum_feed(self, line: Any) -> None:
        if line.lineno - self._memsum_start > 80 or self._memsum_lines is None:
            self.close()
            return
        text = line.text
        if "|" in text and not text.startswith("|"):
            text = text[text.index("|"):]  # a logger prefix: `INFO:__main__:| Allocated memory | ...`
        if text.startswith("|") or "CUDA OOMs" in text:
            self._memsum_lines.append(text)

    def close(self) -> None:
        if self._memsum_lines:
            summary = parse_memory_summary(self._memsum_lines)
            if summary is not None:
                self._memsum_count += 1
                if self._memsum_first is None:
                    self._memsum_first = summary
                    self.sink.values.update(summary.facts())
        self._memsum_lines = None

    def publish(self, values: dict[str, Any]) -> None:
        if self._memsum_count:
            values["memsum.count"] = self._memsum_count
