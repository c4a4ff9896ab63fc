"""Extract numbers from log lines: the facts of docs/facts.md.

Each extractor is a pure function of text (`parse_oom_message`, `parse_memory_summary`,
`parse_metric_record`, `parse_xid`, `parse_child_failed`, `parse_watchdog_timeout`,
`parse_oom_killer`, ...), unit-tested on its own. `FactCollector` feeds lines to them in one
streaming pass, keeps the first event of each group (the root) plus counts, and keeps series in
bounded memory (aggregates plus downsampled points), however long the log.

`TRIGGER_LITERALS` are the words that make a line interesting to an extractor; the engine adds
them to its prefilter so that only such lines (and the rules' lines) are decoded at all.
"""

from __future__ import annotations

import itertools
import math
import re
import signal as _signal
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Optional

from loradoctor.findings import Evidence
from loradoctor.units import MAX_PLAUSIBLE_BYTES, parse_size

# (literal, ignore_case) pairs the extractors need to see.
TRIGGER_LITERALS: tuple[tuple[str, bool], ...] = (
    ("out of memory", True),
    ("Tried to allocate", False),
    ("memory summary", False), ("CUDA OOMs", False), ("Allocated memory", False),
    ("GPU reserved memory", False), ("Non-releasable memory", False),
    # `{'loss': ...}` dicts are found by the engine's block regex (METRIC_DICT_RE), not line by line
    ("loss=", False), ("loss:", False), ("wandb:", False), ("eval_loss", False), ("train_runtime", False), ("trainable params", False),
    ("mem=", False), ("memory/", False),
    ("rain loss ", False), ("| loss ", False), ("|Loss: ", False),  # torchtune bar: `1|12|Loss: 1.87:`  # mlx-lm `Iter 75: Train loss 3.3`, `step 9 | loss 2.3 | lr ...`
    ("Gradient overflow", False), ("OVERFLOW!", False), ("loss scale", False), ("Overflow detected", False),
    ("Traceback", False), ('File "', False), (".py:", False), (".py in ", False), ("Error", False), ("Exception", False),
    ("KeyboardInterrupt", False), ("NVRM", False), ("fallen off the bus", False), ("Xid=", False), ("XID_ERRORS", False),
    ("Timeout at NCCL work", False), ("communicator was aborted on rank", False),
    ("ChildFailedError", False), ("Root Cause", False), ("local_rank", False), ("exitcode", False),
    ("error_file", False), ("Signal ", False), ("Watchdog", False), ("collective operation timeout", True),
    # not a bare "NCCL": healthy multi-GPU runs print thousands of `NCCL INFO` lines
    ("NCCL error", False), ("NCCL communicator", False), ("nccl", False), ("unhandled system error", False),
    ("Killed", False), ("Kill process", False), ("exit code", True), ("exit status", True),
    ("return code", True), ("SIGKILL", False), ("Code 43", False),
    ("ERROR", False), ("FAIL", False), ("Fatal", False), ("FATAL", False), ("Segmentation fault", False),
    ("Aborted", False), ("core dumped", False),
    # source lines under traceback frames that hint at loading (`model = model.to(self.device)`)
    (".to(", False), (".cuda(", False),
    # rich traceback box lines (a frame wrapped onto two of them)
    ("│", False),
    # the second half of an OOM message wrapped by a terminal or notebook, and the figure lines of
    # `Allocation on device 0 would exceed allowed memory`
    ("PyTorch", False), ("GiB", False), ("MiB", False), ("ALLOC_CONF", False), ("Currently allocated", False),
    ("Requested", False),
    ("Device limit", False), ("Free (according", False),
    # world size for dist.silent_ranks, pnputil's Code 43
    ("nranks", False), ("nRanks", False), ("nproc", False), ("WORLD_SIZE", False), ("world_size", False), ("Problem Code", False),
)

_SIZE = r"(\d+(?:\.\d+)?\s*(?:bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB))"


def _size(text: Optional[str]) -> Optional[int]:
    """A plausible byte count or None (WDDM prints values like 17179869184.00 GiB)."""
    if not text:
        return None
    try:
        value = parse_size(text)
    except ValueError:
        return None
    return value if 0 <= value <= MAX_PLAUSIBLE_BYTES else None


# ---------------------------------------------------------------------------------------------
# oom: the CUDA out-of-memory message

@dataclass
class OomMessage:
    """The numbers of one out-of-memory message (docs/facts.md `oom.*`). Absent numbers are None."""

    era: str
    requested_bytes: Optional[int] = None
    device_index: Optional[int] = None
    total_bytes: Optional[int] = None
    free_bytes: Optional[int] = None
    allocated_bytes: Optional[int] = None
    reserved_bytes: Optional[int] = None
    reserved_unallocated_bytes: Optional[int] = None
    private_pool_bytes: Optional[int] = None
    allowed_bytes: Optional[int] = None
    this_process_bytes: Optional[int] = None
    other_process_bytes: Optional[int] = None
    other_process_count: Optional[int] = None
    other_unaccounted_bytes: Optional[int] = None
    non_pytorch_bytes: Optional[int] = None
    hint: Optional[str] = None

    def facts(self) -> dict[str, Any]:
        return {f"oom.{k}": v for k, v in asdict(self).items() if v is not None}


_OOM_HEAD_RE = re.compile(r"(?:\b(CUDA|XPU|MPS|HIP) out of memory|(?<![A-Za-z] )\b(Out of memory))\. Tried to allocate " + _SIZE)
# "CUDA out of memory." with nothing after it (cut messages, summaries); not "CUDA error: out of memory"
_OOM_BARE_RE = re.compile(r"\b(?:CUDA|XPU|HIP) out of memory\.?(?:\s*$|\s+(?!Tried))")
_OOM_G1_RE = re.compile(r"\(GPU (\d+); " + _SIZE + r" total capacity; " + _SIZE + r" already allocated; " + _SIZE
                        + r" free; (?:" + _SIZE + r" allowed; )?" + _SIZE + r" (?:reserved in total by PyTorch|cached)\)")
_OOM_IPEX_RE = re.compile(r"\(GPU (\d+); " + _SIZE + r" total capacity; " + _SIZE + r" already allocated; " + _SIZE
                          + r" reserved in total by PyTorch\)")
_OOM_TOTAL_RE = re.compile(r"GPU (\d+) has a total capac(i?)ty of " + _SIZE + r" of which " + _SIZE + r" is free")
_OOM_PROCESS_RE = re.compile(r"Process (\d+) has " + _SIZE + r" memory in use")
_OOM_THIS_RE = re.compile(r"this process has " + _SIZE + r" memory in use")
_OOM_ALLOWED_RE = re.compile(_SIZE + r" allowed;")
_OOM_ALLOCATED_RE = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch")
_OOM_PRIVATE_RE = re.compile(r"with " + _SIZE + r" allocated in private pools")
_OOM_UNALLOCATED_RE = re.compile(_SIZE + r" is reserved by PyTorch but unallocated")
# Apple: `MPS backend out of memory (MPS allocated: 17.07 GB, other allocations: 1.22 GB, max allowed:
# 18.13 GB). Tried to allocate 256.00 MB on private pool.` (PyTorch prints 1024-based sizes as GB/MB)
_OOM_MPS_RE = re.compile(r"MPS backend out of memory \(MPS allocated: " + _SIZE + r", other allocations: " + _SIZE
                         + r", max allowed: " + _SIZE + r"\)\.?(?:\s*Tried to allocate " + _SIZE + r")?")
# the memory-fraction form: `Allocation on device 0 would exceed allowed memory. (out of memory)`,
# then one figure a line (`Currently allocated     : 5.17 GiB`, `Requested : 20.00 MiB`, ...)
_OOM_FRACTION_RE = re.compile(r"Allocation on device (\d+) would exceed allowed memory")
_OOM_FIGURE_RE = re.compile(r"(Currently allocated|Requested|Device limit|Free \(according to CUDA\)|PyTorch limit"
                            r"(?: \([^)]*\))?)\s*:\s*" + _SIZE)
_FIGURE_FIELDS = {"Currently allocated": "allocated_bytes", "Requested": "requested_bytes",
                  "Device limit": "total_bytes", "Free (according to CUDA)": "free_bytes", "PyTorch limit": "allowed_bytes"}


def _mps_size(text: Optional[str]) -> Optional[int]:
    """MPS messages print GiB/MiB as `GB`/`MB` (PyTorch's 1024-based format_size)."""
    if text and text.rstrip().endswith(("GB", "MB", "KB")) and "i" not in text:
        text = text.rstrip()[:-2] + text.rstrip()[-2] + "iB"
    return _size(text)


