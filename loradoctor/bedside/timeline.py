"""The timeline: one JSON object per line, written and flushed as the run goes, so a hard kill
loses at most the record being written.

Record kinds (field `kind`; `t` is seconds since the epoch):
- `meta`    once, first: `cmd`, `pid`, `interval_s`, `host_ram_bytes`, `gpus` [{index, name, total_bytes}], `source`
- `sample`  from the sampler: `gpus` [{index, used_bytes, total_bytes, util_pct, power_w, temp_c,
            sm_clock_mhz, throttle [names], procs [{pid, used_bytes, ours}]}], `host` {rss_bytes,
            cpu_pct, main_cpu_pct, workers [{pid, name, rss_bytes, cpu_pct}], shm_used_bytes,
            shm_total_bytes, fds}
- `step`    from the Trainer callback / watch(): `step`, `loss`, `grad_norm`, `lr`, `allocated_bytes`,
            `reserved_bytes`, `peak_bytes`, `step_time_s`, `tokens_per_s`
- `preflight` from the callback at train begin: what the real objects are (see integrations)
- `event`   `name` (exception, xid, signal, ...) and free fields
- `end`     last: `exit_code`, `signal`

Every field but `kind` and `t` is optional: readers take what is there.
"""

from __future__ import annotations

import json
import math
import re
import os
import threading
import time
from loradoctor.record import field, record
from typing import Any, Optional

from loradoctor.errors import UserError

SCHEMA = "loradoctor.timeline/1"
KINDS = ("meta", "sample", "step", "preflight", "event", "end")
MAX_LINE = 1 << 20          # a record longer than 1 MiB is not one of ours: skipped
MAX_RECORDS = 4096          # per kind kept in memory when reading; longer runs are thinned evenly


class TimelineWriter:
    """Append records to `path` (created with the user's umask), one flushed line each. Thread-safe."""

    def __init__(self, path: "str | os.PathLike[str]") -> None:
        self.path = os.fspath(path)
        self._fh = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()
        self.count = 0

    def write(self, kind: str, **fields: Any) -> None:
        record = {"kind": kind, "t": round(fields.pop("t", time.time()), 3), **fields}
        line = json.dumps(record, separators=(",", ":"), default=_plain, allow_nan=False) + "\n"
        with self._lock:
            if self._fh.closed:
                return
            self._fh.write(line)
            self._fh.flush()
            self.count += 1

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.close()

    def __enter__(self) -> "TimelineWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if hasattr(value, "item"):
        try:
            return value.item()
        except Exception:  # noqa: BLE001 - a foreign object: write its text
            pass
    return str(value)


def _finite(value: Any) -> Any:
    """Numbers as floats when finite; the strings 'nan' / 'inf' (how we write them) as floats too."""
    if isinstance(value, str) and value.lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return float(value)
    return value


@record
class Timeline:
    """A timeline read back: records by kind, each with its 1-based line number under `_line`."""

    path: str
    meta: dict = field(default_factory=dict)
    samples: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    preflight: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    end: Optional[dict] = None
    skipped: int = 0
    thinned: bool = False

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def start(self) -> Optional[float]:
        for group in (self.meta and [self.meta], self.samples, self.steps):
            if group:
                return group[0].get("t")
        return None

    def card_bytes(self) -> Optional[int]:
        gpus = self.meta.get("gpus") or []
        totals = [g.get("total_bytes") for g in gpus if isinstance(g, dict) and g.get("total_bytes")]
        if totals:
            return int(max(totals))
        for s in self.samples[:1]:
            totals = [g.get("total_bytes") for g in s.get("gpus", []) if g.get("total_bytes")]
            if totals:
                return int(max(totals))
        return None


class _Thinned:
    """Keeps at most `cap` items spread evenly over everything offered (every k-th, k doubling whenever
    the list fills) plus always the newest: bounded memory for any run length. `wants()` says whether
    the next item will be kept, so the caller parses only those."""

    def __init__(self, cap: int) -> None:
        self.cap, self.stride, self.seen, self.items = cap, 1, 0, []
        self.last: Optional[tuple[int, bytes]] = None

    def wants(self) -> bool:
        return self.seen % self.stride == 0

    def add(self, item: Optional[dict], raw: tuple[int, bytes]) -> None:
        if item is not None:
            self.items.append(item)
            if len(self.items) >= self.cap:
                self.items = self.items[::2]
                self.stride *= 2
        self.last = raw if item is None else None
        self.seen += 1


_KIND = re.compile(rb'"kind"\s*:\s*"([a-z]{1,16})"')


def _parse(n: int, raw: bytes) -> Optional[dict]:
    """A valid record with its line number under `_line`, or None."""
    if len(raw) > MAX_LINE:
        return None
    try:
        record = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    t = record.get("t")
    if record.get("kind") not in KINDS or not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t):
        return None
    record = {k: _finite(v) for k, v in record.items()}
    record["_line"] = n
    return record


def read_timeline(path: "str | os.PathLike[str]", cap: int = MAX_RECORDS) -> Timeline:
    """Read a timeline file, or the `timeline.jsonl` inside a `loradoctor run` folder. Memory is bounded
    by `cap` records per kind (longer runs are thinned evenly; the first and the newest are kept).
    UserError when nothing in it is a timeline record."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "timeline.jsonl")
    tl = Timeline(path=path)
    groups = {"sample": _Thinned(cap), "step": _Thinned(cap), "event": _Thinned(cap), "preflight": _Thinned(64)}
    good = 0
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise UserError(f"cannot read timeline {path}: {exc.strerror or exc}") from None
    with fh:
        for n, raw in enumerate(fh, 1):
            m = _KIND.search(raw, 0, 200)
            kind = m.group(1).decode() if m else None
            group = groups.get(kind) if kind else None
            if group is not None and not group.wants():
                group.add(None, (n, raw))  # counted; parsed only if it turns out to be the newest
                good += 1
                continue
            record = _parse(n, raw)
            if record is None:
                tl.skipped += 1
                continue
            good += 1
            kind = record["kind"]
            if kind == "meta":
                tl.meta = tl.meta or record
            elif kind == "end":
                tl.end = record
            else:
                groups[kind].add(record, (n, raw))
    if not good:
        raise UserError(f"{path}: no timeline records in it (expected JSON lines with a 'kind' and a 't')")
    out = {}
    for kind, g in groups.items():
        items = g.items
        if g.last is not None:
            newest = _parse(*g.last)
            if newest is not None:
                items = items + [newest]
        out[kind] = items
    tl.samples, tl.steps, tl.events, tl.preflight = out["sample"], out["step"], out["event"], out["preflight"]
    tl.thinned = any(g.stride > 1 for g in groups.values())
    return tl
