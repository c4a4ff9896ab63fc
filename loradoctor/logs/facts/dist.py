"""dist: torchrun's ChildFailedError box, NCCL watchdog timeouts and errors, the world size, and
the ranks that stayed silent while others timed out."""

from __future__ import annotations

import math
import re
import signal as _signal
from loradoctor.record import record
from typing import Any, Iterable, Optional

from loradoctor.lazyre import lazy_re
from loradoctor.logs.facts.common import MAX_ID, MAX_MS, MAX_RANK, Extractor, Sink, _bounded_int

@record
class ChildFailed:
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    exit_code: Optional[int] = None
    pid: Optional[int] = None
    signal: Optional[str] = None
    host: Optional[str] = None


_CF_RANK_RE = lazy_re(r"^\s*rank\s*:\s*(-?\d+)(?:\s*\(local_rank:\s*(\d+)\))?")
_CF_EXIT_RE = lazy_re(r"^\s*exitcode\s*:\s*(-?\d+)(?:\s*\(pid:\s*(\d+)\))?")
_CF_SIGNAL_RE = lazy_re(r"Signal (\d+) \((SIG\w+)\)")
_CF_HOST_RE = lazy_re(r"^\s*host\s*:\s*(\S+)")


def _signal_name(exit_code: int) -> Optional[str]:
    number = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 160 else None
    if not number:
        return None
    try:
        return _signal.Signals(number).name
    except ValueError:
        return None


def parse_child_failed(lines: Iterable[str]) -> Optional[ChildFailed]:
    """The root-cause entry of torchrun's `ChildFailedError` summary block:
    `rank : 3 (local_rank: 3)`, `exitcode : -9 (pid: 1234)`, `traceback : Signal 9 (SIGKILL) ...`.
    Prefers the `Root Cause (first observed failure)` section; None when no entry is found."""
    lines = list(lines)
    start = 0
    for i, text in enumerate(lines):
        if "Root Cause" in text:
            start = i
            break
    entry = ChildFailed()
    found = False
    for text in lines[start:]:
        if entry.exit_code is not None and re.match(r"^\s*\[\d+\]:", text):
            break  # next failure entry
        if m := _CF_RANK_RE.match(text):
            if entry.rank is not None:
                break
            entry.rank = _bounded_int(m.group(1), MAX_RANK)
            entry.local_rank = _bounded_int(m.group(2), MAX_RANK)
            found = True
        elif m := _CF_EXIT_RE.match(text):
            entry.exit_code = _bounded_int(m.group(1), MAX_ID)
            entry.pid = _bounded_int(m.group(2), MAX_ID)
            found = True
        elif m := _CF_SIGNAL_RE.search(text):
            entry.signal = m.group(2)
        elif m := _CF_HOST_RE.match(text):
            entry.host = m.group(1)
    if not found:
        return None
    if entry.signal is None and entry.exit_code is not None:
        entry.signal = _signal_name(entry.exit_code) if entry.exit_code < 0 else None
    return entry


@record
class WatchdogTimeout:
    rank: Optional[int]
    timeout_ms: Optional[int]
    ran_ms: Optional[int]
    op: Optional[str]


_WATCHDOG_RE = lazy_re(r"(?:\[Rank (\d+)\]\s*)?(?:Watchdog caught collective operation timeout|collective operation "
                          r"timeout|Timeout at NCCL work:)|NCCL communicator was aborted on rank (\d+)", re.I)
_TIMEOUT_MS_RE = lazy_re(r"Timeout\(ms\)=(\d+)")
_RAN_MS_RE = lazy_re(r"ran for (\d+) milliseconds")
_OPTYPE_RE = lazy_re(r"OpType=(\w+)")


def parse_watchdog_timeout(text: str) -> Optional[WatchdogTimeout]:
    """`[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE,
    ..., Timeout(ms)=600000) ran for 600036 milliseconds before timing out.`"""
    m = _WATCHDOG_RE.search(text)
    if not m:
        return None
    t, r, o = _TIMEOUT_MS_RE.search(text), _RAN_MS_RE.search(text), _OPTYPE_RE.search(text)
    rank = m.group(1) or m.group(2)
    return WatchdogTimeout(rank=_bounded_int(rank, MAX_RANK),
                           timeout_ms=_bounded_int(t.group(1), MAX_MS) if t else None,
                           ran_ms=_bounded_int(r.group(1), MAX_MS) if r else None, op=o.group(1) if o else None)


_NRANKS_RE = lazy_re(r"\bn[Rr]anks[ =:]\s*(\d+)")
_WORLD_SIZE_RE = lazy_re(r"\bWORLD_SIZE\s*[=:]\s*['\"]?(\d+)|\bworld_size\s*[=:]\s*(\d+)")
_NPROC_RE = lazy_re(r"--nproc[_-]per[_-]node[= ](\d+)")
_NNODES_RE = lazy_re(r"--nnodes[= ](\d+)(?!\s*:)")


def silent_ranks(world_size: Optional[int], timeout_ranks: Iterable[int]) -> Optional[list[int]]:
    """Ranks 0..world_size-1 that never reported a timeout while others did (the rank that hung
    or died first); None when the world size or the timeout ranks are unknown."""
    reported = set(timeout_ranks)
    if not world_size or not reported or max(reported) >= world_size:
        return None
    return [r for r in range(world_size) if r not in reported]


_NCCL_ERROR_RE = lazy_re(r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclInvalidUsage|"
                            r"ncclRemoteError|ncclInvalidArgument|unhandled system error|NCCL communicator was aborted")