def parse_oom_message(text: str) -> Optional[OomMessage]:
    """Parse a PyTorch out-of-memory message of any generation (shared/reference/pytorch.md §1):
    G1/G2 `(GPU 0; T total capacity; A already allocated; F free; R reserved in total by PyTorch)`,
    G3 `total capacty` (2.1 typo), G4 `expandable_segments` hint, G5 docs.pytorch.org URL, ROCm's
    `HIP out of memory` (same numbers), the device-generic `Out of memory. Tried to allocate`, Apple's
    `MPS backend out of memory (...)` (era `mps`), the memory-fraction form `Allocation on device N
    would exceed allowed memory. (out of memory)` with its figures joined after it (era `fraction`),
    and a bare `CUDA out of memory.` without numbers (era `bare`). Returns None when the text is no
    OOM message."""
    m = _OOM_HEAD_RE.search(text)
    if not m:
        mps = _OOM_MPS_RE.search(text)
        if mps:
            return _drop_implausible(OomMessage(
                era="mps", allocated_bytes=_mps_size(mps.group(1)), non_pytorch_bytes=_mps_size(mps.group(2)),
                allowed_bytes=_mps_size(mps.group(3)), requested_bytes=_mps_size(mps.group(4))))
        frac = _OOM_FRACTION_RE.search(text)
        if frac:
            msg = OomMessage(era="fraction", device_index=int(frac.group(1)))
            for f in _OOM_FIGURE_RE.finditer(text, frac.end()):
                label = f.group(1).split(" (")[0] if f.group(1).startswith("PyTorch") else f.group(1)
                name = _FIGURE_FIELDS[label]
                if getattr(msg, name) is None:
                    setattr(msg, name, _size(f.group(2)))
            msg = _drop_implausible(msg)
            # the cudaMallocAsync backend keeps no cache of its own (freed blocks go back to the
            # driver's pool), so what PyTorch holds is what it allocated; total - free - that is
            # held outside (others + contexts), as in G1/G2. Not when the user's fraction limit
            # refused the request: then the device's free memory did not matter.
            msg.reserved_bytes = msg.allocated_bytes
            limited = (msg.allowed_bytes is not None and msg.allocated_bytes is not None
                       and msg.requested_bytes is not None
                       and msg.allocated_bytes + msg.requested_bytes > msg.allowed_bytes)
            if None not in (msg.total_bytes, msg.free_bytes, msg.reserved_bytes) and not limited:
                msg.other_unaccounted_bytes = max(0, msg.total_bytes - msg.free_bytes - msg.reserved_bytes)  # type: ignore[operator]
            return msg
        bare = _OOM_BARE_RE.search(text)
        return OomMessage(era="bare") if bare else None
    requested = _size(m.group(3))
    rest = text[m.end():]
    hint = None
    if "expandable_segments" in rest:
        hint = "expandable_segments"
    elif "max_split_size_mb" in rest:
        hint = "max_split_size_mb"
    g1 = _OOM_G1_RE.search(rest)
    if g1:
        msg = OomMessage(era="G2" if "max_split_size_mb" in rest else "G1", requested_bytes=requested,
                         device_index=int(g1.group(1)), total_bytes=_size(g1.group(2)),
                         allocated_bytes=_size(g1.group(3)), free_bytes=_size(g1.group(4)),
                         allowed_bytes=_size(g1.group(5)), reserved_bytes=_size(g1.group(6)), hint=hint)
        if msg.reserved_bytes is not None and msg.allocated_bytes is not None:
            msg.reserved_unallocated_bytes = max(0, msg.reserved_bytes - msg.allocated_bytes)
        if None not in (msg.total_bytes, msg.free_bytes, msg.reserved_bytes):
            msg.other_unaccounted_bytes = max(0, msg.total_bytes - msg.free_bytes - msg.reserved_bytes)  # type: ignore[operator]
        return _drop_implausible(msg)
    ipex = _OOM_IPEX_RE.search(rest)
    if ipex:
        # intel-extension-for-pytorch's XPU message: the G1 layout without the free figure
        msg = OomMessage(era="ipex", requested_bytes=requested, device_index=int(ipex.group(1)),
                         total_bytes=_size(ipex.group(2)), allocated_bytes=_size(ipex.group(3)),
                         reserved_bytes=_size(ipex.group(4)), hint=hint)
        msg = _drop_implausible(msg)
        if msg.reserved_bytes is not None and msg.allocated_bytes is not None:
            msg.reserved_unallocated_bytes = max(0, msg.reserved_bytes - msg.allocated_bytes)
        return msg
    if m.group(2):
        era = "generic"
    elif "capacty" in rest:
        era = "G3"
    elif "docs.pytorch.org" in rest:
        era = "G5"
    else:
        era = "G4"
    msg = OomMessage(era=era, requested_bytes=requested, hint=hint)
    t = _OOM_TOTAL_RE.search(rest)
    if t:
        msg.device_index = int(t.group(1))
        msg.total_bytes = _size(t.group(3))
        msg.free_bytes = _size(t.group(4))
    others = [_size(p.group(2)) for p in _OOM_PROCESS_RE.finditer(rest)]
    others = [o for o in others if o is not None and (msg.total_bytes is None or o <= msg.total_bytes)]
    if others:
        msg.other_process_bytes = sum(others)
        msg.other_process_count = len(others)
    this = _OOM_THIS_RE.search(rest)
    if this:
        msg.this_process_bytes = _size(this.group(1))
    allowed = _OOM_ALLOWED_RE.search(rest)
    if allowed:
        msg.allowed_bytes = _size(allowed.group(1))
    a = _OOM_ALLOCATED_RE.search(rest)
    if a:
        msg.allocated_bytes = _size(a.group(1))
    p = _OOM_PRIVATE_RE.search(rest)
    if p:
        msg.private_pool_bytes = _size(p.group(1))
    u = _OOM_UNALLOCATED_RE.search(rest)
    if u:
        msg.reserved_unallocated_bytes = _size(u.group(1))
    msg = _drop_implausible(msg)
    if msg.allocated_bytes is not None and msg.reserved_unallocated_bytes is not None:
        msg.reserved_bytes = msg.allocated_bytes + msg.reserved_unallocated_bytes + (msg.private_pool_bytes or 0)
    if msg.this_process_bytes is not None and msg.reserved_bytes is not None and msg.this_process_bytes < msg.reserved_bytes:
        # vLLM workers and containers print `this process has 0 bytes memory in use`: the process
        # holds at least what PyTorch reserved, so the figure is not usable
        msg.this_process_bytes = None
    if msg.this_process_bytes is not None:
        if None not in (msg.total_bytes, msg.free_bytes):
            msg.other_unaccounted_bytes = max(0, msg.total_bytes - msg.free_bytes - msg.this_process_bytes)  # type: ignore[operator]
        if msg.reserved_bytes is not None:
            msg.non_pytorch_bytes = max(0, msg.this_process_bytes - msg.reserved_bytes)
    elif m.group(1) in ("HIP", "XPU") and None not in (msg.total_bytes, msg.free_bytes, msg.reserved_bytes) \
            and msg.other_process_bytes is None:
        # ROCm and XPU builds print no NVML process clauses at all: as in G1/G2, total - free -
        # reserved is what other processes (plus this process's context) hold
        msg.other_unaccounted_bytes = max(0, msg.total_bytes - msg.free_bytes - msg.reserved_bytes)  # type: ignore[operator]
    return msg


def _drop_implausible(msg: OomMessage) -> OomMessage:
    """No single number can exceed the card (nor 1 PiB); WDDM's garbage NVML values go."""
    limit = msg.total_bytes if msg.total_bytes else MAX_PLAUSIBLE_BYTES
    for name in ("free_bytes", "allocated_bytes", "reserved_bytes", "reserved_unallocated_bytes",
                 "private_pool_bytes", "allowed_bytes", "this_process_bytes"):
        value = getattr(msg, name)
        if value is not None and value > limit * 1.05:
            setattr(msg, name, None)
    return msg


# ---------------------------------------------------------------------------------------------
# memsum: torch.cuda.memory_summary()

@dataclass
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


_MEMSUM_ROW_RE = re.compile(r"^\|?\s*(Allocated memory|GPU reserved memory|Non-releasable memory)\s*\|\s*"
                            r"(\d+(?:\.\d+)?\s*[KMGT]?i?B)\s*\|\s*(\d+(?:\.\d+)?\s*[KMGT]?i?B)\s*\|")
_MEMSUM_COUNTERS_RE = re.compile(r"CUDA OOMs:\s*(\d+)\s*\|\s*cudaMalloc retries:\s*(\d+)")


def parse_memory_summary(lines: Iterable[str]) -> Optional[MemorySummary]:
    """Numbers of one `torch.cuda.memory_summary()` table (shared/reference/pytorch.md §2);
    None when the lines hold no such table."""
    summary = MemorySummary()
    seen = False
    for text in lines:
        text = text.strip()
        c = _MEMSUM_COUNTERS_RE.search(text)
        if c:
            summary.oom_count, summary.alloc_retries = int(c.group(1)), int(c.group(2))
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


# ---------------------------------------------------------------------------------------------
# metrics: Trainer log records

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|NaN|NAN|inf|Inf|INF|infinity|Infinity)"
_METRIC_RE = re.compile(
    r"""(?<![\w/])['"]?([A-Za-z_][\w/().\-]{0,60}?)['"]?\s*[:=]\s*(?:tensor\()?['"]?(""" + _NUMBER
    + r""")(?:\s?([KMGT]i?B|[KMGT]))?(?![\w.])""")
# A Trainer log dict: `{'loss': 1.23, 'grad_norm': 0.5, ...}` (group 1 the loss, group 2 the rest)
# or a JSON record with a "loss" key (trainer_state.json log_history, jsonl loggers; may span lines)
_PY_METRIC_DICT = (rb"\{'loss': ([^,}\r\n]{1,40})(?:, 'grad_norm': ([^,}\r\n]{1,40}))?"
                   rb"(?:, 'learning_rate': ([^,}\r\n]{1,40}))?([^}\r\n]{0,4000})\}")
PY_METRIC_DICT_RE = re.compile(_PY_METRIC_DICT)  # one line, never a newline inside
METRIC_DICT_RE = re.compile(_PY_METRIC_DICT + rb"|\{([^{}]{0,1500}?\"loss\":[^{}]{0,1500})\}")
# values bare or quoted (`"loss": "1.85"`); a quoted number must end where its string ends
_JSON_PAIR_RE = re.compile(rb'"([^"\r\n]{1,80})":\s*"?(-?[0-9][0-9.eE+-]*|-?Infinity|NaN|nan)(?=[\s,}"\]]|$)')
_DICT_PAIR_RE = re.compile(rb"'([^']{1,80})': ([^,}]+)")
_UNIT_IN_KEY_RE = re.compile(r"[(_\[]\s*(gib|gb|mib|mb|kib|kb|g|m)\s*[)\]]?$", re.I)


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


