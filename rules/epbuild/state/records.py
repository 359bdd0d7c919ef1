"""The records under `.state/` (the no-op stamp, the saved plan; the bases of the last run's record and the report's
parts, `journaled`): one way to read, check and write them. Each names what makes it stale in one field (the project
key, its format, the renderer's version) and, where it vouches for files, their identities (ctime included); whatever
does not match is a miss, never an error, and a full check writes the record again (`state.registry`).

A record is data, never code: anyone can put a file under `artifacts/` (a pull request that force-adds one, a
checkout), so it is JSON, read in the order that costs least and trusts least. Its key first, then the files it
vouches for, and only then its body; a body that holds epbuild's own objects (the plan) is typed JSON, made only of
the classes its reader names (`codec`):

    epbuild-record 1
    <key, JSON>
    <vouches_for, JSON: path -> identity, or null>
    <body, JSON: every other field>
    [<blob: bytes the body indexes, as they are>]

The blob holds text that JSON would only slow down (the report's rendered HTML: decoding 30 MB of escaped strings
took three times unpickling them); its owner's body says where each piece lies in it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..files.layout import file_identity, write_atomic
from . import codec

KEY, VOUCHES = "key", "vouches_for"  # every record's staleness fields: one rule for all (`current`)
BLOB = "blob"  # a record's bytes after its body, when it has them (read as a memoryview: not copied)
MAGIC = b"epbuild-record 1"


def current(record: Any, key: Any) -> dict[str, Any] | None:
    """The one invalidation rule of `.state/`: a record is current when its `key` is the reader's (the project key,
    a record format with it, the renderer's version: whatever its owner says makes it stale) and every file it
    vouches for (`vouches_for`: path -> identity, ctime included; None for one that was absent) still has that identity.
    Torn, foreign, stale and absent are one case: a miss (None), which a full check makes good."""
    if not isinstance(record, dict) or record.get(KEY) != key:
        return None
    files = record.get(VOUCHES, {})
    return record if isinstance(files, dict) and identities_hold(files) else None


def decode_record(data: bytes, key: Any, classes: codec.Classes | None = None, start: int = 0,
                  end: int | None = None) -> dict[str, Any] | None:
    """The record in `data[start:end]` (`encode_record`), when it is current under `key`: the key is compared
    before anything else is decoded, the vouched files before the body. `classes`: the objects its body may hold
    (typed JSON), else plain JSON. None for anything else, whatever the bytes."""
    end = len(data) if end is None else end
    ends: list[int] = []  # where the header's three lines and the body end (found, not sliced: a blob may be 30 MB)
    for _ in range(4):
        ends.append(data.find(b"\n", ends[-1] + 1 if ends else start, end))
        if ends[-1] < 0:
            break
    if len(ends) < 3 or ends[2] < 0 or data[start:ends[0]] != MAGIC:
        return None
    key_line, vouch_line = data[ends[0] + 1:ends[1]], data[ends[1] + 1:ends[2]]
    body = data[ends[2] + 1:ends[3] if ends[-1] >= 0 else end]  # compact JSON holds no newline
    try:
        if json.loads(key_line) != key:
            return None
        vouches = json.loads(vouch_line)
        if vouches is not None and not (isinstance(vouches, dict) and identities_hold(vouches)):
            return None
        found = json.loads(body) if classes is None else codec.loads(body, classes)
    except ValueError:  # malformed JSON, bytes that are not UTF-8, an object the reader does not allow
        return None
    if not isinstance(found, dict) or KEY in found or VOUCHES in found or BLOB in found:
        return None
    found[KEY] = key
    if len(ends) == 4 and ends[3] >= 0:
        found[BLOB] = memoryview(data)[ends[3] + 1:end]
    if vouches is not None:
        found[VOUCHES] = vouches
    return found


def read_record(path: Path, key: Any, classes: codec.Classes | None = None) -> dict[str, Any] | None:
    """`decode_record` of the file at `path`; None when it cannot be read."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return decode_record(data, key, classes)


def read_key(path: Path) -> Any:
    """The key a record at `path` was written under (None: none, or no record), read from its first two lines
    only: enough for a writer to see that the record already holds what it would write."""
    try:
        with open(path, "rb") as file:
            if file.readline() != MAGIC + b"\n":
                return None
            return json.loads(file.readline())
    except (OSError, ValueError):
        return None


def encode_record(record: dict[str, Any], classes: codec.Classes | None = None) -> bytes:
    """A record's bytes, as `decode_record` reads them (alone, or as a journaled record's base): it names its `key`,
    and may carry a `blob` (bytes) after its body. TypeError for a value the form cannot hold (plain JSON, or typed
    JSON of `classes`)."""
    assert KEY in record, "a record names what makes it stale"
    body = {name: value for name, value in record.items() if name not in (KEY, VOUCHES, BLOB)}
    text = json.dumps(body, separators=(",", ":")) if classes is None else codec.dumps(body, classes)
    header = [json.dumps(record[KEY]), json.dumps(record.get(VOUCHES), separators=(",", ":"))]
    blob = [record[BLOB]] if BLOB in record else []
    return b"\n".join([MAGIC, *(line.encode() for line in header), text.encode(), *blob])


def write_record(path: Path, record: dict[str, Any], classes: codec.Classes | None = None) -> None:
    """A record under `.state/`, written atomically (a reader sees the old one or this one, whole)."""
    data = encode_record(record, classes)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)


def identities_hold(files: dict[str, Any]) -> bool:
    """Whether every file recorded with its identity (`files.layout.file_identity`: ctime included) still has it."""
    return all(type(path) is str and file_identity(path) == identity for path, identity in files.items())
