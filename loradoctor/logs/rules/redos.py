"""Regexes that cannot run away: a static check for nested and overlapping quantifiers, adversarial
pump strings, and a timed check against them (docs/rules.md "Speed notes"). Used by `rules lint`,
benchmarks/regex_pump.py and the tests.

A backtracking engine is super-linear when one stretch of input can be split between two unbounded
repeats in many ways: a repeat inside a repeat (`(a+)+`, `(a|a)+`), or two unbounded repeats that
can match the same character with nothing required between them (`\\d+\\.?\\d*`, `\\s*:?\\s*`,
`[\\d.]+\\S*`). The static check refuses both shapes; the timed check catches what it cannot see.
"""

from __future__ import annotations

import re
import time
from typing import Iterable, Optional

from loradoctor.logs.rules.literals import _constants, _parser, derive_literals, regex_structure, split_alternatives

UNBOUNDED = 1 << 16  # a repeat above this many is "unbounded" (sre writes MAXREPEAT)
PUMP_CHARS = 2000  # length of a pump string; times are reported per 1,000 characters
PUMP_TIMEOUT_S = 0.25  # one search longer than this is a runaway (the budget test and lint use less)
LINT_BUDGET_S_PER_1000 = 0.003  # lint refuses a pattern slower than this per 1,000 characters of pump
# (the built-in library's worst is about 0.6 ms; a quadratic pattern takes 5 ms and more at 2,000 characters)

# what repeats in real logs and in hostile ones: digits, blanks, words, separators
FILLERS = ("0", " ", "\t", "a", "A", ".", "-", ":", "/", "_", "=", ",", "'", '"', "0.", "0 ", " 0", "a ",
           "a.", "0:", ", ", "=0", "x0", "\\", "|", "#", "*", "(", ")", "[", "]", "{", "}", "<", ">")


# ---------------------------------------------------------------------------------------------
# static check

def _charset(op, av, c) -> Optional[set]:
    """The characters one item can start with, as a set of (kind, value) markers; None = any."""
    if op is c.LITERAL:
        return {chr(av)}
    if op is c.ANY:
        return None
    if op is c.NOT_LITERAL:
        return (_PRINTABLE - {chr(av)}) | {_OTHER}
    if op is c.IN:
        if av and av[0][0] is c.NEGATE:
            excluded = _charset(c.IN, av[1:], c)
            return None if excluded is None else (_PRINTABLE - excluded) | {_OTHER}
        out: set = set()
        for sub_op, sub_av in av:
            if sub_op is c.NEGATE:
                return None
            if sub_op is c.LITERAL:
                out.add(chr(sub_av))
            elif sub_op is c.RANGE:
                lo, hi = sub_av
                if hi - lo > 512:
                    return None
                out.update(chr(x) for x in range(lo, hi + 1))
            elif sub_op is c.CATEGORY:
                out |= _CATEGORY_CHARS.get(sub_av, set()) or {("cat", sub_av)}
        return out
    if op is c.SUBPATTERN:
        return _first_chars(av[-1], c)
    if op is c.BRANCH:
        out = set()
        for branch in av[1]:
            s = _first_chars(branch, c)
            if s is None:
                return None
            out |= s
        return out
    if op in _repeat_ops(c):
        return _first_chars(av[2], c)
    return set()


def _first_chars(items, c) -> Optional[set]:
    out: set = set()
    for op, av in items:
        if op is c.AT or op is c.ASSERT or op is c.ASSERT_NOT:
            continue
        s = _charset(op, av, c)
        if s is None:
            return None
        out |= s
        if not _can_be_empty(op, av, c):
            break
    return out


def _all_chars(items, c) -> Optional[set]:
    """Every character the items can match anywhere (None = any)."""
    out: set = set()
    for op, av in items:
        if op is c.AT or op is c.ASSERT or op is c.ASSERT_NOT:
            continue
        if op is c.SUBPATTERN:
            s = _all_chars(av[-1], c)
        elif op is c.BRANCH:
            s = set()
            for branch in av[1]:
                b = _all_chars(branch, c)
                if b is None:
                    return None
                s |= b
        elif op in _repeat_ops(c):
            s = _all_chars(av[2], c)
        else:
            s = _charset(op, av, c)
        if s is None:
            return None
        out |= s
    return out


def _repeat_ops(c) -> tuple:
    # possessive repeats (`\\d++`) give nothing back, so they cannot be split two ways: not listed
    return tuple(x for x in (c.MAX_REPEAT, c.MIN_REPEAT) if x is not None)


