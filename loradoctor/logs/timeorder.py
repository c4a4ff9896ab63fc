"""Which failure came first, across the ranks of a distributed job (issue 10).

The catalogue says an NCCL failure (dist.nccl_error) or a collective timeout (dist.nccl_timeout) is
usually the echo of another rank's crash: their rules list `cuda.*`, `oom.*`, `train.*` in
`consequence_of`, so a CUDA error, an OOM or a Python exception is ranked as the root. That holds when
the crash comes first. When the log shows the NCCL failure FIRST, the order is evidence too:

- a transport failure (an InfiniBand completion error, a verbs call or socket connect that failed, a
  message truncated) seen on one rank before a CUDA error, an OOM or a Python exception on ANOTHER rank is the first
  failure in time: the likelier root, the later error its consequence (a collective that lost its
  network can fault or abort on the GPU). NCCL lines that by their own words report something else (a
  remote process that exited, a peer that closed or reset the connection, a CUDA failure inside NCCL)
  are echoes whatever their place, and never make the NCCL failure first.
- a watchdog timeout is printed when the wait ends (`ran for 600011 milliseconds`), ten minutes after
  the collective was entered, so its place says little about the other ranks: a rank that reported NO
  timeout is the rank the others waited for, and its error explains the timeouts even where it is
  printed after them (its output flushed late, or the rank was late). Only a rank that had itself
  reported the timeout before its own error was already waiting: that error came after the timeout and
  follows from it.

Order in time: by the lines' timestamps when both carry one of the same format (one clock), else by line
order within one input; lines of different inputs without timestamps are not ordered. Both lines must
belong to a known rank (a `[rankN]:` prefix, a rank file name): a `df` run after the crash or NCCL's own
`host:pid:tid [dev]` lines name no rank's failure. Pure functions of
the matched lines; the engine asks `first_failure` while linking consequences (engine.rank_candidates).
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

from loradoctor.lazyre import lazy_re

EVENT_FAMILIES = ("cuda", "oom", "train")  # a failure at a moment on one rank
TRANSPORT = "dist.nccl_error"
TIMEOUT = "dist.nccl_timeout"

# an NCCL line that reports another failure: a peer that went away, or a CUDA error seen inside NCCL
_ECHO_RE = lazy_re(r"remote process exited|closed by (?:remote )?peer|reset by peer|Connection closed|"
                   r"Cuda failure|unhandled cuda error|ncclUnhandledCudaError|CUDA error|"
                   r"Call to (?:recv|send) (?:from|to) \S+ failed|remote process|peer access|"
                   r"\.(?:cc|cu):\d+ -> 1\b", re.I)  # (an error-return trail of code 1: a CUDA error)


class Seen:
    """One matched line of a finding: where and when."""

    __slots__ = ("rank", "time_s", "clock", "input_index", "lineno", "where", "text")

    def __init__(self, rank: Optional[int], time_s: Optional[float], stamp: Optional[str], input_index: int,
                 lineno: int, where: str, text: str) -> None:
        self.rank = rank
        self.time_s = time_s
        self.clock = re.sub(r"\d", "0", stamp) if stamp and time_s is not None else None  # the stamp's format
        self.input_index = input_index
        self.lineno = lineno
        self.where = where
        self.text = text

    def at(self) -> str:
        return f"{self.where}" + (f", rank {self.rank}" if self.rank is not None else "")


def before(a: Seen, b: Seen) -> Optional[bool]:
    """a strictly before b (True), not before (False), or not comparable (None)."""
    if a.clock is not None and a.clock == b.clock:
        return a.time_s < b.time_s  # type: ignore[operator]
    if a.input_index == b.input_index:
        return a.lineno < b.lineno
    return None


def applies(dist_cause: str, event_cause: str) -> bool:
    """A pair whose order in time is read: an NCCL failure or timeout and a rank's own error."""
    return dist_cause in (TRANSPORT, TIMEOUT) and event_cause.split(".", 1)[0] in EVENT_FAMILIES


def first(seen: Sequence[Seen]) -> Optional[Seen]:
    return min(seen, key=lambda s: (s.input_index, s.lineno)) if seen else None


def first_failure(dist_cause: str, dist_seen: Sequence[Seen], event_cause: str,
                  event_seen: Sequence[Seen]) -> Optional[str]:
    """Why the NCCL finding (dist_cause, its matched lines) is the first failure in time and the event
    finding its consequence, in words; None when the order does not say so (the catalogue's
    `consequence_of` then holds: the event is the root)."""
    if not applies(dist_cause, event_cause):
        return None
    event = first(event_seen)
    if event is None:
        return None
    if dist_cause == TIMEOUT:
        if event.rank is None:
            return None
        own = [s for s in dist_seen if s.rank == event.rank and before(s, event)]
        if not own:
            return None
        s = first(own)
        assert s is not None
        return (f"rank {event.rank} reported the collective timeout ({s.where}) before its own error "
                f"({event.where}): it was already waiting in the collective when it failed")
    if event.rank is None:
        return None  # a line of no rank (a `df` run after the crash, a summary) is no rank's failure
    # on another rank: on the erring rank itself an NCCL error and a CUDA error are often one event told by
    # two layers (`DistBackendError: NCCL error in: ..., unhandled cuda error` then its `Last error: Cuda
    # failure 2 'out of memory'`, whose kind a cut line may have lost)
    transport = [s for s in dist_seen if s.rank is not None and s.rank != event.rank
                 and not _ECHO_RE.search(s.text) and before(s, event)]
    if not transport:
        return None
    s = first(transport)
    assert s is not None
    return f"the NCCL transport failure ({s.at()}) comes before this error ({event.at()}) in time"


def waited_for(dist_cause: str, dist_seen: Sequence[Seen], event_cause: str, event_seen: Sequence[Seen]) -> Optional[str]:
    """For an event kept as the root of a timeout printed BEFORE it: why (the event's rank reported no
    timeout while others did: the rank they waited for), in words; None otherwise."""
    if dist_cause != TIMEOUT or not applies(dist_cause, event_cause):
        return None
    event = first(event_seen)
    if event is None or event.rank is None:
        return None
    earlier = [s for s in dist_seen if s.rank is not None and s.rank != event.rank and before(s, event)]
    if not earlier or any(s.rank == event.rank for s in dist_seen):
        return None
    ranks = ", ".join(str(r) for r in sorted({s.rank for s in earlier}))  # type: ignore[type-var]
    return (f"it is printed after the timeouts of rank {ranks}, but rank {event.rank} reported no timeout: "
            f"it is the rank the collective waited for (its output flushed late, or the rank was late)")


def tells_apart(event_cause: str, event_rank: Optional[int]) -> str:
    """What would decide between the NCCL failure first and the event first."""
    who = f"rank {event_rank}'s" if event_rank is not None else "the"
    return (f"which failed first on one clock: if {who} {event_cause} error happened before the NCCL failure "
            f"(its output buffered: rerun with PYTHONUNBUFFERED=1 and a timestamp on every rank's line, "
            f"e.g. `2>&1 | ts '%F %T'`), it is the root and the NCCL failure its echo; NCCL_DEBUG=INFO on every "
            f"rank names the link or peer that failed first")
