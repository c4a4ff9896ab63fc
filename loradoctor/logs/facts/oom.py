"""oom: the CUDA (ROCm, XPU, MPS) out-of-memory message, joined when a terminal or notebook
wrapped it, with the phase of the traceback it ends and the training step it happened at."""

from __future__ import annotations

import re
from loradoctor.record import asdict, record
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from loradoctor.lazyre import lazy_re
from loradoctor.logs.facts.common import _SIZE, MAX_ID, MAX_RANK, Extractor, Sink, _bounded_int, _size, says_oom
from loradoctor.logs.facts.metrics import METRIC_DICT_RE
from loradoctor.logs.facts.tables import OOM_FIGURE_FIELDS as _FIGURE_FIELDS
from loradoctor.logs.facts.trace import _EXC_RE
from loradoctor.units import MAX_PLAUSIBLE_BYTES

if TYPE_CHECKING:
    from loradoctor.logs.facts.metrics import MetricsExtractor
    from loradoctor.logs.facts.trace import TraceExtractor


@record
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
    other_pids: Optional[str] = None  # the PIDs of those clauses, space-separated (for `kill`)
    other_unaccounted_bytes: Optional[int] = None
    non_pytorch_bytes: Optional[int] = None
    hint: Optional[str] = None

    def facts(self) -> dict[str, Any]:
        return {f"oom.{k}": v for k, v in asdict(self).items() if v is not None}


# `outof`: a title retyped or a screenshot's OCR drops the space (`CUDA outof memory. Tried to allocate ...`)
_OOM_HEAD_RE = lazy_re(r"(?:\b(CUDA|XPU|MPS|HIP) out ?of memory|(?<![A-Za-z] )\b(Out of memory))\. Tried to allocate " + _SIZE)
# "CUDA out of memory." with nothing after it (cut messages, summaries); not "CUDA error: out of memory"
_OOM_BARE_RE = lazy_re(r"\b(?:CUDA|XPU|HIP) out ?of memory\.?(?:\s*$|\s+(?!Tried))")
_OOM_G1_RE = lazy_re(r"\(GPU (\d+); " + _SIZE + r" total capacity; " + _SIZE + r" already allocated; " + _SIZE
                        + r" free; (?:" + _SIZE + r" allowed; )?" + _SIZE + r" (?:reserved in total by PyTorch|cached)\)")
_OOM_IPEX_RE = lazy_re(r"\(GPU (\d+); " + _SIZE + r" total capacity; " + _SIZE + r" already allocated; " + _SIZE
                          + r" reserved in total by PyTorch\)")
