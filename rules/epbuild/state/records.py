"""The pickled records under `.state/` (the no-op stamp, the saved plan; the bases of the last run's record and the
report's parts, `journaled`): one way to read, check and write them. Each names what makes it stale in one field
(the project key, its format, the renderer's version) and, where it vouches for files, their identities (ctime
included); whatever does not match is a miss, never an error, and a full check writes the record again
(`state.registry`)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from ..files.layout import file_identity, write_atomic

KEY, VOUCHES = "key", "vouches_for"  # every record's staleness fields: one rule for all (`current`)


def current(record: Any, key: Any) -> dict[str, Any] | None:
    """The one invalidation rule of `.state/`: a record is current when its `key` is the reader's (the project key,
    a record format with it, the renderer's version: whatever its owner says makes it stale) and every file it
    vouches for (`vouches_for`: path -> identity, ctime included; None for one that was absent) still has that identity.
    Torn, foreign, stale and absent are one case: a miss (None), which a full check makes good."""
    if not isinstance(record, dict) or record.get(KEY) != key:
        return None
    files = record.get(VOUCHES, {})
    return record if isinstance(files, dict) and identities_hold(files) else None


def decode_record(data: bytes, key: Any) -> dict[str, Any] | None:
    """A pickled record (`write_record`), when `current` under `key`."""
    try:
        record = pickle.loads(data)
    except Exception:  # noqa: BLE001 - whatever an unpickler raises on bytes it did not write
        return None
    return current(record, key)


def read_record(path: Path, key: Any) -> dict[str, Any] | None:
    """`decode_record` of the file at `path`; None when it cannot be read."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return decode_record(data, key)


def encode_record(record: dict[str, Any]) -> bytes:
    """A record's bytes, as `decode_record` reads them (alone, or as a journaled record's base): it names its
    `key`."""
    assert KEY in record, "a record names what makes it stale"
    return pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)


def write_record(path: Path, record: dict[str, Any]) -> None:
    """A record under `.state/`, written atomically (a reader sees the old one or this one, whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, encode_record(record))


def identities_hold(files: dict[str, Any]) -> bool:
    """Whether every file recorded with its identity (`files.layout.file_identity`: ctime included) still has it."""
    return all(file_identity(path) == identity for path, identity in files.items())
