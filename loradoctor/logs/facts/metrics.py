"""metrics, line by line: Trainer log records in their many printed shapes (`{'loss': ...}`
dicts, JSON records, `key=value`, `loss: x`, tqdm bar postfixes, torchtune bars, mlx-lm lines),
notebook Trainer tables, wandb run summaries, loss-scale overflows and PEFT's parameter count.
Pure functions of text; the MetricsExtractor (aggregate.py) feeds and aggregates them."""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Optional

from loradoctor.lazyre import lazy_re
from loradoctor.logs.reader import digits_blind
from loradoctor.logs.rules.literals import digit_blind
from loradoctor.logs.facts.common import _NUMBER, _float, _size
from loradoctor.logs.facts.tables import BAR_LOSS_KEYS as _BAR_LOSS_KEYS
from loradoctor.logs.facts.tables import SERIES_KEYS as _SERIES_KEYS
from loradoctor.logs.facts.tables import SPACED_KEYS as _SPACED_KEYS
from loradoctor.logs.facts.tables import TABLE_KEYS as _TABLE_KEYS
from loradoctor.logs.facts.tables import WANDB_KEYS as _WANDB_KEYS

_METRIC_RE = lazy_re(
    r"""(?<![\w/])['"]?([A-Za-z_][\w/().\-]{0,60}?)['"]?\s*[:=]\s*(?:tensor\()?['"]?(""" + _NUMBER
    + r""")(?:\s?([KMGT]i?B|[kmgt]i?b|[KMGT]))?(?![\w.])""")  # `gb`: lower-cased pastes, hand-written prints
# A Trainer log dict: `{'loss': 1.23, 'grad_norm': 0.5, ...}` (group 1 the loss, group 2 the rest)
# or a JSON record with a "loss" key (trainer_state.json log_history, jsonl loggers; may span lines).
# The Trainer's dicts are flat: the rest stops at a `{`, so a start that is no dict (a line of
# `{'loss': 1, ` repeated without a closing brace) is given up at the next start, not 4,000
# characters later (quadratic in effect: 960 KB took 17 s).
# A dict cut at the line's end (a paste cut at a terminal or title width, issue 10) is read up to its
# last whole pair: the pair the cut ran into is dropped, value and all (`'loss': 0.0` cut from `0.0213`
# must not read as a zero loss), so a loss counts only when a `,` follows it.
_PY_METRIC_DICT = (rb"\{'loss': ([^,}\r\n]{1,40})(?:, 'grad_norm': ([^,}\r\n]{1,40}))?"
                   rb"(?:, 'learning_rate': ([^,}\r\n]{1,40}))?([^{}\r\n]{0,4000})"
                   rb"(?:\}|, '[^{},\r\n]*(?=[\r\n]|\Z))")
PY_METRIC_DICT_RE = lazy_re(_PY_METRIC_DICT)  # one line, never a newline inside
METRIC_DICT_RE = lazy_re(_PY_METRIC_DICT + rb"|\{([^{}]{0,1500}?\"loss\":[^{}]{0,1500})\}")
# values bare or quoted (`"loss": "1.85"`); a quoted number must end where its string ends
_JSON_PAIR_RE = lazy_re(rb'"([^"\r\n]{1,80})":\s*"?(-?[0-9][0-9.eE+-]*|-?Infinity|NaN|nan)(?=[\s,}"\]]|$)')
_DICT_PAIR_RE = lazy_re(rb"'([^']{1,80})': ([^,}]+)")
_UNIT_IN_KEY_RE = lazy_re(r"[(_\[]\s*(gib|gb|mib|mb|kib|kb|g|m)\s*[)\]]?$", re.I)


class RecordColumns:
    """Metric records found in a raw block, held as columns (loss, grad_norm, learning_rate, rest of
    the dict, JSON body: the groups of METRIC_DICT_RE, one list each): the engine's split yields them so,
    and the MetricsExtractor aggregates columns, so a block's thousands of records are never turned
    into tuples and back. Reads as the list of METRIC_DICT_RE.findall-style tuples it stands for."""

    __slots__ = ("columns",)

    def __init__(self, loss: list, grad_norm: list, learning_rate: list, rest: list, body: list) -> None:
        self.columns = (loss, grad_norm, learning_rate, rest, body)

    def __len__(self) -> int:
        return len(self.columns[0])

    def __iter__(self):
        return zip(*self.columns)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return RecordColumns(*(c[k] for c in self.columns))
        return tuple(c[k] for c in self.columns)

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (list, tuple, RecordColumns)) else NotImplemented

    def __repr__(self) -> str:
        return f"RecordColumns({list(self)!r})"


