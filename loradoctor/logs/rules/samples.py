"""Strings a rule's regex matches, drawn at random from its parse tree, to check what cannot be read off
the regex: that an explicit `prefilter` (or `exclude_prefilter`) holds a literal of every match. A line is
tried against a rule's patterns only if it contains one of those literals (docs/rules.md), so a pattern
alternative whose words are not among them never fires; the regex alone looks right, and the rule's
fixtures may not use that alternative. Used by `loradoctor rules lint` (lint.prefilter_gap_problems)."""

from __future__ import annotations

import random
from typing import Iterator, Optional

from loradoctor.logs.rules.literals import _constants, _parser, _rendered_literal, paste_tolerant

# Characters drawn for `.`, `\w`, negated classes: letters, digits and the punctuation of log lines. Spaces
# are single (`[ \t]{1,3}` draws one space): a gap that only a tab or a run of spaces opens is not reported.
_POOL = "abcxyzXYZ019_-.:/'\"()"
_WORD = "abcXYZ09_"


def _is_space(items) -> bool:
    c = _constants()
    if len(items) != 1:
        return False
    op, av = items[0]
    if op is c.LITERAL:
        return chr(av) in " \t"
    if op is c.IN:
        return all((o is c.LITERAL and chr(a) in " \t") or (o is c.CATEGORY and "SPACE" in str(a)) for o, a in av)
    return False


def _pick_class(av, rng: random.Random) -> str:
    c = _constants()
    negated = any(o is c.NEGATE for o, _ in av)
    members: list[str] = []
    for o, a in av:
        if o is c.LITERAL and not (chr(a) == "\t" and not negated):
            members.append(chr(a))
        elif o is c.RANGE:
            members += [chr(x) for x in range(a[0], min(a[1], a[0] + 30) + 1)]
        elif o is c.CATEGORY:
            name = str(a)
            if "NOT" in name:
                members += ["a", ".", "-"]
            elif "DIGIT" in name:
                members += list("0123456789")
            elif "WORD" in name:
                members += list(_WORD)
            elif "SPACE" in name:
                members.append(" ")
    if negated:
        pool = [ch for ch in _POOL if ch not in members]
        return rng.choice(pool or ["~"])
    return rng.choice(members or ["a"])


def _draw(items, rng: random.Random, out: list[str]) -> None:
    c = _constants()
    possessive = getattr(c, "POSSESSIVE_REPEAT", None)
    for op, av in items:
        if op is c.LITERAL:
            out.append(chr(av))
        elif op is c.NOT_LITERAL:
            out.append(rng.choice([ch for ch in _POOL if ord(ch) != av]))
        elif op is c.ANY:
            out.append(rng.choice(_POOL))
        elif op is c.IN:
            out.append(_pick_class(av, rng))
        elif op is c.BRANCH:
            _draw(rng.choice(av[1]), rng, out)
        elif op is c.SUBPATTERN:
            _draw(av[-1], rng, out)
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT) or (possessive is not None and op is possessive):
            low, high = av[0], min(av[1], av[0] + 2)
            if _is_space(av[2]):
                low = high = low if low >= 1 else rng.choice((0, 1))
            for _ in range(rng.randint(low, high)):
                _draw(av[2], rng, out)
        # anchors, lookarounds and back-references add no characters: the compiled regex checks the draw


def matches(pattern: str, compiled, seed: str, tries: int = 300) -> Iterator[str]:
    """Up to `tries` random strings that `compiled` (the rule's own compiled `pattern`) finds a match in."""
    try:
        parsed = _parser().parse(paste_tolerant(pattern))
    except Exception:  # a pattern the parser refuses is reported by the loader
        return
    rng = random.Random(seed)
    for _ in range(tries):
        out: list[str] = []
        _draw(list(parsed), rng, out)
        text = "".join(out)
        if compiled.search(text):
            yield text


_GAPS: dict = {}  # (pattern, literals, seed) -> the gap found (draws are seeded: the same answer every time)


def prefilter_gap(pattern: str, compiled, literals: list[str], seed: str) -> Optional[str]:
    """A string the pattern matches that holds none of the explicit literals (compared ignoring case, as the
    engine does), or None when the draws found none. Remembered per process: the draws are seeded by the
    rule, so a second lint of the same rules (a test suite lints the built-in folder several times) reads
    the first answer."""
    key = (pattern, tuple(literals), seed)
    if key in _GAPS:
        return _GAPS[key]
    wanted = [_rendered_literal(lit).lower() for lit in literals]
    found = None
    for text in matches(pattern, compiled, seed):
        low = text.lower()
        if not any(lit in low for lit in wanted):
            found = text
            break
    _GAPS[key] = found
    return found