def _can_be_empty(op, av, c) -> bool:
    if op in _repeat_ops(c):
        return av[0] == 0 or all(_can_be_empty(o, a, c) for o, a in av[2])
    if op is c.SUBPATTERN:
        return all(_can_be_empty(o, a, c) for o, a in av[-1])
    if op is c.BRANCH:
        return any(all(_can_be_empty(o, a, c) for o, a in b) for b in av[1])
    return op is c.AT or op is c.ASSERT or op is c.ASSERT_NOT


def _has_unbounded(items, c) -> bool:
    for op, av in items:
        if op in _repeat_ops(c) and av[1] >= UNBOUNDED:
            return True
        if op is c.SUBPATTERN and _has_unbounded(av[-1], c):
            return True
        if op is c.BRANCH and any(_has_unbounded(b, c) for b in av[1]):
            return True
        if op in _repeat_ops(c) and _has_unbounded(av[2], c):
            return True
    return False


def _ambiguous_body(body, c) -> bool:
    """A repeated body that holds an unbounded repeat and nothing required that the inner repeat
    cannot match: `(a+)+`, `(\\s*x?)*` (many splits); `(?:[\\w-]+, )*` is fine (the `,` ends each)."""
    if not _has_unbounded(body, c):
        return False
    inner = _all_chars(body, c)
    for op, av in body:
        if _can_be_empty(op, av, c) or op in _repeat_ops(c):
            continue
        if op is c.SUBPATTERN and _ambiguous_body(av[-1], c):
            return True
        first = _charset(op, av, c)
        if not _overlap(first, _unbounded_chars(body, c)):
            return False
    return inner is None or True


def _unbounded_chars(items, c) -> Optional[set]:
    """The characters of the unbounded repeats inside the items (None = any)."""
    out: set = set()
    for op, av in items:
        if op in _repeat_ops(c) and av[1] >= UNBOUNDED:
            s = _all_chars(av[2], c)
            if s is None:
                return None
            out |= s
        elif op is c.SUBPATTERN:
            s = _unbounded_chars(av[-1], c)
            if s is None:
                return None
            out |= s
        elif op is c.BRANCH:
            for b in av[1]:
                s = _unbounded_chars(b, c)
                if s is None:
                    return None
                out |= s
        elif op in _repeat_ops(c):
            s = _unbounded_chars(av[2], c)
            if s is None:
                return None
            out |= s
    return out


def _overlap(a: Optional[set], b: Optional[set]) -> bool:
    if a is None or b is None:
        return bool(a is None and b is None) or bool(a or b)
    return bool(a & b)


def _branches_overlap(branches, c) -> bool:
    firsts = [_first_chars(b, c) for b in branches]
    for i in range(len(firsts)):
        for j in range(i + 1, len(firsts)):
            if _overlap(firsts[i], firsts[j]):
                return True
    return False


def static_problems(pattern: str) -> list[str]:
    """Nested or overlapping unbounded quantifiers in `pattern`, one message each; [] when none."""
    parser, c = _parser(), _constants()
    try:
        parsed = parser.parse(pattern)
    except Exception:  # noqa: BLE001 - the compile check reports syntax
        return []
    problems: list[str] = []

    def walk(items) -> None:
        items = list(items)
        # adjacent unbounded repeats that share characters, with only optional items between
        open_runs: list[Optional[set]] = []  # charsets of unbounded repeats still "open"
        prev_literal = False
        for op, av in items:
            if op is not c.LITERAL and op is not c.AT:
                prev_literal = False
            if op in _repeat_ops(c):
                lo, hi, body = av
                if hi >= UNBOUNDED and _ambiguous_body(body, c):
                    problems.append(f"nested quantifier: a repeat inside an unbounded repeat "
                                    f"({_show(pattern)}); bound the inner or the outer one")
                elif hi >= UNBOUNDED and len(body) == 1 and body[0][0] is c.SUBPATTERN and \
                        any(o is c.BRANCH for o, _ in body[0][1][-1]) and \
                        any(_branches_overlap(a[1], c) for o, a in body[0][1][-1] if o is c.BRANCH):
                    problems.append(f"overlapping alternatives under an unbounded repeat ({_show(pattern)})")
                elif hi >= UNBOUNDED and len(body) == 1 and body[0][0] is c.BRANCH and _branches_overlap(body[0][1][1], c):
                    problems.append(f"overlapping alternatives under an unbounded repeat ({_show(pattern)})")
                chars = _all_chars(body, c)
                if hi >= UNBOUNDED:
                    if any(_overlap(prev, chars) for prev in open_runs):
                        problems.append(f"overlapping quantifiers: two unbounded repeats can match the same "
                                        f"characters with nothing required between them ({_show(pattern)})")
                    if lo > 0:
                        open_runs = [chars]
                    else:
                        open_runs.append(chars)
                    walk(body)
                    continue
                walk(body)
                if lo > 0:
                    open_runs = []  # something required between two runs decides where one ends
                continue
            if op is c.SUBPATTERN:
                walk(av[-1])
                if not _can_be_empty(op, av, c):
                    open_runs = []
                continue
            if op is c.BRANCH:
                for b in av[1]:
                    walk(b)
                if not _can_be_empty(op, av, c):
                    open_runs = []
                continue
            if op is c.ASSERT or op is c.ASSERT_NOT:
                walk(av[1])  # a lookahead's own runs (`(?!\\s*[= ]\\s*...)`) are searched too
                continue
            if op is c.AT:
                continue
            chars = _charset(op, av, c)
            if op is c.LITERAL and prev_literal:
                open_runs = []  # two required characters in a row (a word) decide where a run ends
            else:
                # one required character that a run before it can also match keeps it open (`\\s*\\s\\s*`)
                open_runs = [r for r in open_runs if _overlap(r, chars)]
            prev_literal = op is c.LITERAL
            continue

    walk(parsed)
    problems.extend(_alternatives_problems(pattern))
    return list(dict.fromkeys(problems))