def _bfloat(text: bytes) -> float:
    """float() of a metric value as printed, bare or quoted (`1.85`, `'1.85'`, `'nan'`: some
    trainers log their values as strings); ValueError for anything else."""
    try:
        return float(text)
    except ValueError:
        return float(text.strip(b"'\" "))


def _bfloats(texts: Iterable[bytes]) -> list:
    """_bfloat over many values: the plain float() map first (C speed), quoted values after."""
    try:
        return list(map(float, texts))
    except ValueError:
        return list(map(_bfloat, texts))



_SPACED_MEMORY_KEY_RE = lazy_re(r"\b(?:(?:GPU|gpu|CUDA|cuda) )?[Mm]emory (allocated|reserved|used|active|Allocated|Reserved|Used|Active)\b")
# a line that starts with its step (`step 100 | loss 2.31`, `[Epoch 1] ...`), or carries it after a
# logger's `|` prefix (fairseq: `2021-03-01 10:00:00 | INFO | train | epoch 001 | loss 7.123 | ...`)
_ITER_LINE_RE = lazy_re(r"(?:^\W*|\|[ \t]*)(?:iter(?:ation)?|step|epoch)\s*\[?\d+", re.I)
_SPACED_METRIC_RE = lazy_re(
    r"(?<![Vv]al )(?<![Ee]val )(?<![Tt]est )\b(train(?:ing)?[ _]loss|loss|learning[ _]rate|lr|grad[ _]norm|gnorm)"
    r"\s+(-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf|-inf)(?![\w.])", re.I)  # not `\d+\.?\d*`: quadratic
# litgpt's `| loss train: 2.112, val: n/a |` and hand-written `| Loss Train: 0.4132 | Loss Val: ...`
# (`\s*(?:[:=]\s*)?`, not `\s*[:=]?\s*`: two runs of spaces back to back split a long run n ways)
_LOSS_TRAIN_RE = lazy_re(r"\bloss[ _]train\s*(?:[:=]\s*)?(" + _NUMBER + r")(?![\w.])", re.I)


_METRIC_SPANS: dict[str, list] = {}  # digit-blind text -> the spans of _METRIC_RE's matches in it
_METRIC_SPANS_ENTRIES = 4096


def _metric_matches(text: str) -> list[tuple[str, str, Optional[str]]]:
    """(key, number, unit or None) of every _METRIC_RE match in text, in order. _METRIC_RE cannot tell one
    digit from another (rules.literals.digit_blind), so where it matches depends only on the text with its digits
    written 0: the spans are remembered per digit-blind text and cut from the text itself (an eval record
    every 500 steps is the same text but for its numbers; the regex took ~13 us of its ~30)."""
    compiled = _METRIC_RE.compiled()
    if not _METRIC_BLIND:
        _METRIC_BLIND.append(digit_blind(compiled))
    if not _METRIC_BLIND[0] or len(text) > 2048:
        return [m.group(1, 2, 3) for m in compiled.finditer(text)]
    blind = digits_blind(text)
    spans = _METRIC_SPANS.get(blind)
    if spans is None:
        spans = [m.span(1) + m.span(2) + m.span(3) for m in compiled.finditer(blind)]
        if len(_METRIC_SPANS) >= _METRIC_SPANS_ENTRIES:
            _METRIC_SPANS.clear()
        _METRIC_SPANS[blind] = spans
    return [(text[a:b], text[c:d], text[e:f] if e >= 0 else None) for a, b, c, d, e, f in spans]


_METRIC_BLIND: list = []  # [digit_blind(_METRIC_RE)], worked out on first use