def _float(text: str) -> float:
    low = text.lower().lstrip("+")
    if low in ("nan", "-nan"):
        return math.nan
    if low in ("inf", "infinity"):
        return math.inf
    if low in ("-inf", "-infinity"):
        return -math.inf
    return float(text)


_SPACED_MEMORY_KEY_RE = re.compile(r"\b(?:(?:GPU|gpu|CUDA|cuda) )?[Mm]emory (allocated|reserved|used|active|Allocated|Reserved|Used|Active)\b")
_ITER_LINE_RE = re.compile(r"^\W*(?:iter(?:ation)?|step|epoch)\s*\[?\d+", re.I)
_SPACED_METRIC_RE = re.compile(
    r"(?<![Vv]al )(?<![Ee]val )(?<![Tt]est )\b(train(?:ing)?[ _]loss|loss|learning[ _]rate|lr|grad[ _]norm)"
    r"\s+(-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf|-inf)(?![\w.])", re.I)
_SPACED_KEYS = {"train loss": "loss", "training loss": "loss", "loss": "loss", "learning rate": "learning_rate",
                "lr": "learning_rate", "grad norm": "grad_norm"}


def parse_metric_record(text: str) -> Optional[dict[str, Any]]:
    """`{'loss': 1.23, 'grad_norm': nan, 'learning_rate': 2e-05}` or `loss=1.23 lr=2e-5` or
    `loss: 1.23` -> {'loss': 1.23, 'grad_norm': nan, ...}. Bare nan/inf are accepted (which
    `ast.literal_eval` rejects). Values with a unit (`gpu_mem=12.3G`) come back as
    `(value, unit)`. None when no `key: number` pair is present."""
    out: dict[str, Any] = {}
    if "emory " in text:  # `GPU memory allocated: 6.12 GB` -> one key, `memory_allocated`
        text = _SPACED_MEMORY_KEY_RE.sub(lambda m: "memory_" + m.group(1).lower(), text)
    for m in _METRIC_RE.finditer(text):
        key = m.group(1).strip()
        try:
            value = _float(m.group(2))
        except ValueError:
            continue
        out[key] = (value, m.group(3)) if m.group(3) else value
    if not any("loss" in k.lower() for k in out) and _ITER_LINE_RE.match(text):
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


_TORCHTUNE_BAR_RE = re.compile(r"^(\d+)\|(\d+)\|Loss: (" + _NUMBER + r"):")
_BAR_POSTFIX_RE = re.compile(r"\[[^\]]*?(?:it/s|s/it)\s*,([^\]]*)\]")
_BAR_LOSS_KEYS = ("loss", "train_loss", "avr_loss", "avg_loss", "train/loss")


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


@dataclass
class _Series:
    """Downsampled (index, value) points: at most `limit`, evenly thinned as the log grows."""

    limit: int = 256
    stride: int = 1
    points: list = field(default_factory=list)
    _n: int = 0

    def add(self, index: int, value: float) -> None:
        self._n += 1
        if (self._n - 1) % self.stride:
            return
        self.points.append((index, value))
        if len(self.points) >= self.limit:
            self.points = self.points[::2]
            self.stride *= 2

    def add_many(self, indices: list, values: list) -> None:
        """The same as calling add for each pair, with list slicing instead of a Python loop."""
        i, total = 0, len(values)
        while i < total:
            first = i + (-self._n) % self.stride  # the next element that add() would keep
            room = self.limit - len(self.points)
            kept_idx = indices[first:total:self.stride][:room]
            kept_val = values[first:total:self.stride][:room]
            self.points.extend(zip(kept_idx, kept_val))
            if len(self.points) >= self.limit:
                upto = first + (len(kept_idx) - 1) * self.stride + 1
                self._n += upto - i
                i = upto
                self.points = self.points[::2]
                self.stride *= 2
            else:
                self._n += total - i
                i = total


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


# ---------------------------------------------------------------------------------------------
# trace: Python tracebacks

_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_RICH_FRAME_RE = re.compile(r"^(\S+\.py):(\d+) in (\S+)\s*$")
_IPYTHON_FRAME_RE = re.compile(r"^File (\S+?):(\d+), in (?:[\w<>]+\.)*([\w<>]+)\(")
_OLD_IPYTHON_FRAME_RE = re.compile(r"^(\S+\.py) in ()([\w<>]+)\(")
_RICH_WRAPPED_HEAD_RE = re.compile(r"^(\S+\.py):$")
_RICH_WRAPPED_TAIL_RE = re.compile(r"^(\d+) in (\S+)$")
_EXC_RE = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Failure|Warning))(?::\s?(.*))?$")

_LOCATIONS = (  # checked in this order: the more specific phase wins
    ("load", {"from_pretrained", "load_state_dict", "_load_state_dict_into_meta_model", "dispatch_model",
              "load_checkpoint_and_dispatch", "_load_pretrained_model", "load_checkpoint_in_model",
              "_load_from_state_dict", "load_model"}),
    # save: HF Trainer / PEFT, plus the frames of a sharded save without Trainer frames above them
    # (DeepSpeed's engine and ZeRO-3 16-bit consolidation, FSDP full / optimizer state dicts via
    # accelerate or torch, torch.distributed.checkpoint, Lightning, torch.save itself)
    ("save", {"save_model", "_save_checkpoint", "save_pretrained", "_save", "save_state",
              "save_checkpoint", "save_16bit_model", "_zero3_consolidated_16bit_state_dict",
              "_save_zero_checkpoint", "consolidate_state_dict", "save_fsdp_model", "save_fsdp_optimizer",
              "get_state_dict", "_full_post_state_dict_hook", "full_optim_state_dict", "_optim_state_dict_impl",
              "get_model_state_dict", "get_optimizer_state_dict", "save_state_dict", "_save_state_dict",
              "async_save", "dump_checkpoint", "save"}),
    ("eval", {"evaluate", "evaluation_loop", "prediction_step", "_evaluate", "predict",
              # Lightning: validation (and the sanity check before training)
              "validation_step", "_evaluation_step", "_run_sanity_check", "validate",
              # diffusers / kohya: validation images between steps
              "log_validation", "sample_images", "sample_image_inference"}),
    ("generate", {"generate", "_sample", "greedy_search", "sample", "beam_search", "_greedy_search", "_beam_search",
                  "_beam_sample", "_group_beam_search", "_constrained_beam_search", "_assisted_decoding",
                  "_contrastive_search"}),
    ("optimizer", {"optimizer_step"}),
    ("backward", {"backward", "_engine_run_backward", "run_backward"}),
    ("forward", {"forward", "_call_impl", "_wrapped_call_impl", "compute_loss", "training_step"}),
)
# frames that show a training step is under way; a bare `train` is not one (kohya's `train`
# function loads the model too)
_STEP_FRAMES = {"_inner_training_loop", "training_step", "train_step", "compute_loss", "forward", "backward",
                "_engine_run_backward", "optimizer_step", "_call_impl", "_wrapped_call_impl"}
_SPECIFIC = ("load", "save", "eval", "generate")
_MOVE_FRAMES = {"to", "cuda", "_apply"}
_LOAD_SOURCE_RE = re.compile(r"(?:model|net|unet|transformer|encoder|vae|module|pipe)\w*\s*\.\s*(?:to|cuda)\(", re.I)


def location_from_frames(frames: list[tuple[str, str]], sources: Iterable[str] = ()) -> Optional[str]:
    """Phase from (file, function) frames, outermost first: load / save / eval / generate /
    optimizer / backward / forward, or None. Load/save/eval/generate come from the innermost frame
    that names one of them (closest to the exception); a `.to`/`.cuda` frame, or a source line such
    as `model = model.to(self.device)`, means load when no training-step frame is in the traceback
    (a user function named `train` does not count); then optimizer, backward, forward."""
    names = dict(_LOCATIONS)
    for _, fn in reversed(frames):
        for phase in _SPECIFIC:
            if fn in names[phase]:
                return phase
    funcs = {fn for _, fn in frames}
    if not funcs & _STEP_FRAMES:
        if funcs & _MOVE_FRAMES or any(_LOAD_SOURCE_RE.search(src) for src in sources):
            return "load"
    if any(fn == "step" and "optim" in path for path, fn in frames) or "optimizer_step" in funcs:
        return "optimizer"
    for phase in ("backward", "forward"):
        if funcs & names[phase]:
            return phase
    return None


# ---------------------------------------------------------------------------------------------
# xid: kernel NVRM lines

@dataclass
class XidEvent:
    xid: Optional[int]  # None for "fallen off the bus" lines without an Xid number
    pci: Optional[str] = None
    pid: Optional[int] = None
    process: Optional[str] = None
    text: str = ""
    fell_off_bus: bool = False


_XID_MONITOR_RE = re.compile(r"XidCriticalError: Xid=(\d+)|DCGM_FI_DEV_XID_ERRORS\{[^}]*\}\s+(\d+)\b")
_XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?)[^)]*\):\s*(\d+)"
                     r"(?:,\s*pid=('<unknown>'|<unknown>|\d+))?(?:,\s*name=([^,]*))?(?:,\s*(.*))?")
_BUS_RE = re.compile(r"NVRM: (?:GPU |The NVIDIA GPU )(?:at (?:PCI:)?)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?)"
                     r".*fallen off the bus")
# the driver's three-line form: `NVRM: The NVIDIA GPU 0000:b3:00.0` / `NVRM: (PCI ID: 10de:2335) installed
# in this system has` / `NVRM: fallen off the bus and is not responding to commands.`
_BUS_TAIL_RE = re.compile(r"NVRM:.*\bfallen off the bus")


