"""Typed JSON: how a record that holds epbuild's own objects (the saved plan: the manifest, its targets, builds and
stages) is written as data and read back equal, without `pickle`. A checkout or a pull request can bring any file
under `artifacts/.state/`; unpickling one runs whatever it names, while this reader only ever makes JSON values,
tuples, sets, paths, and instances of the classes its caller names (`Classes`), by setting their declared fields:
no code of the file's choosing runs, whatever the bytes.

    tuple (1, 2)          {"$t": "tuple", "v": [1, 2]}
    Path("m.onnx")        {"$t": "path", "v": "m.onnx"}
    {Path("a"): 1}        {"$t": "map", "v": [[{"$t": "path", "v": "a"}, 1]]}   (keys other than strings, or "$t")
    StageKind.FOLD        {"$t": "StageKind", "v": "fold"}
    EP table's QNN entry  {"$t": "EpInfo", "v": "qnn"}                      (a constant of the code, by name)
    Stage(kind=..., ...)  {"$s": 2, "$i": 7, "kind": ..., ...}             (its fields, by name; its shape)
    the same Stage again  {"$r": 7}                                            (one object, as it was)

A record's text is two JSON values: its shapes, then the value. A shape is a class and how those of its fields
written otherwise than as above were written (`$s` indexes the list): `["Stage", ["inputs", "t"]]`, a tuple field
as an array. Each object then carries only its field values, and the reader works out each shape once (the JSON
reader calls back for every object: at 10,000 builds, 35,000 of them). `$i` only where a reference names it.

A value of any other type is not written (`TypeError`: the record is not saved, a full check does its work), and
a file that does not decode to what was written (an unknown class, a missing or extra field, a value its enum lacks,
a reference to no object read before) is `ValueError`: a miss to the reader. An object held in several places (a
target's settings in each of its builds, a model in its members) is written once and read back as one object, as
pickle kept it: a plan of 1,000 builds is then a few thousand objects to make, not tens of thousands."""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path
from typing import Any

TAG, INDEX, REFERENCE, SHAPE = "$t", "$i", "$r", "$s"
# how an object's field was written when not as `encode` writes it, listed in its shape (name, how, name, ...):
# the JSON reader calls back for every JSON object, and tuples, paths and empty dicts were most of a plan's (10,000
# tuples, 2,500 paths, 2,500 empty dicts at 1,000 targets): a tuple as an array, a path as its string, a tuple of
# paths as an array of strings, an empty dict as [] (read by `dict`), an object written before (a build's target, a
# member's validation settings) as its index, an empty tuple not at all (the shape gives it: most of a build's and
# a member's tuples are empty, and each field the reader converts costs it a turn of a Python loop)
AS_ARRAY, AS_PATH, AS_PATHS, AS_EMPTY, AS_SEEN, AS_NONE = "t", "p", "tp", "e", "r", "n"
_HOWS = frozenset({AS_ARRAY, AS_PATH, AS_PATHS, AS_EMPTY, AS_SEEN, AS_NONE})
_PLAIN_JSON = json.JSONDecoder()
_PATH = type(Path())
_PLAIN = frozenset({str, int, float, bool, type(None)})


class Classes:
    """The classes a record may hold (dataclasses and enums), by name: nothing else is ever made from a file.
    `constants`: classes whose instances are the code's own (a table such as the EPs'), held by their name in that
    table and read back as the very object (the code that reads the record is the code that wrote it: its key says
    so). `values`: immutable classes (frozen, never changed in place) whose equal instances a record writes once and
    reads back as one object (a build's validation settings, the same for every model of a target)."""

    __slots__ = ("by_name", "constants", "fields", "fields_of", "named", "names", "values")

    def __init__(self, *classes: type, constants: dict[type, dict[str, Any]] | None = None,
                 values: tuple[type, ...] = ()):
        self.by_name: dict[str, type] = {}
        self.fields: dict[str, tuple[str, ...]] = {}
        self.constants: dict[str, dict[str, Any]] = {}
        self.named: dict[int, str] = {}  # id of a constant -> its name in its table
        for cls, table in (constants or {}).items():
            self.by_name[cls.__name__] = cls
            self.constants[cls.__name__] = dict(table)
            self.named.update({id(value): name for name, value in table.items()})
        for cls in classes:
            if cls.__name__ in self.by_name or cls.__name__ in ("tuple", "path", "map", "set", "frozenset"):
                raise ValueError(f"two classes named {cls.__name__}")
            if dataclasses.is_dataclass(cls):
                if hasattr(cls, "__slots__"):
                    raise TypeError(f"{cls.__name__} has slots: its fields are set through its __dict__")
                self.fields[cls.__name__] = tuple(f.name for f in dataclasses.fields(cls))
            elif not issubclass(cls, enum.Enum):
                raise TypeError(f"{cls.__name__} is neither a dataclass nor an enum")
            self.by_name[cls.__name__] = cls
        self.names = {cls: name for name, cls in self.by_name.items()}
        self.fields_of = {cls: self.fields[name] for name, cls in self.by_name.items() if name in self.fields}
        self.values = frozenset(values)
        if not self.values <= self.fields_of.keys():
            raise TypeError("a value class that is not one of the record's dataclasses")


