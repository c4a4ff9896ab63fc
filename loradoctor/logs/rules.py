"""The rule library: load, validate and compile YAML rules (docs/rules.md).

Rules are validated against `rules/schema.json` by a small validator here (jsonschema is not a
runtime dependency), then checked further: cause ids (the schema's enum, which mirrors
docs/causes.md), repro ids, unique ids across folders, regexes that compile, `when` expressions
that parse and use known fact names, template placeholders that exist. Problems become one-line
`UserError`s naming the file, the rule id and the field.

Also here: the safe condition evaluator (`Condition`) and the summary template renderer.
"""

from __future__ import annotations

import ast
import difflib
import fnmatch
import json
import math
import operator
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from loradoctor.errors import UserError
from loradoctor.findings import Fix, confidence_value
from loradoctor.logs.factnames import BYTES_FACTS, FRACTION_FACTS, KNOWN_FACT_SET
from loradoctor.units import format_bytes, gib, parse_size

MIN_DERIVED_LITERAL = 3  # a derived prefilter literal shorter than this would match everywhere


# ---------------------------------------------------------------------------------------------
# where the rules live

def builtin_rules_dir() -> Path:
    """The shipped rules: the installed `loradoctor.rules` package, or `rules/` in a checkout."""
    try:
        from importlib.resources import files

        path = Path(str(files("loradoctor.rules")))
        if path.is_dir():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    import loradoctor

    return Path(loradoctor.__file__).resolve().parent.parent / "rules"


@lru_cache(maxsize=1)
def load_schema() -> dict:
    path = builtin_rules_dir() / "schema.json"
    with open(path, encoding="utf-8") as fh:
        schema = json.load(fh)
    props = schema["$defs"]["rule"]["properties"]  # the enums come from the cause catalogue, not the file
    props["cause"]["enum"], props["repro"]["enum"] = cause_ids(), repro_ids()
    return schema


def cause_ids() -> list[str]:
    """The root-cause ids (loradoctor/data/causes.yaml)."""
    from loradoctor import catalogue

    return catalogue.cause_ids()


def repro_ids() -> list[str]:
    from loradoctor import catalogue

    return catalogue.repro_ids()


# ---------------------------------------------------------------------------------------------
# a small JSON Schema validator (the subset rules/schema.json uses)

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def validate_schema(value: Any, schema: dict, root: Optional[dict] = None, path: str = "") -> list[tuple[str, str]]:
    """Return (path, message) pairs for every violation; [] when valid."""
    root = root or schema
    if "$ref" in schema:
        ref = schema["$ref"]
        target: Any = root
        for part in ref.lstrip("#/").split("/"):
            target = target[part]
        return validate_schema(value, target, root, path)
    errors: list[tuple[str, str]] = []
    if "anyOf" in schema:
        options = [validate_schema(value, s, root, path) for s in schema["anyOf"]]
        if all(options):
            errors.append((path, f"{value!r} is not valid here ({schema.get('description', 'see the schema')})"))
        return errors
    typ = schema.get("type")
    if typ and not _TYPES[typ](value):
        return [(path, f"must be {'an' if typ[0] in 'aeiou' else 'a'} {typ}, not {type(value).__name__} {value!r}")]
    if "enum" in schema and value not in schema["enum"]:
        shown = ", ".join(map(str, schema["enum"]))
        if len(shown) > 200:
            shown = shown[:200] + "..."
        errors.append((path, f"{value!r} is not one of: {shown}"))
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errors.append((path, "must not be empty" if schema["minLength"] == 1 else f"must be at least {schema['minLength']} characters"))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append((path, f"{value!r} does not match {schema['pattern']}"))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append((path, f"{value} is below {schema['minimum']}"))
        if "maximum" in schema and value > schema["maximum"]:
            errors.append((path, f"{value} is above {schema['maximum']}"))
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                errors.append((f"{path}.{key}" if path else key, "is required"))
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            if key in props:
                errors.extend(validate_schema(item, props[key], root, sub))
            elif schema.get("additionalProperties") is False:
                close = difflib.get_close_matches(str(key).lower(), list(props), n=1, cutoff=0.75)
                hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(props)})"
                errors.append((sub, f"unknown field{hint}"))
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors.extend(validate_schema(item, schema["items"], root, f"{path}[{i}]"))
    return errors