def parse_xid(text: str) -> Optional[XidEvent]:
    """`NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.`
    and the older / MIG / pid-only shapes (shared/reference/nvidia.md §1.1), plus `GPU ... has
    fallen off the bus` lines without an Xid. None for other text."""
    m = _XID_RE.search(text)
    if m:
        pid = m.group(3)
        name = (m.group(4) or "").strip()
        rest = (m.group(5) or "").strip()
        xid = int(m.group(2))
        return XidEvent(xid=xid, pci=m.group(1).lower(), pid=int(pid) if pid and pid.isdigit() else None,
                        process=name if name and name != "<unknown>" else None, text=rest,
                        fell_off_bus=xid == 79 or "fallen off the bus" in text)
    m = _XID_MONITOR_RE.search(text)
    if m and int(m.group(1) or m.group(2)) > 0:
        # the Kubernetes device plugin and dcgm-exporter report the driver's Xid without the NVRM line
        xid = int(m.group(1) or m.group(2))
        return XidEvent(xid=xid, text=text.strip(), fell_off_bus=xid == 79)
    b = _BUS_RE.search(text)
    if b:
        return XidEvent(xid=None, pci=b.group(1).lower(), text=text.strip(), fell_off_bus=True)
    if _BUS_TAIL_RE.search(text):
        return XidEvent(xid=None, text=text.strip(), fell_off_bus=True)
    return None


# ---------------------------------------------------------------------------------------------
# dist: torchrun / NCCL

@dataclass
class ChildFailed:
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    exit_code: Optional[int] = None
    pid: Optional[int] = None
    signal: Optional[str] = None
    host: Optional[str] = None


_CF_RANK_RE = re.compile(r"^\s*rank\s*:\s*(-?\d+)(?:\s*\(local_rank:\s*(\d+)\))?")
_CF_EXIT_RE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)(?:\s*\(pid:\s*(\d+)\))?")
_CF_SIGNAL_RE = re.compile(r"Signal (\d+) \((SIG\w+)\)")
_CF_HOST_RE = re.compile(r"^\s*host\s*:\s*(\S+)")


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
            entry.rank = int(m.group(1))
            entry.local_rank = int(m.group(2)) if m.group(2) else None
            found = True
        elif m := _CF_EXIT_RE.match(text):
            entry.exit_code = int(m.group(1))
            entry.pid = int(m.group(2)) if m.group(2) else None
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


@dataclass
class WatchdogTimeout:
    rank: Optional[int]
    timeout_ms: Optional[int]
    ran_ms: Optional[int]
    op: Optional[str]


_WATCHDOG_RE = re.compile(r"(?:\[Rank (\d+)\]\s*)?(?:Watchdog caught collective operation timeout|collective operation "
                          r"timeout|Timeout at NCCL work:)|NCCL communicator was aborted on rank (\d+)", re.I)
_TIMEOUT_MS_RE = re.compile(r"Timeout\(ms\)=(\d+)")
_RAN_MS_RE = re.compile(r"ran for (\d+) milliseconds")
_OPTYPE_RE = re.compile(r"OpType=(\w+)")


def parse_watchdog_timeout(text: str) -> Optional[WatchdogTimeout]:
    """`[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE,
    ..., Timeout(ms)=600000) ran for 600036 milliseconds before timing out.`"""
    m = _WATCHDOG_RE.search(text)
    if not m:
        return None
    t, r, o = _TIMEOUT_MS_RE.search(text), _RAN_MS_RE.search(text), _OPTYPE_RE.search(text)
    rank = m.group(1) or m.group(2)
    return WatchdogTimeout(rank=int(rank) if rank else None,
                           timeout_ms=int(t.group(1)) if t else None,
                           ran_ms=int(r.group(1)) if r else None, op=o.group(1) if o else None)


_NRANKS_RE = re.compile(r"\bn[Rr]anks[ =:]\s*(\d+)")
_WORLD_SIZE_RE = re.compile(r"\bWORLD_SIZE\s*[=:]\s*['\"]?(\d+)|\bworld_size\s*[=:]\s*(\d+)")
_NPROC_RE = re.compile(r"--nproc[_-]per[_-]node[= ](\d+)")
_NNODES_RE = re.compile(r"--nnodes[= ](\d+)(?!\s*:)")


def silent_ranks(world_size: Optional[int], timeout_ranks: Iterable[int]) -> Optional[list[int]]:
    """Ranks 0..world_size-1 that never reported a timeout while others did (the rank that hung
    or died first); None when the world size or the timeout ranks are unknown."""
    reported = set(timeout_ranks)
    if not world_size or not reported or max(reported) >= world_size:
        return None
    return [r for r in range(world_size) if r not in reported]


_NCCL_ERROR_RE = re.compile(r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclInvalidUsage|"
                            r"ncclRemoteError|ncclInvalidArgument|unhandled system error|NCCL communicator was aborted")

# ---------------------------------------------------------------------------------------------
# killed: host memory


@dataclass
class OomKill:
    pid: Optional[int]
    process: Optional[str]
    anon_rss_bytes: Optional[int]


_OOM_KILL_RE = re.compile(r"(?:Out of memory|Memory cgroup out of memory|oom-kill)?:?\s*Kill(?:ed)? process (\d+) \(([^)]*)\)"
                          r"(?:.*?anon-rss:\s*(\d+)\s*kB)?")
_BARE_KILLED_RE = re.compile(r"^(?:\S*: line \d+:\s+\d+\s+)?Killed(?:\s+\S.*)?$")
_EXIT_CODE_RE = re.compile(r"(?:exit(?:ed with)? (?:code|status)|exitcode|return code|returned non-zero exit status|exit_code)"
                           r"\s*[:=]?\s*(-?\d+)", re.I)


def parse_oom_killer(text: str) -> Optional[OomKill]:
    """`Out of memory: Killed process 12345 (python) total-vm:..kB, anon-rss:..kB, ...` (and the
    older `Kill process N (name) score ...`, the cgroup form). None for other text."""
    if "process" not in text or "ill" not in text:
        return None
    m = _OOM_KILL_RE.search(text)
    if not m:
        return None
    rss = int(m.group(3)) * 1024 if m.group(3) else None
    return OomKill(pid=int(m.group(1)), process=m.group(2), anon_rss_bytes=rss)


def is_bare_killed(text: str) -> bool:
    """`Killed` alone, or the shell's `bash: line 1: 1234 Killed   python train.py`."""
    return bool(_BARE_KILLED_RE.match(text.strip())) and "process" not in text


def parse_exit_code(text: str) -> Optional[int]:
    m = _EXIT_CODE_RE.search(text)
    if m:
        return int(m.group(1))
    if "Signals.SIGKILL" in text:
        return -9
    return None


_CODE43_RE = re.compile(r"\(?Code 43\)?|Problem Code:\s*43\b")
_DEVICE_NAME_RE = re.compile(r"((?:NVIDIA )?(?:GeForce|Quadro|Tesla|TITAN|RTX|GTX)[\w \-]*?)(?=\s*[:;,()]|\s+(?:Windows|has|is|reported)\b|$)")
_PEFT_RE = re.compile(r"trainable params:\s*([\d,.]+)\s*\|\|\s*all params:\s*([\d,.]+)")
_FLOAT = r"(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)"
_APEX_OVERFLOW_RE = re.compile(r"Gradient overflow\.\s+Skipping step(?:.*?reducing loss scale to\s*" + _FLOAT + ")?")
_DS_OVERFLOW_RE = re.compile(r"OVERFLOW! Rank \d+ Skipping step\.?(?:.*?reducing to\s*" + _FLOAT + ")?")
# older DeepSpeed / fused optimizers: "Overflow detected. Skipping step. Attempted loss scale: 1024, reducing to 512"
_OLD_OVERFLOW_RE = re.compile(r"Overflow detected\.\s+Skipping step\.?(?:.*(?:reducing to|[Aa]ttempted loss scale:)\s*"
                              + _FLOAT + ")?")
# Words that make a line "error-looking" (shown when nothing is recognised), matched on the lower-cased
# line with plain `in` tests: a case-insensitive regex alternation cost ~25 us a line, most of the
# collector's time on a busy log.
_ERRORISH_WORDS = ("error", "exception", "traceback", "fail", "fatal", "killed", "abort", "segmentation fault",
                   "core dumped", "out of memory", "nccl", "xid")


def is_errorish(text: str) -> bool:
    """Does the line look like an error (for the tail shown when nothing is recognised)?"""
    low = text.lower()
    return any(word in low for word in _ERRORISH_WORDS)


def _int(text: str) -> Optional[int]:
    try:
        return int(float(text.replace(",", "")))
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------
# metrics without dicts: notebook Trainer tables and wandb run summaries

# Jupyter/Colab/Kaggle (and Unsloth) render the Trainer's log as an HTML table; pasted as text it
# is a header `Step  Training Loss  Validation Loss` (tabs, spaces or `|`) and one row per logging
# step (`50  0.693100  0.693147`, `1  No log  0.69`). The rows hold no trigger literal, so the
# engine hands whole blocks that contain TABLE_HEAD to FactCollector.feed_table_block.
TABLE_HEAD = b"Training Loss"
_TABLE_HEAD_RE = re.compile(rb"^[ \t|]*(?:Step|Epoch)[ \t|]+Training Loss(?![\w])[^\r\n]*", re.M)
_TABLE_CELL = r"(?:No log|None|-|" + _NUMBER + r")"
_TABLE_ROW_RE = re.compile(r"^[ \t|]*\d+(?:\.\d+)?(?:[ \t|]+" + _TABLE_CELL + r")+[ \t|]*$")
_TABLE_CELL_RE = re.compile(r"No log|[^\s|]+")
_TABLE_RULE_RE = re.compile(r"^[ \t|:+=\-]*-{3}[ \t|:+=\-]*$")  # a markdown / ascii separator row
_TABLE_COLUMN_RE = re.compile(r"Training Loss|Validation Loss|Train Loss|Eval Loss|Grad Norm|Learning Rate|[^\s|]+")
_TABLE_KEYS = {"step": "step", "epoch": "epoch", "training loss": "loss", "train loss": "loss",
               "validation loss": "eval_loss", "eval loss": "eval_loss", "grad norm": "grad_norm",
               "learning rate": "learning_rate"}
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
_WANDB_VALUE_RE = re.compile(r"(?:^|[\s\]|:])wandb:\s+([A-Za-z_][\w/.\-]*)\s+(" + _NUMBER + r")\s*$")
_WANDB_KEYS = {"train/loss": "loss", "loss": "loss", "train/grad_norm": "grad_norm", "grad_norm": "grad_norm",
               "train/learning_rate": "learning_rate", "learning_rate": "learning_rate", "eval/loss": "eval_loss",
               "eval_loss": "eval_loss", "train/epoch": "epoch", "train/global_step": "step",
               "train_runtime": "train_runtime"}


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


