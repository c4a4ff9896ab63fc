"""metrics, aggregated: the MetricsExtractor feeds metric records (from lines, from the engine's
batches of `{'loss': ...}` dicts, from notebook tables and wandb summaries) into streaming
aggregates (docs/facts.md `metrics.*`), in bounded memory however long the log."""

from __future__ import annotations

import itertools
import math
import operator
from typing import Any, Callable, Optional

from loradoctor.logs.facts.common import Extractor, Sink, _float, _int
from loradoctor.logs.reader import peel_table_line as _peel
from loradoctor.logs.facts.metrics import (
    _APEX_OVERFLOW_RE, _DICT_PAIR_RE, _DS_OVERFLOW_RE, _JSON_PAIR_RE, _OLD_OVERFLOW_RE, _PEFT_RE, _TABLE_HEAD_RE,
    _ITER_LINE_RE, _TABLE_MAX_ROWS, _TABLE_RULE_RE, _TORCHTUNE_BAR_RE, TABLE_HEAD, _bfloat, _bfloats, _metric_bytes,
    RecordColumns, parse_bar_description, parse_bar_postfix, parse_metric_record, parse_table_row, parse_wandb_value,
    precision_of, table_columns,
)


FLAT_EPS = 1e-4  # steady: consecutive losses closer than this (flat_run)


class RepeatTracker:
    """Does the loss series repeat itself from its first record on (`2.31, 2.12, 2.45, 2.31, 2.12, 2.45,
    ...`: a loop over the same batches in the same order whose weights never change)? The smallest
    period of the series so far, found online with the prefix function of Knuth-Morris-Pratt (amortised
    O(1) a record) over the first `STORE` losses; after those, each record is compared with the record
    one period earlier (O(1), nothing more kept). A non-finite loss ends the tracking (no repetition)."""

    STORE = 16384
    GIVE_UP_EARLY = True  # (False only in the test that checks the early stop changes no result)

    def __init__(self) -> None:
        self.seq: list = []
        self.border: list = []  # border[i]: the longest proper prefix of seq[:i + 1] that is also its suffix
        self.n = 0  # records seen
        self.period = 0  # once the store is full: the period the rest must follow (0: not periodic)
        self.broken = False

    def add(self, x: float) -> None:
        if self.broken:
            return
        if x - x != 0:  # nan / inf
            self.broken = True
            return
        seq = self.seq
        if self.n < self.STORE:
            k = self.border[-1] if seq else 0
            if seq:
                while k > 0 and seq[k] != x:
                    k = self.border[k - 1]
                if seq[k] == x:
                    k += 1
            seq.append(x)
            self.border.append(k)
            self.n += 1
            # a border grows by one a record at most, and a repeat needs border >= records / 2 (at the end, or
            # at STORE): once records - border passes STORE / 2 no later record can give one (a run whose
            # losses do not repeat stops here, after half the store, instead of filling it)
            if self.GIVE_UP_EARLY and 2 * (self.n - k) > self.STORE:
                self.broken = True
                return
            if self.n == self.STORE:
                period = self.n - k
                self.period = period if k >= period else 0
                if not self.period:
                    self.broken = True
            return
        if x != seq[self.n % self.period]:
            self.broken = True
            return
        self.n += 1

    def add_many(self, values: list) -> None:
        """`add` for each value (list comparisons once the store is full)."""
        i = 0
        while i < len(values) and not self.broken and self.n < self.STORE:
            self.add(values[i])
            i += 1
        if i >= len(values) or self.broken:
            return
        rest = values[i:] if i else values
        p, start = self.period, self.n % self.period
        expected = list(itertools.islice(itertools.cycle(self.seq[:p]), start, start + len(rest)))
        if rest == expected:
            self.n += len(rest)
        else:  # a nan compares unequal too
            self.broken = True

    def result(self) -> Optional[tuple[int, int]]:
        """(period, records that repeat an earlier one) when the whole series repeats a stretch of two or
        more different losses at least once in full; None otherwise (a constant loss is a flat one)."""
        if self.broken or self.n < 4:
            return None
        if self.n <= self.STORE:
            repeated = self.border[self.n - 1]
            period = self.n - repeated
        else:
            period = self.period
            repeated = self.n - period
        if period < 2 or repeated < period or len(set(self.seq[:period])) < 2:
            return None
        return period, repeated


