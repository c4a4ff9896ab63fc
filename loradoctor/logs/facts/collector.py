"""The streaming collector: feeds each normalised line to every extractor, in one fixed order,
and gathers their facts at the end."""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Iterable, Optional

from loradoctor.findings import Evidence
from loradoctor.logs.facts.aggregate import MetricsExtractor
from loradoctor.logs.facts.common import Extractor, Facts, Sink, TriggerLiterals
from loradoctor.logs.facts.dist import DistExtractor
from loradoctor.logs.facts.host import HostExtractor
from loradoctor.logs.facts.memsum import MemsumExtractor
from loradoctor.logs.facts.oom import OomExtractor, RawPosition
from loradoctor.logs.facts.tables import ERRORISH_WORDS
from loradoctor.logs.facts.config import ConfigExtractor
from loradoctor.logs.facts.prose import ProseExtractor
from loradoctor.logs.facts.trace import TraceExtractor
from loradoctor.logs.facts.smi import SmiExtractor
from loradoctor.logs.facts.xid import XidExtractor
from loradoctor.logs.scan import LiteralIndex

# lines the collector keeps for the "nothing recognised" tail (is_errorish), beyond the extractors' words
_TAIL_TRIGGERS: TriggerLiterals = (
    ("ERROR", False), ("FAIL", False), ("Fatal", False), ("FATAL", False), ("Segmentation fault", False),
    ("Aborted", False), ("core dumped", False),
    # torch's dispatch refusal without its exception class (an issue title): `"addmm_impl_cpu_" not implemented for 'Half'`
    ("not implemented for '", True),
)


class Dispatch:
    """The one dispatch of lines to extractors: a line goes to an extractor when it holds one of the
    extractor's declared TRIGGERS (the same words the engine's prefilter decodes lines for), or
    while the extractor has a multi-line record open. `mask(text)` has bit k set for the k-th
    extractor whose triggers the text holds (scan.LiteralIndex: repeated lines are one dict lookup)."""

    def __init__(self, triggers: Iterable[TriggerLiterals]) -> None:
        self._index = LiteralIndex(((text, ignore_case, 1 << bit) for bit, literals in enumerate(triggers)
                                    for text, ignore_case in literals), int)

    def mask(self, text: str) -> int:
        return self._index.find(text)


def is_errorish(text: str) -> bool:
    """Does the line look like an error (for the tail shown when nothing is recognised)?"""
    low = text.lower()
    return any(word in low for word in ERRORISH_WORDS)


