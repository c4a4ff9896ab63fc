"""frames: one parser for the traceback dialects, a normalised frame list, and the phase it names.

Dialects (`Frame.dialect`), each also lower-cased, behind `[rankN]:` prefixes (the reader peels them)
and with Windows paths:

- `cpython`: `File "/x/trainer.py", line 1885, in train` (quotes may be typographic after a markdown
  render, which also drops `<module>` and several frames can share one joined line);
- `ipython`: IPython 8 / Jupyter / Colab, `File /x/trainer.py:1885, in Trainer.train(self, ...)`;
- `ipython-old`: IPython 7, `/x/trainer.py in train(self, resume_from_checkpoint, ...)` (the line
  number comes from the `-> 1885` arrow under it);
- `cell`: the notebook's own frame, `Cell In[7], line 3`, `Input In [7], in <cell line: 3>()`,
  `<ipython-input-7-abc> in <module>()`;
- `rich`: a rich box's `/x/trainer.py:1885 in train` (the reader strips the box), also wrapped after
  `trainer.py:` onto the next box line.

The phase tables are data (loradoctor/data/frames.yaml), read on the first frame a log shows.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Iterable, NamedTuple, Optional, Sequence

from loradoctor.lazyre import lazy_re
from loradoctor.logs.facts.common import MAX_ID, _bounded_int

TABLE = Path(__file__).resolve().parent.parent.parent / "data" / "frames.yaml"


class Frame(NamedTuple):
    file: str
    line: int  # 0 when the dialect does not print it
    function: str  # as printed, qualifier dropped (`Trainer.train` -> `train`); "" when a render ate it
    dialect: str
    qualname: str = ""  # IPython's `Trainer.train`, when printed


_Q = "\"“”'"
# `File "path", line N, in func`: searched (a `[rank2]:` or `traceback :` lead stays harmless), all
# of a line's frames (a markdown render joins a pasted traceback into one paragraph)
_CPYTHON_RE = lazy_re(r"\bFile [" + _Q + r"]([^" + _Q + r"]+)[" + _Q + r"], line (\d+)(?:, in ([\w<>.]*))?", re.I)
# `File /x/trainer.py:1885, in Trainer.train(self, ...)`; the path may hold spaces (`C:\Program Files`)
_IPYTHON_RE = lazy_re(r"^File (.+?):(\d+), in ((?:[\w<>]+\.)*)([\w<>]+)", re.I)
# `/x/trainer.py in train(self, ...)`
_OLD_IPYTHON_RE = lazy_re(r"^(\S.*?\.py) in ((?:[\w<>]+\.)*)([\w<>]+)\(", re.I)
# `/x/trainer.py:1885 in train`
_RICH_RE = lazy_re(r"^(\S.*?\.py):(\d+) in (\S+)\s*$", re.I)
# the notebook cell frames
_CELL_RE = lazy_re(r"^(?:(Cell In ?\[\d*\]), line (\d+)(?:, in ([\w<>]+))?|(Input In ?\[\d*\]), in ([\w<> :]+)\(|"
                      r"(<ipython-input-[\w-]+>) in ([\w<> :]+)\()", re.I)
# a rich frame wrapped onto two box lines: `path.py:` + `1885 in train`, `path.py:1885` + `in train`,
# `path.py:1885 in` + `train`
_RICH_HEAD_RE = lazy_re(r"^(\S.*?\.py):(?:(\d+)( in)?)?$", re.I)
_RICH_TAILS = (lazy_re(r"^(\d+) in ([\w<>.]+)$"), lazy_re(r"^in ([\w<>.]+)$", re.I), lazy_re(r"^([\w<>.]+)$"))
# `----> 12 trainer.train()` / `-> 1885     return inner_training_loop(`: the line of the frame above
ARROW_RE = lazy_re(r"^-*> ?(\d+)\b")


def _line(digits: Optional[str]) -> int:
    """A frame's line number; 0 when absent or absurd (a pasted 4,000-digit run: int() refuses it)."""
    return _bounded_int(digits, MAX_ID) or 0


