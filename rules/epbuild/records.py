"""`record`: epbuild's dataclasses, with equality, hash and repr shared instead of generated per class.

On Python 3.11 `dataclass` compiles every method it generates on its own: the six of a frozen class
(`__init__`, `__repr__`, `__eq__`, `__hash__`, `__setattr__`, `__delattr__`) made about half of what importing
epbuild costs at the start of every run that builds. A `record` is a `dataclass` (frozen unless told otherwise)
whose `__eq__`, `__hash__` and `__repr__` are these three functions, with the dataclass meaning: fields compared in
order and only between instances of one class, the hash of the fields (a mutable record has none), `Name(a=1)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar, cast, dataclass_transform, overload

T = TypeVar("T", bound=type)


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is self.__class__:
        return self._record_values(self) == other._record_values(other)
    return NotImplemented


def _hash(self: Any) -> int:
    return hash(self._record_values(self))


def _repr(self: Any) -> str:
    shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr)
    return f"{self.__class__.__qualname__}({shown})"


@overload
def record(cls: T, /) -> T: ...


@overload
def record(cls: None = None, /, *, frozen: bool = True) -> Callable[[T], T]: ...


@dataclass_transform(frozen_default=True)
def record(cls: T | None = None, /, *, frozen: bool = True) -> Any:
    """`@record`, or `@record(frozen=False)` for a mutable one (a type checker reads it as `dataclass`)."""

    def wrap(cls: T) -> T:
        made: Any = dataclasses.dataclass(cls, frozen=frozen, eq=False, repr=False)
        names = [f.name for f in dataclasses.fields(made)]
        # the field values as a tuple (attrgetter of fewer than two names gives no tuple)
        values = attrgetter(*names) if len(names) > 1 else lambda item: tuple(getattr(item, n) for n in names)
        made._record_values = staticmethod(values)
        made.__eq__, made.__repr__ = _eq, _repr
        made.__hash__ = _hash if frozen else None
        return cast(T, made)

    return wrap if cls is None else wrap(cls)
