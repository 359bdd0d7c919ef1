"""`records.record`: a dataclass whose equality, hash and repr are shared functions, with the dataclass meaning."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from epbuild.records import record


@record
class Point:
    x: int
    y: tuple[int, ...] = ()
    note: str = dataclasses.field(default="", repr=False)


@dataclasses.dataclass(frozen=True)
class SamePoint:
    x: int
    y: tuple[int, ...] = ()
    note: str = dataclasses.field(default="", repr=False)


@record
class One:
    x: int


@record(frozen=False)
class Mutable:
    items: list[int] = dataclasses.field(default_factory=list)


def test_equality_and_hash_are_the_dataclass_ones():
    assert Point(1, (2,)) == Point(1, (2,)) and Point(1) != Point(2) and Point(1, (2,)) != Point(1, (3,))
    assert hash(Point(1, (2,))) == hash(Point(1, (2,)))
    assert len({Point(1), Point(1), Point(2)}) == 2
    assert Point(1) != SamePoint(1) and Point(1).__eq__(SamePoint(1)) is NotImplemented  # only one class
    assert One(3) == One(3) and One(3) != One(4) and hash(One(3)) == hash(One(3))


def test_repr_is_the_dataclass_one():
    assert repr(Point(1, (2,), note="hidden")) == repr(SamePoint(1, (2,), note="hidden")).replace("SamePoint", "Point")


def test_frozen_replace_and_pickle_as_a_dataclass():
    point = Point(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 2  # type: ignore[misc]
    assert dataclasses.replace(point, x=2) == Point(2) and dataclasses.asdict(point) == {"x": 1, "y": (), "note": ""}
    assert pickle.loads(pickle.dumps(point)) == point


def test_frozen_as_a_frozen_dataclass_is_with_its_two_methods_shared_and_dataclasses_left_as_it_was():
    """`records._frozen_methods` stands in for what `dataclass` compiles: the same errors for the same attempts, on
    the class and on a subclass of it, and `dataclasses` itself unchanged after (a frozen dataclass made later gets
    its own compiled methods)."""
    import epbuild.records as records

    class Sub(Point):
        pass

    class SameSub(SamePoint):
        pass

    for made, same in ((Point(1), SamePoint(1)), (Sub(1), SameSub(1))):
        for attempt in (lambda o: setattr(o, "x", 2), lambda o: setattr(o, "other", 2), lambda o: delattr(o, "x"),
                        lambda o: delattr(o, "other")):
            outcomes = []
            for item in (made, same):
                try:
                    attempt(item)
                    outcomes.append("allowed")
                except Exception as exc:  # noqa: BLE001 - the outcome compared, whatever it is
                    outcomes.append(f"{type(exc).__name__}: {exc}".replace("SameSub", "Sub"))
            assert outcomes[0] == outcomes[1]
    assert Point.__setattr__.__qualname__ == "Point.__setattr__"
    if records._SHARED:
        assert Point.__setattr__.__code__ is One.__setattr__.__code__  # one function's code, not one per class
    assert dataclasses._frozen_get_del_attr is records._GENERATED

    @dataclasses.dataclass(frozen=True)
    class Later:
        x: int

    assert Later.__setattr__.__code__ is not Point.__setattr__.__code__


def test_a_mutable_record_compares_by_value_and_has_no_hash():
    made = Mutable()
    made.items.append(1)
    assert made == Mutable([1]) and made != Mutable()
    with pytest.raises(TypeError):
        hash(made)
