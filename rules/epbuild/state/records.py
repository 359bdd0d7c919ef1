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


def decode_record(data: bytes, field: str, expected: Any) -> dict[str, Any] | None:
    """A record this epbuild wrote (`write_record`) whose `field` holds `expected` (the project key, the record's
    format, the renderer's version: what makes it stale), else None. Torn, foreign, stale and absent are one case
    for every record under `.state/`: a miss, which a full check makes good."""
    try:
        record = pickle.loads(data)
    except Exception:  # noqa: BLE001 - whatever an unpickler raises on bytes it did not write
        return None
    return record if isinstance(record, dict) and record.get(field) == expected else None


def read_record(path: Path, field: str, expected: Any) -> dict[str, Any] | None:
    """`decode_record` of the file at `path`; None when it cannot be read."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return decode_record(data, field, expected)


def write_record(path: Path, record: dict[str, Any]) -> None:
    """A record under `.state/`, written atomically (a reader sees the old one or this one, whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL))


def identities_hold(files: dict[str, Any]) -> bool:
    """Whether every file recorded with its identity (`files.layout.file_identity`: ctime included) still has it."""
    return all(file_identity(path) == identity for path, identity in files.items())