# ---------------------------------------------------------------------------------------------
# wrapped OOM messages

_SENTENCE_END = (".", ")", "!", "PYTORCH_CUDA_ALLOC_CONF")
_FRACTION_LABEL_END = "(set by user-supplied memory fraction)"  # cudaMallocAsync prints the figure on the next line
_OOM_PIECES = ("Tried to allocate", "GPU ", "Of the allocated", "Including non-PyTorch", "Process ", "If reserved",
               "See documentation", "this process", "Currently allocated", "Requested", "Device limit",
               "Free (according", "PyTorch limit")
_OOM_WORDS = ("PyTorch", "GiB", "MiB", "allocat", "reserved", "capacity", "memory", "free")
_HEADERLESS_GAP = 60  # lines after the last frame of a traceback without header that still belong to it


# Message forms whose numbers parse_oom_message reads but the collector does not publish (a form
# goes here while rules/oom.yaml cannot read it yet). Empty: the numbered rules read ROCm's `HIP out
# of memory`, Apple's `MPS backend out of memory` and the cudaMallocAsync / memory-fraction form.
HELD_BACK_OOM_FORMS: frozenset[str] = frozenset()


def _held_back(msg: OomMessage, text: str) -> bool:
    form = "HIP" if "HIP out of memory" in text else msg.era
    return form in HELD_BACK_OOM_FORMS


def _oom_finished(text: str) -> bool:
    """True when an OOM message ends its sentence; the fraction form always takes figure lines."""
    if _OOM_FRACTION_RE.search(text) and not _OOM_FIGURE_RE.search(text):
        return False
    if text.rstrip().endswith(_FRACTION_LABEL_END):
        return False  # the limit's figure is on the next line
    return text.rstrip().endswith(_SENTENCE_END) and not text.rstrip().endswith("out of memory.")


def _continues_oom(pending: dict, line: Any) -> bool:
    """The line right after a pending OOM line that starts mid-sentence (terminal or notebook wrap)."""
    if line.file != pending["file"] or line.lineno != pending["lineno"] + 1 or line.timestamp is not None:
        return False
    if line.rank is not None and line.rank != pending["line"].rank:
        return False  # another rank's line interleaved
    text = line.text
    if not text or text.startswith(("Traceback", "File ", "[", "{", "During handling", "The above")):
        return False
    if text.startswith(_OOM_PIECES):
        return True
    if pending["text"].rstrip().endswith(_FRACTION_LABEL_END):
        return text.startswith(":")  # `                        : 39.62 GiB`
    if pending["text"].rstrip().endswith(_SENTENCE_END) or _EXC_RE.match(text):
        return False  # a finished message: only its known next sentences follow
    return text[:1].islower() or any(w in text for w in _OOM_WORDS)


def _join_wrapped(first: str, second: str) -> str:
    """Join a wrapped message: with or without a space, whichever reads more OOM numbers
    (`allocated by P` + `yTorch` joins tight; `allocated by` + `PyTorch` needs the space)."""
    tight, spaced = first + second, first.rstrip() + " " + second
    if first.rstrip().endswith((".", ",", ";", ":", ")")):
        return spaced

    def numbers(text: str) -> int:
        msg = parse_oom_message(text)
        return 0 if msg is None else sum(v is not None for v in asdict(msg).values())

    return tight if numbers(tight) > numbers(spaced) else spaced


# ---------------------------------------------------------------------------------------------
# the collector

MAX_GROUP_EVIDENCE = 6


@dataclass
class Facts:
    """The extracted facts: flat values, source lines per group, downsampled series."""

    values: dict[str, Any] = field(default_factory=dict)
    groups: dict[str, list[Evidence]] = field(default_factory=dict)
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    first_seen: dict[str, tuple] = field(default_factory=dict)  # group -> (time_s, input, lineno)

    def flat(self) -> dict[str, Any]:
        """Fact name -> value, with exactly the names of docs/facts.md (absent facts are absent)."""
        return dict(self.values)

    def evidence(self, group: str) -> list[Evidence]:
        return list(self.groups.get(group, []))

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)


