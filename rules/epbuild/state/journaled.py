"""One file per record that grows by appended lines (the settings record, the last run's record, the report's parts,
the external-data index): a header line, the base, then one JSON line per run that changed it since. A run appends
the line of what it changed instead of rewriting megabytes, and readers lay the lines over the base; the base is
rewritten, lines merged, when they outgrow it (`outgrown`). Before, each record kept its lines in a journal file and
a text base its digest in a third: one file now holds all three, so a record is read, written and watched (its
identity) as one.

    epbuild-journaled <base size> <sha256 of the base, or ->\\n<base><line>\\n<line>\\n...

The digest vouches that a text base is exactly what its writer made (`files.entry_lines`: its entries are then
split without decoding the whole); a record's base (`records`) names none (its own key says whether it is stale).
A line a killed writer tore is read as None, and a line appended after it starts on a line of its own.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from ..errors import json_value
from ..files.layout import file_identity, write_atomic

MAGIC = b"epbuild-journaled"
UNVOUCHED = "-"

# Every run reads a record's lines whole; the run whose line would take them past an eighth of the base, or past
# 256 KiB (~1 ms of JSON), rewrites the base instead: a rewrite costs the base's size once, long lines every run (at
# 10,000 targets, half the report parts' 30 MB base, the earlier limit, is 15 MB of JSON).
JOURNAL_LIMIT = 256 * 1024


def outgrown(base_size: int, journal_size: int) -> bool:
    """Whether `journal_size` bytes of lines (with the line about to be appended) are due to be merged into a base
    of `base_size`."""
    return journal_size > min(base_size // 8, JOURNAL_LIMIT)


class Journaled:
    """A record as read: its base (`data[start:end]`: found, not copied, as a base may be tens of MB), its lines
    (parsed; None for a torn one) and what was read (the file's identity, taken before it was read, and its sizes),
    which `append` checks so that a line never extends a base it was not computed against."""

    __slots__ = ("data", "end", "identity", "lines", "lines_size", "start", "vouched")

    def __init__(self, data: bytes, start: int, end: int, lines: list[Any], lines_size: int,
                 identity: list[int] | None, vouched: bool):
        self.data, self.start, self.end = data, start, end
        self.lines, self.lines_size, self.identity, self.vouched = lines, lines_size, identity, vouched

    @property
    def base(self) -> bytes:
        return self.data[self.start:self.end]


def _digest(base: bytes | memoryview) -> str:
    return hashlib.sha256(base).hexdigest()


def read_journaled(path: Path, vouch: bool = False) -> Journaled | None:
    """The record at `path`; None when absent, unreadable or not one (`vouch`: check the base's digest)."""
    identity = file_identity(str(path))
    try:
        data = path.read_bytes()
    except OSError:
        return None
    start = data.find(b"\n") + 1
    fields = data[:start].rstrip(b"\n").split(b" ")
    if start == 0 or len(fields) != 3 or fields[0] != MAGIC or not fields[1].isdigit():
        return None
    end = start + int(fields[1])
    if len(data) < end:
        return None
    tail = data[end:]
    lines = []
    for line in tail.split(b"\n"):
        if line:
            try:
                lines.append(json_value(line))
            except ValueError:
                lines.append(None)
    vouched = vouch and fields[2].decode(errors="replace") == _digest(memoryview(data)[start:end])
    return Journaled(data, start, end, lines, len(tail), identity, vouched)


def write_journaled(path: Path, base: bytes, vouch: bool = False) -> None:
    """The record with `base` and no lines, atomically (a reader sees the old one or this one, whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = b"%s %d %s\n" % (MAGIC, len(base), (_digest(base) if vouch else UNVOUCHED).encode())
    write_atomic(path, header + base)


def append(path: Path, read: Journaled, line: str) -> bool:
    """Append one JSON line to the record as `read`, when the file is still the one read (its identity) and the
    lines are not due to be merged; False when the caller is to write the record whole (`write_journaled`). Callers
    that may race hold `state.registry.records_lock`."""
    if read.identity is None or file_identity(str(path)) != read.identity:
        return False
    data = line.encode()
    if outgrown(read.end - read.start, read.lines_size + len(data) + 1):
        return False
    with open(path, "a+b") as handle:
        handle.seek(-1, os.SEEK_END)  # the header ends in a newline: never empty
        if handle.read(1) != b"\n":  # after a line a killed writer tore, on a line of its own
            data = b"\n" + data
        handle.write(data if data.endswith(b"\n") else data + b"\n")
    return True
