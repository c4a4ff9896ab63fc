"""Transforms that turn a raw log into the shapes people really paste (issue 10): a log rendered as
Markdown, lower-cased as an issue title, indented as a code block, behind prompts or line numbers, a
traceback in the IPython / Jupyter / Colab or rich dialect, collapsed onto one line by a web form, and
the older wrap / prefix / HTML shapes. Used by tests/test_pasted_shapes.py and by
benchmarks/shape_invariance.py (which counts, per transform, the fixtures whose first cause changes).

Each transform takes the text of one log and returns the pasted text; a transform that does not apply
to a log (no traceback to re-dialect) returns it unchanged and the callers skip that pair."""

from __future__ import annotations

import html
import re
import unicodedata
from typing import Callable


def _per_line(fn: Callable[[int, str], str]) -> Callable[[str], str]:
    def apply(text: str) -> str:
        return "".join(fn(i, line) for i, line in enumerate(text.splitlines(True), 1))
    return apply


_DUNDER_RE = re.compile(r"__(\w+?)__")


def render_markdown(text: str) -> str:
    """What a rendered issue page gives back when copied: backquotes gone, `__init__` turned bold
    (`init`), asterisks eaten by emphasis (`**kwargs` -> `kwargs`)."""
    return _DUNDER_RE.sub(r"\1", text).replace("`", "").replace("*", "")


def fold(text: str, width: int = 80) -> str:
    """A console that hard-wraps at `width` columns."""
    out = []
    for line in text.splitlines():
        while len(line) > width:
            out.append(line[:width])
            line = line[width:]
        out.append(line)
    return "\n".join(out) + "\n"


def _columns(ch: str) -> int:
    """A terminal's columns for one character: 2 for an East Asian wide or full-width one (CJK)."""
    return 2 if unicodedata.east_asian_width(ch) in "WF" else 1


def fold_display(text: str, width: int = 80) -> str:
    """A console that hard-wraps at `width` display columns: a CJK character takes two, and one that no
    longer fits in the last column goes to the next line (that line then has width - 1 columns). A text
    without a wide character is returned unchanged (the shape does not apply: wrap80 covers it)."""
    if not any(_columns(ch) == 2 for ch in text):
        return text
    out = []
    for line in text.splitlines():
        cur: list[str] = []
        col = 0
        for ch in line:
            w = _columns(ch)
            if col + w > width:
                out.append("".join(cur))
                cur, col = [], 0
            cur.append(ch)
            col += w
        out.append("".join(cur))
    return "\n".join(out) + "\n"


def no_final_newline(text: str) -> str:
    """A paste that ends without a newline (a form field, a chat message): compose it after a wrap
    (`wrap80+open_end`) to cut the input's last line off its newline."""
    return text.rstrip("\n") if text.endswith("\n") else text


# ---------------------------------------------------------------------------------------------
# traceback dialects

_FRAME_RE = re.compile(r'^(?P<ind>\s*)File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)\s*$')
_TB_HEAD = "Traceback (most recent call last):"
_EXC_RE = re.compile(r"^(?P<type>[\w.]+(?:Error|Exception|Interrupt|Exit|Warning|Failure)\w*)(?P<rest>:.*)?$")


def _frames(lines: list[str], start: int) -> tuple[list[tuple[str, str, str, str]], int]:
    """The frames (path, lineno, func, source) of the traceback whose header is at `start`, and the
    index of the line after the last frame."""
    frames = []
    i = start + 1
    while i < len(lines):
        m = _FRAME_RE.match(lines[i].rstrip("\n"))
        if not m:
            break
        source = ""
        if i + 1 < len(lines) and not _FRAME_RE.match(lines[i + 1]) and lines[i + 1].startswith("    "):
            source = lines[i + 1].strip()
            i += 1
        frames.append((m.group("path"), m.group("line"), m.group("func"), source))
        i += 1
    return frames, i


def _redialect(text: str, render: Callable[[list, str], list[str]]) -> str:
    """Every `Traceback (most recent call last):` block with its frames rewritten by `render`
    (frames, exception line) -> lines; the exception line is consumed when it directly follows."""
    lines = text.splitlines(True)
    out: list[str] = []
    i = 0
    changed = False
    while i < len(lines):
        if lines[i].strip() == _TB_HEAD:
            frames, j = _frames(lines, i)
            if frames:
                exc = lines[j].rstrip("\n") if j < len(lines) else ""
                if _EXC_RE.match(exc.strip()):
                    j += 1
                else:
                    exc = ""
                out.extend(line + "\n" for line in render(frames, exc.strip()))
                i = j
                changed = True
                continue
        out.append(lines[i])
        i += 1
    return "".join(out) if changed else text


def _short_exc(exc: str) -> tuple[str, str]:
    m = _EXC_RE.match(exc)
    if not m:
        return "Exception", exc
    return m.group("type").rsplit(".", 1)[-1], (m.group("rest") or "")


