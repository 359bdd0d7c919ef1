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
    <vouches_for, JSON: {"paths": the paths joined by NUL, "identities": one digest of their identities}, or null>
    <body, JSON: every other field>
    [<blob: bytes the body indexes, as they are>]

The blob holds text that JSON would only slow down (the report's rendered HTML: decoding 30 MB of escaped strings
took three times unpickling them); its owner's body says where each piece lies in it.

The files a record vouches for are kept as one string of paths and one digest of their identities (`vouch`), not as
a JSON object of path -> identity: the no-op stamp vouches for every file of every task (45,000 at 10,000 targets),
and decoding 45,000 identities on every no-op cost more than stat-ing the files; a changed file is found by the
digest as surely, only not by name (a miss is a miss: the full check that follows says what changed).
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import json_value
from ..files.layout import write_atomic

if TYPE_CHECKING:
    from . import codec

KEY, VOUCHES = "key", "vouches_for"  # every record's staleness fields: one rule for all (`current`)
PATHS, IDENTITIES = "paths", "identities"  # what `vouches_for` holds (`vouch`)
BLOB = "blob"  # a record's bytes after its body, when it has them (read as a memoryview: not copied)
MAGIC = b"epbuild-record 1"


def current(record: Any, key: Any) -> dict[str, Any] | None:
    """The one invalidation rule of `.state/`: a record is current when its `key` is the reader's (the project key,
    a record format with it, the renderer's version: whatever its owner says makes it stale) and every file it
    vouches for (`vouches_for`, made by `vouch`: each file's identity, ctime included, or its absence) still has that
    identity.
    Torn, foreign, stale and absent are one case: a miss (None), which a full check makes good."""
    if not isinstance(record, dict) or record.get(KEY) != key:
        return None
    files = record.get(VOUCHES)
    return record if files is None or identities_hold(files) else None


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
        if json_value(key_line) != key:
            return None
        vouches = json_value(vouch_line)
        if vouches is not None and not identities_hold(vouches):
            return None
        if classes is None:
            found = json_value(body)
        else:  # typed JSON: the saved plan's (imported only by its readers and writers)
            from .codec import loads

            found = loads(body, classes)
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
            return json_value(file.readline())
    except (OSError, ValueError):
        return None


def encode_record(record: dict[str, Any], classes: codec.Classes | None = None) -> bytes:
    """A record's bytes, as `decode_record` reads them (alone, or as a journaled record's base): it names its `key`,
    and may carry a `blob` (bytes) after its body. TypeError for a value the form cannot hold (plain JSON, or typed
    JSON of `classes`)."""
    assert KEY in record, "a record names what makes it stale"
    body = {name: value for name, value in record.items() if name not in (KEY, VOUCHES, BLOB)}
    if classes is None:
        text = json.dumps(body, separators=(",", ":"), check_circular=False)  # a record is built as a tree
    else:
        from .codec import dumps

        text = dumps(body, classes)
    header = [json.dumps(record[KEY]), json.dumps(record.get(VOUCHES), separators=(",", ":"))]
    blob = [record[BLOB]] if BLOB in record else []
    return b"\n".join([MAGIC, *(line.encode() for line in header), text.encode(), *blob])


def write_record(path: Path, record: dict[str, Any], classes: codec.Classes | None = None) -> None:
    """A record under `.state/`, written atomically (a reader sees the old one or this one, whole)."""
    data = encode_record(record, classes)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)


def vouch(files: dict[str, list[int] | None]) -> dict[str, str]:
    """What a record keeps of the files it vouches for (`files`: path -> the identity it judged, `files.layout.
    file_identity`; None for a file that was absent): their paths and one digest of those identities, in the order
    `identities_hold` stats them. A path holding NUL names no file, and is left out."""
    paths = [path for path in files if "\0" not in path]
    try:
        digest = _digest(files[path] for path in paths)
    except OverflowError:  # an identity past 64 bits (no filesystem epbuild was run on): a record that never holds
        digest = ""
    return {PATHS: "\0".join(paths), IDENTITIES: digest}


def vouched_files(vouches: dict[str, str]) -> int:
    """How many files a record vouches for."""
    return vouches[PATHS].count("\0") + 1 if vouches[PATHS] else 0


ABSENT = (-1, -1, -1)  # no file has a negative size


def _digest(identities: Iterable[list[int] | None]) -> str:
    """One digest of many identities (size, mtime, ctime: signed; inode: unsigned), packed as machine integers:
    formatting 45,000 of them as text would cost what decoding them did."""
    times, inodes = array("q"), array("Q")
    for identity in identities:
        if identity is None:
            times.extend(ABSENT)
            inodes.append(0)
        else:
            times.extend(identity[:3])
            inodes.append(identity[3])
    return hashlib.sha256(times.tobytes() + inodes.tobytes()).hexdigest()


def identities_hold(vouches: Any) -> bool:
    """Whether every file a record vouches for (`vouch`) still has the identity it had (`files.layout.stat_key`,
    ctime included), or is still absent. One stat per file and one digest: no identity is decoded or compared in
    Python."""
    if not (isinstance(vouches, dict) and isinstance(vouches.get(PATHS), str)
            and isinstance(vouches.get(IDENTITIES), str)):
        return False
    times, inodes = array("q"), array("Q")
    stat, add_times, add_inode = os.stat, times.extend, inodes.append
    try:
        for path in vouches[PATHS].split("\0") if vouches[PATHS] else ():
            try:
                found = stat(path)
            except OSError:
                add_times(ABSENT)
                add_inode(0)
                continue
            add_times((found.st_size, found.st_mtime_ns, found.st_ctime_ns))
            add_inode(found.st_ino)
    except OverflowError:  # an identity past 64 bits: never vouched for (`_digest` could not have packed it)
        return False
    return hashlib.sha256(times.tobytes() + inodes.tobytes()).hexdigest() == vouches[IDENTITIES]
