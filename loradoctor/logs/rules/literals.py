"""Prefilter literals: the words of which at least one occurs in every match of a rule's regex,
derived from the parsed pattern (or written by the author as `prefilter:`), so the engine decodes
only lines that could match."""

from __future__ import annotations

import re

from typing import Iterator, Optional

MIN_DERIVED_LITERAL = 3  # a derived prefilter literal shorter than this would match everywhere


def _parser():
    try:
        import re._parser as parser  # type: ignore[import-not-found]  # Python 3.11+
    except ImportError:  # pragma: no cover
        import sre_parse as parser  # type: ignore[no-redef]
    return parser


def _constants():
    try:
        import re._constants as c  # type: ignore[import-not-found]
    except ImportError:  # pragma: no cover
        import sre_constants as c  # type: ignore[no-redef]
    return c


# ---------------------------------------------------------------------------------------------
# digit-blind regexes (engine: require_all / exclude misses; metrics: the record regex)

_DIGIT_BLIND: dict[tuple, bool] = {}  # (pattern, flags) -> digit_blind(compiled)


def digit_blind(compiled) -> bool:
    r"""True when a compiled `re` regex cannot tell one ASCII digit from another: no digit written literally,
    every class holding all digits or none (`\d`, `\w`, `[0-9a-f]`, `[^\d]` do; `[1-9]`, `0x` do not), no
    backreference. Its search on a line then goes the same way on the line with every digit written 0
    (each step of the matcher tests a character against the same classes), so whether it matches is a
    property of the digit-blind line: an eval record that a rule's require_all regex missed need not be
    searched again when only its numbers changed. Anything the walk does not know counts as not blind."""
    key = (compiled.pattern, compiled.flags)
    found = _DIGIT_BLIND.get(key)
    if found is None:
        found = False
        if compiled.__class__ is re.Pattern and isinstance(compiled.pattern, str):
            try:
                found = _blind_tree(_parser().parse(compiled.pattern, compiled.flags))
            except Exception:  # an internal module that changed shape: not blind, searched as before
                found = False
        _DIGIT_BLIND[key] = found
    return found


_ASCII_DIGITS = frozenset(range(48, 58))


def _blind_tree(items) -> bool:
    c = _constants()
    for op, av in items:
        if op is c.LITERAL or op is c.NOT_LITERAL:
            if av in _ASCII_DIGITS:
                return False
        elif op is c.IN:
            if not _blind_class(av, c):
                return False
        elif op is c.ANY or op is c.AT:
            continue
        elif op is c.BRANCH:
            if not all(_blind_tree(branch) for branch in av[1]):
                return False
        elif op is c.SUBPATTERN:
            if not _blind_tree(av[3]):
                return False
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", c.MAX_REPEAT)):
            if not _blind_tree(av[2]):
                return False
        elif op is c.ASSERT or op is c.ASSERT_NOT:
            if not _blind_tree(av[1]):
                return False
        elif op is getattr(c, "ATOMIC_GROUP", None):
            if not _blind_tree(av):
                return False
        else:  # a backreference, a conditional, anything else
            return False
    return True


def _blind_class(items, c) -> bool:
    """A character class holds every ASCII digit or none (negated or not)."""
    all_digits = (c.CATEGORY_DIGIT, c.CATEGORY_WORD, c.CATEGORY_NOT_SPACE, c.CATEGORY_UNI_DIGIT,
                  c.CATEGORY_UNI_WORD, c.CATEGORY_UNI_NOT_SPACE, c.CATEGORY_NOT_LINEBREAK,
                  c.CATEGORY_UNI_NOT_LINEBREAK)
    no_digit = (c.CATEGORY_NOT_DIGIT, c.CATEGORY_NOT_WORD, c.CATEGORY_SPACE, c.CATEGORY_UNI_NOT_DIGIT,
                c.CATEGORY_UNI_NOT_WORD, c.CATEGORY_UNI_SPACE, c.CATEGORY_LINEBREAK, c.CATEGORY_UNI_LINEBREAK)
    held: set = set()
    for op, av in items:
        if op is c.NEGATE:
            continue
        if op is c.LITERAL:
            if av in _ASCII_DIGITS:
                held.add(av)
        elif op is c.RANGE:
            held.update(d for d in _ASCII_DIGITS if av[0] <= d <= av[1])
        elif op is c.CATEGORY and av in all_digits:
            held.update(_ASCII_DIGITS)
        elif not (op is c.CATEGORY and av in no_digit):
            return False
    return not held or held == _ASCII_DIGITS


# bytes that fill progress bars, metric dicts and timestamps: a literal made of them (and digits)
# would send most of a training log through the rule matcher
_COMMON_LOG_CHARS = frozenset("0123456789 %|/.:,[]<>_'\t")


def _informative_literal(text: str) -> bool:
    """A prefilter literal worth its cost: long enough, and with two characters beyond the digits and
    punctuation of progress bars, metric dicts and timestamps (' 43', '137' or '0000:' would send most
    of a training log through the matcher). One test for derived and explicit literals. Length counts
    UTF-8 bytes, as the prefilter searches bytes: a two-character CJK word (`显存`, 6 bytes) is as rare
    in a log as a six-letter English one."""
    return len(text.encode("utf-8")) >= MIN_DERIVED_LITERAL and sum(ch not in _COMMON_LOG_CHARS for ch in text) >= 2