# ---------------------------------------------------------------------------------------------
# conditions

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


class Condition:
    """A compiled `when` expression. Only the constructs of docs/rules.md are accepted: fact names,
    numbers (with size units), strings, lists, and/or/not, comparisons, in, + - * /, and the
    helpers defined(fact) and any_of(a, b). Anything else (calls, subscripts, lambdas, dunder
    attributes) is rejected at load time, so evaluation never runs user code."""

    def __init__(self, expr: str):
        self.expr = expr
        try:
            self.tree = ast.parse(_expand_sizes(expr.strip()), mode="eval")
        except SyntaxError as exc:
            raise ConditionError(f"cannot parse {expr!r}: {exc.msg}") from None
        self.facts: list[str] = []  # every fact name used
        self.value_facts: list[str] = []  # facts whose values matter (not only defined())
        self._check(self.tree.body, in_defined=False)

    def _add_fact(self, name: str, in_defined: bool) -> None:
        if name not in KNOWN_FACT_SET:
            raise ConditionError(f"unknown fact {name!r} (see docs/facts.md)")
        if name not in self.facts:
            self.facts.append(name)
        if not in_defined and name not in self.value_facts:
            self.value_facts.append(name)

    def _check(self, node: ast.AST, in_defined: bool) -> None:
        if isinstance(node, ast.BoolOp):
            for v in node.values:
                self._check(v, in_defined)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
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
            if value is MISSING:
                return MISSING
            try:
                return -value if isinstance(node.op, ast.USub) else +value
            except TypeError:
                return MISSING
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
            if a is MISSING or b is MISSING:
                return MISSING
            try:
                return _BIN[type(node.op)](a, b)
            except (TypeError, ZeroDivisionError, OverflowError):
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
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Compare):
                text = show(node.left)
                for op, comp in zip(node.ops, node.comparators):
                    text += f" {_CMP_TEXT[type(op)]} {show(comp)}"
                parts.append(text)
        return "; ".join(parts) if parts else self.expr


def _bin_symbol(op: ast.operator) -> str:
    return {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}[type(op)]


# ---------------------------------------------------------------------------------------------
# templates

_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][\w.]*)(?:\|([a-z]+))?\}")
FILTERS = ("bytes", "gib", "pct")