class _Writer:
    """One record's encoding: the objects written so far (id -> index, written again as references), the shapes
    (a class and how its fields were written) in the order first met, and which indexes a reference names (an
    object no reference names drops its index: the reader need not keep it)."""

    __slots__ = ("classes", "indexed", "named", "seen", "shapes", "values")

    def __init__(self, classes: Classes):
        self.classes = classes
        self.seen: dict[int, int] = {}
        self.shapes: dict[tuple[str, tuple[str, ...]], int] = {}
        self.indexed: list[dict[str, Any]] = []  # every record object written, by index
        self.named: set[int] = set()  # the indexes a reference names
        self.values: dict[tuple[str, str], int] = {}  # a value class's instance (by its repr) -> its index

    def reference(self, index: int) -> int:
        self.named.add(index)
        return index

    def written_as(self, value: Any, kind: type) -> int | None:
        """The index of `value` when it was written before: this very object, or one equal to it of a value class."""
        index = self.seen.get(id(value))
        if index is None and kind in self.classes.values:
            index = self.values.get((self.classes.names[kind], repr(value)))
            if index is not None:
                self.seen[id(value)] = index
        return index

    def encode(self, value: Any) -> Any:
        kind = type(value)
        if kind in _PLAIN:
            return value
        classes = self.classes
        if kind is list:
            return [self.encode(item) for item in value]
        if kind is dict:
            if TAG not in value and REFERENCE not in value and SHAPE not in value and \
                    all(type(key) is str for key in value):
                return {key: self.encode(item) for key, item in value.items()}
            return {TAG: "map", "v": [[self.encode(key), self.encode(item)] for key, item in value.items()]}
        if kind is tuple or kind is set or kind is frozenset:
            return {TAG: kind.__name__, "v": [self.encode(item) for item in value]}
        if kind is _PATH:
            return {TAG: "path", "v": str(value)}
        name = classes.names.get(kind)
        if name is None:
            raise TypeError(f"a record cannot hold a {kind.__qualname__}")
        if isinstance(value, enum.Enum):
            return {TAG: name, "v": self.encode(value.value)}
        if name in classes.constants:
            if id(value) not in classes.named:
                raise TypeError(f"a {name} that is not one of the code's own")
            return {TAG: name, "v": classes.named[id(value)]}
        if id(value) in self.seen:
            return {REFERENCE: self.reference(self.seen[id(value)])}
        equal = None
        if kind in classes.values:  # an immutable value: one written before that equals it is this one
            equal = (name, repr(value))
            if equal in self.values:
                index = self.seen[id(value)] = self.values[equal]
                return {REFERENCE: self.reference(index)}
        self.seen[id(value)] = index = len(self.indexed)
        if equal is not None:
            self.values[equal] = index
        found: dict[str, Any] = {SHAPE: 0, INDEX: index}
        self.indexed.append(found)
        written: list[str] = []
        for field in classes.fields[name]:
            item = getattr(value, field)
            kind = type(item)
            if kind is tuple:
                if not item:
                    written += [field, AS_NONE]
                    continue
                if all(type(part) is _PATH for part in item):
                    found[field], how = [str(part) for part in item], AS_PATHS
                else:
                    found[field], how = [self.encode(part) for part in item], AS_ARRAY
            elif kind is _PATH:
                found[field], how = str(item), AS_PATH
            elif kind is dict and not item:
                found[field], how = [], AS_EMPTY
            elif kind in classes.fields_of and (seen := self.written_as(item, kind)) is not None:
                found[field], how = self.reference(seen), AS_SEEN
            else:
                found[field] = self.encode(item)
                continue
            written += [field, how]
        shape = (name, tuple(written))
        found[SHAPE] = self.shapes.setdefault(shape, len(self.shapes))
        return found

    def text(self, value: Any) -> str:
        """`value`'s record text: the shapes, then the value (each compact JSON)."""
        encoded = self.encode(value)
        for index, found in enumerate(self.indexed):
            if index not in self.named:
                del found[INDEX]
        shapes = [[name, list(written)] for name, written in self.shapes]
        return json.dumps(shapes, separators=(",", ":")) + json.dumps(encoded, separators=(",", ":"),
                                                                      check_circular=False)  # built as a tree


Shape = tuple[type, frozenset[str], tuple[tuple[str, str], ...], dict[str, Any]]