def _arrow(line: str) -> str:
    """IPython's arrow fills the number column: `----> 1`, `--> 188`, `-> 1885`."""
    return "-" * max(1, 5 - len(line)) + "> " + line


def _ipython_old(frames: list, exc: str) -> list[str]:
    """IPython 7 / old Colab: `<ipython-input-7-...> in <module>()`, `----> 3 trainer.train()`,
    `/usr/.../trainer.py in train(self, ...)`."""
    short, rest = _short_exc(exc)
    out = ["-" * 75, f"{short:<42}Traceback (most recent call last)"]
    for n, (path, line, func, source) in enumerate(frames):
        where = "<ipython-input-7-3c9f1c2b2e41>" if n == 0 and path.endswith(".py") and "/" not in path else path
        call = "<module>()" if func == "<module>" else f"{func}(self, *args, **kwargs)"
        out.append(f"{where} in {call}")
        out.append(f"{int(line) - 1:>7} ")
        out.append(f"{_arrow(line)} {source}")
        out.append(f"{int(line) + 1:>7} ")
        out.append("")
    out.append(f"{short}{rest}")
    return out


def _ipython8(frames: list, exc: str) -> list[str]:
    """IPython 8 / Jupyter / Colab today: `Cell In[7], line 3`, `----> 3 trainer.train()`,
    `File /usr/...:1885, in Trainer.train(self, ...)`."""
    short, rest = _short_exc(exc)
    out = ["-" * 75, f"{short:<42}Traceback (most recent call last)"]
    for n, (path, line, func, source) in enumerate(frames):
        if n == 0 and "/" not in path:
            out.append(f"Cell In[7], line {line}")
        else:
            out.append(f"File {path}:{line}, in {func}(self, *args, **kwargs)")
        out.append(f"{int(line) - 1:>6} ")
        out.append(f"{_arrow(line)} {source}")
        out.append("")
    out.append(f"{short}{rest}")
    return out


def _rich_wrap(text: str, width: int) -> list[str]:
    """How rich lays a frame's header out in the box: word-wrapped at spaces, a word wider than the box
    folded (checked against rich 15.0: `/long/path/modeling_utils.py:2 in` then the function name on the
    next line; rich never crops a frame's name mid-word)."""
    out: list[str] = []
    cur = ""
    for word in text.split(" "):
        if cur and len(cur) + 1 + len(word) <= width:
            cur += " " + word
            continue
        if cur or out:
            out.append(cur)
        while len(word) > width:
            out.append(word[:width])
            word = word[width:]
        cur = word
    out.append(cur)
    return out


def _rich(frames: list, exc: str) -> list[str]:
    """rich.traceback (accelerate, typer, Lightning): boxed frames, `❱ 1885 │ source`."""
    width = 98
    out = ["╭" + " Traceback (most recent call last) ".center(width, "─") + "╮"]
    for path, line, func, source in frames:
        # the frame's header is word-wrapped; source lines are cropped (rich's Syntax, word_wrap=False)
        header = _rich_wrap(f"{path}:{line} in {func}", width - 2)
        for inner in (*header, "", f"❱ {line} │   {source}"[: width - 2], ""):
            out.append("│ " + inner.ljust(width - 2) + " │")
    out.append("╰" + "─" * width + "╯")
    out.append(exc)
    return out


def _one_line(frames: list, exc: str) -> list[str]:
    """A traceback whose line breaks a web form ate: one line, frames joined by spaces."""
    parts = [_TB_HEAD]
    for path, line, func, source in frames:
        parts.append(f'File "{path}", line {line}, in {func}')
        if source:
            parts.append(source)
    parts.append(exc)
    return [" ".join(p for p in parts if p)]


SHAPES: dict[str, Callable[[str], str]] = {
    # the older shapes
    "quoted": _per_line(lambda i, line: "> " + line),
    "html": html.escape,
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "compose": _per_line(lambda i, line: "trainer-1  | " + line),
    "kubelet": _per_line(lambda i, line: "2024-05-01T10:00:00.123Z stdout F " + line),
    "wrap80": fold,
    "wrap80cjk": fold_display,
    "open_end": no_final_newline,
    # issue 10
    "markdown": render_markdown,
    "lower": str.lower,
    "indent4": _per_line(lambda i, line: "    " + line),
    "tab": _per_line(lambda i, line: "\t" + line),
    "strip_indent": _per_line(lambda i, line: line.lstrip(" \t")),
    "prompt": _per_line(lambda i, line: ">>> " + line),
    "line_numbers": _per_line(lambda i, line: f"{i:>4}  " + line),
    "ipython7": lambda t: _redialect(t, _ipython_old),
    "ipython8": lambda t: _redialect(t, _ipython8),
    "rich": lambda t: _redialect(t, _rich),
    "one_line": lambda t: _redialect(t, _one_line),
}