_DUNDER_SRC_RE = re.compile(r"(?<!\\)__(\w+?)__")


def paste_tolerant(pattern: str) -> str:
    """A rule's regex as it is matched: a log copied from a rendered page lost its backquotes and the
    underscores of `__init__` (Markdown bold), so a backquote becomes optional and `__x__` matches `x`
    too. Rule authors write the message as the library prints it."""
    if "`" in pattern:
        pattern = pattern.replace("\\`", "`").replace("`", "`?")
    if "__" in pattern:
        pattern = _DUNDER_SRC_RE.sub(r"(?:__\1__|\1)", pattern)
    return pattern


# Python's `re` counts every letter as \w, CJK characters included, so in `微调时显存OOM了` or `报错RuntimeError`
# (Chinese and Japanese writers glue English to their own words; so do some others: `ошибкаCUDA`) there is
# no \b before the English word. The rules' words are ASCII: a \b also holds between a non-ASCII character
# and an ASCII letter or digit, which is the ASCII-mode \b, `(?a:\b)`. No character classes: one of the CJK
# blocks costs 2-10 ms to compile (a log compiles hundreds), `(?a:\b)` costs what \b does.
WIDE_BOUNDARY = r"(?:\b|(?a:\b))"
# where the pattern writes an ASCII letter or digit on one side, the ASCII-mode boundary alone is the same
_WIDE_SIDE = r"(?a:\b)"


