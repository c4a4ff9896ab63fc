"""trace: Python tracebacks (plain, rich boxes, IPython), the exception that ends them and the
phase (load / save / eval / generate / optimizer / backward / forward) their frames name."""

from __future__ import annotations

import re
from typing import Any, Iterable, Optional

from loradoctor.lazyre import lazy_re
from loradoctor.findings import Evidence
from loradoctor.logs.facts.common import Extractor, Sink
from loradoctor.logs.facts.tables import LOCATIONS as _LOCATIONS
from loradoctor.logs.facts.tables import MOVE_FRAMES as _MOVE_FRAMES
from loradoctor.logs.facts.tables import SPECIFIC_PHASES as _SPECIFIC
from loradoctor.logs.facts.tables import STEP_FRAMES as _STEP_FRAMES

_FRAME_RE = lazy_re(r'File "([^"]+)", line (\d+), in (\S+)')
_RICH_FRAME_RE = lazy_re(r"^(\S+\.py):(\d+) in (\S+)\s*$")
_IPYTHON_FRAME_RE = lazy_re(r"^File (\S+?):(\d+), in (?:[\w<>]+\.)*([\w<>]+)\(")
_OLD_IPYTHON_FRAME_RE = lazy_re(r"^(\S+\.py) in ()([\w<>]+)\(")
_RICH_WRAPPED_HEAD_RE = lazy_re(r"^(\S+\.py):$")
_RICH_WRAPPED_TAIL_RE = lazy_re(r"^(\d+) in (\S+)$")
_EXC_RE = lazy_re(r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Failure|Warning))(?::\s?(.*))?$")
_LOAD_SOURCE_RE = lazy_re(r"(?:model|net|unet|transformer|encoder|vae|module|pipe)\w*\s*\.\s*(?:to|cuda)\(", re.I)


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



def _dialect_frame(text: str) -> Optional[re.Match]:
    """A frame line of the rich or IPython traceback dialects."""
    return _RICH_FRAME_RE.match(text) or _IPYTHON_FRAME_RE.match(text) or _OLD_IPYTHON_FRAME_RE.match(text)


_HEADERLESS_GAP = 60  # lines after the last frame of a traceback without header that still belong to it


class TraceExtractor(Extractor):
    """Tracebacks: frames, their source lines, the exception line; the first traceback's exception
    and location, and the location of the traceback that ends the first OOM."""

    TRIGGERS = (
        ("Traceback", False), ('File "', False), (".py:", False), (".py in ", False), ("Error", False),
        ("Exception", False), ("KeyboardInterrupt", False),
        # source lines under traceback frames that hint at loading (`model = model.to(self.device)`)
        (".to(", False), (".cuda(", False),
        # rich traceback box lines (a frame wrapped onto two of them)
        ("│", False),
    )

    def __init__(self, sink: Sink) -> None:
        super().__init__(sink)
        self._in_trace = False
        self._frames: list[tuple[str, str]] = []
        self._sources: list[str] = []  # source lines shown under the frames (load hints)
        self._headerless = False  # frames seen without `Traceback (most recent call last):`
        self._last_frame_lineno = 0
        self._rich_path: Optional[tuple[str, int]] = None  # a rich frame wrapped after `path.py:`
        self._oom_trace_done = False  # trace.location was taken from the traceback ending the OOM
        self._trace_count = 0
        self._trace_start: Optional[Evidence] = None

    @property
    def open(self) -> bool:
        return self._in_trace

    def feed(self, line: Any) -> bool:
        text = line.text
        if "Traceback" in text or self._in_trace or 'File "' in text or _EXC_RE.match(text) \
                or (".py" in text and _dialect_frame(text) is not None):
            self._trace(line)
            return True
        return False

    def current_phase(self, line: Any) -> Optional[str]:
        """The phase of the traceback this line ends (or sits in), from its frames so far."""
        if not self._frames or not self._in_trace:
            return None
        if self._headerless and line.lineno - self._last_frame_lineno > _HEADERLESS_GAP:
            return None
        return location_from_frames(self._frames, self._sources)

    def _trace(self, line: Any) -> None:
        text = line.text
        if "Traceback (most recent call last)" in text:
            self._open_trace(line, headerless=False)
            return
        if not self._in_trace:
            # `[rank2]: File "...", line 4214, in _load_pretrained_model` tails pasted without header, and
            # the rich / IPython dialects pasted from their middle (no box top, no `Traceback` banner)
            if _FRAME_RE.search(text) or _dialect_frame(text) is not None:
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
                    self.sink.groups.setdefault("trace", []).append(self._trace_start)
                self.sink._evidence("trace", line)
                self.sink.values["trace.exception"] = e.group(1)
                if e.group(2):
                    self.sink.values["trace.message"] = e.group(2)[:300]
                if loc:
                    self.sink.values["trace.location"] = loc
            if not self._oom_trace_done and ("ut of memory" in text or "UT OF MEMORY" in text):
                # the traceback that ends with the (first) OOM places it, not an unrelated earlier
                # one (a caught flash-attn ImportError before a training OOM)
                self._oom_trace_done = True
                if loc:
                    self.sink.values["trace.location"] = loc
                else:
                    self.sink.values.pop("trace.location", None)
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

    def publish(self, values: dict[str, Any]) -> None:
        if self._trace_count:
            values["trace.count"] = self._trace_count
