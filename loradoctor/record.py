"""Records: the part of `dataclasses` loradoctor uses, without its start-up cost.

`dataclasses` imports `inspect` (and with it `dis`, `ast`'s helpers, `tokenize`...) and builds each
class with three to five `exec` calls plus a signature for the docstring: on this project's start
path (about 20 classes) that was ~40 ms of the ~130 ms `explain` spends over a bare interpreter.
`record` keeps the declarative form (annotated fields, `field(default=...)`,
`field(default_factory=...)`, `frozen`, `eq`, `repr`, `__post_init__`) and the same behaviour
(positional and keyword `__init__` in field order, equality on the field tuple of the same class,
`__hash__` for frozen records, `None` for mutable ones with `eq`), with one small `exec` per class
for `__init__` (so creating an instance costs what a written `__init__` costs) and shared,
generic `__repr__` / `__eq__` / `__hash__`.

    @record(frozen=True)
    class Literal:
        text: str
        ignore_case: bool = False

`asdict` and `replace` work as their `dataclasses` namesakes do; `field_names` lists the fields.
"""

from __future__ import annotations

from typing import Any, Callable

try:
    from typing import dataclass_transform  # 3.11: tells type checkers that record works as dataclass
except ImportError:  # pragma: no cover - Python < 3.11
    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        return lambda f: f

_MISSING: Any = object()


class FrozenInstanceError(AttributeError):
    """Assignment to a field of a frozen record."""


class Field:
    """A field's default or default factory (what `field(...)` returns in a class body)."""

    __slots__ = ("default", "default_factory", "compare", "repr")

    def __init__(self, default: Any = _MISSING, default_factory: Any = _MISSING, compare: bool = True,
                 repr: bool = True) -> None:
        if default is not _MISSING and default_factory is not _MISSING:
            raise ValueError("a field takes a default or a default_factory, not both")
        self.default = default
        self.default_factory = default_factory
        self.compare = compare
        self.repr = repr


def field(*, default: Any = _MISSING, default_factory: Callable[[], Any] = _MISSING, compare: bool = True,
          repr: bool = True) -> Any:
    """A field with a default, or with a factory called for each new instance (for lists, dicts);
    compare=False leaves it out of == and hash(), repr=False out of repr()."""
    return Field(default, default_factory, compare, repr)


def field_names(obj_or_cls: Any) -> tuple[str, ...]:
    """The field names of a record (class or instance), in declaration order (bases first)."""
    return obj_or_cls.__record_fields__


def asdict(obj: Any) -> Any:
    """A record as a dict, recursing into records, lists, tuples and dicts (as dataclasses.asdict)."""
    if hasattr(type(obj), "__record_fields__"):
        return {name: asdict(getattr(obj, name)) for name in obj.__record_fields__}
    if isinstance(obj, (str, int, float, bool, type(None))):
        return obj
    if isinstance(obj, list):
        return [asdict(v) for v in obj]
    if isinstance(obj, tuple):
        values = [asdict(v) for v in obj]
        return type(obj)(*values) if hasattr(obj, "_fields") else type(obj)(values)
    if isinstance(obj, dict):
        return type(obj)((asdict(k), asdict(v)) for k, v in obj.items())
    import copy

    return copy.deepcopy(obj)


def replace(obj: Any, **changes: Any) -> Any:
    """A new record with the given fields changed (as dataclasses.replace)."""
    unknown = set(changes) - set(obj.__record_fields__)
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field(s) {', '.join(sorted(unknown))}")
    values = {name: getattr(obj, name) for name in obj.__record_fields__}
    values.update(changes)
    return type(obj)(**values)


def _repr(self) -> str:
    inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__record_repr__)
    return f"{type(self).__qualname__}({inner})"


def _as_tuple(self) -> tuple:
    return tuple(getattr(self, name) for name in self.__record_compare__)


def _eq(self, other: Any) -> Any:
    if other.__class__ is self.__class__:
        return _as_tuple(self) == _as_tuple(other)
    return NotImplemented


def _hash(self) -> int:
    return hash(_as_tuple(self))


def _frozen_setattr(self, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r} of frozen {type(self).__name__}")


def _frozen_delattr(self, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r} of frozen {type(self).__name__}")


@dataclass_transform(field_specifiers=(field, Field))
def record(cls: Any = None, *, frozen: bool = False, eq: bool = True, repr: bool = True) -> Any:
    """Class decorator: `@record` or `@record(frozen=True, eq=False, repr=False)`."""
    if cls is None:
        return lambda c: _build(c, frozen, eq, repr)
    return _build(cls, frozen, eq, repr)


def _build(cls: Any, frozen: bool, eq: bool, want_repr: bool) -> Any:
    names: list[str] = []
    defaults: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        for name in getattr(base, "__record_fields__", ()):
            if name not in defaults and name not in names:
                names.append(name)
            defaults.setdefault(name, base.__record_defaults__.get(name, Field()))
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if isinstance(annotation, str) and annotation.startswith(("ClassVar", "typing.ClassVar")):
            continue
        value = cls.__dict__.get(name, _MISSING)
        spec = value if isinstance(value, Field) else Field(value)
        if isinstance(value, Field):
            if spec.default is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, spec.default)
        if name not in names:
            names.append(name)
        defaults[name] = spec
    cls.__record_fields__ = tuple(names)
    cls.__record_defaults__ = defaults
    cls.__record_compare__ = tuple(name for name in names if defaults[name].compare)
    cls.__record_repr__ = tuple(name for name in names if defaults[name].repr)
    if "__init__" not in cls.__dict__:
        cls.__init__ = _make_init(cls, names, defaults, frozen)
    if want_repr and "__repr__" not in cls.__dict__:
        cls.__repr__ = _repr
    if eq and "__eq__" not in cls.__dict__:
        cls.__eq__ = _eq
    if frozen:
        cls.__setattr__ = _frozen_setattr
        cls.__delattr__ = _frozen_delattr
    # as dataclasses: a hash of its own is kept (a body with __eq__ alone has __hash__ = None implicitly);
    # else a frozen record hashes its fields and a mutable one with eq is unhashable
    explicit_hash = "__hash__" in cls.__dict__ and not (cls.__dict__["__hash__"] is None and "__eq__" in cls.__dict__)
    if eq and not explicit_hash:
        cls.__hash__ = _hash if frozen else None
    return cls


def _make_init(cls: Any, names: list[str], defaults: dict[str, Field], frozen: bool) -> Callable:
    params, body = [], []
    scope: dict[str, Any] = {"_MISSING": _MISSING, "_set": object.__setattr__}
    seen_default = False
    for name in names:
        spec = defaults[name]
        if spec.default is not _MISSING:
            scope[f"_d_{name}"] = spec.default
            params.append(f"{name}=_d_{name}")
            value, seen_default = name, True
        elif spec.default_factory is not _MISSING:
            scope[f"_f_{name}"] = spec.default_factory
            params.append(f"{name}=_MISSING")
            value, seen_default = f"_f_{name}() if {name} is _MISSING else {name}", True
        else:
            if seen_default:
                raise TypeError(f"{cls.__name__}: field {name!r} without a default follows one with a default")
            params.append(name)
            value = name
        body.append(f"_set(self, {name!r}, {value})" if frozen else f"self.{name} = {value}")
    if "__post_init__" in {n for klass in cls.__mro__ for n in klass.__dict__}:
        body.append("self.__post_init__()")
    source = f"def __init__(self, {', '.join(params)}):\n    " + "\n    ".join(body or ["pass"]) + "\n"
    exec(source, scope)  # noqa: S102 - the source is built above from the class's own field names
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init