def parse_metric_record(text: str) -> Optional[dict[str, Any]]:
    """`{'loss': 1.23, 'grad_norm': nan, 'learning_rate': 2e-05}` or `loss=1.23 lr=2e-5` or
    `loss: 1.23` -> {'loss': 1.23, 'grad_norm': nan, ...}. Bare nan/inf are accepted (which
    `ast.literal_eval` rejects). Values with a unit (`gpu_mem=12.3G`) come back as
    `(value, unit)`. None when no `key: number` pair is present."""
    out: dict[str, Any] = {}
    if "emory " in text:  # `GPU memory allocated: 6.12 GB` -> one key, `memory_allocated`
        text = _SPACED_MEMORY_KEY_RE.sub(lambda m: "memory_" + m.group(1).lower(), text)
    for key, number, unit in _metric_matches(text):
        key = key.strip()
        try:
            value = _float(number)
        except ValueError:
            continue
        out[key] = (value, unit) if unit else value
    for key in list(out):
        canon = _SERIES_KEYS.get(key.lower())
        if canon is not None and canon != key:
            out.setdefault(canon, out[key])
    if "loss" not in out and ("rain" in text or "RAIN" in text):
        m = _LOSS_TRAIN_RE.search(text)
        if m:
            try:
                out["loss"] = _float(m.group(1))
            except ValueError:
                pass
    if not any("loss" in k.lower() for k in out) and _ITER_LINE_RE.search(text):
        # `Iter 75: Train loss 3.316, Learning Rate 1.000e-04` (mlx-lm), `step 100 | loss 2.31 | lr 2e-4`:
        # names and numbers separated by a space, on a line that starts with its step
        spaced: dict[str, Any] = {}
        for m in _SPACED_METRIC_RE.finditer(text):
            try:
                spaced.setdefault(_SPACED_KEYS[m.group(1).lower().replace("_", " ")], _float(m.group(2)))
            except (ValueError, KeyError):
                continue
        if "loss" in spaced:
            out.update({k: v for k, v in spaced.items() if k not in out})
    return out or None


_TORCHTUNE_BAR_RE = lazy_re(r"^(\d+)\|(\d+)\|Loss: (" + _NUMBER + r"):")
# (from the last `[` before the rate: a lazy run across `[`s rescanned the line from each of them)
_BAR_POSTFIX_RE = lazy_re(r"\[[^\[\]]*?(?:it/s|s/it)\s*,([^\]]*)\]")


def parse_bar_postfix(text: str) -> Optional[dict[str, Any]]:
    """The postfix of a tqdm bar state (`... [01:02<00:37, 4.01it/s, loss=nan, v_num=3]`; Lightning's
    `train_loss=`, kohya's `avr_loss=`) as a metric record whose `loss` is the first of those keys.
    None when the bar carries no loss."""
    m = _BAR_POSTFIX_RE.search(text)
    if not m:
        return None
    record = parse_metric_record(m.group(1))
    if not record:
        return None
    for key in _BAR_LOSS_KEYS:
        if isinstance(record.get(key), float):
            record["loss"] = record[key]
            return record
    return None


def parse_bar_description(text: str) -> Optional[dict[str, Any]]:
    """A hand-written tqdm description that holds the loss (`Epoch 2/3 | step 40 | loss=nan:  13%|██ |
    40/300 [...]`, `epoch 1 loss 0.0: 45%|...`) as a metric record; None when it holds none. The
    description is the text before the bar's `NN%|`, cut with string operations (no regex)."""
    at = text.find("%|")
    head = text[:at].rstrip("0123456789").rstrip(" \t:") if at > 0 else ""
    if not head:
        return None
    record = parse_metric_record(head)
    return record if record and isinstance(record.get("loss"), float) else None


def _metric_bytes(key: str, value: Any) -> Optional[int]:
    """A memory metric in bytes: unit from the value (`12.3G`) or the key (`(gib)`, `_mb`)."""
    unit = None
    if isinstance(value, tuple):
        value, unit = value
    if unit is None:
        m = _UNIT_IN_KEY_RE.search(key)
        if m:
            unit = m.group(1)
        elif key == "memory" and isinstance(value, float) and value.is_integer():
            unit = "mib"  # mmcv/mmengine log `memory: 6814` (torch.cuda.max_memory_allocated() in MiB)
        elif key.startswith("peak_memory_") and isinstance(value, float):
            unit = "gib"  # torchtune's log_memory_stats: `peak_memory_alloc:18.02` in GiB
        else:
            return None
    unit = unit.lower()
    if not unit.endswith("b"):
        unit += "ib"  # 12.3G in a progress bar means GiB
    elif unit in ("gb", "mb", "kb", "tb") and "(" in key:
        unit = unit[0] + "ib"  # axolotl's (gb) keys hold GiB
    if not isinstance(value, float) or not math.isfinite(value):
        return None
    return _size(f"{value}{unit}")


