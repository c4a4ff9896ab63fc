"""trace: Python tracebacks (every dialect frames.parse_frames reads), the exception that ends them,
the phase (load / merge / save / eval / generate / optimizer / backward / forward) their frames name,
and whether they run through bitsandbytes' 4-bit path (trace.bnb_4bit)."""

from __future__ import annotations

import re
from typing import Any, Optional

from loradoctor.lazyre import lazy_re
from loradoctor.findings import Evidence
from loradoctor.logs.facts.common import Extractor, Sink, says_oom
from loradoctor.logs.facts.frames import (ARROW_RE, Frame, _line, called_function, caller_source, cut_frame_head, raised_in,
                                          location_from_frames, parse_frames, rich_wrapped_frame, rich_wrapped_head,
                                          shows_bnb_4bit)

_EXC_RE = lazy_re(r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Failure|Warning))(?::\s?(.*))?$")

__all__ = ["TraceExtractor", "location_from_frames", "Frame", "parse_frames"]


_HEADERLESS_GAP = 60  # lines after the last frame of a traceback without header that still belong to it


_HEADER = "traceback (most recent call last):"


def _cut_header(text: str) -> bool:
    """A line that ends in the traceback header cut short (`... [rank3]: Traceback (most recent ca`:
    a paste cut at a terminal / title width)."""
    at = text.rfind("raceback (m")
    if at < 0:
        at = text.rfind("RACEBACK (M")
    return at >= 1 and _HEADER.startswith(text[at - 1:].rstrip().lower())


