"""`record`: epbuild's dataclasses, with equality, hash and repr shared instead of generated per class.

On Python 3.11 `dataclass` compiles every method it generates on its own: the six of a frozen class
(`__init__`, `__repr__`, `__eq__`, `__hash__`, `__setattr__`, `__delattr__`) made about half of what importing
epbuild costs at the start of every run that builds. A `record` is a `dataclass` (frozen unless told otherwise)
whose `__eq__`, `__hash__` and `__repr__` are these three functions, with the dataclass meaning: fields compared in
order and only between instances of one class, the hash of the fields (a mutable record has none), `Name(a=1)`.
A frozen record's `__setattr__` and `__delattr__` are closures with the code `dataclass` would compile for them
(`_frozen_methods`), where this Python's `dataclasses` makes them in the one function that can be handed them
(3.11 and 3.12); only `__init__` is compiled per class.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar, cast, dataclass_transform, overload

T = TypeVar("T", bound=type)

# `dataclasses._frozen_get_del_attr(cls, fields, globals)`, where it has that form (3.11, 3.12; 3.13 builds the
# methods otherwise): replaced, only while a record is made, by `_frozen_methods`, whose methods do what its would
_GENERATED: Any = getattr(dataclasses, "_frozen_get_del_attr", None)
_SHARED = (sys.version_info < (3, 13) and _GENERATED is not None
           and _GENERATED.__code__.co_varnames[:3] == ("cls", "fields", "globals"))
_SWAP = threading.Lock()


def _frozen_methods(cls: Any, fields: list[dataclasses.Field[Any]], globals: dict[str, Any]) -> tuple[Any, Any]:
    """A frozen dataclass's `__setattr__` and `__delattr__`, as `dataclasses` writes them: no field may be set or
    deleted, nor anything on an instance of the class itself; a subclass's own attributes go to its base."""
    names = frozenset(field.name for field in fields)

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __setattr__, __delattr__


def _dataclass(cls: type, frozen: bool) -> Any:
    if not (frozen and _SHARED):
        return dataclasses.dataclass(cls, frozen=frozen, eq=False, repr=False)
    with _SWAP:  # one record at a time; a dataclass another thread makes meanwhile gets the same methods' meaning
        dataclasses._frozen_get_del_attr = _frozen_methods  # type: ignore[attr-defined]
        try:
            return dataclasses.dataclass(cls, frozen=True, eq=False, repr=False)
        finally:
            dataclasses._frozen_get_del_attr = _GENERATED  # type: ignore[attr-defined]


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
        made: Any = _dataclass(cls, frozen)
        names = [f.name for f in dataclasses.fields(made)]
        # the field values as a tuple (attrgetter of fewer than two names gives no tuple)
        values = attrgetter(*names) if len(names) > 1 else lambda item: tuple(getattr(item, n) for n in names)
        made._record_values = staticmethod(values)
        made.__eq__, made.__repr__ = _eq, _repr
        made.__hash__ = _hash if frozen else None
        return cast(T, made)

    return wrap if cls is None else wrap(cls)
