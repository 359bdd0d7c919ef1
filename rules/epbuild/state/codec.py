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
    Stage(kind=..., ...)  {"$t": "Stage", "$i": 7, "kind": ..., ...}           (every field, by name)
    the same Stage again  {"$r": 7}                                            (one object, as it was)

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

TAG, INDEX, REFERENCE, FIELDS = "$t", "$i", "$r", "$f"
# how an object's field was written when not as `encode` writes it, listed in its `$f` array (name, how, name, ...):
# the JSON reader calls back for every JSON object, and tuples, paths and empty dicts were most of a plan's (10,000
# tuples, 2,500 paths, 2,500 empty dicts at 1,000 targets): a tuple as an array, a path as its string, a tuple of
# paths as an array of strings, an empty dict as 0, an object written before as its index (a build's target)
AS_ARRAY, AS_PATH, AS_PATHS, AS_EMPTY, AS_SEEN = "t", "p", "tp", "e", "r"
_PATH = type(Path())
_PLAIN = frozenset({str, int, float, bool, type(None)})


class Classes:
    """The classes a record may hold (dataclasses and enums), by name: nothing else is ever made from a file.
    `constants`: classes whose instances are the code's own (a table such as the EPs'), held by their name in that
    table and read back as the very object (the code that reads the record is the code that wrote it: its key says
    so)."""

    __slots__ = ("by_name", "constants", "fields", "fields_of", "named", "names")

    def __init__(self, *classes: type, constants: dict[type, dict[str, Any]] | None = None):
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


def encode(value: Any, classes: Classes, seen: dict[int, int] | None = None) -> Any:
    """`value` as JSON values (see the module's docstring); TypeError for a type it cannot hold. `seen`: the
    objects written so far (id -> their index), which are written again as references."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    seen = {} if seen is None else seen
    if kind is list:
        return [encode(item, classes, seen) for item in value]
    if kind is dict:
        if TAG not in value and REFERENCE not in value and all(type(key) is str for key in value):
            return {key: encode(item, classes, seen) for key, item in value.items()}
        return {TAG: "map", "v": [[encode(key, classes, seen), encode(item, classes, seen)]
                                  for key, item in value.items()]}
    if kind is tuple or kind is set or kind is frozenset:
        return {TAG: kind.__name__, "v": [encode(item, classes, seen) for item in value]}
    if kind is _PATH:
        return {TAG: "path", "v": str(value)}
    name = classes.names.get(kind)
    if name is None:
        raise TypeError(f"a record cannot hold a {kind.__qualname__}")
    if isinstance(value, enum.Enum):
        return {TAG: name, "v": encode(value.value, classes, seen)}
    if name in classes.constants:
        if id(value) not in classes.named:
            raise TypeError(f"a {name} that is not one of the code's own")
        return {TAG: name, "v": classes.named[id(value)]}
    if id(value) in seen:
        return {REFERENCE: seen[id(value)]}
    seen[id(value)] = index = len(seen)
    found: dict[str, Any] = {TAG: name, INDEX: index}
    written: list[str] = []
    for field in classes.fields[name]:
        item = getattr(value, field)
        kind = type(item)
        if kind is tuple:
            if item and all(type(part) is _PATH for part in item):
                found[field], how = [str(part) for part in item], AS_PATHS
            else:
                found[field], how = [encode(part, classes, seen) for part in item], AS_ARRAY
        elif kind is _PATH:
            found[field], how = str(item), AS_PATH
        elif kind is dict and not item:
            found[field], how = 0, AS_EMPTY
        elif id(item) in seen and kind in classes.fields_of:
            found[field], how = seen[id(item)], AS_SEEN
        else:
            found[field] = encode(item, classes, seen)
            continue
        written += [field, how]
    if written:
        found[FIELDS] = written
    return found


def _hook(classes: Classes) -> Any:
    by_name, constants = classes.by_name, classes.constants
    specs = {name: (by_name[name], frozenset(names)) for name, names in classes.fields.items()}
    objects: dict[int, Any] = {}  # index -> the object read, for the references after it
    paths: dict[str, Path] = {}  # one (immutable) Path per string: a model's path is in each of its builds

    def path(text: str) -> Path:
        found = paths.get(text)
        if found is None:
            found = paths[text] = _PATH(text)
        return found

    def made(found: dict[str, Any]) -> Any:
        tag = found.get(TAG)
        if tag is None:
            if REFERENCE in found:
                if len(found) != 1 or found[REFERENCE] not in objects:
                    raise ValueError(f"a reference to no object read before: {found}")
                return objects[found[REFERENCE]]
            return found
        spec = specs.get(tag)
        if spec is not None:  # a record: the JSON object becomes its __dict__, its fields exactly the declared ones
            cls, names = spec
            del found[TAG]
            index, written = found.pop(INDEX, None), found.pop(FIELDS, [])
            if found.keys() != names or type(index) is not int or index in objects or type(written) is not list \
                    or len(written) % 2:
                raise ValueError(f"a {tag} with fields {sorted(found)}")
            for name, how in zip(written[::2], written[1::2], strict=True):
                value = found.get(name)
                if how == AS_SEEN and type(value) is int and value in objects:
                    found[name] = objects[value]
                elif how == AS_EMPTY and value == 0:
                    found[name] = {}
                elif how == AS_PATH and type(value) is str:
                    found[name] = path(value)
                elif how == AS_ARRAY and type(value) is list:
                    found[name] = tuple(value)
                elif how == AS_PATHS and type(value) is list and all(type(part) is str for part in value):
                    found[name] = tuple(map(path, value))
                else:
                    raise ValueError(f"{tag}.{name} written as {how!r}: {value!r}")
            made: Any = object.__new__(cls)  # as pickle makes it: no __init__ runs, the declared fields are set
            object.__setattr__(made, "__dict__", found)
            objects[index] = made
            return made
        if tag == "tuple":
            return tuple(found["v"])
        if tag == "path":
            return path(found["v"])
        if tag == "map":
            return {key: item for key, item in found["v"]}
        if tag == "set" or tag == "frozenset":
            return (set if tag == "set" else frozenset)(found["v"])
        enum = by_name.get(tag)
        if enum is None:
            raise ValueError(f"a record names {tag!r}, which it may not hold")
        table = constants.get(tag)
        if table is not None:
            if found["v"] not in table:
                raise ValueError(f"no {tag} named {found['v']!r}")
            return table[found["v"]]
        return enum(found["v"])  # an enum: a member by value, never a new one

    return made

    return made


def loads(text: str | bytes, classes: Classes) -> Any:
    """What `dumps` wrote (ValueError for anything else: malformed, or naming a class `classes` lacks)."""
    try:
        return json.loads(text, object_hook=_hook(classes))
    except (KeyError, TypeError, RecursionError) as exc:  # a tag without its fields, an unhashable key, nesting
        raise ValueError(f"not a record: {exc}") from None


def dumps(value: Any, classes: Classes) -> str:
    """`value` as typed JSON text (`loads` reads it back equal)."""
    return json.dumps(encode(value, classes), separators=(",", ":"))
