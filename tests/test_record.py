"""loradoctor.record behaves as the part of dataclasses it replaces (compared side by side)."""

from __future__ import annotations

import dataclasses
from typing import Optional

import pytest

from loradoctor.record import FrozenInstanceError, asdict, field, field_names, record, replace


def _pair(frozen: bool = False, eq: bool = True):
    """The same class declared both ways."""

    def body():
        class Point:
            x: int
            y: int = 0
            tags: list = field(default_factory=list)
            note: Optional[str] = None
        return Point

    def dbody():
        class Point:
            x: int
            y: int = 0
            tags: list = dataclasses.field(default_factory=list)
            note: Optional[str] = None
        return Point

    return record(frozen=frozen, eq=eq)(body()), dataclasses.dataclass(frozen=frozen, eq=eq)(dbody())


def test_init_defaults_factories_and_repr_match_dataclasses():
    ours, theirs = _pair()
    a, b = ours(1, note="n"), theirs(1, note="n")
    assert (a.x, a.y, a.tags, a.note) == (b.x, b.y, b.tags, b.note)
    assert repr(a).rsplit(">.", 1)[1] == repr(b).rsplit(">.", 1)[1] == "Point(x=1, y=0, tags=[], note='n')"
    assert ours(1).tags is not ours(1).tags  # a new list per instance
    with pytest.raises(TypeError):
        ours()  # x is required
    with pytest.raises(TypeError):
        ours(1, 2, [], None, 5)
    assert field_names(ours) == ("x", "y", "tags", "note")


def test_equality_and_hash_match_dataclasses():
    for frozen in (False, True):
        ours, theirs = _pair(frozen=frozen)
        assert ours(1, 2) == ours(1, 2) and ours(1, 2) != ours(1, 3)
        assert (ours.__hash__ is None) == (theirs.__hash__ is None)
    ours, _ = _pair(frozen=True)
    ours_t = record(frozen=True)(type("P", (), {"__annotations__": {"x": "int"}}))
    assert hash(ours_t(3)) == hash(ours_t(3)) and len({ours_t(3), ours_t(3), ours_t(4)}) == 2
    ours, _ = _pair(eq=False)
    assert ours(1) != ours(1)  # identity
    ours, _ = _pair()
    assert ours(1) != object() and (ours(1) == 1) is False


def test_frozen_refuses_assignment():
    ours, _ = _pair(frozen=True)
    p = ours(1)
    with pytest.raises(FrozenInstanceError):
        p.x = 2
    with pytest.raises(AttributeError):  # as dataclasses' FrozenInstanceError
        del p.x


def test_compare_false_field_is_left_out_of_eq_hash_and_repr():
    @record(frozen=True)
    class Cause:
        id: str
        cached: tuple = field(default=(None,), compare=False, repr=False)

    assert Cause("a", (1,)) == Cause("a", (2,)) and hash(Cause("a", (1,))) == hash(Cause("a", (2,)))
    assert repr(Cause("a")) == "test_compare_false_field_is_left_out_of_eq_hash_and_repr.<locals>.Cause(id='a')"


def test_post_init_inheritance_asdict_and_replace():
    @record
    class Base:
        a: int
        seen: list = field(default_factory=list)

        def __post_init__(self) -> None:
            self.seen.append("post")

    @record
    class Child(Base):
        b: str = "x"

    @record
    class Outer:
        child: Child
        items: list = field(default_factory=list)
        by_name: dict = field(default_factory=dict)

    c = Child(1, b="y")
    assert c.seen == ["post"] and field_names(Child) == ("a", "seen", "b")
    doc = asdict(Outer(c, [Child(2)], {"k": Child(3)}))
    assert doc == {"child": {"a": 1, "seen": ["post"], "b": "y"},
                   "items": [{"a": 2, "seen": ["post"], "b": "x"}],
                   "by_name": {"k": {"a": 3, "seen": ["post"], "b": "x"}}}
    moved = replace(c, b="z")
    assert (moved.a, moved.b) == (1, "z") and moved is not c
    with pytest.raises(TypeError):
        replace(c, nope=1)


def test_a_required_field_after_a_default_is_refused():
    with pytest.raises(TypeError):
        @record
        class Bad:
            a: int = 0
            b: int