def parse_frames(text: str) -> list[Frame]:
    """The frames one (normalised) line shows, in any dialect; [] when it is no frame line."""
    if "ile " in text or "ILE " in text:
        found = [Frame(m.group(1), _line(m.group(2)), _short(m.group(3) or ""), "cpython")
                 for m in _CPYTHON_RE.finditer(text)]
        if found:
            return found
        m = _IPYTHON_RE.match(text)
        if m:
            return [Frame(m.group(1), _line(m.group(2)), m.group(4), "ipython", m.group(3) + m.group(4))]
    if ".py" in text or ".PY" in text:
        m = _RICH_RE.match(text)
        if m:
            return [Frame(m.group(1), _line(m.group(2)), _short(m.group(3)), "rich")]
        m = _OLD_IPYTHON_RE.match(text)
        if m:
            return [Frame(m.group(1), 0, m.group(3), "ipython-old", m.group(2) + m.group(3))]
    if text[:1] in "CcIi<":
        m = _CELL_RE.match(text)
        if m:
            if m.group(1):
                return [Frame(m.group(1), _line(m.group(2)), m.group(3) or "<module>", "cell")]
            if m.group(4):
                return [Frame(m.group(4), 0, m.group(5), "cell")]
            return [Frame(m.group(6), 0, m.group(7), "cell")]
    return []


# A `File "path", line N, in func` header cut at a terminal / title width before its function: inside the
# path, after it, or after the line number (what parse_frames leaves unread, or reads with no function)
_CUT_HEAD_RE = lazy_re(r"^File [" + _Q + r"]([^" + _Q + r"]*)(?:[" + _Q + r"](?:,(?: (?:l|li|lin|line(?: (\d+),?)?)?)?)?)?$", re.I)
# the function a source line calls: `model = AutoModel.from_pretrained(...`, `return _load(f,`,
# `) = cls._load_pretrained_model(`; a name the cut ends (`... = _load_state_dict_into_meta`) counts too
_CALL_RE = lazy_re(r"^(?:return\s|await\s|yield\s|\)\s*=\s*|[\w.,\s\[\]]*=\s*)?\s*(?:\w+\.)*(\w+)(?:\s*\(|$)")
_CALL_SOURCE_MAX = 240  # longer source lines are not read for a call (the name regex then stays linear enough)
# IPython's header cut the same way: `File /x/auto_factory.py`, `File /x/modeling_utils.py:3706`, `...:786, i`
_CUT_IPYTHON_HEAD_RE = lazy_re(r"^File (?![" + _Q + r"])(\S[^\n]*?[/\\][^\n]*?)(?::(\d+)(?:,(?: i?)?)?)?$", re.I)
# IPython's source lines: `----> 2 base_model = ...`, `--> 566     return ...` (the call), `    567  ...`
_IPYTHON_SOURCE_RE = lazy_re(r"^(-*>)?\s*\d+ ")


def cut_frame_head(text: str, ipython: bool = False) -> Optional[Frame]:
    """A cpython frame header that a paste cut before its function (`File "/x/site-packages/transform`,
    `File "/x/train.py", line`), as a Frame with no function (dialect `cut`); with `ipython` (inside a
    traceback already), IPython's too (`File /x/modeling_utils.py:3706`). None for any other line."""
    if not text.startswith(("File ", "file ", "FILE ")):
        return None
    m = _CUT_HEAD_RE.match(text)
    if m is None and ipython and " in " not in text:
        m = _CUT_IPYTHON_HEAD_RE.match(text)
    if m is None:
        return None
    return Frame(m.group(1), _line(m.group(2)), "", "cut")


def called_function(source: str) -> str:
    """The function a traceback source line calls (`model = AutoModel.from_pretrained(` -> `from_pretrained`,
    IPython's `--> 566     return model_class.from_pretrained(` too), or "": in a traceback the call on a
    frame's source line is the frame below it."""
    if len(source) > _CALL_SOURCE_MAX:
        return ""
    source = source.strip()
    numbered = _IPYTHON_SOURCE_RE.match(source)
    if numbered:
        source = source[numbered.end():].strip()
    m = _CALL_RE.match(source)
    return m.group(1) if m else ""