class DistExtractor(Extractor):
    """The root-cause entry of a ChildFailedError box (up to 60 lines after it opens), watchdog
    timeouts and their ranks, NCCL error lines, and the largest world size any line states."""

    TRIGGERS = (
        ("Timeout at NCCL work", False), ("communicator was aborted on rank", False),
        ("ChildFailedError", False), ("Root Cause", False), ("local_rank", False), ("exitcode", False),
        ("error_file", False), ("Signal ", False), ("Watchdog", False), ("collective operation timeout", True),
        # not a bare "NCCL": healthy multi-GPU runs print thousands of `NCCL INFO` lines
        ("NCCL error", False), ("NCCL communicator", False), ("nccl", False), ("unhandled system error", False),
        # world size for dist.silent_ranks
        ("nranks", False), ("nRanks", False), ("nproc", False), ("WORLD_SIZE", False), ("world_size", False),
        ("--nnodes", False),
    )

    def __init__(self, sink: Sink) -> None:
        super().__init__(sink)
        self._cf_lines: Optional[list[str]] = None
        self._cf_budget = 0
        self._timeouts = 0
        self._timeout_ranks: list[int] = []
        self._first_timeout: Optional[tuple] = None
        self._nccl_errors = 0
        self._world: dict[str, int] = {}  # source (nranks, world_size, nproc, nnodes) -> largest value seen

    @property
    def open(self) -> bool:
        return self._cf_lines is not None

    def feed(self, line: Any) -> bool:
        text = line.text
        touched = False
        if self._cf_lines is not None:
            self._cf_feed(line)
        if "ChildFailedError" in text or ("Root Cause" in text and self._cf_lines is None):
            self._cf_open(line)
            touched = True
        if "ollective operation timeout" in text or "Timeout at NCCL work" in text \
                or "communicator was aborted on rank" in text:
            self._timeout(line)
            touched = True
        if _NCCL_ERROR_RE.search(text):
            self._nccl_errors += 1
            self.sink._evidence("dist", line)
            touched = True
        self._world_size(text)  # a running maximum: a repeat adds nothing
        return touched

    def _cf_open(self, line: Any) -> None:
        if self._cf_lines is None:
            self._cf_lines = []
            self._cf_budget = 60
        self.sink.values["dist.child_failed"] = True
        self.sink._evidence("dist", line)
        self._cf_lines.append(line.text)

    def _cf_feed(self, line: Any) -> None:
        self._cf_budget -= 1
        if self._cf_budget < 0:
            self.close()
            return
        self._cf_lines.append(line.text)  # type: ignore[union-attr]
        if line.text.lstrip().startswith(("exitcode", "traceback")):
            self.sink._evidence("dist", line)

    def close(self) -> None:
        if self._cf_lines:
            entry = parse_child_failed(self._cf_lines)
            if entry is not None and "dist.failed_rank" not in self.sink.values:
                self.sink._set_first({"dist.failed_rank": entry.rank, "dist.exit_code": entry.exit_code,
                                 "dist.signal": entry.signal})
                if entry.exit_code in (-9, 137):
                    self.sink._set_first({"killed.exit_code": entry.exit_code})
        self._cf_lines = None

    def _timeout(self, line: Any) -> None:
        t = parse_watchdog_timeout(line.text)
        if t is None:
            return
        self._timeouts += 1
        self.sink._evidence("dist", line)
        rank = t.rank if t.rank is not None else line.rank
        if rank is not None and rank not in self._timeout_ranks:
            self._timeout_ranks.append(rank)
        key = (line.time_s if line.time_s is not None else math.inf, line.input_index, line.lineno)
        if rank is not None and (self._first_timeout is None or key < self._first_timeout[0]):
            self._first_timeout = (key, rank)
        if t.timeout_ms is not None:
            self.sink._set_first({"dist.timeout_ms": t.timeout_ms})

    def _world_size(self, text: str) -> None:
        for key, regex in (("nranks", _NRANKS_RE), ("world_size", _WORLD_SIZE_RE), ("nproc", _NPROC_RE),
                           ("nnodes", _NNODES_RE)):
            for m in regex.finditer(text):
                value = _bounded_int(next(g for g in m.groups() if g is not None), MAX_RANK)
                if value:
                    self._world[key] = max(self._world.get(key, 0), value)

    def world_size(self) -> Optional[int]:
        """From NCCL's `nranks N`, else WORLD_SIZE / world_size=, else --nproc_per_node (times --nnodes)."""
        w = self._world
        if "nranks" in w:
            return w["nranks"]
        if "world_size" in w:
            return w["world_size"]
        if "nproc" in w:
            world = w["nproc"] * w.get("nnodes", 1)
            return world if world <= MAX_RANK else None
        return None

    def publish(self, values: dict[str, Any]) -> None:
        if self._timeouts:
            values["dist.timeout_count"] = self._timeouts
            values["dist.timeout_ranks"] = sorted(self._timeout_ranks)
            if self._first_timeout is not None:
                values["dist.first_timeout_rank"] = self._first_timeout[1]
        world = self.world_size()
        if world is not None:
            values["dist.world_size"] = world
            silent = silent_ranks(world, self._timeout_ranks) if self._timeouts else None
            if silent is not None:
                values["dist.silent_ranks"] = silent
        if self._nccl_errors:
            values["dist.nccl_error_count"] = self._nccl_errors

    @staticmethod
    def publish_rank_files(values: dict[str, Any], rank_files: set[int]) -> None:
        """Without a world size in the lines, one file per rank (two or more) is the world."""
        if "dist.world_size" not in values and len(rank_files) >= 2:
            values["dist.world_size"] = len(rank_files)
            reported = set(values.get("dist.timeout_ranks", ()))
            if reported and reported <= rank_files:
                values["dist.silent_ranks"] = sorted(rank_files - reported)