def _groups(pattern: str) -> Iterable[tuple[str, str]]:
    """(group body, quantifier after it) for each parenthesised group, as written (the parser
    merges `(a|a)` into one literal and `(\\w|\\d)` into one class, hiding what the `regex` engine
    will backtrack over)."""
    stack: list[int] = []
    for i, ch in regex_structure(pattern):
        if ch == "(":
            stack.append(i)
        elif ch == ")" and stack:
            start = stack.pop()
            body = pattern[start + 1:i]
            if body.startswith("?P<"):
                body = body[body.find(">") + 1:]
            elif body.startswith("?"):
                body = body[body.index(":") + 1:] if body[1:2] in (":", "P", "i", "s", "m", "x", "a", "u", "L") and ":" in body[:12] else ""
            yield body, pattern[i + 1:i + 8]


def _alternatives_problems(pattern: str) -> list[str]:
    """Alternatives under an unbounded repeat that can start with the same character: `(a|a)+`,
    `(\\w|\\d)*` make the matcher try every way of splitting a run between them."""
    import re as std_re

    parser, c = _parser(), _constants()
    for body, after in _groups(pattern):
        if not std_re.match(r"(?:[+*]|\{\d*,\})", after):
            continue
        alts = split_alternatives(body)
        if len(alts) < 2:
            continue
        firsts = []
        for alt in alts:
            try:
                items = list(parser.parse(alt))
            except Exception:  # noqa: BLE001
                return []
            if all(_can_be_empty(op, av, c) for op, av in items):
                firsts.append(None)  # an empty alternative overlaps everything
            else:
                firsts.append(_first_chars(items, c))
        for a in range(len(firsts)):
            for b in range(a + 1, len(firsts)):
                if firsts[a] is None or firsts[b] is None or firsts[a] & firsts[b]:
                    return [f"overlapping alternatives under an unbounded repeat: {alts[a]!r} and {alts[b]!r} "
                            f"can start alike ({_show(pattern)})"]
    return []


def _show(pattern: str) -> str:
    return repr(pattern if len(pattern) <= 80 else pattern[:77] + "...")


# the characters of the categories a log pattern uses, so that \d and \s are disjoint; _OTHER stands
# for every character outside printable ASCII (in every negated class)
_CATEGORY_CHARS: dict = {}
_PRINTABLE = frozenset({chr(x) for x in range(32, 127)} | set(" \t\n\r\f\v"))
_OTHER = ("other",)


def _init_categories() -> None:
    c = _constants()
    digits = set("0123456789")
    space = set(" \t\n\r\f\v")
    word = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
    other = {_OTHER}
    _CATEGORY_CHARS.update({
        c.CATEGORY_DIGIT: digits, c.CATEGORY_SPACE: space, c.CATEGORY_WORD: word | other,
        c.CATEGORY_NOT_DIGIT: (_PRINTABLE - digits) | other, c.CATEGORY_NOT_SPACE: (_PRINTABLE - space) | other,
        c.CATEGORY_NOT_WORD: (_PRINTABLE - word) | other,
    })


_init_categories()


# ---------------------------------------------------------------------------------------------
# pump strings and the timed check

def _prefixes(pattern: str) -> list[str]:
    lits = derive_literals(pattern) or []
    out = [text for text, _ in lits][:3]
    return out or [""]