class FactCollector:
    """Feed normalised lines (in input order) with `feed`; `finish` returns the Facts."""

    def __init__(self, block_metrics: bool = False) -> None:
        # block_metrics: the engine feeds `{'loss': ...}` dicts through feed_dict_record itself
        self.block_metrics = block_metrics
        self.values: dict[str, Any] = {}
        self.groups: dict[str, list[Evidence]] = {}
        self.first_seen: dict[str, tuple] = {}
        self.progress: Optional[tuple[int, int]] = None  # last training progress bar (n, total)
        self.records_before_oom: Optional[int] = None  # metric records before the first OOM (engine)
        self.ranks: set[int] = set()
        self.error_tail: deque = deque(maxlen=10)
        # oom
        self._oom_count = 0
        self._oom_numbered = False  # the numbers of a numbered message are in
        self._oom_pending: Optional[dict] = None  # an OOM line whose sentence may go on next line
        # memsum
        self._memsum_lines: Optional[list[str]] = None
        self._memsum_start = 0
        self._memsum_count = 0
        self._memsum_first: Optional[MemorySummary] = None
        # metrics
        self._records = 0
        self._loss_first = self._loss_last = self._loss_min = self._loss_max = None
        self._loss_nan = self._loss_zero = 0
        self._first_nonfinite: Optional[int] = None
        self._finite_before_nan = 0
        self._flat_run = self._flat_best = 0
        self._prev_loss: Optional[float] = None
        self._max_after_min: Optional[float] = None
        self._gn_first = self._gn_max = None
        self._gn_nan = 0
        self._lr_max = self._lr_last = None
        self._eval_last = None
        self._finished = False
        self._overflows = 0
        self._scale_min: Optional[float] = None
        self._mem_key: Optional[str] = None
        self._mem_first = self._mem_last = self._mem_max = None
        self._mem_run = self._mem_best = 0
        self.loss_series = _Series()
        self.mem_series = _Series()
        # records from notebook tables and wandb summaries: replayed by finish() only in a log
        # without metric records of its own (docs/facts.md)
        self._table_columns: Optional[list[str]] = None  # a table whose rows ran to a block's end
        self._table_rows: list = []  # (record, raw row, line number in block, make_line)
        self._wandb: dict[str, float] = {}  # the last `wandb: Run summary:` values
        self._wandb_line: Any = None
        # trace
        self._in_trace = False
        self._frames: list[tuple[str, str]] = []
        self._sources: list[str] = []  # source lines shown under the frames (load hints)
        self._headerless = False  # frames seen without `Traceback (most recent call last):`
        self._last_frame_lineno = 0
        self._rich_path: Optional[tuple[str, int]] = None  # a rich frame wrapped after `path.py:`
        self._oom_trace_done = False  # trace.location was taken from the traceback ending the OOM
        self._trace_count = 0
        self._trace_start: Optional[Evidence] = None
        # dist
        self._cf_lines: Optional[list[str]] = None
        self._cf_budget = 0
        self._timeouts = 0
        self._timeout_ranks: list[int] = []
        self._first_timeout: Optional[tuple] = None
        self._nccl_errors = 0
        self._world: dict[str, int] = {}  # source (nranks, world_size, nproc, nnodes) -> largest value seen
        # xid
        self._xid_count = 0
        self._xid_numbers: list[int] = []

    # helpers ----------------------------------------------------------------------------------
    def _evidence(self, group: str, line: Any) -> None:
        items = self.groups.setdefault(group, [])
        if len(items) < MAX_GROUP_EVIDENCE and not any(e.line == line.lineno and e.file == line.file for e in items):
            items.append(Evidence(file=line.file, line=line.lineno, text=line.quote()))
        if group not in self.first_seen:
            self.first_seen[group] = (line.time_s, line.input_index, line.lineno)

    def _set_first(self, values: dict[str, Any]) -> None:
        for k, v in values.items():
            if v is not None and k not in self.values:
                self.values[k] = v

    # feeding ----------------------------------------------------------------------------------
    @property
    def idle(self) -> bool:
        """No multi-line record is open (traceback, memory summary, ChildFailedError box, wrapped OOM
        message): what a line does then depends on its text alone."""
        return not self._in_trace and self._memsum_lines is None and self._cf_lines is None \
            and self._oom_pending is None

    def feed(self, line: Any) -> bool:
        """Take one normalised line (a reader.Line). Returns True when feeding the same text again
        could change what is collected (beyond `ranks` and `error_tail`): the engine skips later
        repeats of a line that returned False while `idle` (a warning printed every step)."""
        text = line.text
        if not text:
            return False
        touched = not self.idle
        if line.rank is not None:
            self.ranks.add(line.rank)
        if self._memsum_lines is not None:
            self._memsum_feed(line)
        if self._cf_lines is not None:
            self._cf_feed(line)
        if "wandb:" in text:
            touched |= self._wandb_feed(line)
        elif "loss" in text or "train_runtime" in text or "mem" in text or "|Loss: " in text:
            if not (self.block_metrics and ("{'loss'" in text or '"loss"' in text)) \
                    and ("{" in text or "=" in text or ":" in text or "|" in text):
                touched |= self._metrics(line)
        if "ut of memory" in text or "UT OF MEMORY" in text or self._oom_pending is not None:
            self._oom_feed(line)
            touched = True
        if "Traceback" in text or self._in_trace or 'File "' in text:
            self._trace(line)
            touched = True
        elif _EXC_RE.match(text):
            self._trace(line)
            touched = True
        if "memory summary" in text and "PyTorch" in text:
            self._memsum_open(line)
            touched = True
        elif "CUDA OOMs" in text and self._memsum_lines is None:
            self._memsum_open(line)
            self._memsum_feed(line)
            touched = True
        if "NVRM" in text or "Xid=" in text or "XID_ERRORS" in text:
            self._xid(line)
            touched = True
        if "ChildFailedError" in text or ("Root Cause" in text and self._cf_lines is None):
            self._cf_open(line)
            touched = True
        if "ollective operation timeout" in text or "Timeout at NCCL work" in text \
                or "communicator was aborted on rank" in text:
            self._timeout(line)
            touched = True
        if ("NCCL" in text or "nccl" in text or "unhandled system error" in text) and _NCCL_ERROR_RE.search(text):
            self._nccl_errors += 1
            self._evidence("dist", line)
            touched = True
        if "nranks" in text or "nRanks" in text or "WORLD_SIZE" in text or "world_size" in text or "--n" in text:
            self._world_size(text)  # a running maximum: a repeat adds nothing
        if "ill" in text:
            touched |= self._killed(line)
        if "Code 43" in text or "Problem Code" in text:
            touched |= self._code43(line)
        if "trainable params" in text:
            m = _PEFT_RE.search(text)
            if m:
                self._set_first({"peft.trainable_params": _int(m.group(1)), "peft.all_params": _int(m.group(2))})
                self._evidence("peft", line)
                touched = True
        if "verflow" in text or "OVERFLOW" in text:
            self._overflow(line)
            touched = True
        code = parse_exit_code(text) if ("xit" in text or "return code" in text or "SIGKILL" in text) else None
        if code is not None and code in (137, -9):
            self._set_first({"killed.exit_code": code})
            self._evidence("killed", line)
            touched = True
        if is_errorish(text):
            self.note_errorish(line)
        return touched

    def note_errorish(self, line: Any) -> None:
        """Keep an error-looking line for the "nothing recognised" tail."""
        self.error_tail.append(Evidence(file=line.file, line=line.lineno, text=line.quote()))

    @property
    def table_open(self) -> bool:
        """True when the last block ended inside a notebook table (its rows go on in the next)."""
        return self._table_columns is not None

    def feed_table_block(self, block: bytes, make_line: Callable[[bytes, int], Any]) -> None:
        """Notebook Trainer tables in a raw block (the engine calls this for blocks that hold
        TABLE_HEAD, or while `table_open`): the rows after each `Step  Training Loss ...` header, up
        to the first line that is no row. `make_line(raw, n)` builds the Line of the block's n-th
        line (1-based) when evidence needs it. The rows are kept and replayed by finish()."""
        starts = []  # (offset of the first row, columns, its line number in the block)
        if self._table_columns is not None:
            starts.append((0, self._table_columns, 1))
            self._table_columns = None
        if TABLE_HEAD in block:
            for m in _TABLE_HEAD_RE.finditer(block):
                columns = table_columns(m.group(0).decode("utf-8", "replace"))
                if not columns:
                    continue
                nl = block.find(b"\n", m.end())
                if nl < 0:  # the header ends the block: its rows start the next one
                    self._table_columns = columns
                    continue
                starts.append((nl + 1, columns, block.count(b"\n", 0, nl + 1) + 1))
        for pos, columns, lineno in starts:
            rows = 0
            while pos < len(block):
                end = block.find(b"\n", pos)
                if end < 0:
                    end = len(block)
                raw = block[pos:end]
                text = raw.decode("utf-8", "replace").strip()
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
                self._table_columns = columns  # the rows ran to the block's end: they may go on

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

    def _fallback_records(self) -> None:
        """Replay table rows, else the wandb summary as one final record, when the log holds no
        metric record of its own: the dicts of the same run carry the same numbers, step by step,
        and adding a table or summary to them would count steps twice or append a fake last step."""
        if self._records == 0:
            for record, raw, n, make_line in self._table_rows:
                self._record(record, lambda raw=raw, n=n, make_line=make_line: make_line(raw, n))
        if self._records == 0 and "loss" in self._wandb:
            line = self._wandb_line
            self._record(dict(self._wandb), lambda: line)
            self.values["metrics.summary_only"] = True
        self._table_rows = []

    def set_progress(self, n: int, total: int) -> None:
        """The last training progress bar state seen (the engine finds bars in raw blocks)."""
        self.progress = (n, total)

    # groups -----------------------------------------------------------------------------------
    def _oom_feed(self, line: Any) -> None:
        """OOM lines, and the lines that continue a wrapped one (joined before parsing)."""
        pending = self._oom_pending
        if pending is not None:
            if _continues_oom(pending, line):
                pending["text"] = _join_wrapped(pending["text"], line.text)
                pending["joins"] += 1
                if pending["joins"] < 8 and not _oom_finished(pending["text"]):
                    pending["lineno"] = line.lineno
                    return
                self._oom_pending = None
                self._oom_parse(pending)
                return
            self._oom_pending = None
            self._oom_parse(pending)
        if "ut of memory" not in line.text and "UT OF MEMORY" not in line.text:
            return
        if parse_oom_message(line.text) is None:
            return
        phase = self._current_phase(line)
        item = {"line": line, "text": line.text, "lineno": line.lineno, "file": line.file, "joins": 0,
                "phase": phase}
        if _oom_finished(line.text):
            self._oom_parse(item)
        else:
            self._oom_pending = item  # the next line may carry the rest of the message

    def _current_phase(self, line: Any) -> Optional[str]:
        """The phase of the traceback this line ends (or sits in), from its frames so far."""
        if not self._frames or not self._in_trace:
            return None
        if self._headerless and line.lineno - self._last_frame_lineno > _HEADERLESS_GAP:
            return None
        return location_from_frames(self._frames, self._sources)

    def _oom_parse(self, item: dict) -> None:
        msg = parse_oom_message(item["text"])
        if msg is None:
            return
        line = item["line"]
        self._oom_count += 1
        self._evidence("oom", line)
        first = self._oom_count == 1
        if first:
            if item["phase"]:
                self.values["oom.phase"] = item["phase"]
            self._oom_step()
        # the numbers describe the first message that has numbers: a bare warning (`CUDA out of
        # memory on batch 311, skipping batch`) does not hide the full message after it
        if self._oom_numbered:
            return
        if msg.era == "bare" or _held_back(msg, item["text"]):
            if first:
                self.values["oom.era"] = msg.era
            return
        self._oom_numbered = True
        self.values.update(msg.facts())
        if "oom.phase" not in self.values and item["phase"]:
            self.values["oom.phase"] = item["phase"]

    def _oom_step(self) -> None:
        if self.progress is not None:
            n, total = self.progress
            self.values["oom.step"] = n
            if total:
                self.values["oom.step_fraction"] = n / total
        else:
            records = self.records_before_oom if self.records_before_oom is not None else self._records
            if records:
                self.values["oom.step"] = records

    def _trace(self, line: Any) -> None:
        text = line.text
        if "Traceback (most recent call last)" in text:
            self._open_trace(line, headerless=False)
            return
        if not self._in_trace:
            # `[rank2]: File "...", line 4214, in _load_pretrained_model` tails pasted without header
            if _FRAME_RE.search(text):
                self._open_trace(line, headerless=True)
            else:
                return
        elif self._headerless and line.lineno - self._last_frame_lineno > _HEADERLESS_GAP:
            self._in_trace = False
            return
        m = _FRAME_RE.search(text) or _RICH_FRAME_RE.match(text) or _IPYTHON_FRAME_RE.match(text) \
            or _OLD_IPYTHON_FRAME_RE.match(text)
        if m is None and self._rich_path is not None and line.lineno == self._rich_path[1] + 1:
            # rich wraps `path.py:698 in func` onto two box lines: `path.py:` then `698 in func`
            w = _RICH_WRAPPED_TAIL_RE.match(text)
            if w:
                self._add_frame(self._rich_path[0], w.group(2), line)
                self._rich_path = None
                return
        self._rich_path = None
        if m:
            self._add_frame(m.group(1), m.group(3), line)
            return
        w = _RICH_WRAPPED_HEAD_RE.match(text)
        if w:
            self._rich_path = (w.group(1), line.lineno)
            return
        e = _EXC_RE.match(text)
        if e and not text.startswith(("During handling", "The above exception")):
            self._trace_count += 1
            self._in_trace = False
            loc = location_from_frames(self._frames, self._sources)
            if self._trace_count == 1:
                if self._trace_start is not None:
                    self.groups.setdefault("trace", []).append(self._trace_start)
                self._evidence("trace", line)
                self.values["trace.exception"] = e.group(1)
                if e.group(2):
                    self.values["trace.message"] = e.group(2)[:300]
                if loc:
                    self.values["trace.location"] = loc
            if not self._oom_trace_done and ("ut of memory" in text or "UT OF MEMORY" in text):
                # the traceback that ends with the (first) OOM places it, not an unrelated earlier
                # one (a caught flash-attn ImportError before a training OOM)
                self._oom_trace_done = True
                if loc:
                    self.values["trace.location"] = loc
                else:
                    self.values.pop("trace.location", None)
        elif self._frames and len(self._sources) < 200 and text and not text.startswith(("^", "~")):
            self._sources.append(text)  # the source line under a frame

    def _open_trace(self, line: Any, headerless: bool) -> None:
        self._in_trace = True
        self._headerless = headerless
        self._frames = []
        self._sources = []
        self._rich_path = None
        self._last_frame_lineno = line.lineno
        if self._trace_count == 0:
            self._trace_start = Evidence(file=line.file, line=line.lineno, text=line.quote())

    def _add_frame(self, path: str, func: str, line: Any) -> None:
        self._last_frame_lineno = line.lineno
        if len(self._frames) < 200:
            self._frames.append((path, func))

    def _memsum_open(self, line: Any) -> None:
        self._memsum_close()
        self._memsum_lines = []
        self._memsum_start = line.lineno
        self._evidence("memsum", line)

    def _memsum_feed(self, line: Any) -> None:
        if line.lineno - self._memsum_start > 80 or self._memsum_lines is None:
            self._memsum_close()
            return
        text = line.text
        if "|" in text and not text.startswith("|"):
            text = text[text.index("|"):]  # a logger prefix: `INFO:__main__:| Allocated memory | ...`
        if text.startswith("|") or "CUDA OOMs" in text:
            self._memsum_lines.append(text)

    def _memsum_close(self) -> None:
        if self._memsum_lines:
            summary = parse_memory_summary(self._memsum_lines)
            if summary is not None:
                self._memsum_count += 1
                if self._memsum_first is None:
                    self._memsum_first = summary
                    self.values.update(summary.facts())
        self._memsum_lines = None

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
        else:
            record = parse_metric_record(text)
        if record:
            self._record(record, lambda: line)
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
        loss_t, gn_t, lr_t, rest_t, body_t = zip(*items)
        if self._mem_key is None and not any(body_t) and b"mem" not in b"".join(rest_t):
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
        """Aggregate a run of plain records; the same facts as _record, record by record."""
        n = len(losses)
        start = self._records  # records before this batch; record k has index start + k + 1
        finite = list(map(math.isfinite, losses))
        all_finite = all(finite)
        gn_finite = list(map(math.isfinite, gns)) if gns is not None else None
        if self._records == 0:
            self._evidence("metrics", line_at(0))
        if self._first_nonfinite is None:
            firsts = []
            if not all_finite:
                firsts.append(finite.index(False))
            if gn_finite is not None and not all(gn_finite):
                firsts.append(gn_finite.index(False))
            if firsts:
                k = min(firsts)
                self._first_nonfinite = start + k + 1
                self._finite_before_nan = start + k - self._loss_nan
                self._evidence("metrics", line_at(k))
        if all_finite:
            values, where = losses, list(range(start + 1, start + n + 1))
        else:
            values = list(itertools.compress(losses, finite))
            where = list(itertools.compress(range(start + 1, start + n + 1), finite))
            self._loss_nan += n - len(values)
        self._records = start + n
        self._last_metrics_line = lambda k=n - 1: line_at(k)
        if values:
            self.loss_series.add_many(where, values)
            if self._loss_first is None:
                self._loss_first = values[0]
            self._loss_last = values[-1]
            self._loss_zero += values.count(0.0)
            low, high = min(values), max(values)
            if self._loss_min is None or low < self._loss_min:
                at = values.index(low)
                tail = values[at + 1:]
                self._max_after_min = max(tail) if tail else None
                self._loss_min = low
            else:
                self._max_after_min = high if self._max_after_min is None else max(self._max_after_min, high)
            if self._loss_max is None or high > self._loss_max:
                self._loss_max = high
        self._flat_runs(losses, finite, all_finite)
        if gns is not None:
            good = gns if all(gn_finite) else list(itertools.compress(gns, gn_finite))  # type: ignore[arg-type]
            self._gn_nan += len(gns) - len(good)
            if good:
                if self._gn_first is None:
                    self._gn_first = good[0]
                top = max(good)
                if self._gn_max is None or top > self._gn_max:
                    self._gn_max = top
        if lrs is not None:
            good = [x for x in lrs if x - x == 0] if not all(map(math.isfinite, lrs)) else lrs
            if good:
                self._lr_last = good[-1]
                top = max(good)
                if self._lr_max is None or top > self._lr_max:
                    self._lr_max = top

    def _flat_runs(self, losses: list, finite: list, all_finite: bool) -> None:
        """Longest run of consecutive finite records whose loss changed by < 1e-4."""
        pieces = [losses] if all_finite else _finite_pieces(losses, finite)
        prev, run, best = self._prev_loss, self._flat_run, self._flat_best
        for piece_no, piece in enumerate(pieces):
            if not piece:  # a non-finite record: the run ends
                prev, run = None, 0
                continue
            steady = bytes(-1e-4 < b - a < 1e-4 for a, b in zip(piece, piece[1:]))
            streaks = steady.split(b"\0")
            # the first record continues the previous run if it is close to the previous loss
            lead = 1 if prev is None or not (-1e-4 < piece[0] - prev < 1e-4) else run + 1
            if len(streaks) == 1:  # no break inside the piece
                run = lead + len(streaks[0])
                best = max(best, run)
            else:
                best = max(best, lead + len(streaks[0]), 1 + max(len(x) for x in streaks[1:]))
                run = 1 + len(streaks[-1])
            prev = piece[-1]
        self._prev_loss, self._flat_run, self._flat_best = prev, run, best

    def _scalar_batch(self, items: list, line_at: Callable[[int], Any]) -> None:
        """Record by record, for blocks with memory keys, JSON bodies or odd values."""
        loss_min, loss_max = self._loss_min, self._loss_max
        prev, run, best = self._prev_loss, self._flat_run, self._flat_best
        max_after = self._max_after_min
        gn_first, gn_max, lr_max = self._gn_first, self._gn_max, self._lr_max
        last_loss = self._loss_last
        add_point = self.loss_series.add
        index = self._records
        last_k = None
        for k, (loss_text, gn_text, lr_text, rest, body) in enumerate(items):
            if body or (rest and b"mem" in rest) or self._mem_key is not None:
                # rare shapes: the general path (sync the locals around it)
                self._records = index
                self._loss_min, self._loss_max, self._prev_loss = loss_min, loss_max, prev
                self._flat_run, self._flat_best, self._max_after_min = run, best, max_after
                self._gn_first, self._gn_max, self._lr_max = gn_first, gn_max, lr_max
                self._loss_last = last_loss
                if body:
                    self.feed_json_record(body, lambda k=k: line_at(k))
                else:
                    extra = b"".join(((b", 'grad_norm': " + gn_text) if gn_text else b"",
                                      (b", 'learning_rate': " + lr_text) if lr_text else b"", rest))
                    self.feed_dict_record(loss_text, extra, lambda k=k: line_at(k))
                index = self._records
                loss_min, loss_max, prev = self._loss_min, self._loss_max, self._prev_loss
                run, best, max_after = self._flat_run, self._flat_best, self._max_after_min
                gn_first, gn_max, lr_max = self._gn_first, self._gn_max, self._lr_max
                last_loss = self._loss_last
                continue
            try:
                loss = _bfloat(loss_text)
            except ValueError:
                continue
            index += 1
            last_k = k
            finite = loss - loss == 0
            gn = None
            if gn_text:
                try:
                    gn = _bfloat(gn_text)
                except ValueError:
                    gn = None
            if index == 1:
                self._evidence("metrics", line_at(k))
            if self._first_nonfinite is None and (not finite or (gn is not None and gn - gn != 0)):
                self._first_nonfinite = index
                self._finite_before_nan = index - 1 - self._loss_nan
                self._evidence("metrics", line_at(k))
            if finite:
                add_point(index, loss)
                last_loss = loss
                if loss_min is None:
                    self._loss_first = loss
                    loss_min = loss_max = loss
                elif loss < loss_min:
                    loss_min = loss
                    max_after = None
                elif max_after is None or loss > max_after:
                    max_after = loss
                if loss > loss_max:
                    loss_max = loss
                if loss == 0:
                    self._loss_zero += 1
                if prev is not None and -1e-4 < loss - prev < 1e-4:
                    run += 1
                else:
                    run = 1
                if run > best:
                    best = run
                prev = loss
            else:
                self._loss_nan += 1
                run = 0
                prev = None
            if gn is not None:
                if gn - gn == 0:
                    if gn_first is None:
                        gn_first = gn_max = gn
                    elif gn > gn_max:
                        gn_max = gn
                else:
                    self._gn_nan += 1
            if lr_text:
                try:
                    lr = _bfloat(lr_text)
                except ValueError:
                    lr = None
                if lr is not None and lr - lr == 0:
                    self._lr_last = lr
                    if lr_max is None or lr > lr_max:
                        lr_max = lr
        self._records = index
        self._loss_last = last_loss
        if last_k is not None:
            self._last_metrics_line = lambda k=last_k: line_at(k)
        self._loss_min, self._loss_max, self._prev_loss = loss_min, loss_max, prev
        self._flat_run, self._flat_best, self._max_after_min = run, best, max_after
        self._gn_first, self._gn_max, self._lr_max = gn_first, gn_max, lr_max

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
            self._evidence("metrics", line_at())
        if "eval_loss" in record and isinstance(record["eval_loss"], float):
            self._eval_last = record["eval_loss"]
        if self._mem_key is not None or any("mem" in k for k in record):
            self._memory_metric(record)
        loss = record.get("loss")
        if not isinstance(loss, float):
            return
        self._records += 1
        index = self._records
        gn = record.get("grad_norm")
        lr = record.get("learning_rate", record.get("lr"))
        finite = loss - loss == 0  # false for nan and +-inf
        gn_finite = not isinstance(gn, float) or gn - gn == 0
        if index == 1:
            self._evidence("metrics", line_at())
        if (not finite or not gn_finite) and self._first_nonfinite is None:
            self._first_nonfinite = index
            self._finite_before_nan = self._records - 1 - self._loss_nan
            self._evidence("metrics", line_at())
        if finite:
            self.loss_series.add(index, loss)
            if self._loss_first is None:
                self._loss_first = loss
            self._loss_last = loss
            if self._loss_min is None or loss < self._loss_min:
                self._loss_min = loss
                self._max_after_min = None
            elif self._max_after_min is None or loss > self._max_after_min:
                self._max_after_min = loss
            if self._loss_max is None or loss > self._loss_max:
                self._loss_max = loss
            if loss == 0:
                self._loss_zero += 1
            if self._prev_loss is not None and abs(loss - self._prev_loss) < 1e-4:
                self._flat_run += 1
            else:
                self._flat_run = 1
            if self._flat_run > self._flat_best:
                self._flat_best = self._flat_run
            self._prev_loss = loss
        else:
            self._loss_nan += 1
            self._flat_run = 0
            self._prev_loss = None
        if isinstance(gn, float):
            if gn - gn == 0:
                if self._gn_first is None:
                    self._gn_first = gn
                if self._gn_max is None or gn > self._gn_max:
                    self._gn_max = gn
            else:
                self._gn_nan += 1
        if isinstance(lr, float) and lr - lr == 0:
            self._lr_last = lr
            if self._lr_max is None or lr > self._lr_max:
                self._lr_max = lr
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
        self.mem_series.add(self._records, float(value))

    def _overflow(self, line: Any) -> None:
        text = line.text
        m = _APEX_OVERFLOW_RE.search(text) or _DS_OVERFLOW_RE.search(text) or _OLD_OVERFLOW_RE.search(text)
        if not m:
            return
        self._overflows += 1
        if self._overflows <= 2:
            self._evidence("metrics", line)
        if m.group(1):
            try:
                scale = float(m.group(1))
            except ValueError:
                return
            self._scale_min = scale if self._scale_min is None else min(self._scale_min, scale)

    def _xid(self, line: Any) -> None:
        event = parse_xid(line.text)
        if event is None:
            return
        self._evidence("xid", line)
        if event.fell_off_bus:
            self.values["xid.fell_off_bus"] = True
        if event.xid is None:
            return
        self._xid_count += 1
        if event.xid not in self._xid_numbers:
            self._xid_numbers.append(event.xid)
        self._set_first({"xid.first": event.xid, "xid.pci": event.pci, "xid.pid": event.pid,
                         "xid.process": event.process})

    def _cf_open(self, line: Any) -> None:
        if self._cf_lines is None:
            self._cf_lines = []
            self._cf_budget = 60
        self.values["dist.child_failed"] = True
        self._evidence("dist", line)
        self._cf_lines.append(line.text)

    def _cf_feed(self, line: Any) -> None:
        self._cf_budget -= 1
        if self._cf_budget < 0:
            self._cf_close()
            return
        self._cf_lines.append(line.text)  # type: ignore[union-attr]
        if line.text.lstrip().startswith(("exitcode", "traceback")):
            self._evidence("dist", line)

    def _cf_close(self) -> None:
        if self._cf_lines:
            entry = parse_child_failed(self._cf_lines)
            if entry is not None and "dist.failed_rank" not in self.values:
                self._set_first({"dist.failed_rank": entry.rank, "dist.exit_code": entry.exit_code,
                                 "dist.signal": entry.signal})
                if entry.exit_code in (-9, 137):
                    self._set_first({"killed.exit_code": entry.exit_code})
        self._cf_lines = None

    def _timeout(self, line: Any) -> None:
        t = parse_watchdog_timeout(line.text)
        if t is None:
            return
        self._timeouts += 1
        self._evidence("dist", line)
        rank = t.rank if t.rank is not None else line.rank
        if rank is not None and rank not in self._timeout_ranks:
            self._timeout_ranks.append(rank)
        key = (line.time_s if line.time_s is not None else math.inf, line.input_index, line.lineno)
        if rank is not None and (self._first_timeout is None or key < self._first_timeout[0]):
            self._first_timeout = (key, rank)
        if t.timeout_ms is not None:
            self._set_first({"dist.timeout_ms": t.timeout_ms})

    def _world_size(self, text: str) -> None:
        for key, regex in (("nranks", _NRANKS_RE), ("world_size", _WORLD_SIZE_RE), ("nproc", _NPROC_RE),
                           ("nnodes", _NNODES_RE)):
            for m in regex.finditer(text):
                value = int(next(g for g in m.groups() if g is not None))
                if value > 0:
                    self._world[key] = max(self._world.get(key, 0), value)

    def world_size(self) -> Optional[int]:
        """From NCCL's `nranks N`, else WORLD_SIZE / world_size=, else --nproc_per_node (times --nnodes)."""
        w = self._world
        if "nranks" in w:
            return w["nranks"]
        if "world_size" in w:
            return w["world_size"]
        if "nproc" in w:
            return w["nproc"] * w.get("nnodes", 1)
        return None

    def _killed(self, line: Any) -> bool:
        """OOM-killer and bare `Killed` lines; True when the line was one."""
        text = line.text
        kill = parse_oom_killer(text)
        if kill is not None:
            self.values["killed.oom_killer"] = True
            self._set_first({"killed.pid": kill.pid, "killed.process": kill.process,
                             "killed.anon_rss_bytes": kill.anon_rss_bytes})
            self._evidence("killed", line)
            return True
        if "Killed" in text and is_bare_killed(text):
            self.values["killed.bare"] = True
            self._evidence("killed", line)
            return True
        return False

    def _code43(self, line: Any) -> bool:
        if not _CODE43_RE.search(line.text):
            return False
        self.values["code43.present"] = True
        self._evidence("code43", line)
        d = _DEVICE_NAME_RE.search(line.text)
        if d and "code43.device" not in self.values:
            self.values["code43.device"] = d.group(1).strip()
        return True

    # finishing --------------------------------------------------------------------------------
    def finish(self) -> Facts:
        if self._oom_pending is not None:
            pending, self._oom_pending = self._oom_pending, None
            self._oom_parse(pending)
        self._memsum_close()
        self._cf_close()
        self._fallback_records()
        v = self.values
        if self._oom_count:
            v["oom.count"] = self._oom_count
        if self._memsum_count:
            v["memsum.count"] = self._memsum_count
        if self._trace_count:
            v["trace.count"] = self._trace_count
        if self._records:
            v["metrics.steps"] = self._records
            v["metrics.loss_nan_count"] = self._loss_nan
            v["metrics.loss_zero_count"] = self._loss_zero
            v["metrics.grad_norm_nan_count"] = self._gn_nan
            if self._first_nonfinite is not None:
                v["metrics.first_nonfinite_index"] = self._first_nonfinite
                v["metrics.finite_before_nan"] = self._finite_before_nan
            if self._loss_first is not None:
                v["metrics.first_loss"] = self._loss_first
                v["metrics.last_loss"] = self._loss_last
                v["metrics.min_loss"] = self._loss_min
                v["metrics.max_loss"] = self._loss_max
                v["metrics.loss_range"] = self._loss_max - self._loss_min  # type: ignore[operator]
                v["metrics.loss_flat_steps"] = self._flat_best
                if self._max_after_min is not None and self._loss_min and self._loss_min > 0:
                    v["metrics.loss_rise_ratio"] = self._max_after_min / self._loss_min
            if self._gn_first is not None:
                v["metrics.grad_norm_first"] = self._gn_first
                v["metrics.grad_norm_max"] = self._gn_max
                if self._gn_first > 0:
                    v["metrics.grad_norm_growth"] = self._gn_max / self._gn_first  # type: ignore[operator]
            if self._lr_max is not None:
                v["metrics.lr_max"] = self._lr_max
                v["metrics.lr_last"] = self._lr_last
            last = getattr(self, "_last_metrics_line", None)
            if last is not None:
                self._evidence("metrics", last())
        if self._eval_last is not None:
            v["metrics.eval_loss_last"] = self._eval_last
        if self._finished:
            v["metrics.train_finished"] = True
        if self._overflows:
            v["metrics.overflow_skips"] = self._overflows
            if self._scale_min is not None:
                v["metrics.loss_scale_min"] = self._scale_min
        if self._mem_first is not None:
            v["metrics.mem_first_bytes"] = self._mem_first
            v["metrics.mem_last_bytes"] = self._mem_last
            v["metrics.mem_max_bytes"] = self._mem_max
            if self._mem_first > 0:
                v["metrics.mem_growth_ratio"] = self._mem_last / self._mem_first  # type: ignore[operator]
            v["metrics.mem_rising_records"] = self._mem_best
        if self._xid_count:
            v["xid.count"] = self._xid_count
            v["xid.numbers"] = list(self._xid_numbers)
        if self._timeouts:
            v["dist.timeout_count"] = self._timeouts
            v["dist.timeout_ranks"] = sorted(self._timeout_ranks)
            if self._first_timeout is not None:
                v["dist.first_timeout_rank"] = self._first_timeout[1]
        world = self.world_size()
        if world is not None:
            v["dist.world_size"] = world
            silent = silent_ranks(world, self._timeout_ranks) if self._timeouts else None
            if silent is not None:
                v["dist.silent_ranks"] = silent
        if self._nccl_errors:
            v["dist.nccl_error_count"] = self._nccl_errors
        if self.ranks:
            v["dist.ranks"] = sorted(self.ranks)
        series = {}
        if self.loss_series.points:
            series["loss"] = list(self.loss_series.points)
        if self.mem_series.points:
            series["mem_bytes"] = list(self.mem_series.points)
        return Facts(values={k: val for k, val in v.items() if val is not None}, groups=self.groups,
                     series=series, first_seen=self.first_seen)