def _shapes(raw: Any, classes: Classes) -> list[Shape]:
    """A record's shapes table as the reader uses it: each a class it may hold, its fields, how those written
    otherwise than plainly were written, and those not written at all (empty tuples). ValueError for anything
    else."""
    if type(raw) is not list:
        raise ValueError("not a record: no shapes")
    shapes = []
    for entry in raw:
        if type(entry) is not list or len(entry) != 2 or entry[0] not in classes.fields or type(entry[1]) is not list \
                or len(entry[1]) % 2:
            raise ValueError(f"not a record: a shape {entry!r:.80}")
        name, written = entry
        names = frozenset(classes.fields[name])
        pairs = tuple(zip(written[::2], written[1::2], strict=True))
        if any(field not in names or how not in _HOWS for field, how in pairs) or len(pairs) != len(set(pairs)):
            raise ValueError(f"not a record: a shape {entry!r:.80}")
        shapes.append((classes.by_name[name], names, tuple(pair for pair in pairs if pair[1] != AS_NONE),
                       {field: () for field, how in pairs if how == AS_NONE}))
    return shapes


def _hook(classes: Classes, shapes: list[Shape]) -> Any:
    by_name, constants = classes.by_name, classes.constants
    objects: dict[int, Any] = {}  # index -> the object read, for the references after it
    paths: dict[str, Path] = {}  # one (immutable) Path per string: a model's path is in each of its builds

    def path(text: str) -> Path:
        found = paths.get(text)
        if found is None:
            if type(text) is not str:  # JSON's other values: a number, true, null (a list: unhashable, above)
                raise TypeError(f"a path written as {text!r}")
            found = paths[text] = _PATH(text)
        return found

    # each way of writing a field, read back by one call (in C where it can be: the reader calls it for tens of
    # thousands of fields); a value of the wrong kind fails there (KeyError, TypeError: a miss)
    read_as: dict[str, Any] = {AS_SEEN: objects.__getitem__, AS_ARRAY: tuple, AS_EMPTY: dict, AS_PATH: path,
                               AS_PATHS: lambda value: tuple(map(path, value))}
    readers: list[tuple[type, frozenset[str], tuple[tuple[str, Any], ...], dict[str, Any]]] = [
        (cls, names, tuple((name, read_as[how]) for name, how in written), empty)
        for cls, names, written, empty in shapes]

    def made(found: dict[str, Any]) -> Any:
        shape = found.pop(SHAPE, None)
        if shape is not None:  # a record: the JSON object becomes its __dict__, its fields exactly the declared ones
            if type(shape) is not int or not 0 <= shape < len(readers):
                raise ValueError(f"a record of no shape: {shape!r}")
            cls, names, fields, empty = readers[shape]
            index = found.pop(INDEX, None)
            if empty:
                if not found.keys().isdisjoint(empty):
                    raise ValueError(f"a {cls.__name__} that writes a field its shape says it does not")
                found.update(empty)
            if found.keys() != names or (index is not None and (type(index) is not int or index in objects)):
                raise ValueError(f"a {cls.__name__} with fields {sorted(found)}")
            for name, read in fields:
                found[name] = read(found[name])
            made: Any = object.__new__(cls)  # as pickle makes it: no __init__ runs, the declared fields are set
            object.__setattr__(made, "__dict__", found)
            if index is not None:
                objects[index] = made
            return made
        tag = found.get(TAG)
        if tag is None:
            if REFERENCE in found:
                if len(found) != 1 or found[REFERENCE] not in objects:
                    raise ValueError(f"a reference to no object read before: {found}")
                return objects[found[REFERENCE]]
            return found
        if tag == "tuple":
            return tuple(found["v"])
        if tag == "path":
            return path(found["v"])
        if tag == "map":
            return {key: item for key, item in found["v"]}
        if tag == "set" or tag == "frozenset":
            return (set if tag == "set" else frozenset)(found["v"])
        enum = by_name.get(tag)
        if enum is None or tag in classes.fields:
            raise ValueError(f"a record names {tag!r}, which it may not hold")
        table = constants.get(tag)
        if table is not None:
            if found["v"] not in table:
                raise ValueError(f"no {tag} named {found['v']!r}")
            return table[found["v"]]
        return enum(found["v"])  # an enum: a member by value, never a new one

    return made


def loads(text: str | bytes, classes: Classes) -> Any:
    """What `dumps` wrote (ValueError for anything else: malformed, or naming a class `classes` lacks)."""
    if not isinstance(text, str):
        text = text.decode()
    try:
        raw, end = _PLAIN_JSON.raw_decode(text)
        value, end = json.JSONDecoder(object_hook=_hook(classes, _shapes(raw, classes))).raw_decode(text, end)
    except (KeyError, TypeError, RecursionError, IndexError) as exc:  # a field missing, an unhashable key, nesting
        raise ValueError(f"not a record: {exc}") from None
    if end != len(text):
        raise ValueError("not a record: text after its value")
    return value


def dumps(value: Any, classes: Classes) -> str:
    """`value` as typed JSON text (`loads` reads it back equal)."""
    return _Writer(classes).text(value)