class FactCollector(Sink):
    """Feed normalised lines (in input order) with `feed`; `finish` returns the Facts."""

    def __init__(self, block_metrics: bool = False) -> None:
        super().__init__()
        self.ranks: set[int] = set()
        self.error_tail: deque = deque(maxlen=10)
        self.metrics = MetricsExtractor(self, block_metrics)
        self.trace = TraceExtractor(self)
        self.oom = OomExtractor(self, self.trace, self.metrics)
        self.memsum = MemsumExtractor(self)
        self.xid = XidExtractor(self)
        self.dist = DistExtractor(self)
        self.host = HostExtractor(self)
        self.config = ConfigExtractor(self)
        self.smi = SmiExtractor(self)
        self.prose = ProseExtractor(self)
        # the feeding order: the OOM extractor reads the traceback's frames before the trace
        # extractor takes the line, and the metric records before it
        self.extractors: tuple[Extractor, ...] = (self.metrics, self.oom, self.trace, self.memsum, self.xid,
                                                  self.dist, self.host, self.config, self.smi, self.prose)
        self.dispatch = Dispatch(e.triggers for e in self.extractors)
        # an extractor opens or closes a record only while it is fed a line (or closed), so whether
        # any record is open is worked out after each feed, not asked of every extractor per line
        self._idle = True

    @property
    def wants_every_line(self) -> bool:
        """An open record reads every line until it ends (EVERY_LINE_WHILE_OPEN): the engine hands over
        the lines after the last candidate line as well, until this turns False."""
        return not self._idle and any(e.EVERY_LINE_WHILE_OPEN and e.open for e in self.extractors)

    @property
    def idle(self) -> bool:
        """No multi-line record is open (traceback, memory summary, ChildFailedError box, wrapped OOM
        message): what a line does then depends on its text alone."""
        return self._idle

    def feed(self, line: Any, position: Optional[RawPosition] = None) -> bool:
        """Take one normalised line (a reader.Line), with where it sits in its raw block when the
        engine read it from one. Returns True when feeding the same text again could change what
        is collected (beyond `ranks` and `error_tail`): the engine skips later repeats of a line
        that returned False while `idle` (a warning printed every step)."""
        text = line.text
        if not text:
            return False
        if position is not None:
            self.oom.locate(line, position)
        touched = not self._idle
        if line.rank is not None:
            self.ranks.add(line.rank)
        wanted = self.dispatch.mask(text)
        for extractor in self.extractors:
            if wanted & 1 or extractor.open:
                touched |= extractor.feed(line)
            wanted >>= 1
        self._idle = not any(e.open for e in self.extractors)
        if is_errorish(text):
            self.note_errorish(line)
        return touched

    def note_errorish(self, line: Any) -> None:
        """Keep an error-looking line for the "nothing recognised" tail."""
        self.error_tail.append(Evidence(file=line.file, line=line.lineno, text=line.quote()))

    # the engine's fast paths and context ---------------------------------------------------------
    @property
    def records(self) -> int:
        """Metric records aggregated so far."""
        return self.metrics.records

    @property
    def table_open(self) -> bool:
        return self.metrics.table_open

    def feed_table_block(self, block: bytes, make_line: Callable[[bytes, int], Any]) -> None:
        self.metrics.feed_table_block(block, make_line)

    def feed_metric_batch(self, items: list, line_at: Callable[[int], Any]) -> None:
        self.metrics.feed_metric_batch(items, line_at)

    def feed_dict_record(self, loss_text: bytes, rest: bytes, line_at: Callable[[], Any]) -> None:
        self.metrics.feed_dict_record(loss_text, rest, line_at)

    def feed_json_record(self, body: bytes, line_at: Callable[[], Any]) -> None:
        self.metrics.feed_json_record(body, line_at)

    def world_size(self) -> Optional[int]:
        return self.dist.world_size()

    # finishing --------------------------------------------------------------------------------
    def finish(self, inputs: Optional[Iterable[Any]] = None) -> Facts:
        """The facts of everything fed. `inputs` (the engine's reader.Inputs, read to the end) add
        the input.* facts and the ranks their file names carry: one file per rank, the files are
        the world (a rank without a file cannot be called silent)."""
        # open records close first (a pending OOM message takes its step from the records fed so
        # far, before table rows or a wandb summary are replayed as records)
        for extractor in (self.oom, self.memsum, self.dist, self.metrics, self.smi):
            extractor.close()
        self._idle = not any(e.open for e in self.extractors)
        v = self.values
        for extractor in (self.oom, self.memsum, self.trace, self.metrics, self.xid, self.dist, self.smi):
            extractor.publish(v)
        items = list(inputs) if inputs is not None else []
        rank_files = {item.rank for item in items if item.rank is not None}
        self.ranks |= rank_files
        if self.ranks:
            v["dist.ranks"] = sorted(self.ranks)
        self.dist.publish_rank_files(v, rank_files)
        if inputs is not None:
            v["input.files"] = len(items)
            v["input.lines"] = sum(i.lines for i in items)
            v["input.bytes"] = sum(i.bytes for i in items)
        return Facts(values={k: val for k, val in v.items() if val is not None}, groups=self.groups,
                     first_seen=self.first_seen)


def trigger_literals(extractors: tuple[type[Extractor], ...] = (
        OomExtractor, MetricsExtractor, MemsumExtractor, TraceExtractor, XidExtractor, DistExtractor,
        HostExtractor, ConfigExtractor, SmiExtractor, ProseExtractor)) -> TriggerLiterals:
    """Every extractor's trigger literals, and the tail's: the engine's prefilter adds them."""
    out: list[tuple[str, bool]] = []
    for extractor in extractors:
        out.extend(extractor.TRIGGERS)
    out.extend(_TAIL_TRIGGERS)
    return tuple(out)


TRIGGER_LITERALS: TriggerLiterals = trigger_literals()
