"""prose: the phase an out-of-memory error came in, when a Chinese, Korean or Japanese report says it
only in words ("合并的时候报错显存溢出", "평가 단계에서 ... OOM"). The words are data
(loradoctor/data/prose_words.yaml, which also says how a line is read); this module only applies them."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, NamedTuple, Optional

from loradoctor.lazyre import lazy_re
from loradoctor.logs.facts.common import Extractor

TABLE = Path(__file__).resolve().parent.parent.parent / "data" / "prose_words.yaml"

# CJK ideographs, Hangul syllables, Kana: a line holding none of them is not this extractor's prose
# (compiled on first use: the class's charset takes ~7 ms to build, and an ASCII line never needs it)
_CJK_RE = lazy_re("[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")
_SENTENCE_END_RE = lazy_re("[。！？!?]")
_LATIN = re.compile("[A-Za-z]")
# what a growth word's line must also name: GPU memory or the OOM (not "loss keeps increasing")
_MEMORY_WORD_RE = lazy_re(r"(?i)显存|\bmemory\b|\bvram\b|(?<![a-z])oom(?![a-z])")


class ProseTable(NamedTuple):
    anchors: tuple[str, ...]  # the symptom words
    weak: tuple[str, ...]  # GPU memory / "the error below" words
    phases: tuple[tuple[str, str], ...]  # (word, phase), longest word first
    after: tuple[str, ...]
    not_phases: tuple[str, ...] = ()  # names that hold a phase word but name no phase (modules_to_save)
    growth: tuple[str, ...] = ()  # memory-grew-over-the-run words (prose.memory_growth)
    either: tuple[str, ...] = ()  # "training or inference": a phase word paired with a training word
    plus: tuple[str, ...] = ()  # "loading takes 6 GB, plus ...": a phase word that is one addend


@functools.lru_cache(maxsize=2)
def prose_table(path: Path = TABLE) -> ProseTable:
    """prose_words.yaml, parsed once per process (kept as JSON in the user's cache)."""
    from loradoctor import cache

    data = cache.yaml_data(path, "prose_words")
    anchors = data.get("anchors") or {}
    pairs = [(str(w), str(phase)) for phase, words in (data.get("phases") or {}).items() for w in words or ()]
    pairs.sort(key=lambda p: -len(p[0]))
    return ProseTable(anchors=tuple(str(w) for w in anchors.get("oom") or ()),
                      weak=tuple(str(w) for w in anchors.get("weak") or ()),
                      phases=tuple(pairs), after=tuple(str(w) for w in data.get("after") or ()),
                      not_phases=tuple(str(w) for w in data.get("not_phases") or ()),
                      growth=tuple(str(w) for w in data.get("growth") or ()),
                      either=tuple(str(w) for w in data.get("either") or ()),
                      plus=tuple(str(w) for w in data.get("plus") or ()))


@functools.lru_cache(maxsize=2)
def _phase_re(table: ProseTable) -> "re.Pattern[str]":
    """Any phase word, lower-cased (longest first, so a longer word wins where two start alike)."""
    return re.compile("|".join(re.escape(w.lower()) for w, _ in table.phases))


def _last_at(sentence: str, words: tuple[str, ...]) -> int:
    """Where the last of `words` starts in the sentence (-1: none). Latin words match case-blind."""
    low = sentence.lower()
    best = -1
    for w in words:
        at = (low if _LATIN.search(w) else sentence).rfind(w.lower() if _LATIN.search(w) else w)
        best = max(best, at)
    return best


def _word_at(sentence: str, low: str, at: int, word: str) -> bool:
    if _LATIN.search(word):
        if not low.startswith(word.lower(), at):
            return False
        # a Latin word on its own (eval_step and evaluate count; retrain or medieval do not)
        return at == 0 or not sentence[at - 1].isascii() or not sentence[at - 1].isalpha()
    return sentence.startswith(word, at)


def _paired_with_training(low: str, at: int, t: ProseTable) -> bool:
    """Whether the phase word at `at` follows a training word and an `either` word ("학습하거나 추론",
    "训练或推理", "train or inference"): both named, no one phase."""
    head = low[:at].rstrip()
    for e in t.either:
        e = e.lower()
        if not head.endswith(e):
            continue
        if _LATIN.search(e) and len(head) > len(e) and head[-len(e) - 1].isalpha():
            continue  # `vendor` does not end in the word `or`
        rest = head[:len(head) - len(e)].rstrip()
        # the training word itself, or with a short verb ending between ("학습하거나": 학습 + 하 + 거나)
        if any(w.lower() in rest[-(len(w) + 3):] for w, p in t.phases if p == "train"):
            return True
    return False


def sentence_phase(sentence: str, table: Optional[ProseTable] = None) -> tuple[Optional[str], bool]:
    """(phase or None, whether the sentence names the OOM itself) for one sentence. The phase is
    the nearest phase word before the last OOM word (before the last weak anchor when there is none);
    'train' gives None, a finished phase is passed over."""
    t = table or prose_table()
    strong = _last_at(sentence, t.anchors)
    # the OOM word itself when the sentence has one; GPU memory / "the error below" only without one
    anchor = strong if strong >= 0 else _last_at(sentence, t.weak)
    if anchor < 0:
        return None, False
    low = sentence.lower()
    for name in t.not_phases:  # blanked (same length: the positions stay the sentence's)
        low = low.replace(name.lower(), " " * len(name))
    # the phase words before the anchor, nearest first (one regex pass: a line may be 8,000 characters)
    # (the 64 nearest: a hostile line of repeated finished phases costs no more)
    for m in reversed(list(_phase_re(t).finditer(low, 0, anchor))[-64:]):
        at = m.start()
        hit = next(((w, p) for w, p in t.phases if _word_at(sentence, low, at, w)), None)
        if hit is None:
            continue
        word, phase = hit
        if phase == "train" or _paired_with_training(low, at, t):
            return None, strong >= 0
        if any(sentence.startswith(a, at + len(word)) for a in t.after):
            continue  # a finished phase ("加载完", "合并后"): look further back
        if any(p in sentence[at + len(word):anchor] for p in t.plus):
            continue  # one addend of what did not fit ("加载就要6GB，再加上激活值"): look further back
        return phase, strong >= 0
    return None, strong >= 0


def line_phase(text: str, table: Optional[ProseTable] = None) -> tuple[Optional[str], bool]:
    """(the phase of the line's last sentence that names one, whether any sentence names an OOM)."""
    found: Optional[str] = None
    said = False
    for sentence in _SENTENCE_END_RE.split(text):
        phase, strong = sentence_phase(sentence, table)
        said |= strong
        if phase is not None:
            found = phase
    return found, said


class ProseExtractor(Extractor):
    """prose.oom_phase (the phase CJK prose names next to an OOM word), prose.gpu_oom (a CJK line
    names a GPU out-of-memory error in words) and prose.memory_growth (a line, in any script, says GPU
    memory grew over the run); evidence group `prose`."""

    TRIGGERS = (
        # Latin words case-blind: a pasted title or search snippet may be lower-cased
        ("显存", False), ("OOM", True), ("out of memory", True), ("OutOfMemory", True), ("메모리", False),
        ("VRAM", True), ("メモリ", False), ("오류", False), ("如下错误", False), ("报错如下", False),
        ("以下のエラー", False),
        # what every `growth` word of prose_words.yaml holds (tests/test_prose_facts.py checks it)
        ("keep", True), ("fine for", True), ("ok for", True), ("一直", False), ("不断", False), ("持续", False),
        ("越来越", False),
    )

    def feed(self, line: Any) -> bool:
        text = line.text
        low = text.lower()
        if any(w.lower() in low for w in prose_table().growth) and _MEMORY_WORD_RE.search(text):
            self.sink.values["prose.memory_growth"] = True
            self.sink._evidence("prose", line)
        if text.isascii() or not _CJK_RE.search(text):
            return False
        phase, said = line_phase(text)
        values = self.sink.values
        if said:
            values["prose.gpu_oom"] = True
        if phase is not None:
            values["prose.oom_phase"] = phase
        if said or phase is not None:
            self.sink._evidence("prose", line)
            return True
        return False