def caller_source(sources: Sequence[str]) -> str:
    """Of the source lines under one frame, the one that calls the frame below: IPython's arrow line when
    it shows context lines around it (`--> 566 ...`), else the last."""
    for text in reversed(sources):
        m = _IPYTHON_SOURCE_RE.match(text.strip())
        if m and m.group(1):
            return text
    return sources[-1] if sources else ""


def rich_wrapped_head(text: str) -> Optional[tuple[str, int, int]]:
    """The first box line of a wrapped rich frame: (path, line or 0, which tail form completes it)."""
    if ".py" not in text and ".PY" not in text:
        return None
    m = _RICH_HEAD_RE.match(text)
    if m is None:
        return None
    return m.group(1), _line(m.group(2)), 0 if m.group(2) is None else (2 if m.group(3) else 1)


def rich_wrapped_frame(head: tuple[str, int, int], text: str) -> Optional[Frame]:
    """The frame a wrapped rich head and the box line after it make, or None."""
    path, lineno, form = head
    m = _RICH_TAILS[form].match(text)
    if m is None:
        return None
    if form == 0:
        return Frame(path, _line(m.group(1)), _short(m.group(2)), "rich")
    return Frame(path, lineno, _short(m.group(1)), "rich")


def _short(func: str) -> str:
    """`Trainer.train` -> `train` (rich and Python 3.11+ may print qualified names)."""
    return func.rsplit(".", 1)[-1] if "." in func else func


def frame_key(func: str) -> str:
    """The name a table matches: lower-cased, without underscores (a markdown render eats them)."""
    return func.replace("_", "").lower()


class FrameTable(NamedTuple):
    specific: tuple[tuple[str, frozenset], ...]  # (phase, function keys), in order
    keys: dict  # phase -> function keys
    step_in_path: str
    step_keys: frozenset
    move: frozenset  # exact names
    bnb_keys: frozenset
    bnb_classes: frozenset  # lower-cased
    bnb_path: str
    bnb_source_word: str


@functools.lru_cache(maxsize=2)
def frame_table(path: Path = TABLE) -> FrameTable:
    """frames.yaml, parsed once per process (kept as JSON in the user's cache: loradoctor.cache.yaml_data)."""
    from loradoctor import cache

    data = cache.yaml_data(path, "frames")
    phases = data["phases"]
    keys = {name: frozenset(frame_key(f) for f in spec.get("functions") or ()) for name, spec in phases.items()}
    bnb = data.get("bnb_4bit") or {}
    return FrameTable(
        specific=tuple((name, keys[name]) for name in data["specific"]), keys=keys,
        step_in_path=str(phases.get("optimizer", {}).get("step_in_path") or "optim"),
        step_keys=frozenset(frame_key(f) for f in data.get("step_functions") or ()),
        move=frozenset(data.get("move_functions") or ()),
        bnb_keys=frozenset(frame_key(f) for f in bnb.get("functions") or ()),
        bnb_classes=frozenset(c.lower() for c in bnb.get("classes") or ()),
        bnb_path=str(bnb.get("path") or "bitsandbytes").lower(),
        bnb_source_word=str(bnb.get("source_word") or "4bit").lower(),
    )


_LOAD_SOURCE_RE = lazy_re(r"(?:model|net|unet|transformer|encoder|vae|module|pipe)\w*\s*\.\s*(?:to|cuda)\(", re.I)


def _as_frame(f: Any) -> Frame:
    return f if isinstance(f, Frame) else Frame(f[0], 0, f[-1], "")


# A frame line cut at a terminal / title width ends inside the function name (`in _load_pretrain`): a name
# at least this long that begins exactly one phase's names (and is none itself) reads as that phase.
_CUT_NAME_MIN = 8