class LossAggregate:
    """The streaming aggregates of a run's loss, grad norm and learning rate (docs/facts.md
    `metrics.*`), record by record (`add`) or a block of records at once with list operations
    (`add_many`, the same result: tests/test_facts.py checks this on random runs)."""

    def __init__(self) -> None:
        self.records = 0
        self.loss_first: Optional[float] = None
        self.loss_last: Optional[float] = None
        self.loss_min: Optional[float] = None
        self.loss_max: Optional[float] = None
        self.max_after_min: Optional[float] = None  # the highest finite loss after the minimum
        self.loss_nan = 0  # non-finite losses
        self.trailing_nan = 0  # non-finite losses at the end of the series so far
        self.loss_zero = 0
        self.before_zero: Optional[float] = None  # the finite loss just before the first exact 0
        self.first_nonfinite: Optional[int] = None  # 1-based record of the first non-finite loss or grad norm
        self.finite_before_nan = 0
        self.flat_run = 0  # consecutive finite records whose loss changed by < 1e-4, ending at the last
        self.flat_best = 0
        self.prev_loss: Optional[float] = None  # the last loss when finite, else None
        self.gn_first: Optional[float] = None
        self.gn_max: Optional[float] = None
        self.gn_nan = 0
        self.lr_max: Optional[float] = None
        self.lr_last: Optional[float] = None
        self.repeat = RepeatTracker()

    def add(self, loss: float, gn: Optional[float] = None, lr: Optional[float] = None) -> bool:
        """One record (gn and lr None when absent). True when it is the first non-finite one."""
        self.records += 1
        self.repeat.add(loss)
        finite = loss - loss == 0  # false for nan and +-inf
        first_bad = False
        if self.first_nonfinite is None and (not finite or (gn is not None and gn - gn != 0)):
            self.first_nonfinite = self.records
            self.finite_before_nan = self.records - 1 - self.loss_nan
            first_bad = True
        if finite:
            if self.loss_first is None:
                self.loss_first = loss
            last_finite = self.loss_last
            self.loss_last = loss
            if self.loss_min is None or loss < self.loss_min:
                self.loss_min = loss
                self.max_after_min = None
            elif self.max_after_min is None or loss > self.max_after_min:
                self.max_after_min = loss
            if self.loss_max is None or loss > self.loss_max:
                self.loss_max = loss
            if loss == 0:
                if not self.loss_zero and self.records > 1:
                    self.before_zero = last_finite
                self.loss_zero += 1
            if self.prev_loss is not None and -1e-4 < loss - self.prev_loss < 1e-4:
                self.flat_run += 1
            else:
                self.flat_run = 1
            if self.flat_run > self.flat_best:
                self.flat_best = self.flat_run
            self.prev_loss = loss
            self.trailing_nan = 0
        else:
            self.loss_nan += 1
            self.trailing_nan += 1
            self.flat_run = 0
            self.prev_loss = None
        if gn is not None:
            if gn - gn == 0:
                if self.gn_first is None:
                    self.gn_first = gn
                if self.gn_max is None or gn > self.gn_max:
                    self.gn_max = gn
            else:
                self.gn_nan += 1
        if lr is not None and lr - lr == 0:
            self.lr_last = lr
            if self.lr_max is None or lr > self.lr_max:
                self.lr_max = lr
        return first_bad

    def add_many(self, losses: list, gns: Optional[list] = None, lrs: Optional[list] = None) -> Optional[int]:
        """`add` for each record (gns / lrs None when no record has them), with list operations: a
        long training log has millions of records. Returns the position in `losses` of the first
        non-finite record when it is the run's first, else None."""
        n = len(losses)
        if not n:
            return None
        start = self.records  # records before this batch; record k has index start + k + 1
        self.repeat.add_many(losses)
        finite = list(map(math.isfinite, losses))
        all_finite = all(finite)
        gn_finite = list(map(math.isfinite, gns)) if gns is not None else None
        first_bad = None
        if self.first_nonfinite is None:
            firsts = []
            if not all_finite:
                firsts.append(finite.index(False))
            if gn_finite is not None and not all(gn_finite):
                firsts.append(gn_finite.index(False))
            if firsts:
                first_bad = min(firsts)
                self.first_nonfinite = start + first_bad + 1
                self.finite_before_nan = start + first_bad - self.loss_nan
        values = losses if all_finite else list(itertools.compress(losses, finite))
        self.loss_nan += n - len(values)
        if not values:
            self.trailing_nan += n
        else:
            self.trailing_nan = 0 if all_finite else finite[::-1].index(True)  # the non-finite after the last finite
        self.records = start + n
        if values:
            if self.loss_first is None:
                self.loss_first = values[0]
            if not self.loss_zero and 0.0 in values:
                at = values.index(0.0)
                self.before_zero = values[at - 1] if at else self.loss_last
            self.loss_last = values[-1]
            self.loss_zero += values.count(0.0)
            low, high = min(values), max(values)
            if self.loss_min is None or low < self.loss_min:
                at = values.index(low)
                tail = values[at + 1:]
                self.max_after_min = max(tail) if tail else None
                self.loss_min = low
            else:
                self.max_after_min = high if self.max_after_min is None else max(self.max_after_min, high)
            if self.loss_max is None or high > self.loss_max:
                self.loss_max = high
        self._flat_runs(losses, finite, all_finite)
        if gns is not None:
            good = gns if all(gn_finite) else list(itertools.compress(gns, gn_finite))  # type: ignore[arg-type]
            self.gn_nan += len(gns) - len(good)
            if good:
                if self.gn_first is None:
                    self.gn_first = good[0]
                top = max(good)
                if self.gn_max is None or top > self.gn_max:
                    self.gn_max = top
        if lrs is not None:
            good = [x for x in lrs if x - x == 0] if not all(map(math.isfinite, lrs)) else lrs
            if good:
                self.lr_last = good[-1]
                top = max(good)
                if self.lr_max is None or top > self.lr_max:
                    self.lr_max = top
        return first_bad

    def _flat_runs(self, losses: list, finite: list, all_finite: bool) -> None:
        """flat_run / flat_best over a batch: the steady steps found with one comparison per pair
        (bytes of 0/1, split at the breaks)."""
        pieces = [losses] if all_finite else _finite_pieces(losses, finite)
        prev, run, best = self.prev_loss, self.flat_run, self.flat_best
        for piece in pieces:
            if not piece:  # a non-finite record: the run ends
                prev, run = None, 0
                continue
            # |b - a| < 1e-4 (the same as -1e-4 < b - a < 1e-4 for finite losses), mapped in C
            steady = bytes(map(operator.gt, itertools.repeat(FLAT_EPS), map(abs, map(operator.sub, piece[1:], piece))))
            streaks = steady.split(b"\0")
            # the first record continues the previous run if it is close to the previous loss
            lead = 1 if prev is None or not (-1e-4 < piece[0] - prev < 1e-4) else run + 1
            if len(streaks) == 1:  # no break inside the piece
                run = lead + len(streaks[0])
                best = max(best, run)
            else:
                best = max(best, lead + len(streaks[0]), 1 + max(map(len, streaks[1:])))
                run = 1 + len(streaks[-1])
            prev = piece[-1]
        self.prev_loss, self.flat_run, self.flat_best = prev, run, best

    def publish(self, v: dict[str, Any]) -> None:
        v["metrics.steps"] = self.records
        v["metrics.loss_nan_count"] = self.loss_nan
        v["metrics.loss_zero_count"] = self.loss_zero
        v["metrics.grad_norm_nan_count"] = self.gn_nan
        if self.first_nonfinite is not None:
            v["metrics.first_nonfinite_index"] = self.first_nonfinite
            v["metrics.finite_before_nan"] = self.finite_before_nan
        if self.loss_nan:
            v["metrics.trailing_nan_count"] = self.trailing_nan
        if self.loss_first is not None:
            v["metrics.first_loss"] = self.loss_first
            v["metrics.last_loss"] = self.loss_last
            v["metrics.min_loss"] = self.loss_min
            v["metrics.max_loss"] = self.loss_max
            v["metrics.loss_range"] = self.loss_max - self.loss_min  # type: ignore[operator]
            v["metrics.loss_flat_steps"] = self.flat_best
            if self.before_zero is not None:
                v["metrics.loss_before_zero"] = self.before_zero
            if self.max_after_min is not None and self.loss_min and self.loss_min > 0:
                v["metrics.loss_rise_ratio"] = self.max_after_min / self.loss_min
            repeat = self.repeat.result()
            if repeat is not None:
                v["metrics.loss_repeat_period"], v["metrics.loss_repeated_records"] = repeat
        if self.gn_first is not None:
            v["metrics.grad_norm_first"] = self.gn_first
            v["metrics.grad_norm_max"] = self.gn_max
            if self.gn_first > 0:
                v["metrics.grad_norm_growth"] = self.gn_max / self.gn_first  # type: ignore[operator]
        if self.lr_max is not None:
            v["metrics.lr_max"] = self.lr_max
            v["metrics.lr_last"] = self.lr_last


