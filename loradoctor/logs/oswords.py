"""oswords: the shell's signal texts in the user's locale (`Getötet`, `Убито`, `Processus arrêté`, `Lỗi phân
đoạn (đã xuất tập tin lõi)`) read as the English ones the rules know (`Killed`, `Segmentation fault (core
dumped)`). The words are data (loradoctor/data/os_strings.yaml, which also says which line shapes are read);
this module only applies them. The reader calls `unlocalize` on a line's text; `Line.raw` keeps the line as
pasted, so evidence quotes what the user saw."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import NamedTuple, Optional

TABLE = Path(__file__).resolve().parent.parent / "data" / "os_strings.yaml"

# a shell's signal line is short; a longer line is prose or a log record, never one of the shapes read here
MAX_CHARS = 400


class OsWords(NamedTuple):
    whole: dict  # lower-cased whole line -> its English text
    words: tuple  # (signal string, English), longest first
    core: tuple  # the `(core dumped)` strings
    lines: tuple  # bash's word for `line`
    ascii_lines: tuple  # the ASCII ones, as ` word ` (a cheap test before the regex on an ASCII line)
    resolver: dict  # lower-cased resolver message -> its English text


def _load(path: Path) -> dict:
    from loradoctor import cache

    return cache.yaml_data(path, "os_strings")


@functools.lru_cache(maxsize=2)
def os_words(path: Path = TABLE) -> OsWords:
    """os_strings.yaml, parsed once per process (kept as JSON in the user's cache)."""
    data = _load(path)
    words = [(str(w), str(english)) for english, ws in (data.get("signals") or {}).items() for w in ws or ()]
    words.sort(key=lambda p: -len(p[0]))
    core = tuple(str(c) for c in data.get("core_dumped") or ())
    whole: dict = {}
    for w, english in words:
        whole[w.lower()] = english
        for c in core:
            whole[f"{w} {c}".lower()] = f"{english} (core dumped)"
    lines = tuple(str(w) for w in data.get("line") or ())
    resolver = {str(w).lower(): str(english) for english, ws in (data.get("resolver") or {}).items() for w in ws or ()}
    return OsWords(whole=whole, words=tuple(words), core=core, lines=lines,
                   ascii_lines=tuple(dict.fromkeys(f" {f} " for w in lines if w.isascii() for f in (w, w.lower()))),
                   resolver=resolver)


def trigger_words(path: Path = TABLE) -> tuple:
    """The signal strings and resolver messages as extractor triggers (the engine decodes only lines that hold a
    trigger): each as written and lower-cased, both case-sensitive (a lower-cased paste lowers `Убито` too,
    which the byte-level case-blind search does not: it folds ASCII only)."""
    table = os_words(path)
    out: list = []
    for w in [w for w, _ in table.words] + [w for w in _resolver_words(path)]:
        for form in dict.fromkeys((w, w.lower())):
            out.append((form, False))
    return tuple(out)


def _resolver_words(path: Path = TABLE) -> list:
    """The resolver messages as written in the table (os_words keeps them lower-cased)."""
    return [str(w) for ws in (_load(path).get("resolver") or {}).values() for w in ws or ()]


_SHAPES: dict = {}  # id(table) -> its compiled shapes (a table holds a dict: not hashable for lru_cache)


def _shapes(table: OsWords) -> tuple:
    """(bash's child report, bash job control), both case-blind; compiled on first use."""
    got = _SHAPES.get(id(table))
    if got is not None and got[0] is table:
        return got[1]
    sig = "|".join(re.escape(w) for w, _ in table.words)
    core = "|".join(re.escape(c) for c in table.core)
    tail = rf"(?P<sig>{sig})(?:[ \t]+(?P<core>{core}))?(?P<rest>(?:[ \t].*)?)$"
    child = re.compile(rf"^(?P<head>\S*?: ?)(?:{'|'.join(re.escape(w) for w in table.lines)}) (?P<n>\d+) ?: +"
                       rf"(?P<pid>\d+)[ \t]+{tail}", re.I)
    job = re.compile(rf"^(?P<head>\[\d+\][+-]?[ \t]+){tail}", re.I)
    _SHAPES[id(table)] = (table, (child, job))
    return child, job


def unlocalize(text: str, table: Optional[OsWords] = None) -> str:
    """`text` with a localized shell signal line given its English words; any other line unchanged."""
    if not text or len(text) > MAX_CHARS:
        return text
    t = table or os_words()
    low = text.lower()
    english = t.whole.get(low)
    if english is not None:
        return english
    if t.resolver and text.count(": ") == 2:
        # `ping: huggingface.co: Fallo temporal en la resolución del nombre` (a program and a host, one word each)
        head, _, message = text.rpartition(": ")
        english = t.resolver.get(message.strip().lower())
        if english is not None and all(w and " " not in w for w in head.split(": ")):
            return f"{head}: {english}"
    job = text[:1] == "["
    if not job and not (": " in text and (not text.isascii() or any(w in text for w in t.ascii_lines))):
        return text
    m = _shapes(t)[1 if job else 0].match(text)
    if m is None:
        return text
    english = next(e for w, e in t.words if w.lower() == m.group("sig").lower())
    core = " (core dumped)" if m.group("core") else ""
    if job:
        return f"{m.group('head')}{english}{core}{m.group('rest')}"
    return f"{m.group('head')}line {m.group('n')}: {m.group('pid')} {english}{core}{m.group('rest')}"