_OOM_TOTAL_RE = lazy_re(r"GPU (\d+) has a total capac(i?)ty of " + _SIZE + r" of which " + _SIZE + r" is free")
# `GPU  has a total capacity` (two spaces, no index: a container's message without the ordinal); a regex of
# its own, so that the recaser still learns the phrase `GPU 0 has a total capac` from the one above. The
# recaser has no key for `gpu` alone (patterns write it both ways), so a lower-cased paste keeps `gpu  has`
_OOM_TOTAL_NO_INDEX_RE = lazy_re(r"(?:GPU|gpu)  has a total capac(i?)ty of " + _SIZE + r" of which " + _SIZE + r" is free")
_OOM_PROCESS_RE = lazy_re(r"Process (\d+) has " + _SIZE + r" memory in use")
_OOM_THIS_RE = lazy_re(r"this process has " + _SIZE + r" memory in use")
_OOM_ALLOWED_RE = lazy_re(_SIZE + r" allowed;")
_OOM_ALLOCATED_RE = lazy_re(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch")
_OOM_PRIVATE_RE = lazy_re(r"with " + _SIZE + r" allocated in private pools")
_OOM_UNALLOCATED_RE = lazy_re(_SIZE + r" is reserved by PyTorch but unallocated")
# the one-figure clauses of the G3-G5 message and the field each fills
# (with the words every match of each holds: a regex is only compiled and searched where they are)
_OOM_CLAUSES = ((_OOM_THIS_RE, "this_process_bytes", "this process has "), (_OOM_ALLOWED_RE, "allowed_bytes", " allowed;"),
                (_OOM_ALLOCATED_RE, "allocated_bytes", "Of the allocated memory "),
                (_OOM_PRIVATE_RE, "private_pool_bytes", " allocated in private pools"),
                (_OOM_UNALLOCATED_RE, "reserved_unallocated_bytes", " is reserved by PyTorch but unallocated"))
# Apple: `MPS backend out of memory (MPS allocated: 17.07 GB, other allocations: 1.22 GB, max allowed:
# 18.13 GB). Tried to allocate 256.00 MB on private pool.` (PyTorch prints 1024-based sizes as GB/MB)
_OOM_MPS_RE = lazy_re(r"MPS backend out of memory \(MPS allocated: " + _SIZE + r", other allocations: " + _SIZE
                         + r", max allowed: " + _SIZE + r"\)\.?(?:\s*Tried to allocate " + _SIZE + r")?")
# the memory-fraction form: `Allocation on device 0 would exceed allowed memory. (out of memory)`,
# then one figure a line (`Currently allocated     : 5.17 GiB`, `Requested : 20.00 MiB`, ...)
_OOM_FRACTION_RE = lazy_re(r"Allocation on device (\d+) would exceed allowed memory")
_OOM_FIGURE_RE = lazy_re(r"(Currently allocated|Requested|Device limit|Free \(according to CUDA\)|PyTorch limit"
                            r"(?: \([^)]*\))?)\s*:\s*" + _SIZE)


def _mps_size(text: Optional[str]) -> Optional[int]:
    """MPS messages print GiB/MiB as `GB`/`MB` (PyTorch's 1024-based format_size)."""
    if text and text.rstrip().endswith(("GB", "MB", "KB")) and "i" not in text:
        text = text.rstrip()[:-2] + text.rstrip()[-2] + "iB"
    return _size(text)


def parse_oom_message(text: str) -> Optional[OomMessage]:
    """Parse a PyTorch out-of-memory message of any generation (docs/reference/pytorch.md §1):
    G1/G2 `(GPU 0; T total capacity; A already allocated; F free; R reserved in total by PyTorch)`,
    G3 `total capacty` (2.1 typo), G4 `expandable_segments` hint, G5 docs.pytorch.org URL, ROCm's
    `HIP out of memory` (same numbers), the device-generic `Out of memory. Tried to allocate`, Apple's
    `MPS backend out of memory (...)` (era `mps`), the memory-fraction form `Allocation on device N
    would exceed allowed memory. (out of memory)` with its figures joined after it (era `fraction`),
    and a bare `CUDA out of memory.` without numbers (era `bare`). Returns None when the text is no
    OOM message."""
    m = _OOM_HEAD_RE.search(text)
    if not m:
        mps = _OOM_MPS_RE.search(text) if "MPS backend out of memory (MPS allocated: " in text else None
        if mps:
            return _drop_implausible(OomMessage(
                era="mps", allocated_bytes=_mps_size(mps.group(1)), non_pytorch_bytes=_mps_size(mps.group(2)),
                allowed_bytes=_mps_size(mps.group(3)), requested_bytes=_mps_size(mps.group(4))))
        frac = _OOM_FRACTION_RE.search(text) if " would exceed allowed memory" in text else None
        if frac:
            msg = OomMessage(era="fraction", device_index=_bounded_int(frac.group(1), MAX_RANK))
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
        bare = _OOM_BARE_RE.search(text) if " out of memory" in text else None
        return OomMessage(era="bare") if bare else None
    requested = _size(m.group(3))
    rest = text[m.end():]
    if "pytorch" in rest or "of the allocated" in rest:
        # a lower-cased paste gets its case back block by block, before wrapped lines are joined: a clause
        # that a terminal broke in two (`is r` / `eserved by pytorch`) stayed lower-case
        rest = rest.replace("by pytorch", "by PyTorch").replace("of the allocated memory", "Of the allocated memory")
    hint = None
    if "expandable_segments" in rest:
        hint = "expandable_segments"
    elif "max_split_size_mb" in rest:
        hint = "max_split_size_mb"
    g1 = _OOM_G1_RE.search(rest) if " already allocated; " in rest else None
    if g1:
        msg = OomMessage(era="G2" if "max_split_size_mb" in rest else "G1", requested_bytes=requested,
                         device_index=_bounded_int(g1.group(1), MAX_RANK), total_bytes=_size(g1.group(2)),
                         allocated_bytes=_size(g1.group(3)), free_bytes=_size(g1.group(4)),
                         allowed_bytes=_size(g1.group(5)), reserved_bytes=_size(g1.group(6)), hint=hint)
        if msg.reserved_bytes is not None and msg.allocated_bytes is not None:
            msg.reserved_unallocated_bytes = max(0, msg.reserved_bytes - msg.allocated_bytes)
        if None not in (msg.total_bytes, msg.free_bytes, msg.reserved_bytes):
            msg.other_unaccounted_bytes = max(0, msg.total_bytes - msg.free_bytes - msg.reserved_bytes)  # type: ignore[operator]
        return _drop_implausible(msg)
    ipex = _OOM_IPEX_RE.search(rest) if " reserved in total by PyTorch)" in rest else None
    if ipex:
        # intel-extension-for-pytorch's XPU message: the G1 layout without the free figure
        msg = OomMessage(era="ipex", requested_bytes=requested, device_index=_bounded_int(ipex.group(1), MAX_RANK),
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
    t = _OOM_TOTAL_RE.search(rest) if " has a total capac" in rest else None
    if t:
        msg.device_index = _bounded_int(t.group(1), MAX_RANK)
        msg.total_bytes = _size(t.group(3))
        msg.free_bytes = _size(t.group(4))
    elif "PU  has a total capac" in rest or "pu  has a total capac" in rest:
        t = _OOM_TOTAL_NO_INDEX_RE.search(rest)
        if t:
            msg.total_bytes = _size(t.group(2))
            msg.free_bytes = _size(t.group(3))
    clauses = [(p.group(1), _size(p.group(2))) for p in _OOM_PROCESS_RE.finditer(rest)] if " memory in use" in rest else []
    clauses = [(pid, o) for pid, o in clauses if o is not None and (msg.total_bytes is None or o <= msg.total_bytes)]
    others = [o for _, o in clauses]
    if others:
        msg.other_process_bytes = sum(others)
        msg.other_process_count = len(others)
        msg.other_pids = " ".join(dict.fromkeys(pid for pid, _ in clauses))
    for regex, name, words in _OOM_CLAUSES:
        clause = regex.search(rest) if words in rest else None
        if clause:
            setattr(msg, name, _size(clause.group(1)))
    msg = _drop_implausible(msg)
    if msg.allocated_bytes is not None and msg.reserved_unallocated_bytes is not None:
        msg.reserved_bytes = msg.allocated_bytes + msg.reserved_unallocated_bytes + (msg.private_pool_bytes or 0)
    blind = False
    if msg.this_process_bytes is not None and msg.reserved_bytes is not None and msg.this_process_bytes < msg.reserved_bytes:
        # vLLM workers and containers print `this process has 0 bytes memory in use`: the process
        # holds at least what PyTorch reserved, so the figure is not usable
        msg.this_process_bytes = None
        # ... and when every other process it lists shows 0 bytes too, NVML sees no process's memory (a
        # container's PID namespace): the listing says who is on the card, not how much each holds
        blind = msg.other_process_count is not None and msg.other_process_bytes == 0
    if msg.this_process_bytes is not None:
        if None not in (msg.total_bytes, msg.free_bytes):
            msg.other_unaccounted_bytes = max(0, msg.total_bytes - msg.free_bytes - msg.this_process_bytes)  # type: ignore[operator]
        if msg.reserved_bytes is not None:
            msg.non_pytorch_bytes = max(0, msg.this_process_bytes - msg.reserved_bytes)
    elif (blind or m.group(1) in ("HIP", "XPU") and msg.other_process_bytes is None) \
            and None not in (msg.total_bytes, msg.free_bytes, msg.reserved_bytes):
        # ROCm and XPU builds print no NVML process clauses at all, and a blind listing (above) gives no
        # figures: as in G1/G2, total - free - reserved is what other processes (plus this process's
        # context) hold
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
# wrapped OOM messages

_SENTENCE_END = (".", ")", "!", "PYTORCH_CUDA_ALLOC_CONF")
_FRACTION_LABEL_END = "(set by user-supplied memory fraction)"  # cudaMallocAsync prints the figure on the next line
_OOM_PIECES = ("Tried to allocate", "GPU ", "Of the allocated", "Including non-PyTorch", "Process ", "If reserved",
               "See documentation", "this process", "Currently allocated", "Requested", "Device limit",
               "Free (according", "PyTorch limit")
_OOM_WORDS = ("PyTorch", "GiB", "MiB", "allocat", "reserved", "capacity", "memory", "free")


# Message forms whose numbers parse_oom_message reads but the collector does not publish (a form
# goes here while rules/oom.yaml cannot read it yet). Empty: the numbered rules read ROCm's `HIP out
# of memory`, Apple's `MPS backend out of memory` and the cudaMallocAsync / memory-fraction form.
HELD_BACK_OOM_FORMS: frozenset[str] = frozenset()


def _held_back(msg: OomMessage, text: str) -> bool:
    form = "HIP" if "HIP out of memory" in text else msg.era
    return form in HELD_BACK_OOM_FORMS


def _oom_finished(text: str) -> bool:
    """True when an OOM message ends its sentence; the fraction form always takes figure lines."""
    if " would exceed allowed memory" in text and _OOM_FRACTION_RE.search(text) and not _OOM_FIGURE_RE.search(text):
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
# the step at the OOM: the training bar before it, or the metric records before it

class RawPosition(NamedTuple):
    """Where a line sits in the raw block the engine read it from: what the OOM extractor needs
    to find the progress bar and the metric records before the first OOM line."""

    view: bytes  # the block as scanned (metric dicts may be cut out)
    start: int  # the line's offset in view
    block: bytes  # the whole block
    line_in_block: int  # 1-based
    records_before_block: int  # metric records aggregated before this block
    has_records: bool  # the block holds metric records

    def progress(self) -> Optional[tuple[int, int]]:
        return _last_training_bar(self.view, self.start)

    def bar_phase(self) -> Optional[str]:
        return _last_bar_phase(self.view, self.start)

    def records_before(self) -> int:
        return self.records_before_block + (
            _records_before_line(self.block, self.line_in_block) if self.has_records else 0)


_BAR_TAIL_RE = lazy_re(rb"(?:^|[\r\n])([^\r\n]{0,120}?)(\d{1,3})%\|[^|\r\n]{0,400}\|\s*(\d+)/(\d+)\s*\[[^\]\r\n]*(?:it/s|s/it)\]")


def _last_training_bar(block: bytes, end: int, window: int = 1 << 20) -> Optional[tuple[int, int]]:
    """The last tqdm bar without a description before `end` in the block: (n, total), as read
    from the `window` bytes before `end`. A training log redraws its bar every step (a MiB holds
    ~12,000 states), so the window's tail is read first (64 KiB, then 1 MiB) from a point no bar
    match can straddle: a bar found there is the last one of the whole window."""
    start = max(0, end - window)
    size = BAR_TAIL_FIRST_BYTES
    while size < end - start:
        cut = _bar_resync(block, end - size, end)
        if cut < 0:
            break
        found = _last_bar_in(block, cut, end)
        if found is not None:
            return found
        size *= 16
    return _last_bar_in(block, start, end)


BAR_TAIL_FIRST_BYTES = 64 << 10
# A `\r` or `\n` whose previous byte is none of these is inside no _BAR_TAIL_RE match (one can
# start there): inside a match a line break can only sit in a `\s*` run, which follows `|` or a digit
_BAR_BREAK_BEFORE = frozenset(b" \t\n\r\f\v|0123456789")


def _bar_resync(block: bytes, at: int, end: int) -> int:
    """A line break in block[at:end) that no bar match straddles (see _BAR_BREAK_BEFORE), or -1:
    _BAR_TAIL_RE.finditer from there finds exactly the matches of a scan from further back that
    start there or later."""
    for _ in range(64):
        cr, nl = block.find(b"\r", at, end), block.find(b"\n", at, end)
        pos = min(cr, nl) if cr >= 0 and nl >= 0 else max(cr, nl)
        if pos <= 0:
            return -1
        if block[pos - 1] not in _BAR_BREAK_BEFORE:
            return pos
        at = pos + 1
    return -1


def _last_bar_in(block: bytes, start: int, end: int) -> Optional[tuple[int, int]]:
    chunk = block[start:end]
    best = None
    for m in _BAR_TAIL_RE.finditer(chunk):
        desc = m.group(1).strip()
        if desc and re.search(rb"[A-Za-z]", desc) and not desc.lower().startswith((b"[rank", b"train", b"epoch")):
            continue  # "Loading checkpoint shards", "Map", eval bars with names
        n, total = _bounded_int(m.group(3).decode(), MAX_ID), _bounded_int(m.group(4).decode(), MAX_ID)  # digits
        if n is not None and total is not None:
            best = (n, total)
    return best


# a progress bar of any dialect, with its description: tqdm's `Validation DataLoader 0:  37%|███▋ | 11/30
# [00:02<00:04,  4.45it/s]`, catalyst's `0/10 * Epoch (valid):   3% 1/32 [00:01<00:46,  1.50s/it, ...]` (no bar)
_ANY_BAR_RE = lazy_re(rb"(?:^|[\r\n])([^\r\n%]{0,120}?)(\d{1,3})%\s*(?:\|[^|\r\n]{0,400}\|)?\s*(\d+)/(\d+)\s*"
                      rb"\[[^\]\r\n]{0,80}?(?:it/s|s/it)")
# descriptions of an evaluation loop's bar (HF `Evaluating`, Lightning `Validation DataLoader 0` / `Validating` /
# `Sanity Checking DataLoader 0`, catalyst `Epoch (valid)`, `eval`, `Valid (loss 53.34) epoch 1`)
_EVAL_BAR_DESC_RE = lazy_re(rb"(?i)(?:\b|_)(?:eval\w*|valid\w*|sanity checking)\b")


# the description of transformers' bar while it loads the weights (`Loading checkpoint shards:  41%|...| 78/191`)
_LOAD_BAR_DESC_RE = lazy_re(rb"(?i)\bloading checkpoint shards\b")


# the bar named in a sentence just before the error instead of pasted (`But on the "Loading checkpoint shards"
# step I'm getting an error:`, `it fails while loading checkpoint shards`): the writer's own placing of the OOM
_LOAD_BAR_PROSE_RE = lazy_re(rb"(?i)(?:\b(?:on|at|in|during)\s+the\s+(?:[\"'`]|\xe2\x80[\x9c\x9d])?loading checkpoint shards"
                             rb"(?:[\"'`]|\xe2\x80[\x9c\x9d])?\s+(?:step|stage|phase|part|bar)\b"
                             rb"|\b(?:while|when|during)\s+loading\s+(?:the\s+)?checkpoint shards\b)")


def _load_bar_named_before(block: bytes, end: int, lines: int = 4) -> bool:
    """A prose line among the last `lines` non-blank lines before `end` that names the checkpoint-shards
    step as where the error came."""
    at, seen = end, 0
    while at > 0 and seen < lines:
        start = block.rfind(b"\n", 0, at - 1) + 1
        line = block[start:at]
        if line.strip():
            seen += 1
            if _LOAD_BAR_PROSE_RE.search(line):
                return True
        at = start
    return False


# transformers' banner before its evaluation / prediction loop, whose bar has no description: `***** Running
# Evaluation *****`, then `  Num examples = 2400` / `  Batch size = 4`, then the bar
_HF_EVAL_BANNER_RE = lazy_re(rb"\*\*\*\*\* Running (?:Evaluation|Prediction) \*\*\*\*\*")


def _hf_eval_banner_before(block: bytes, bar_start: int, window: int = 600) -> bool:
    """The Trainer's evaluation banner shortly before an undescribed bar, with no other bar between them."""
    last = None
    for last in _HF_EVAL_BANNER_RE.finditer(block, max(0, bar_start - window), bar_start):
        pass
    return last is not None and _ANY_BAR_RE.search(block, last.end(), bar_start) is None


def _last_bar_phase(block: bytes, end: int, window: int = 1 << 16) -> Optional[str]:
    """`eval` when the last progress bar before `end` (any description) is an evaluation loop's, cut
    short of its total: the OOM interrupted that loop; `load` when it is transformers' checkpoint-shards
    bar cut short (the OOM came while the weights were loading), or, with no bar pasted, when a sentence
    just before the error names that step. None otherwise (a training bar, a finished bar, no bar)."""
    last = None
    for last in _ANY_BAR_RE.finditer(block, max(0, end - window), end):
        pass
    if last is None:
        return "load" if _load_bar_named_before(block, end) else None
    n, total = _bounded_int(last.group(3).decode(), MAX_ID), _bounded_int(last.group(4).decode(), MAX_ID)
    if n is None or total is None or n >= total:
        return None
    if _EVAL_BAR_DESC_RE.search(last.group(1)):
        return "eval"
    # (undescribed: nothing before the bar but a pasted line number, `  7   37%|...`)
    if (not last.group(1).strip() or last.group(1).strip().isdigit()) and _hf_eval_banner_before(block, last.start()):
        return "eval"
    return "load" if _LOAD_BAR_DESC_RE.search(last.group(1)) else None


def _records_before_line(block: bytes, line_in_block: int) -> int:
    """Metric records in the block before its line number `line_in_block` (1-based)."""
    offset = 0
    for _ in range(line_in_block - 1):
        offset = block.find(b"\n", offset) + 1
        if offset == 0:
            return len(METRIC_DICT_RE.findall(block))
    return len(METRIC_DICT_RE.findall(block, 0, offset))


class OomExtractor(Extractor):
    """OOM lines, and the lines that continue a wrapped one (joined before parsing). The phase
    comes from the traceback the message ends (the trace extractor's frames so far), the step from
    the last progress bar or the metric records before it."""

    TRIGGERS = (
        ("out of memory", True), ("outof memory", True), ("Tried to allocate", False),
        # the second half of an OOM message wrapped by a terminal or notebook, and the figure lines of
        # `Allocation on device 0 would exceed allowed memory`
        ("PyTorch", False), ("GiB", False), ("MiB", False), ("ALLOC_CONF", False), ("Currently allocated", False),
        ("Requested", False), ("Device limit", False), ("Free (according", False),
    )

    def __init__(self, sink: Sink, trace: "TraceExtractor", metrics: "MetricsExtractor") -> None:
        super().__init__(sink)
        self.trace = trace
        self.metrics = metrics
        self.progress: Optional[tuple[int, int]] = None  # last training progress bar (n, total)
        self.records_before_oom: Optional[int] = None  # metric records before the first OOM (engine)
        self._oom_count = 0
        self._oom_numbered = False  # the numbers of a numbered message are in
        self._oom_pending: Optional[dict] = None  # an OOM line whose sentence may go on next line
        self._located = False  # the first OOM line's position was taken
        self._bar_located = False  # the bar before the first line that says out of memory was read

    @property
    def open(self) -> bool:
        return self._oom_pending is not None

    def locate(self, line: Any, position: RawPosition) -> None:
        """The first OOM line of any form (bare ones too) takes the training bar and the metric
        records before it, from where it sits in its block; records after it (a rerun) never count."""
        text = line.text
        if not self._bar_located and says_oom(text):
            # any form, the bare `CUDA error: out of memory` too: the loop whose bar it interrupted
            self._bar_located = True
            phase = position.bar_phase()
            if phase is not None:
                self.sink.values["oom.bar_phase"] = phase
        if self._located:
            return
        if says_oom(text) and parse_oom_message(text) is not None:
            self._located = True
            bar = position.progress()
            if bar is not None:
                self.progress = bar
            self.records_before_oom = position.records_before()

    def feed(self, line: Any) -> bool:
        text = line.text
        if says_oom(text) or self._oom_pending is not None:
            self._oom_feed(line)
            return True
        return False

    def _oom_feed(self, line: Any) -> None:
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
        if not says_oom(line.text):
            return
        if parse_oom_message(line.text) is None:
            return
        phase = self.trace.current_phase(line)
        item = {"line": line, "text": line.text, "lineno": line.lineno, "file": line.file, "joins": 0,
                "phase": phase}
        if _oom_finished(line.text):
            self._oom_parse(item)
        else:
            self._oom_pending = item  # the next line may carry the rest of the message

    def _oom_parse(self, item: dict) -> None:
        msg = parse_oom_message(item["text"])
        if msg is None:
            return
        line = item["line"]
        values = self.sink.values
        self._oom_count += 1
        self.sink._evidence("oom", line)
        first = self._oom_count == 1
        if first:
            if item["phase"]:
                values["oom.phase"] = item["phase"]
            self._oom_step()
        # the numbers describe the first message that has numbers: a bare warning (`CUDA out of
        # memory on batch 311, skipping batch`) does not hide the full message after it
        if self._oom_numbered:
            return
        if msg.era == "bare" or _held_back(msg, item["text"]):
            if first:
                values["oom.era"] = msg.era
            return
        self._oom_numbered = True
        values.update(msg.facts())
        if "oom.phase" not in values and item["phase"]:
            values["oom.phase"] = item["phase"]

    def _oom_step(self) -> None:
        values = self.sink.values
        if self.progress is not None:
            n, total = self.progress
            values["oom.step"] = n
            if total:
                values["oom.step_fraction"] = n / total
        else:
            records = self.records_before_oom if self.records_before_oom is not None else self.metrics.records
            if records:
                values["oom.step"] = records

    def close(self) -> None:
        if self._oom_pending is not None:
            pending, self._oom_pending = self._oom_pending, None
            self._oom_parse(pending)

    def publish(self, values: dict[str, Any]) -> None:
        if self._oom_count:
            values["oom.count"] = self._oom_count
