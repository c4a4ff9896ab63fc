"""smi: an `nvidia-smi` table pasted into the log (facts `smi.*`): memory in use on a GPU that no listed
process accounts for. The table is read by the env importer (env/snapshot.py) and measured by
env/facts.unlisted_bytes, the same code that `env --from` and the live env check use."""

from __future__ import annotations

import re
from typing import Any, Optional

from loradoctor.lazyre import lazy_re
from loradoctor.logs.facts.common import Extractor, Sink

_HEADER_RE = lazy_re(r"NVIDIA-SMI\s.*Driver Version", re.I)  # the table's first row (any case: a lower-cased paste)

MAX_TABLE_LINES = 120  # a table of 8 GPUs and a few dozen processes; more is not a table


def _unquoted(text: str) -> str:
    """The row without the reply quotes (`> `) and indentation a paste put before it (the reader peels one
    layer of prefix; a quote inside an indented or container-prefixed paste is still there)."""
    text = text.lstrip()
    while text.startswith(">"):
        text = text[1:].lstrip()
    return text


_LETTER_RE = lazy_re(r"[^\W\d_]")


def _has_letter(text: str) -> bool:
    return _LETTER_RE.search(text) is not None


def _table_line(text: str) -> bool:
    return _unquoted(text).startswith(("|", "+"))


class SmiExtractor(Extractor):
    """From a `NVIDIA-SMI ... Driver Version` header line, the table's lines until the first line that is
    not part of it; each table is read when it ends. Of all tables in the input, the GPU with the most
    memory that no listed process holds is kept (its memory row is the evidence). The header is found by
    its trigger; while a table is open the engine hands over every line (EVERY_LINE_WHILE_OPEN), so the
    table ends at the first line that is not a table row (blank lines are never fed)."""

    TRIGGERS = (("NVIDIA-SMI", True), ("MiB", True), ("Processes:", True),
                ("No running processes found", True),
                ("N/A  N/A", False))  # a process row whose memory is N/A (Windows): its GI / CI columns
    # the GPU row of a driver before 470 (`|   0  A100-SXM4-40GB  On | 00000000:07:00.0 Off |`) holds no
    # trigger; the bus id's `0000:` was one, but it is all digits and a colon, as common as bytes get in a
    # log of progress bars: searching every block for it was ~7% of explain's time on a 200 MB log.
    # An open table is handed every line instead.
    EVERY_LINE_WHILE_OPEN = True

    def __init__(self, sink: Sink) -> None:
        super().__init__(sink)
        self._lines: Optional[list] = None  # the open table's lines
        self._seen = 0  # lines fed since the open table's header (rows and gaps)
        self._best: Optional[tuple] = None  # (unlisted, gpu index, used, total, evidence, listed, large)

    @property
    def open(self) -> bool:
        return self._lines is not None

    def feed(self, line: Any) -> bool:
        text = line.text
        header = ("NVIDIA-SMI" in text or "nvidia-smi" in text) and _HEADER_RE.search(text) is not None
        if self._lines is None:
            if header:
                self._lines, self._seen = [line], 1
                return True
            return False
        if header:  # the next table starts
            self.close()
            self._lines, self._seen = [line], 1
            return True
        self._seen += 1
        if not _table_line(text):
            # a line without a letter is a gap, not the end: the blank line between the GPU table and the
            # process table as a numbered paste shows it (`  14  ` reads `14`), or a lone `>` of a quote
            if _has_letter(text) or self._seen >= MAX_TABLE_LINES:
                self.close()
            return False
        self._lines.append(line)
        if self._seen >= MAX_TABLE_LINES:
            self.close()
        return True

    def close(self) -> None:
        lines, self._lines = self._lines, None
        if not lines:
            return
        from loradoctor.env.facts import unlisted_bytes, unlisted_is_large
        from loradoctor.env.snapshot import import_nvidia_smi_table

        nvidia = import_nvidia_smi_table("\n".join(_unquoted(ln.text) for ln in lines)).get("nvidia") or {}
        for gpu in nvidia.get("gpus") or []:
            unlisted = unlisted_bytes(gpu)
            if unlisted is None or (self._best is not None and unlisted <= self._best[0]):
                continue
            used = gpu["memory_used_bytes"]
            mib = f"{used >> 20}mib /"
            row = next((ln for ln in lines if mib in ln.text.lower()), None)
            empty = next((ln for ln in lines if "no running processes found" in ln.text.lower()), None)
            total = gpu.get("memory_total_bytes") or 0
            self._best = (unlisted, gpu.get("index", 0), used, total, [ln for ln in (row, empty) if ln is not None],
                          len(gpu.get("processes") or []), unlisted_is_large(unlisted, total))

    def publish(self, values: dict[str, Any]) -> None:
        if self._best is None:
            return
        unlisted, index, used, total, evidence, listed, large = self._best
        for line in evidence:
            self.sink._evidence("smi", line)
        values.update({"smi.unlisted_bytes": unlisted, "smi.unlisted_large": large, "smi.gpu_index": index,
                       "smi.used_bytes": used, "smi.total_bytes": total or None, "smi.process_count": listed})