def pump_strings(pattern: str, length: int = PUMP_CHARS) -> Iterable[str]:
    """Strings that make a backtracking matcher try many splits: each of the pattern's literals
    followed (and preceded) by a long run of one filler, ending in a character nothing expects."""
    for prefix in _prefixes(pattern):
        for filler in FILLERS:
            run = filler * max(1, (length - len(prefix)) // len(filler))
            yield prefix + run + "\x00"
            yield run + prefix + "\x00"
            unit = prefix + filler * 8
            yield unit * max(1, length // max(1, len(unit))) + "\x00"


def worst_time_s(compiled, pattern: str, length: int = PUMP_CHARS, timeout_s: float = PUMP_TIMEOUT_S) -> tuple[float, str]:
    """The slowest search of `compiled` over the pump strings of `pattern`: (seconds per 1,000
    characters, the pump), stopping at the first search that hits the timeout."""
    timed = []
    for text in pump_strings(pattern, length):
        spent = _search_time(compiled, text, timeout_s)
        if spent is None:
            return timeout_s * 1000 / len(text), text
        timed.append((spent * 1000 / len(text), text))
    timed.sort(reverse=True)
    worst, worst_text = 0.0, ""
    for _, text in timed[:3]:  # the slowest again, best of three: a busy machine adds noise, never removes it
        spent = min(_search_time(compiled, text, timeout_s) or timeout_s for _ in range(3)) * 1000 / len(text)
        if spent > worst:
            worst, worst_text = spent, text
    return worst, worst_text


def _search_time(compiled, text: str, timeout_s: float) -> Optional[float]:
    """CPU seconds of one search (this process only: other jobs on the machine do not count);
    None when it ran past the timeout."""
    started = time.process_time()
    if isinstance(compiled, re.Pattern):  # the built-in library's engine: no timeout (see timed_regex_problems)
        compiled.search(text)
        took = time.process_time() - started
        return None if took > timeout_s else took
    try:
        compiled.search(text, timeout=timeout_s)
    except TimeoutError:
        return None
    return time.process_time() - started


_TIMED: dict = {}  # (pattern, length, budget) -> problems: lint runs several times in one process


def timed_problems(compiled, pattern: str, length: int = PUMP_CHARS,
                   budget_s_per_1000: float = LINT_BUDGET_S_PER_1000) -> list[str]:
    """The timed check of `rules lint`: a search over a pump string that takes more CPU time than
    the budget (per 1,000 characters) refuses the pattern; a linear pattern costs a few
    milliseconds in all."""
    key = (pattern, length, budget_s_per_1000, compiled.__class__)  # timed once per engine
    if key not in _TIMED:
        _TIMED[key] = _timed_problems(compiled, pattern, length, budget_s_per_1000)
    return list(_TIMED[key])


def _timed_problems(compiled, pattern: str, length: int, budget_s_per_1000: float) -> list[str]:
    budget_s = budget_s_per_1000 * length / 1000
    for text in pump_strings(pattern, length):
        # CPU time against the budget; the wall-clock timeout (20x) only stops a runaway, so a busy
        # machine cannot fail a linear pattern
        spent = _search_time(compiled, text, max(0.2, 20 * budget_s))
        for _ in range(2):  # over budget once can be a busy core (caches, clocks): a runaway stays over
            if spent is None or spent <= budget_s:
                break
            again = _search_time(compiled, text, max(0.2, 20 * budget_s))
            spent = again if again is not None and again < spent else spent
        if spent is None or spent > budget_s:
            return [f"runaway regex: a {len(text):,}-character input ({text[:24]!r}...) took more than "
                    f"{budget_s * 1000:.0f} ms ({_show(pattern)}); bound its repeats"]
    return []


def timed_regex_problems(rules: list) -> list[str]:
    """The timed half of the runaway-regex check (the static half runs when a rule is built):
    every regex of every rule against the pump strings, one line per pattern refused. Each pattern is
    timed in both engines: the `regex` engine first (its timeout stops a runaway), then, when that
    passed, the standard `re` engine that the built-in library matches with (rules.model._compile_vetted)."""
    from loradoctor.logs.rules.model import _compile_vetted

    problems = []
    for rule in rules:
        for fname, compiled in (("patterns", rule.compiled_patterns), ("require_all", rule.compiled_require),
                                ("exclude", rule.compiled_exclude)):
            sources = getattr(rule, fname)
            for i, regex in enumerate(compiled):
                found = timed_problems(regex, sources[i])
                if not found and not isinstance(regex, re.Pattern):
                    found = timed_problems(_compile_vetted(sources[i]), sources[i])
                problems.extend(f"{rule.source}: rule {rule.id}: {fname}[{i}]: {p}" for p in found)
    return problems
