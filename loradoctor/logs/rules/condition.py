"""The condition language of a rule's `when:` and of a fix's `when:` / `unless:` (a rule's fixes and the
cause catalogue's alike): a safe subset of Python expressions over fact names (comparisons, and/or/not,
+ - * /, `defined(...)`, `any_of(...)`, sizes such as `2 GiB`), parsed and checked once, evaluated against
the facts, and described with their values. `compile_fix_conditions` and `fixes_that_apply` are the one
place where a fix's conditions are compiled and where the fixes that apply are picked."""

from __future__ import annotations

import ast
import math
import operator
import re
from typing import AbstractSet, Any, Iterable, Mapping, Optional, Sequence, TypeVar

from loradoctor.logs.factnames import KNOWN_FACT_SET
from loradoctor.logs.rules.templates import format_value
from loradoctor.units import format_bytes, parse_size


class _Missing:
    """A fact the input did not show: comparisons with it are false, arithmetic stays missing."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "missing"


MISSING = _Missing()

_SIZE_LITERAL_RE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*(KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b")
_STRING_SPLIT_RE = re.compile(r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")
_CMP = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
        ast.Eq: operator.eq, ast.NotEq: operator.ne,
        ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_CMP_TEXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
             ast.In: "in", ast.NotIn: "not in"}
_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_HELPERS = ("defined", "any_of")
_CONSTANT_NAMES = {"true": True, "false": False, "True": True, "False": False, "none": None, "None": None}


def _expand_sizes(expr: str) -> str:
    """`1GiB` -> `1073741824` outside string literals; line breaks become spaces there, so that a
    condition may span lines (YAML block scalars)."""
    parts = _STRING_SPLIT_RE.split(expr)
    for i in range(0, len(parts), 2):
        text = parts[i].replace("\r", " ").replace("\n", " ")
        parts[i] = _SIZE_LITERAL_RE.sub(lambda m: str(parse_size(m.group(1) + m.group(2))), text)
    return "".join(parts)


def _dotted(node: ast.AST) -> Optional[str]:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


class ConditionError(ValueError):
    pass


MAX_MAGNITUDE = 1e30  # a result beyond this (or not finite) is no fact about a training run: missing
_OP_TEXT = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bounded(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return MISSING
    return value if abs(value) <= MAX_MAGNITUDE else MISSING


def _numeric_operand(node: ast.AST, op: str) -> None:
    """Refuse at load time what evaluation would refuse: arithmetic on a string, a list, a truth
    value or a comparison. Fact names and numbers (and arithmetic on them) pass; a fact that turns
    out not to be a number makes the arithmetic missing at evaluation."""
    if isinstance(node, ast.Constant) and _is_number(node.value):
        return
    if isinstance(node, (ast.Attribute, ast.BinOp)):
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return
    what = {ast.Constant: "a constant", ast.List: "a list", ast.Tuple: "a list", ast.Compare: "a comparison",
            ast.BoolOp: "an and/or", ast.Call: "a helper call", ast.UnaryOp: "a not"}.get(type(node), "this")
    if isinstance(node, ast.Constant):
        what = "a string" if isinstance(node.value, str) else f"the constant {node.value!r}"
    raise ConditionError(f"arithmetic ({op}) only between numbers and fact names, not {what}: {ast.unparse(node)[:40]!r}")


class Condition:
    """A compiled `when` expression. Only the constructs of docs/rules.md are accepted: fact names,
    numbers (with size units), strings, lists, and/or/not, comparisons, in, + - * /, and the
    helpers defined(fact) and any_of(a, b). Anything else (calls, subscripts, lambdas, dunder
    attributes) is rejected at load time, so evaluation never runs user code. `known` is the set of fact
    names it may use (the log's facts, docs/facts.md; the catalogue's fix conditions pass the env checks'
    `check.*` facts) and `hint` says where they are listed in the unknown-fact error."""

    def __init__(self, expr: str, known: AbstractSet[str] = KNOWN_FACT_SET, hint: str = "see docs/facts.md"):
        self.expr = expr
        self.known, self.hint = known, hint
        try:
            self.tree = ast.parse(_expand_sizes(expr.strip()), mode="eval")
        except SyntaxError as exc:
            raise ConditionError(f"cannot parse {expr!r}: {exc.msg}") from None
        self.facts: list[str] = []  # every fact name used
        self.value_facts: list[str] = []  # facts whose values matter (not only defined())
        self._check(self.tree.body, in_defined=False)

    def _add_fact(self, name: str, in_defined: bool) -> None:
        if name not in self.known:
            raise ConditionError(f"unknown fact {name!r} ({self.hint})")
        if name not in self.facts:
            self.facts.append(name)
        if not in_defined and name not in self.value_facts:
            self.value_facts.append(name)

    def _check(self, node: ast.AST, in_defined: bool) -> None:
        if isinstance(node, ast.BoolOp):
            for v in node.values:
                self._check(v, in_defined)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
            if not isinstance(node.op, ast.Not):
                _numeric_operand(node.operand, "-" if isinstance(node.op, ast.USub) else "+")
            self._check(node.operand, in_defined)
        elif isinstance(node, ast.Compare):
            for op in node.ops:
                if type(op) not in _CMP:
                    raise ConditionError(f"operator {type(op).__name__} is not allowed")
            for sub in [node.left, *node.comparators]:
                self._check(sub, in_defined)
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BIN:
                raise ConditionError(f"operator {type(node.op).__name__} is not allowed (use + - * /)")
            for side in (node.left, node.right):
                _numeric_operand(side, _OP_TEXT[type(node.op)])
            self._check(node.left, in_defined)
            self._check(node.right, in_defined)
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float, str, bool, type(None))):
                raise ConditionError(f"constant {node.value!r} is not allowed")
        elif isinstance(node, (ast.List, ast.Tuple)):
            for elt in node.elts:
                self._check(elt, in_defined)
        elif isinstance(node, ast.Name):
            if node.id not in _CONSTANT_NAMES:
                raise ConditionError(f"unknown name {node.id!r}: facts have a group and a name, like oom.requested_bytes")
        elif isinstance(node, ast.Attribute):
            name = _dotted(node)
            if name is None or "__" in name:
                raise ConditionError("only fact names like oom.requested_bytes may use dots")
            self._add_fact(name, in_defined)
        elif isinstance(node, ast.Call):
            func = node.func.id if isinstance(node.func, ast.Name) else None
            if func not in _HELPERS or node.keywords:
                shown = func or ast.unparse(node.func)
                raise ConditionError(f"call to {shown!r} is not allowed (only defined() and any_of())")
            if func == "defined":
                if len(node.args) != 1 or _dotted(node.args[0]) is None:
                    raise ConditionError("defined() takes one fact name")
                self._add_fact(_dotted(node.args[0]), in_defined=True)  # type: ignore[arg-type]
            else:
                if len(node.args) != 2:
                    raise ConditionError("any_of() takes two lists")
                for a in node.args:
                    self._check(a, in_defined)
        else:
            raise ConditionError(f"{type(node).__name__} is not allowed in a condition")

    # evaluation -------------------------------------------------------------------------------
    def evaluate(self, facts: Mapping[str, Any]) -> bool:
        return bool(self._eval(self.tree.body, facts))

    def _eval(self, node: ast.AST, facts: Mapping[str, Any]) -> Any:
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                return all(self._eval(v, facts) for v in node.values)
            return any(self._eval(v, facts) for v in node.values)
        if isinstance(node, ast.UnaryOp):
            value = self._eval(node.operand, facts)
            if isinstance(node.op, ast.Not):
                return not value
            if not _is_number(value):
                return MISSING
            return _bounded(-value if isinstance(node.op, ast.USub) else +value)
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, facts)
            for op, comp in zip(node.ops, node.comparators):
                right = self._eval(comp, facts)
                if left is MISSING or right is MISSING:
                    return False
                try:
                    if not _CMP[type(op)](left, right):
                        return False
                except TypeError:
                    return False
                left = right
            return True
        if isinstance(node, ast.BinOp):
            a, b = self._eval(node.left, facts), self._eval(node.right, facts)
            if not (_is_number(a) and _is_number(b)):
                return MISSING  # arithmetic only between numbers: never 'x' * 10**10 or [0] * 10**12
            try:
                return _bounded(_BIN[type(node.op)](a, b))
            except (ZeroDivisionError, OverflowError):
                return MISSING
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self._eval(e, facts) for e in node.elts]
        if isinstance(node, ast.Name):
            return _CONSTANT_NAMES[node.id]
        if isinstance(node, ast.Attribute):
            value = facts.get(_dotted(node), MISSING)  # type: ignore[arg-type]
            return MISSING if value is None else value
        if isinstance(node, ast.Call):
            if node.func.id == "defined":  # type: ignore[attr-defined]
                return facts.get(_dotted(node.args[0])) is not None  # type: ignore[arg-type]
            a, b = (self._eval(x, facts) for x in node.args)
            if a is MISSING or b is MISSING:
                return False
            a = a if isinstance(a, (list, tuple, set)) else [a]
            b = b if isinstance(b, (list, tuple, set)) else [b]
            return any(x in b for x in a)
        raise ConditionError(f"cannot evaluate {type(node).__name__}")  # pragma: no cover

    def describe(self, facts: Mapping[str, Any]) -> str:
        """The condition with the values it saw: `9.20 GiB reserved_unallocated >= 4.40 GiB requested`."""
        def show(node: ast.AST) -> str:
            name = _dotted(node) if isinstance(node, ast.Attribute) else None
            if name:
                value = facts.get(name)
                return f"{name.split('.', 1)[1]} {format_value(name, value) if value is not None else '?'}"
            if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and node.value >= 1 << 20:
                return format_bytes(node.value)
            if isinstance(node, ast.BinOp):
                return f"{show(node.left)} {_bin_symbol(node.op)} {show(node.right)}"
            return ast.unparse(node)

        parts = []
        compared = False
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Compare):
                compared = True
                names = [_dotted(n) for n in ast.walk(node) if isinstance(n, ast.Attribute)]
                if any(facts.get(n) is None for n in names if n):
                    continue  # a comparison on a fact the input lacks was false: no reason, and no `?`
                text = show(node.left)
                for op, comp in zip(node.ops, node.comparators):
                    text += f" {_CMP_TEXT[type(op)]} {show(comp)}"
                parts.append(text)
        return "; ".join(parts) if parts or compared else self.expr

    def held_parts(self, facts: Mapping[str, Any], limit: int) -> tuple[list[str], bool]:
        """The comparisons that held on numeric facts, each described with its values (`describe`),
        in reading order, without repeats and without those under a `not` (those held because the
        rule's exception did not apply): at most `limit`, and whether more held."""
        parts: list[str] = []
        for node in _held_comparisons(self.tree.body):
            names = [_dotted(n) for n in ast.walk(node) if isinstance(n, ast.Attribute)]
            if not any(isinstance(facts.get(n), (int, float)) and not isinstance(facts.get(n), bool)
                       for n in names if n):
                continue
            try:
                held = bool(self._eval(node, facts))
            except Exception:  # noqa: BLE001 - a part that cannot be shown is left out
                held = False
            if not held:
                continue
            try:
                text = Condition(ast.unparse(node), self.known, self.hint).describe(facts)
            except ConditionError:
                continue
            if text in parts:
                continue
            if len(parts) == limit:
                return parts, True
            parts.append(text)
        return parts, False


# ------------------------------------------------------------------ conditions on a fix

_T = TypeVar("_T")
FixConditions = tuple  # per fix: (when, unless), each a Condition or None


def compile_fix_conditions(sources: Sequence[tuple[Optional[str], Optional[str]]],
                           known: AbstractSet[str] = KNOWN_FACT_SET, hint: str = "see docs/facts.md",
                           problems: Optional[list] = None) -> list[FixConditions]:
    """Per fix, its `when:` and `unless:` sources (None or empty: none) compiled to Conditions over the names in
    `known`. A bad one is a problem `fixes[i].when: ...` appended to `problems` (and left None), or, without a
    list, a ConditionError with that text. Rules (logs/rules/model.py) and the cause catalogue both compile here."""
    out = []
    for i, pair in enumerate(sources):
        compiled = []
        for key, source in zip(("when", "unless"), pair):
            cond = None
            if source:
                try:
                    cond = Condition(source, known, hint)
                except ConditionError as exc:
                    if problems is None:
                        raise ConditionError(f"fixes[{i}].{key}: {exc}") from None
                    problems.append(f"fixes[{i}].{key}: {exc}")
            compiled.append(cond)
        out.append((compiled[0], compiled[1]))
    return out


def fixes_that_apply(fixes: Sequence[_T], conditions: Sequence[FixConditions], facts: Mapping[str, Any]) -> list[_T]:
    """The one place that picks the fixes that apply, for a rule's fixes and the catalogue's alike: a fix is kept
    when its `when` holds (or it has none) and its `unless` does not (or it has none). `conditions` holds one
    (when, unless) pair per fix, from compile_fix_conditions."""
    if len(conditions) != len(fixes):
        raise ValueError(f"{len(fixes)} fixes but {len(conditions)} condition pairs")
    return [fix for fix, (when, unless) in zip(fixes, conditions)
            if (when is None or when.evaluate(facts)) and (unless is None or not unless.evaluate(facts))]


def _held_comparisons(node: ast.AST, negated: bool = False) -> Iterable[ast.Compare]:
    """The comparisons of a `when`, in reading order, that are not under a `not` (a comparison
    inside `not (...)` that holds is the part that did NOT make the rule fire)."""
    if isinstance(node, ast.Compare):
        if not negated:
            yield node
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        negated = True
    for child in ast.iter_child_nodes(node):
        yield from _held_comparisons(child, negated)


def _bin_symbol(op: ast.operator) -> str:
    return {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}[type(op)]