def _plain_rests(rests: bytes) -> bool:
    """True when the rest of a block's dicts holds no key that the record-by-record path reads."""
    return b"mem" not in rests and b"reward_std" not in rests


def _bfloat_or_none(text: Optional[bytes]) -> Optional[float]:
    if not text:
        return None
    try:
        return _bfloat(text)
    except ValueError:
        return None


def _finite_pieces(values: list, finite: list) -> list:
    """Split values at non-finite entries: [1, nan, 2, 3] -> [[1], [], [2, 3]] (an empty list
    marks each non-finite entry, in order)."""
    pieces: list = []
    current: list = []
    for v, ok in zip(values, finite):
        if ok:
            current.append(v)
        else:
            if current:
                pieces.append(current)
            pieces.append([])
            current = []
    if current:
        pieces.append(current)
    return pieces


class MetricsExtractor(Extractor):
    """Metric records and their aggregates, loss-scale overflows, PEFT's parameter count."""

    TRIGGERS = (
        # `{'loss': ...}` dicts are found by the engine's block regex (METRIC_DICT_RE), not line by line
        ("loss=", False), ("loss:", False), ("wandb:", False), ("eval_loss", False), ("train_runtime", False),
        ("trainable params", False), ("mem=", False), ("memory/", False),
        # a memory series printed by the script itself, any case: `max_memory_allocated: 12.1 GB`,
        # `GPU memory allocated: 6.12 GB`, `mem_reserved 9.8GB` (torch.cuda.memory_allocated() and friends)
        ("memory_allocated", True), ("memory allocated", True), ("mem_allocated", True),
        ("memory_reserved", True), ("memory reserved", True), ("mem_reserved", True),
        # torchtune bar: `1|12|Loss: 1.87:`; mlx-lm `Iter 75: Train loss 3.3`; `step 9 | loss 2.3 | lr ...`
        ("rain loss ", False), ("| loss ", False), ("|Loss: ", False),
        # loops that are not the Trainer, any case: timm `Loss: 6.912 (6.930)  ...  LR: 1.000e-03`,
        # mmengine `... grad_norm: 3.2  loss: 0.6931`, a hand-written `epoch 1 step 10 loss 0.0`,
        # fairseq `| epoch 001 | loss 7.123 | ... | gnorm 1.8 |`, litgpt `| loss train: 2.112, val: n/a |`
        ("loss:", True), ("loss ", True),
        ("Gradient overflow", False), ("OVERFLOW!", False), ("loss scale", False), ("Overflow detected", False),
        # the run's precision (metrics.precision): `fp16=True`, `--bf16`, `torch_dtype=torch.float16`, ...
        ("fp16", False), ("bf16", False), ("float16", False), ("Bfloat16 = ", False), ("16bit Automatic", False),
        # a model cast to float16 whole (`model = model.half()`): pure half precision, no fp32 master weights
        (".half()", True),
    )

    # fed line by line (no engine block path), Trainer dicts arrive as lines too
    LINE_DICT_TRIGGERS = (("'loss'", False), ('"loss"', False))

    @property
    def triggers(self) -> tuple:
        return self.TRIGGERS if self.block_metrics else self.TRIGGERS + self.LINE_DICT_TRIGGERS

    def __init__(self, sink: Sink, block_metrics: bool = False) -> None:
        super().__init__(sink)
        # block_metrics: the engine feeds `{'loss': ...}` dicts through feed_dict_record itself
        self.block_metrics = block_metrics
        self.loss = LossAggregate()
        self._eval_last = None
        self._finished = False
        self._summary: dict[str, float] = {}  # train_loss / train_runtime of the end-of-training record
        self._summary_head: Optional[str] = None  # the first part of that record, when a hard wrap cut it
        self._overflows = 0
        self._scale_min: Optional[float] = None
        self._mem_key: Optional[str] = None
        self._mem_first = self._mem_last = self._mem_max = None
        self._mem_run = self._mem_best = 0
        # records from notebook tables and wandb summaries: replayed by close() only in a log
        # without metric records of its own (docs/facts.md)
        self._table_columns: Optional[list[str]] = None  # a table whose rows ran to a block's end
        self._table_peel: Optional[bool] = None  # its lines behind a prefix: None none, else numbered
        self._table_rows: list = []  # (record, raw row, line number in block, make_line)
        self._wandb: dict[str, float] = {}  # the last `wandb: Run summary:` values
        self._wandb_line: Any = None
        self._precisions: set = set()  # 'fp16' / 'bf16' seen switched on
        self._reward_std_n = 0  # RL records (GRPO) with a finite reward_std, and the largest one
        self._reward_std_max: Optional[float] = None

    @property
    def records(self) -> int:
        """Metric records aggregated so far."""
        return self.loss.records

    @property
    def open(self) -> bool:
        """True while an end-of-training record cut by a hard wrap waits for the line that ends it."""
        return self._summary_head is not None

    def _summary_tail(self, line: Any) -> bool:
        """The line after an end-of-training record that a hard wrap cut (`{'train_runtime': ..., 'train_steps_per_seco`
        / `nd': 0.524, 'train_loss': 0.0, 'epoch': 3.0}`): the record's keys that it holds, when it ends the dict."""
        head, self._summary_head = self._summary_head, None
        text = line.text
        if "{" in text or "}" not in text:
            return False
        record = parse_metric_record(head + text)
        if not record:
            return False
        for key in ("train_loss", "train_runtime"):
            if isinstance(record.get(key), float) and record[key] == record[key]:
                self._summary[key] = record[key]
        return True

    def feed(self, line: Any) -> bool:
        text = line.text
        touched = False
        if self._summary_head is not None and self._summary_tail(line):
            return True  # (a line that does not end the cut record is read as any other)
        if "wandb:" in text:
            touched |= self._wandb_feed(line)
        elif "loss" in text or "train_runtime" in text or "mem" in text or "Loss" in text or "LOSS" in text:
            if not (self.block_metrics and ("{'loss'" in text or '"loss"' in text)) \
                    and ("{" in text or "=" in text or ":" in text or "|" in text or _ITER_LINE_RE.search(text)):
                touched |= self._metrics(line)
        if "trainable params" in text:
            m = _PEFT_RE.search(text)
            if m:
                self.sink._set_first({"peft.trainable_params": _int(m.group(1)), "peft.all_params": _int(m.group(2))})
                # the last count printed: a trainer that re-prepares a PeftModel prints a non-zero count, then 0
                if _int(m.group(1)) is not None:
                    self.sink.values["peft.last_trainable_params"] = _int(m.group(1))
                self.sink._evidence("peft", line)
                touched = True
        if "verflow" in text or "OVERFLOW" in text or "Skipping step" in text:
            self._overflow(line)
            touched = True
        if ("16" in text or "half()" in text) and len(self._precisions) < 2:
            found = precision_of(text)
            if found is not None:
                self._precisions.add(found)
                touched = True
        return touched

    @property
    def table_open(self) -> bool:
        """True when the last block ended inside a notebook table (its rows go on in the next)."""
        return self._table_columns is not None

    def feed_table_block(self, block: bytes, make_line: Callable[[bytes, int], Any]) -> None:
        """Notebook Trainer tables in a raw block (the engine calls this for blocks that hold
        TABLE_HEAD, or while `table_open`): the rows after each `Step  Training Loss ...` header, up
        to the first line that is no row. `make_line(raw, n)` builds the Line of the block's n-th
        line (1-based) when evidence needs it. The rows are kept and replayed by finish()."""
        # (offset of the first row, columns, its line number in the block, how its lines are peeled: None
        # when the header had no prefix, else whether it had a line number)
        starts: list[tuple[int, list[str], int, Optional[bool]]] = []
        if self._table_columns is not None:
            starts.append((0, self._table_columns, 1, self._table_peel))
            self._table_columns = None
        counted, newlines = 0, 0  # newlines in block[:counted], so that line numbers cost one pass
        at = block.find(TABLE_HEAD)
        while at >= 0:  # each header's line once: the search goes on after it (linear in the block)
            start = block.rfind(b"\n", 0, at) + 1
            nl = block.find(b"\n", at)
            line = block[start:nl if nl >= 0 else len(block)]
            peel: Optional[bool] = None
            m = _TABLE_HEAD_RE.match(line)
            if m:
                columns = table_columns(m.group(0).decode("utf-8", "replace"))
            else:
                # a header behind a pasted prefix (`> `, `>>> `, line numbers, compose, kubelet, rank, time):
                # its rows are peeled alike
                text, numbered = _peel(line.decode("utf-8", "replace"))
                columns = table_columns(text)
                peel = numbered
            at = block.find(TABLE_HEAD, nl) if nl >= 0 else -1
            if not columns:
                continue
            if nl < 0:  # the header ends the block: its rows start the next one
                self._table_columns, self._table_peel = columns, peel
                continue
            newlines += block.count(b"\n", counted, nl + 1)
            counted = nl + 1
            starts.append((nl + 1, columns, newlines + 1, peel))
        for pos, columns, lineno, peel in starts:
            rows = 0
            while pos < len(block):
                end = block.find(b"\n", pos)
                if end < 0:
                    end = len(block)
                raw = block[pos:end]
                text = raw.decode("utf-8", "replace")
                text = (text if peel is None else _peel(text, peel)[0]).strip()
                record = parse_table_row(text, columns) if text else None
                if record is None and not rows and _TABLE_RULE_RE.match(text):
                    pos, lineno = end + 1, lineno + 1  # `|------|:---:|` under a markdown header
                    continue
                if record is None:
                    if text or rows:
                        break  # the table ends at the first line that is no row
                else:
                    rows += 1
                    if len(self._table_rows) < _TABLE_MAX_ROWS:
                        self._table_rows.append((record, raw, lineno, make_line))
                pos, lineno = end + 1, lineno + 1
            else:
                # the rows ran to the block's end: they may go on
                self._table_columns, self._table_peel = columns, peel

    def _wandb_feed(self, line: Any) -> bool:
        """`wandb: Run summary:` and its `wandb:   train/loss nan` lines (the last run's wins).
        True when the line was one of those."""
        if "Run summary" in line.text:
            self._wandb, self._wandb_line = {}, None
            return True
        value = parse_wandb_value(line.text)
        if value is None:
            return False
        self._wandb[value[0]] = value[1]
        if value[0] == "loss" or self._wandb_line is None:
            self._wandb_line = line
        return True

    def close(self) -> None:
        """Replay table rows, else the wandb summary as one final record, when the log holds no
        metric record of its own: the dicts of the same run carry the same numbers, step by step,
        and adding a table or summary to them would count steps twice or append a fake last step."""
        if self.loss.records == 0:
            for record, raw, n, make_line in self._table_rows:
                self._record(record, lambda raw=raw, n=n, make_line=make_line: make_line(raw, n))
        if self.loss.records == 0 and "loss" in self._wandb:
            line = self._wandb_line
            self._record(dict(self._wandb), lambda: line)
            self.sink.values["metrics.summary_only"] = True
        self._table_rows = []

    def _metrics(self, line: Any) -> bool:
        """A metric record in a line (key=value forms, bar postfixes, odd dicts); True when one was found."""
        text = line.text
        if "%|" in text and ("it/s" in text or "s/it" in text):
            record = parse_bar_postfix(text)
            if record is None:
                m = _TORCHTUNE_BAR_RE.match(text)
                if m:  # torchtune puts the loss in the bar's description: `1|12|Loss: 1.87:  3%|...`
                    try:
                        record = {"loss": _float(m.group(3)), "step": float(m.group(2))}
                    except ValueError:
                        record = None
                else:  # a hand-written description: `Epoch 2/3 | step 40 | loss=nan:  13%|...`
                    record = parse_bar_description(text)
        else:
            record = parse_metric_record(text)
        if record:
            self._record(record, lambda: line)
            if "train_runtime" in record and "train_loss" not in record and "{" in text and "}" not in text:
                self._summary_head = text.rstrip("\r\n")  # a record cut by a hard wrap: its end is on the next line
            return True
        return False

    def feed_dict_record(self, loss_text: bytes, rest: bytes, line_at: Callable[[], Any]) -> None:
        """Fast path for the engine: a Trainer dict `{'loss': <loss_text><rest>}` found in a raw
        block; `line_at()` builds its Line only when evidence needs it."""
        try:
            loss = _bfloat(loss_text)
        except ValueError:
            return
        record: dict[str, Any] = {"loss": loss}
        if rest:
            for key, value in _DICT_PAIR_RE.findall(rest):
                try:
                    parsed = _bfloat(value)
                except ValueError:
                    parsed = None
                if parsed is not None:
                    record[key.decode("utf-8", "replace")] = parsed
        self._record(record, line_at)

    def feed_metric_batch(self, items: list, line_at: Callable[[int], Any]) -> None:
        """Fast path for the engine: the metric records of one block, in order, as the tuples of
        METRIC_DICT_RE.findall (loss, grad_norm, learning_rate, rest of the dict, JSON body);
        `line_at(k)` builds the Line of the k-th record only when evidence needs one. A block of
        plain `{'loss': x, 'grad_norm': y, 'learning_rate': z, ...}` dicts (a long training log
        has millions) is aggregated with list operations; other shapes one record at a time."""
        if not items:
            return
        loss_t, gn_t, lr_t, rest_t, body_t = items.columns if isinstance(items, RecordColumns) else zip(*items)
        # records holding memory keys or GRPO's reward_std go record by record (their extra keys are read)
        if self._mem_key is None and not any(body_t) and _plain_rests(b"".join(rest_t)):
            try:
                losses = _bfloats(loss_t)
                # absent optional groups are b"" (findall) or None (match)
                gns = _bfloats(gn_t) if b"" not in gn_t and None not in gn_t else None
                lrs = _bfloats(lr_t) if b"" not in lr_t and None not in lr_t else None
            except ValueError:
                pass
            else:
                if (gns is not None or not any(gn_t)) and (lrs is not None or not any(lr_t)):
                    self._vector_batch(losses, gns, lrs, line_at)
                    return
        self._scalar_batch(items, line_at)

    def _vector_batch(self, losses: list, gns: Optional[list], lrs: Optional[list],
                      line_at: Callable[[int], Any]) -> None:
        """A run of plain records, aggregated at once."""
        n = len(losses)
        if self.loss.records == 0:
            self.sink._evidence("metrics", line_at(0))
        first_bad = self.loss.add_many(losses, gns, lrs)
        if first_bad is not None:
            self.sink._evidence("metrics", line_at(first_bad))
        self._last_metrics_line = lambda k=n - 1: line_at(k)

    def _scalar_batch(self, items: list, line_at: Callable[[int], Any]) -> None:
        """Record by record, for blocks with memory keys, JSON bodies or odd values: a dict's
        grad_norm and learning_rate count where the dict pattern found them (as in _vector_batch)."""
        last_k = None
        for k, (loss_text, gn_text, lr_text, rest, body) in enumerate(items):
            if body or (rest and not _plain_rests(rest)) or self._mem_key is not None:
                # rare shapes: the general path
                if body:
                    self.feed_json_record(body, lambda k=k: line_at(k))
                else:
                    extra = b"".join(((b", 'grad_norm': " + gn_text) if gn_text else b"",
                                      (b", 'learning_rate': " + lr_text) if lr_text else b"", rest))
                    self.feed_dict_record(loss_text, extra, lambda k=k: line_at(k))
                continue
            try:
                loss = _bfloat(loss_text)
            except ValueError:
                continue
            last_k = k
            if self.loss.add(loss, _bfloat_or_none(gn_text), _bfloat_or_none(lr_text)) or self.loss.records == 1:
                self.sink._evidence("metrics", line_at(k))
        if last_k is not None:
            self._last_metrics_line = lambda k=last_k: line_at(k)

    def feed_json_record(self, body: bytes, line_at: Callable[[], Any]) -> None:
        """Fast path for a JSON record with a "loss" key (the text between the braces)."""
        record: dict[str, Any] = {}
        for key, value in _JSON_PAIR_RE.findall(body):
            try:
                record[key.decode("utf-8", "replace")] = float(value)
            except ValueError:
                continue
        if record:
            self._record(record, line_at)

    def _record(self, record: dict[str, Any], line_at: Callable[[], Any]) -> None:
        """Aggregate one metric record (the streaming facts of docs/facts.md `metrics.*`)."""
        if "train_runtime" in record:
            self._finished = True
            self.sink._evidence("metrics", line_at())
            # the end-of-training record's average loss and run time (a paste of that record alone)
            for key in ("train_loss", "train_runtime"):
                if isinstance(record.get(key), float) and record[key] == record[key]:
                    self._summary[key] = record[key]
        if "eval_loss" in record and isinstance(record["eval_loss"], float):
            self._eval_last = record["eval_loss"]
        if self._mem_key is not None or any("mem" in k for k in record):
            self._memory_metric(record)
        reward_std = record.get("reward_std")
        if isinstance(reward_std, float) and reward_std == reward_std:
            self._reward_std_n += 1
            self._reward_std_max = reward_std if self._reward_std_max is None else max(self._reward_std_max, reward_std)
        loss = record.get("loss")
        if not isinstance(loss, float):
            return
        gn = record.get("grad_norm", record.get("gnorm"))  # fairseq's json records: "gnorm"
        lr = record.get("learning_rate", record.get("lr"))
        first_bad = self.loss.add(loss, gn if isinstance(gn, float) else None, lr if isinstance(lr, float) else None)
        if self.loss.records == 1:
            self.sink._evidence("metrics", line_at())
        if first_bad:
            self.sink._evidence("metrics", line_at())
        self._last_metrics_line = line_at

    def _memory_metric(self, record: dict) -> None:
        if self._mem_key is None:
            keys = [k for k in record if "mem" in k.lower()]
            if not keys:
                return
            for pref in ("allocated", "active", "reserved", ""):
                chosen = [k for k in keys if pref in k.lower() and _metric_bytes(k, record[k]) is not None]
                if chosen:
                    self._mem_key = chosen[0]
                    break
            if self._mem_key is None:
                return
        if self._mem_key not in record:
            return
        value = _metric_bytes(self._mem_key, record[self._mem_key])
        if value is None:
            return
        if self._mem_first is None:
            self._mem_first = value
        if self._mem_last is not None and value > self._mem_last:
            self._mem_run += 1
        else:
            self._mem_run = 0
        self._mem_best = max(self._mem_best, self._mem_run)
        self._mem_last = value
        self._mem_max = value if self._mem_max is None else max(self._mem_max, value)

    def _overflow(self, line: Any) -> None:
        text = line.text
        m = _APEX_OVERFLOW_RE.search(text) or _DS_OVERFLOW_RE.search(text) or _OLD_OVERFLOW_RE.search(text)
        if not m:
            return
        self._overflows += 1
        if self._overflows <= 2:
            self.sink._evidence("metrics", line)
        if m.group(1):
            try:
                scale = float(m.group(1))
            except ValueError:
                return
            self._scale_min = scale if self._scale_min is None else min(self._scale_min, scale)


    def publish(self, v: dict[str, Any]) -> None:
        if self.loss.records:
            self.loss.publish(v)
            last = getattr(self, "_last_metrics_line", None)
            if last is not None:
                self.sink._evidence("metrics", last())
        if self._eval_last is not None:
            v["metrics.eval_loss_last"] = self._eval_last
            if self._eval_last != self._eval_last or self._eval_last in (float("inf"), float("-inf")):
                v["metrics.eval_loss_nonfinite"] = True
        if self._finished:
            v["metrics.train_finished"] = True
            for key, value in self._summary.items():
                v["metrics." + key] = value
        if self._precisions:
            v["metrics.precision"] = self._precisions.pop() if len(self._precisions) == 1 else "both"
        if self._overflows:
            v["metrics.overflow_skips"] = self._overflows
            if self._scale_min is not None:
                v["metrics.loss_scale_min"] = self._scale_min
        if self._reward_std_n:
            v["metrics.reward_std_records"] = self._reward_std_n
            v["metrics.reward_std_max"] = self._reward_std_max
        if self._mem_first is not None:
            v["metrics.mem_first_bytes"] = self._mem_first
            v["metrics.mem_last_bytes"] = self._mem_last
            v["metrics.mem_max_bytes"] = self._mem_max
            if self._mem_first > 0:
                v["metrics.mem_growth_ratio"] = self._mem_last / self._mem_first  # type: ignore[operator]
            v["metrics.mem_rising_records"] = self._mem_best