class TraceExtractor(Extractor):
    """Tracebacks: frames, their source lines, the exception line; the first traceback's exception
    and location, and the location of the traceback that ends the first OOM."""

    TRIGGERS = (
        ("Traceback", False), ('File "', True), ("File \u201c", True), ("File \u201d", True), ("File '", True),
        (".py:", False), (".py in ", False), ("Error", False),
        ("Exception", False), ("KeyboardInterrupt", False),
        # notebook cells (`Cell In[7], line 3`, `Input In [7], in <cell line: 1>()`, `<ipython-input-7-…> in f()`)
        ("Cell In", True), ("Input In", True), ("ipython-input", False),
        # source lines under traceback frames that hint at loading (`model = model.to(self.device)`)
        (".to(", False), (".cuda(", False),
        # source lines that call a function of a phase (loradoctor/data/frames.yaml `specific`): the frame
        # under such a line, when a paste cut its header before the function, is the function called
        # (`model = AutoModel.from_pretrained(` above `File "/x/site-packages/transform`); one literal per
        # name, a shorter one standing for the names it ends (`save(` for `_save(`, `async_save(`)
        *((call, False) for call in (
            "from_pretrained(", "_load_pretrained_model(", "_load_state_dict_into_meta_model(", "load_state_dict(",
            "_load_from_state_dict(", "dispatch_model(", "load_checkpoint_and_dispatch(", "load_checkpoint_in_model(",
            "load_model(", "create_quantized_param(", "_process_model_before_weight_loading(",
            "replace_with_bnb_linear(", "quantize_4bit(", "_quantize(", "load_and_quantize_model(",
            "load_adapter(", "load_peft_weights(",
            "merge_and_unload(", "_unload_and_optionally_merge(", "merge_adapter(", "add_weighted_adapter(",
            "merge_lora_weights(", "_merge_lora(",
            "save(", "save_model(", "_save_checkpoint(", "save_pretrained(", "save_state(", "save_checkpoint(",
            "save_16bit_model(", "_zero3_consolidated_16bit_state_dict(", "_save_zero_checkpoint(",
            "consolidate_state_dict(", "save_fsdp_model(", "save_fsdp_optimizer(", "get_state_dict(",
            "_full_post_state_dict_hook(", "full_optim_state_dict(", "_optim_state_dict_impl(",
            "get_model_state_dict(", "get_optimizer_state_dict(", "save_state_dict(", "dump_checkpoint(",
            "_save_to_state_dict(",
            "evaluate(", "evaluation_loop(", "prediction_step(", "predict(", "prediction_loop(", "nested_concat(",
            "_nested_gather(", "gather_for_metrics(", "eval_step(", "_evaluation_step(", "_run_sanity_check(",
            "validate(", "log_validation(", "sample_images(", "sample_image_inference(", "validation_step(",
            "generate(", "sample(", "greedy_search(", "beam_search(", "_assisted_decoding(", "_contrastive_search(",
            "generate_image(", "denoise(")),
        # rich traceback box lines (a frame wrapped onto two of them)
        ("│", False),
    )

    def __init__(self, sink: Sink) -> None:
        super().__init__(sink)
        self._in_trace = False
        self._frames: list[Frame] = []
        self._sources: list[tuple[int, str]] = []  # source lines under the frames: (frame index, text)
        self._headerless = False  # frames seen without `Traceback (most recent call last):`
        self._last_frame_lineno = 0
        self._rich_path: Optional[tuple[tuple, int]] = None  # a rich frame wrapped after `path.py:`: (head, lineno)
        self._oom_trace_done = False  # trace.location was taken from the traceback ending the OOM
        self._trace_count = 0
        self._trace_start: Optional[Evidence] = None

    @property
    def open(self) -> bool:
        return self._in_trace

    def feed(self, line: Any) -> bool:
        text = line.text
        if self._in_trace or "raceback" in text or "RACEBACK" in text or _EXC_RE.match(text) \
                or parse_frames(text) or cut_frame_head(text):
            self._trace(line)
            return True
        return False

    def current_phase(self, line: Any) -> Optional[str]:
        """The phase of the traceback this line ends (or sits in), from its frames so far."""
        if not self._frames or not self._in_trace:
            return None
        if self._headerless and line.lineno - self._last_frame_lineno > _HEADERLESS_GAP:
            return None
        return location_from_frames(self._frames, self._source_texts())

    def _source_texts(self) -> list[str]:
        return [src for _, src in self._sources]

    def _trace(self, line: Any) -> None:
        text = line.text
        if "ost recent call last" in text or "OST RECENT CALL LAST" in text or _cut_header(text):
            self._open_trace(line, headerless=False)
            for frame in parse_frames(text):  # a markdown render joins the traceback into one line
                self._add_frame(frame, line)
            return
        if not self._in_trace:
            # `[rank2]: File "...", line 4214, in _load_pretrained_model` tails pasted without header, and
            # the rich / IPython dialects pasted from their middle (no box top, no `Traceback` banner)
            if parse_frames(text) or cut_frame_head(text):
                self._open_trace(line, headerless=True)
            else:
                return
        elif self._headerless and line.lineno - self._last_frame_lineno > _HEADERLESS_GAP:
            self._in_trace = False
            return
        found = parse_frames(text)
        if not found and self._rich_path is not None and line.lineno == self._rich_path[1] + 1:
            # rich wraps `path.py:698 in func` onto two box lines: `path.py:` then `698 in func`
            w = rich_wrapped_frame(self._rich_path[0], text)
            if w is not None:
                self._add_frame(w, line)
                self._rich_path = None
                return
        self._rich_path = None
        if found:
            for frame in found:
                self._add_frame(frame, line)
            return
        cut = cut_frame_head(text, ipython=True)
        if cut is not None:
            # a frame header cut before its function (a paste cut at a terminal / title width)
            self._add_frame(cut, line)
            return
        head = rich_wrapped_head(text)
        if head is not None:
            self._rich_path = (head, line.lineno)
            return
        e = _EXC_RE.match(text)
        if e and not text.startswith(("During handling", "The above exception")):
            self._trace_count += 1
            self._in_trace = False
            loc = location_from_frames(self._frames, self._source_texts())
            self._note_bnb()
            if self._trace_count == 1:
                if self._trace_start is not None:
                    self.sink.groups.setdefault("trace", []).append(self._trace_start)
                self.sink._evidence("trace", line)
                self.sink.values["trace.exception"] = e.group(1)
                if e.group(2):
                    self.sink.values["trace.message"] = e.group(2)[:300]
                if loc:
                    self.sink.values["trace.location"] = loc
                package = raised_in(self._frames)
                if package:
                    self.sink.values["trace.raised_in"] = package
            if not self._oom_trace_done and says_oom(text):
                # the traceback that ends with the (first) OOM places it, not an unrelated earlier
                # one (a caught flash-attn ImportError before a training OOM)
                self._oom_trace_done = True
                if loc:
                    self.sink.values["trace.location"] = loc
                else:
                    self.sink.values.pop("trace.location", None)
        elif self._frames and len(self._sources) < 200 and text and not text.startswith(("^", "~")):
            last = self._frames[-1]
            if last.line == 0 and "> " in text[:12]:  # old IPython: `-> 1539     return inner_training_loop(`
                a = ARROW_RE.match(text)
                if a:
                    self._frames[-1] = last._replace(line=_line(a.group(1)))
            self._sources.append((len(self._frames) - 1, text))  # the source line under a frame

    def _open_trace(self, line: Any, headerless: bool) -> None:
        self._in_trace = True
        self._headerless = headerless
        self._frames = []
        self._sources = []
        self._rich_path = None
        self._last_frame_lineno = line.lineno
        if self._trace_count == 0:
            self._trace_start = Evidence(file=line.file, line=line.lineno, text=line.quote())

    def _add_frame(self, frame: Frame, line: Any) -> None:
        self._last_frame_lineno = line.lineno
        if not frame.function and frame.dialect in ("cpython", "cut") and self._frames and self._sources \
                and self._sources[-1][0] == len(self._frames) - 1:
            # a header cut before its function: the frame above calls it on its source line
            # (`model = AutoModel.from_pretrained(` above a cut `File "/x/site-packages/transform`)
            above = [text for k, text in reversed(self._sources) if k == len(self._frames) - 1]
            frame = frame._replace(function=called_function(caller_source(above[::-1])))
        if len(self._frames) < 200:
            self._frames.append(frame)

    def _note_bnb(self) -> None:
        if self._frames and "trace.bnb_4bit" not in self.sink.values and shows_bnb_4bit(self._frames, self._sources):
            self.sink.values["trace.bnb_4bit"] = True

    def publish(self, values: dict[str, Any]) -> None:
        if self._in_trace:
            self._note_bnb()  # a traceback the log cut off before its exception
        if self._trace_count:
            values["trace.count"] = self._trace_count