# The precision a run shows (metrics.precision, for the differential: a nan in fp16 is overflow first,
# in bf16 divergence first). The clear "on" forms of the fp16 rules' lines (rules/numerics.yaml):
# `fp16=True` / `--fp16` / `mixed_precision: fp16` / `compute dtype: torch.float16` / a model loaded with
# `torch_dtype=torch.float16` / DeepSpeed's `"fp16": {"enabled": true` / Unsloth's `Bfloat16 = FALSE` /
# Lightning's `Using 16bit Automatic Mixed Precision` / torchtune's `dtype: fp16`, and their bf16 twins.
# (`(?:\s*[=:])?\s*`, not `\s*[=:]?\s*`: two space runs back to back split a long run n ways)
def _precision_re(name: str, dtype: str, amp: str, unsloth: str) -> "re.Pattern[str]":
    return lazy_re(
        r"\b" + name + r"['\"]?\s*[=:]\s*['\"]?(?:True|true|1|yes)\b"
        r"|--" + name + r"(?![\w-])(?![ =]+(?:False|false|0)\b)"
        r"|(?i:mixed[_ ]precision)(?: type)?(?:\s*[=:])?\s*['\"]?" + name + r"\b"
        r"|(?:compute dtype: |dtype\s*=\s*|with precision )torch\." + dtype + r"\b"
        r"|\"" + name + r"\":\s*\{\s*\"enabled\":\s*true"
        r"|Bfloat16 = " + unsloth + r"|Using " + amp + r" Automatic Mixed Precision"
        r"|^\s*dtype: " + name + r"\s*$")


_FP16_ON_RE = _precision_re("fp16", "float16", "16bit", "FALSE")
_BF16_ON_RE = _precision_re("bf16", "bfloat16", "bfloat16", "TRUE")


# Every form either precision regex matches holds one of these (`fp16`, `bf16`, `float16`, `bfloat16`,
# `16bit`): a line without them (an eval record whose numbers hold `16`) is answered without the regexes
_PRECISION_HINTS = ("p16", "f16", "t16", "16b")  # (spelt out in precision_of: four `in` tests)


# a model cast to float16 whole: `model = model.half()`, `AutoModel.from_pretrained(name).half()` (pure
# half precision: the updates themselves are fp16, without the fp32 master weights mixed precision keeps)
_HALF_MODEL_RE = lazy_re(r"(?:\b\w*[Mm]odel\w*|\bfrom_pretrained\(.*\))\.half\(\)")


# Advice, not the run: a reply's "please add bf16=True and change fp16=False", "try --bf16", "you should
# set bf16=True instead", "pass torch_dtype=torch.bfloat16 ... and set bf16=True". Only imperative and modal
# forms: "I set / added / tried / am using fp16=True" tells what the run did. Read in the few words before the
# setting on the same line.
_ADVICE_BEFORE_RE = lazy_re(r"(?i)\b(?:please|try|add|change|switch|should|recommend\w*|suggest\w*|instead"
                            r"|you (?:can|could|need|must|may)|need to|make sure|(?:and|then) (?:also )?set"
                            r"|(?<!i )(?<!we )pass)\b[^.;!?]{0,40}$")


def _switched_on(pattern: "re.Pattern[str]", text: str) -> bool:
    for m in pattern.finditer(text):
        if not _ADVICE_BEFORE_RE.search(text, max(0, m.start() - 60), m.start()):
            return True
    return False


def precision_of(text: str) -> Optional[str]:
    """'fp16' or 'bf16' when the line shows that precision switched on (not advised), else None."""
    if "half()" in text and _HALF_MODEL_RE.search(text):
        return "fp16"
    if not ("p16" in text or "f16" in text or "t16" in text or "16b" in text):
        return None
    if _switched_on(_FP16_ON_RE, text):
        return "fp16"
    if _switched_on(_BF16_ON_RE, text):
        return "bf16"
    return None


_PEFT_RE = lazy_re(r"trainable params:\s*([\d,.]+)\s*\|\|\s*all params:\s*([\d,.]+)")
_FLOAT = r"(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)"
# `[Ss]kipping`: a lower-cased paste gets `Gradient overflow` back from the vocabulary, but not the `Skipping`
# of a line with two spaces after the full stop
_APEX_OVERFLOW_RE = lazy_re(r"Gradient overflow\.\s+[Ss]kipping step(?:.*?reducing loss scale to\s*" + _FLOAT + ")?")
# (a retyped title or a quoted line keeps only `Rank 0 Skipping step. Attempted loss scale: ...`)
_DS_OVERFLOW_RE = lazy_re(r"(?:OVERFLOW! )?Rank \d+ Skipping step\.?(?:.*?reducing to\s*" + _FLOAT + ")?")
# older DeepSpeed / fused optimizers: "Overflow detected. Skipping step. Attempted loss scale: 1024, reducing to 512"
_OLD_OVERFLOW_RE = lazy_re(r"Overflow detected\.\s+Skipping step\.?(?:.*(?:reducing to|[Aa]ttempted loss scale:)\s*"
                              + _FLOAT + ")?")