def _cut_phase(keys: Sequence[str], table: FrameTable) -> Optional[str]:
    """The specific phase a cut function name begins, innermost frame first; None when no frame has one
    or a name begins names of two phases."""
    for key in reversed(keys):
        if len(key) < _CUT_NAME_MIN:
            continue
        phases = {phase for phase, names in table.specific if any(n != key and n.startswith(key) for n in names)}
        if len(phases) == 1:
            return phases.pop()
    return None


# The LoRA-stack library whose own code raised (trace.raised_in): the innermost frame's file, installed
# (`site-packages/trl/...`, `dist-packages/unsloth_zoo/...`) or a source checkout (`LLaMA-Factory/src/
# llamafactory/...`, `axolotl/src/axolotl/...`). torch and datasets are left out: an exception inside them is
# most often the caller's tensors or data.
_STACK_PACKAGES = ("transformers", "peft", "trl", "accelerate", "unsloth", "unsloth_zoo", "axolotl", "llamafactory",
                   "swift", "torchtune", "deepspeed", "vllm", "liger_kernel", "bitsandbytes", "xtuner", "litgpt")
_PACKAGE_DIR_RE = lazy_re(r"(?:^|[/\\])(" + "|".join(_STACK_PACKAGES) + r")[/\\][^/\\]")


def raised_in(frames: Sequence[Any]) -> Optional[str]:
    """The LoRA-stack package of the innermost frame, or None (the script's own code, torch, a cut path)."""
    if not frames:
        return None
    found = _PACKAGE_DIR_RE.findall(_as_frame(frames[-1]).file.replace("-", "_").lower())
    return found[-1] if found else None


def location_from_frames(frames: Sequence[Any], sources: Iterable[str] = ()) -> Optional[str]:
    """Phase from frames (Frame, or (file, function) pairs), outermost first: load / merge / save /
    eval / generate / optimizer / backward / forward, or None. Load/merge/save/eval/generate come from
    the innermost frame that names one of them (closest to the exception); a `.to`/`.cuda` frame, or a
    source line such as `model = model.to(self.device)`, means load when no training-step frame is in
    the traceback (a user function named `train` does not count); then optimizer, backward, forward."""
    table = frame_table()
    items = [_as_frame(f) for f in frames]
    keys = [frame_key(f.function) for f in items]
    for key in reversed(keys):
        for phase, names in table.specific:
            if key in names:
                return phase
    cut = _cut_phase(keys, table)
    if cut:
        return cut
    present = set(keys)
    if not present & table.step_keys:
        if any(f.function in table.move for f in items) or any(_LOAD_SOURCE_RE.search(src) for src in sources):
            return "load"
    if any(k == "step" and table.step_in_path in f.file.lower() for f, k in zip(items, keys)) \
            or present & table.keys.get("optimizer", frozenset()):
        return "optimizer"
    for phase in ("backward", "forward"):
        if present & table.keys.get(phase, frozenset()):
            return phase
    return None


def shows_bnb_4bit(frames: Sequence[Any], sources: Sequence[tuple[int, str]] = ()) -> bool:
    """True when the frames run through bitsandbytes' 4-bit path: a 4-bit function (`matmul_4bit`,
    `dequantize_4bit`), a 4-bit class in a qualified name (`Linear4bit.forward`), or a source line
    under a bitsandbytes frame that names 4 bit (`bnb.matmul_4bit(...)`). `sources` are (index of the
    frame above, text)."""
    table = frame_table()
    items = [_as_frame(f) for f in frames]
    for f in items:
        if frame_key(f.function) in table.bnb_keys:
            return True
        if f.qualname and f.qualname.rsplit(".", 1)[0].rsplit(".", 1)[-1].lower() in table.bnb_classes:
            return True
    bnb_frames = {i for i, f in enumerate(items) if table.bnb_path in f.file.lower()}
    return any(i in bnb_frames and table.bnb_source_word in src.lower() for i, src in sources)