def _ascii_alnum(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


def _optional(pattern: str, j: int) -> bool:
    """The atom that ends before j may be absent (`?`, `*`, `{0,`)."""
    return pattern[j:j + 1] in ("?", "*") or pattern.startswith("{0", j)


def regex_structure(pattern: str, start: int = 0) -> Iterator[tuple[int, str]]:
    """(index, character) of each character of `pattern` from `start` that is neither escaped nor inside a
    character class: the characters that give a regex its structure (groups, `|`, quantifiers)."""
    i, n = start, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "[":
            i += 1
            if pattern[i:i + 1] == "^":
                i += 1
            if pattern[i:i + 1] == "]":  # a `]` first in a class is a member
                i += 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
            i += 1
            continue
        yield i, ch
        i += 1


def _group_end(pattern: str, j: int) -> int:
    """The index after the group that opens at j; len(pattern) if unclosed."""
    depth = 0
    for i, ch in regex_structure(pattern, j):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(pattern)


def split_alternatives(body: str) -> list[str]:
    """The alternatives of a regex body at its own level (`a|(b|c)|d` -> a, (b|c), d)."""
    cuts, depth = [], 0
    for i, ch in regex_structure(body):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "|" and depth == 0:
            cuts.append(i)
    return [body[a + 1 if a >= 0 else 0:b] for a, b in zip([-1] + cuts, cuts + [len(body)])]


def _starts_alnum(pattern: str, j: int, depth: int = 0) -> bool:
    """Every match of the pattern from j starts with an ASCII letter or digit that the pattern writes
    (`OOM`, `(?:keeps?|grows)`); False when unsure (an escape, a class, an optional first atom)."""
    if depth > 4 or j >= len(pattern):
        return False
    ch = pattern[j]
    if _ascii_alnum(ch):
        return not _optional(pattern, j + 1)
    if ch != "(":
        return False
    end = _group_end(pattern, j)
    if _optional(pattern, end):
        return False
    k = j + 1
    if pattern.startswith("?:", k):
        k += 2
    elif pattern.startswith("?P<", k):
        k = pattern.find(">", k) + 1
    elif pattern[k:k + 1] == "?":
        return False  # a lookaround, inline flags, a back-reference
    return all(_starts_alnum(alt, 0, depth + 1) for alt in split_alternatives(pattern[k:end - 1]))


_META = frozenset(".^$*+?{}[]\\|()")


def _leading_literal(pattern: str, j: int) -> str:
    """The run of plain characters from j (no metacharacter, not the one a quantifier applies to)."""
    k = j
    while k < len(pattern) and pattern[k] not in _META:
        k += 1
    if k < len(pattern) and pattern[k] in "?*+{" and k > j:
        k -= 1  # `errors?`: the s belongs to the quantifier
    return pattern[j:k]


def wide_boundaries(pattern: str) -> str:
    """`pattern` with each `\\b` (outside a character class) also true between a non-ASCII character (CJK) and
    an ASCII letter or digit: a boundary is only added, never removed, so what matched before still matches. Applied
    when a pattern is compiled (not to the literals the prefilter derives: they stay the rule's own). Where
    the pattern writes a letter or digit next to the `\\b` (`\\bOOM`, `OOM\\b`), one lookaround is enough,
    which keeps the runaway checks' timings (`rules lint`) where they were."""
    if "\\b" not in pattern:
        return pattern
    out: list[str] = []
    i, n, in_class = 0, len(pattern), False
    prev_alnum = False  # the last thing written is a plain ASCII letter or digit (not an escape, not a class)
    lead = _leading_literal(pattern, 2) if pattern.startswith("\\b") else ""
    if lead and _ascii_alnum(lead[0]):
        # `\bNCCL WARN` as `NCCL WARN(?<!(?a:\w)NCCL WARN)`: the same boundary, checked after the literal,
        # so that `re` scans for the literal prefix (a leading \b makes it try every position: 20x slower)
        out.append(f"{lead}(?<!(?a:\\w){lead})")
        i, prev_alnum = 2 + len(lead), _ascii_alnum(lead[-1])
    while i < n:
        ch = pattern[i]
        if ch == "\\" and i + 1 < n:
            if pattern[i + 1] == "b" and not in_class:
                out.append(_WIDE_SIDE if prev_alnum or _starts_alnum(pattern, i + 2) else WIDE_BOUNDARY)
            else:
                out.append(pattern[i:i + 2])
            prev_alnum = False
            i += 2
            continue
        out.append(ch)
        i += 1
        prev_alnum = not in_class and _ascii_alnum(ch)
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
            if pattern[i:i + 1] == "^":
                out.append("^")
                i += 1
            if pattern[i:i + 1] == "]":  # a `]` first in a class is a member
                out.append("]")
                i += 1
    return "".join(out)


def derive_literals(pattern: str) -> Optional[list[tuple[str, bool]]]:
    """Literals of which at least one occurs in every match of `pattern`, as (text, ignore_case);
    None when the pattern has no literal part long enough to look for."""
    parser, c = _parser(), _constants()
    try:
        parsed = parser.parse(paste_tolerant(pattern))
    except Exception:
        return None
    global_ci = bool(parsed.state.flags & c.SRE_FLAG_IGNORECASE)

    def required(items, ci: bool) -> Optional[list[tuple[str, bool]]]:
        candidates: list[list[tuple[str, bool]]] = []
        run: list[str] = []

        def flush() -> None:
            if run:
                candidates.append([("".join(run), ci)])
                run.clear()

        for op, av in items:
            if op is c.LITERAL:
                run.append(chr(av))
                continue
            if op is c.AT:
                continue  # zero-width: ^ $ \b keep adjacent literals adjacent
            flush()
            if op is c.SUBPATTERN:
                add = av[1] if len(av) > 1 else 0
                sub = required(av[-1], ci or bool(add & c.SRE_FLAG_IGNORECASE))
                if sub:
                    candidates.append(sub)
            elif op is c.BRANCH:
                alts: list[tuple[str, bool]] = []
                for branch in av[1]:
                    sub = required(branch, ci)
                    if not sub:
                        alts = []
                        break
                    alts.extend(sub)
                if alts:
                    candidates.append(alts)
            elif op in (c.MAX_REPEAT, c.MIN_REPEAT) or op is getattr(c, "POSSESSIVE_REPEAT", None):
                if av[0] >= 1:
                    sub = required(av[2], ci)
                    if sub:
                        candidates.append(sub)
        flush()
        good = [cand for cand in candidates if all(_informative_literal(t) for t, _ in cand)]
        if not good:
            return None
        # the best: its shortest alternative is longest (rarest), then fewest alternatives
        return max(good, key=lambda cand: (min(len(t) for t, _ in cand), -len(cand)))

    return required(list(parsed), global_ci)


def _rendered_literal(lit: str) -> str:
    """An explicit prefilter literal as a Markdown-rendered paste still holds it: the pattern makes its
    backquotes and the `__` of `__init__` optional (paste_tolerant), so the literal is the longest piece
    between them (``offload_dir` to dispatch`` -> `` to dispatch``)."""
    if "`" not in lit and "__" not in lit:
        return lit
    return max(re.split(r"`|__", lit), key=len)


def _literals_for(patterns: list[str], explicit: list[str], field_name: str,
                  explicit_name: str = "prefilter") -> tuple[list, list[str]]:
    """Prefilter literals for a list of regexes, and the problems found. Explicit literals are
    matched ignoring case (rule authors rely on `out of memory` finding `Out of memory`)."""
    if explicit:
        explicit = [_rendered_literal(lit) for lit in explicit]
        weak = [lit for lit in explicit if not _informative_literal(lit)]
        problems = [(f"{explicit_name}: {lit!r} is shorter than {MIN_DERIVED_LITERAL} bytes" if len(lit.encode("utf-8")) < MIN_DERIVED_LITERAL
                     else f"{explicit_name}: {lit!r} is made of digits and punctuation every progress bar and metric line holds")
                    + "; give words every match contains" for lit in weak]
        return [(lit, True) for lit in explicit], problems
    literals: list[tuple[str, bool]] = []
    problems = []
    for p in patterns:
        derived = derive_literals(p)
        if not derived:
            problems.append(f"{field_name}: cannot derive a literal of {MIN_DERIVED_LITERAL}+ characters from "
                            f"{p!r}; add `prefilter:` with words every match contains")
        else:
            literals.extend(derived)
    return literals, problems