def format_value(name: str, value: Any, filt: Optional[str] = None) -> str:
    """How a fact prints in summaries and explanations."""
    if value is None:
        return "?"
    if filt == "bytes" or (filt is None and name in BYTES_FACTS and isinstance(value, (int, float))):
        return format_bytes(value) if isinstance(value, (int, float)) else str(value)
    if filt == "gib":
        return gib(value) if isinstance(value, (int, float)) else str(value)
    if filt == "pct" or (filt is None and name in FRACTION_FACTS):
        return f"{100 * value:.0f}%" if isinstance(value, (int, float)) else str(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        return f"{value:.4g}"
    if isinstance(value, (list, tuple, set)):
        return ", ".join(str(v) for v in value)
    return str(value)


def template_placeholders(template: str) -> list[tuple[str, Optional[str]]]:
    return [(m.group(1), m.group(2)) for m in _PLACEHOLDER_RE.finditer(template)]


def check_template(template: str) -> list[str]:
    """Problems with a summary template's placeholders."""
    problems = []
    for name, filt in template_placeholders(template):
        if filt is not None and filt not in FILTERS:
            problems.append(f"unknown filter |{filt} in {{{name}|{filt}}} (use {', '.join(FILTERS)})")
        if name.startswith("match."):
            continue
        if name not in KNOWN_FACT_SET:
            problems.append(f"unknown fact {{{name}}} (see docs/facts.md)")
    return problems


_OPTIONAL_RE = re.compile(r"\[\[(.*?)\]\]", re.S)


def render_template(template: str, facts: Mapping[str, Any], match: Any = None) -> str:
    """Fill `{fact.name|filter}` and `{match.N}` / `{match.name}`; a missing value prints `?`,
    except inside `[[ ... ]]`, an optional part left out whole when any value in it is missing
    (`[[ (joined {match.1} of {match.2})]]`)."""
    missing: list[bool] = []

    def fill(m: re.Match) -> str:
        name, filt = m.group(1), m.group(2)
        if name.startswith("match."):
            key = name[6:]
            value = None
            if match is not None:
                try:
                    value = match.group(int(key) if key.isdigit() else key)
                except (IndexError, KeyError, ValueError):
                    value = None
            if value is None:
                missing.append(True)
                return "?"
            return value
        if facts.get(name) is None:
            missing.append(True)
        return format_value(name, facts.get(name), filt)

    def optional(m: re.Match) -> str:
        missing.clear()
        text = _PLACEHOLDER_RE.sub(fill, m.group(1))
        return "" if missing else text

    text = _OPTIONAL_RE.sub(optional, template)
    text = _PLACEHOLDER_RE.sub(fill, text)
    return " ".join(text.split())


# ---------------------------------------------------------------------------------------------
# prefilter literals derived from patterns

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


# bytes that fill progress bars, metric dicts and timestamps: a literal made of them (and digits)
# would send most of a training log through the rule matcher
_COMMON_LOG_CHARS = frozenset("0123456789 %|/.:,[]<>_'\t")


def _informative_literal(text: str) -> bool:
    """A prefilter literal worth its cost: long enough, and with two characters beyond the digits and
    punctuation of progress bars, metric dicts and timestamps (' 43', '137' or '0000:' would send most
    of a training log through the matcher). One test for derived and explicit literals."""
    return len(text) >= MIN_DERIVED_LITERAL and sum(ch not in _COMMON_LOG_CHARS for ch in text) >= 2


def derive_literals(pattern: str) -> Optional[list[tuple[str, bool]]]:
    """Literals of which at least one occurs in every match of `pattern`, as (text, ignore_case);
    None when the pattern has no literal part long enough to look for."""
    parser, c = _parser(), _constants()
    try:
        parsed = parser.parse(pattern)
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


# ---------------------------------------------------------------------------------------------
# rules

@dataclass
class Rule:
    id: str
    cause: str
    title: str
    severity: str
    confidence: float
    summary: str
    patterns: list[str] = field(default_factory=list)
    prefilter: list[str] = field(default_factory=list)
    require_all: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    when: Optional[str] = None
    facts: list[str] = field(default_factory=list)
    fixes: list[Fix] = field(default_factory=list)
    repro: Optional[str] = None
    consequence_of: list[str] = field(default_factory=list)
    generic: bool = False
    references: list[str] = field(default_factory=list)
    falsepositives: str = ""
    docs: str = ""
    source: str = ""  # the file it came from
    # compiled forms (filled by compile_rule)
    compiled_patterns: list = field(default_factory=list, repr=False)
    compiled_require: list = field(default_factory=list, repr=False)
    compiled_exclude: list = field(default_factory=list, repr=False)
    condition: Optional[Condition] = field(default=None, repr=False)
    literals: list = field(default_factory=list, repr=False)  # (text, ignore_case) for patterns
    require_literals: list = field(default_factory=list, repr=False)  # per require_all regex
    exclude_literals: list = field(default_factory=list, repr=False)  # per exclude regex

    def is_consequence_of(self, cause: str) -> bool:
        return any(fnmatch.fnmatchcase(cause, glob) for glob in self.consequence_of)

    def to_dict(self) -> dict:
        return {
            "id": self.id, "cause": self.cause, "title": self.title, "severity": self.severity,
            "confidence": self.confidence, "patterns": self.patterns, "prefilter": self.prefilter,
            "require_all": self.require_all, "exclude": self.exclude, "when": self.when, "facts": self.facts,
            "summary": self.summary, "fixes": [{"text": f.text, "command": f.command} for f in self.fixes],
            "repro": self.repro, "consequence_of": self.consequence_of, "generic": self.generic,
            "references": self.references, "falsepositives": self.falsepositives, "docs": self.docs,
            "source": self.source,
        }


def _compile_regex(pattern: str):
    import regex

    return regex.compile(pattern, regex.V0)


class LazyRegexes:
    """A rule's compiled regexes, compiled on first use. The built-in rules (linted in CI) load this
    way, so `explain` on a short log does not pay for ~360 compilations it never needs; user rule
    folders and `rules lint` compile eagerly, so a bad regex is reported at load time."""

    __slots__ = ("sources", "_compiled")

    def __init__(self, sources: list[str]) -> None:
        self.sources = list(sources)
        self._compiled: list = [None] * len(self.sources)

    def __len__(self) -> int:
        return len(self.sources)

    def __getitem__(self, i: int):
        compiled = self._compiled[i]
        if compiled is None:
            compiled = self._compiled[i] = _compile_regex(self.sources[i])
        return compiled

    def __iter__(self):
        return (self[i] for i in range(len(self.sources)))


def _literals_for(patterns: list[str], explicit: list[str], field_name: str) -> tuple[list, list[str]]:
    """Prefilter literals for a list of regexes, and the problems found. Explicit literals are
    matched ignoring case (rule authors rely on `out of memory` finding `Out of memory`)."""
    if explicit:
        weak = [lit for lit in explicit if not _informative_literal(lit)]
        problems = [f"prefilter: {lit!r} is made of digits and punctuation every progress bar and metric "
                    f"line holds; give words every match contains" for lit in weak]
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


def build_rule(data: dict, source: str, eager: bool = True) -> tuple[Optional[Rule], list[str]]:
    """A compiled Rule from one validated YAML mapping, and the problems (field: message).
    eager=False defers regex compilation to first use (LazyRegexes)."""
    problems: list[str] = []
    try:
        confidence = confidence_value(data.get("confidence", "medium"))
    except (ValueError, TypeError) as exc:
        problems.append(f"confidence: {exc}")
        confidence = 0.5
    rule = Rule(
        id=data["id"], cause=data["cause"], title=data["title"], severity=data["severity"],
        confidence=confidence, summary=data["summary"], patterns=list(data.get("patterns", [])),
        prefilter=list(data.get("prefilter", [])), require_all=list(data.get("require_all", [])),
        exclude=list(data.get("exclude", [])), when=data.get("when"), facts=list(data.get("facts", [])),
        fixes=[Fix(text=f["text"], command=f.get("command")) for f in data.get("fixes", [])],
        repro=data.get("repro"), consequence_of=list(data.get("consequence_of", [])),
        generic=bool(data.get("generic", False)), references=list(data.get("references", [])),
        falsepositives=data.get("falsepositives", "") or "", docs=data.get("docs", "") or "", source=source,
    )
    for fname in ("patterns", "require_all", "exclude"):
        if not eager:
            setattr(rule, {"patterns": "compiled_patterns", "require_all": "compiled_require",
                           "exclude": "compiled_exclude"}[fname], LazyRegexes(getattr(rule, fname)))
            continue
        compiled = []
        for i, p in enumerate(getattr(rule, fname)):
            try:
                compiled.append(_compile_regex(p))
            except Exception as exc:
                problems.append(f"{fname}[{i}]: regex {p!r} does not compile: {exc}")
        setattr(rule, {"patterns": "compiled_patterns", "require_all": "compiled_require",
                       "exclude": "compiled_exclude"}[fname], compiled)
    if not rule.patterns and not rule.when:
        problems.append("patterns: a rule needs patterns, a when condition, or both")
    if rule.patterns:
        rule.literals, found = _literals_for(rule.patterns, rule.prefilter, "patterns")
        problems.extend(found)
    for fname, target in (("require_all", "require_literals"), ("exclude", "exclude_literals")):
        per = []
        for i, p in enumerate(getattr(rule, fname)):
            lits, found = _literals_for([p], [], f"{fname}[{i}]")
            problems.extend(found)
            per.append(lits)
        setattr(rule, target, per)
    if rule.when:
        try:
            rule.condition = Condition(rule.when)
        except ConditionError as exc:
            problems.append(f"when: {exc}")
    for name in rule.facts:
        if name not in KNOWN_FACT_SET:
            problems.append(f"facts: unknown fact {name!r} (see docs/facts.md)")
    problems.extend(f"summary: {p}" for p in check_template(rule.summary))
    problems.extend(f"title: {p}" for p in check_template(rule.title))
    return rule, problems


def _load_file(path: Path, eager: bool = True) -> tuple[list[Rule], list[str]]:
    """Rules of one YAML file and its problems, each problem a full one-line message."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: 10x faster
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        reason = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return [], [f"{path}{where}: YAML syntax error: {reason}"]
    except (OSError, UnicodeDecodeError) as exc:
        return [], [f"{path}: cannot read: {exc}"]
    if data is None:
        return [], []
    schema = load_schema()
    problems: list[str] = []
    rules: list[Rule] = []
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        return [], [f"{path}: expected a mapping with a `rules:` list at the top"]
    errors = validate_schema(data, schema)
    bad_indexes: set[int] = set()
    for where, message in errors:
        m = re.match(r"rules\[(\d+)\]\.?(.*)", where)
        if m:
            idx = int(m.group(1))
            bad_indexes.add(idx)
            rid = data["rules"][idx].get("id", f"#{idx + 1}") if isinstance(data["rules"][idx], dict) else f"#{idx + 1}"
            problems.append(f"{path}: rule {rid}: {m.group(2) or 'rule'}: {message}")
        else:
            problems.append(f"{path}: {where or 'file'}: {message}")
    for idx, item in enumerate(data["rules"]):
        if idx in bad_indexes or not isinstance(item, dict):
            continue
        rule, found = build_rule(item, str(path), eager=eager)
        problems.extend(f"{path}: rule {item['id']}: {p}" for p in found)
        if rule is not None and not found:
            rules.append(rule)
    return rules, problems


def _rule_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def _collect(folders: Iterable[Path], lazy: Iterable[Path] = ()) -> tuple[list[Rule], list[str]]:
    """Rules of the folders; those in `lazy` compile their regexes on first use."""
    lazy = {Path(f).resolve() for f in lazy}
    rules: list[Rule] = []
    problems: list[str] = []
    seen: dict[str, str] = {}
    for folder in folders:
        if not folder.is_dir():
            problems.append(f"{folder}: rules folder does not exist")
            continue
        for path in _rule_files(folder):
            found, errs = _load_file(path, eager=folder.resolve() not in lazy)
            problems.extend(errs)
            for rule in found:
                if rule.id in seen:
                    problems.append(f"{path}: rule {rule.id}: id: duplicate id, also defined in {seen[rule.id]}")
                    continue
                seen[rule.id] = str(path)
                rules.append(rule)
    return rules, problems


_CACHE: dict[tuple, list[Rule]] = {}


def _builtin_rules(folder: Path) -> tuple[list[Rule], list[str]]:
    """The built-in rules, parsed once and kept on disk (loradoctor/cache.py) while the rule files and
    the code that builds them are unchanged: YAML parsing, schema validation and literal derivation cost
    ~0.15 s, unpickling ~0.01 s. Rules with problems are never kept (the next run reports them again)."""
    import pickle
    import sys

    from loradoctor import __version__, cache

    here = Path(__file__).resolve().parent
    stamp = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir()) if p.is_file()]
    code = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(here.glob("*.py"))]
    key = cache.digest([__version__, sys.version, str(folder), stamp, code, pickle.HIGHEST_PROTOCOL])
    data = cache.read_bytes("rules", key, ".pickle")
    if data is not None:
        try:
            rules = pickle.loads(data)
            if isinstance(rules, list) and all(isinstance(r, Rule) for r in rules):
                return rules, []
        except Exception:  # noqa: BLE001 - a damaged entry is rebuilt, never fatal
            pass
    rules, problems = _collect([folder], lazy=[folder])
    if not problems:
        cache.write_bytes("rules", key, ".pickle", pickle.dumps(rules, protocol=pickle.HIGHEST_PROTOCOL), keep=4)
    return rules, problems


def load_rules(extra_dirs: Iterable["str | Path"] = (), include_builtin: bool = True) -> list[Rule]:
    """The built-in rules plus those in `extra_dirs`, validated and compiled. Raises UserError with
    the first problem (file, rule id, field) in one line; `lint_rules` lists them all."""
    builtin = builtin_rules_dir()
    extra = [Path(d) for d in extra_dirs]
    folders = ([builtin] if include_builtin else []) + extra
    key = tuple((str(f), tuple((p.name, p.stat().st_mtime_ns) for p in _rule_files(f)) if f.is_dir() else ())
                for f in folders)
    if key in _CACHE:
        return list(_CACHE[key])
    rules, problems = _builtin_rules(builtin) if include_builtin else ([], [])
    if extra:
        more, extra_problems = _collect(extra)
        problems += extra_problems
        seen = {r.id: r.source for r in rules}
        for rule in more:
            if rule.id in seen:
                problems.append(f"{rule.source}: rule {rule.id}: id: duplicate id, also defined in {seen[rule.id]}")
                continue
            seen[rule.id] = rule.source
            rules.append(rule)
    if problems:
        more = f" (and {len(problems) - 1} more problem(s); run `loradoctor rules lint`)" if len(problems) > 1 else ""
        raise UserError(problems[0] + more)
    _CACHE.clear()
    _CACHE[key] = rules
    return list(rules)


def lint_rules(folder: "str | Path | None" = None) -> list[str]:
    """Every problem in a rules folder (default: the built-in one), one line each; [] when clean.
    A user folder is also checked for ids that clash with the built-in rules."""
    target = Path(folder) if folder is not None else builtin_rules_dir()
    if not target.is_dir():
        return [f"{target}: not a folder"]
    rules, problems = _collect([target])
    builtin = builtin_rules_dir()
    if target.resolve() != builtin.resolve():
        builtin_rules, _ = _collect([builtin])
        ids = {r.id: r.source for r in builtin_rules}
        for r in rules:
            if r.id in ids:
                problems.append(f"{r.source}: rule {r.id}: id: duplicate id, also defined in {ids[r.id]}")
    return problems


# ---------------------------------------------------------------------------------------------
# keeping the schema's enums in step with the docs (a developer tool; docs/ is not installed)

def sync_schema_enums(repo_root: "str | Path") -> list[str]:
    """Rewrite rules/schema.json's cause and repro enums (for editors; loading uses the catalogue) from
    loradoctor/data/causes.yaml. Returns the ids added. Run `python -m loradoctor.logs.rules sync-schema` after adding a cause."""
    root = Path(repo_root)
    causes, repros = cause_ids(), repro_ids()
    path = root / "rules" / "schema.json"
    schema = json.loads(path.read_text(encoding="utf-8"))
    props = schema["$defs"]["rule"]["properties"]
    added = [c for c in causes if c not in props["cause"]["enum"]] + [r for r in repros if r not in props["repro"]["enum"]]
    props["cause"]["enum"] = causes
    props["repro"]["enum"] = repros
    path.write_text(json.dumps(schema, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    load_schema.cache_clear()
    return added


if __name__ == "__main__":  # pragma: no cover
    import sys

    if sys.argv[1:] == ["sync-schema"]:
        print("added:", ", ".join(sync_schema_enums(Path(__file__).resolve().parent.parent.parent)) or "nothing")
    else:
        print("usage: python -m loradoctor.logs.rules sync-schema", file=sys.stderr)
        sys.exit(2)