# ---------------------------------------------------------------------------------------------
# metrics without dicts: notebook Trainer tables and wandb run summaries

# Jupyter/Colab/Kaggle (and Unsloth) render the Trainer's log as an HTML table; pasted as text it
# is a header `Step  Training Loss  Validation Loss` (tabs, spaces or `|`) and one row per logging
# step (`50  0.693100  0.693147`, `1  No log  0.69`). The rows hold no trigger literal, so the
# engine hands whole blocks that contain TABLE_HEAD to FactCollector.feed_table_block.
TABLE_HEAD = b"Training Loss"
_TABLE_HEAD_RE = lazy_re(rb"^[ \t|]*(?:Step|Epoch)[ \t|]+Training Loss(?![\w])[^\r\n]*", re.M)
_TABLE_CELL = r"(?:No log|None|-|" + _NUMBER + r")"
_TABLE_ROW_RE = lazy_re(r"^[ \t|]*\d+(?:\.\d+)?(?:[ \t|]+" + _TABLE_CELL + r")+[ \t|]*$")
_TABLE_CELL_RE = lazy_re(r"No log|[^\s|]+")
_TABLE_RULE_RE = lazy_re(r"^[ \t|:+=\-]*-{3}[ \t|:+=\-]*$")  # a markdown / ascii separator row
_TABLE_COLUMN_RE = lazy_re(r"Training Loss|Validation Loss|Train Loss|Eval Loss|Grad Norm|Learning Rate|[^\s|]+")
_TABLE_MAX_ROWS = 100_000  # rows kept for replay (a notebook table has one per logging step)


def table_columns(header: str) -> Optional[list[str]]:
    """The column names of a notebook Trainer table header (`Step\tTraining Loss\tValidation
    Loss`, space- or `|`-separated too); None when the line is no such header."""
    if not _TABLE_HEAD_RE.match(header.encode("utf-8", "replace")):
        return None
    text = header.strip()
    if "\t" in text or "|" in text:
        return [c.strip() for c in re.split(r"[\t|]", text) if c.strip()]
    if re.search(r"\S\s{2,}\S", text):  # columns padded with runs of spaces
        return re.split(r"\s{2,}", text)
    return _TABLE_COLUMN_RE.findall(text)


def parse_table_row(text: str, columns: list[str]) -> Optional[dict[str, Any]]:
    """One row of a notebook Trainer table as a metric record (`Training Loss` -> `loss`,
    `Validation Loss` -> `eval_loss`, `No log` cells left out); None when the line is no row."""
    if not _TABLE_ROW_RE.match(text):
        return None
    record: dict[str, Any] = {}
    for name, cell in zip(columns, _TABLE_CELL_RE.findall(text)):
        key = _TABLE_KEYS.get(name.lower())
        if key is None or cell in ("No log", "None", "-"):
            continue
        try:
            record[key] = _float(cell)
        except ValueError:
            continue
    return record


# `wandb:               train/loss nan` in the `wandb: Run summary:` block printed when a run ends
# (the `Run history:` lines hold sparklines, not numbers)
# (after a timestamp or a `[rank0]:`-style prefix too)
_WANDB_VALUE_RE = lazy_re(r"(?:^|[\s\]|:])wandb:\s+([A-Za-z_][\w/.\-]*)\s+(" + _NUMBER + r")\s*$")


def parse_wandb_value(text: str) -> Optional[tuple[str, float]]:
    """(record key, value) of a wandb summary line such as `wandb:   train/loss nan`, for the keys
    that metric records use (`train/loss` -> `loss`, ...); None for other lines."""
    m = _WANDB_VALUE_RE.search(text.strip())
    if not m or m.group(1) not in _WANDB_KEYS:
        return None
    try:
        return _WANDB_KEYS[m.group(1)], _float(m.group(2))
    except ValueError:
        return None
