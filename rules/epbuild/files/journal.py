"""Append-only journals beside whole-file records (the settings record, the report's part store, the run record):
a run appends one JSON line of what it changed instead of rewriting megabytes, and readers lay the lines over the
base. Not used by the jobs (their code is in every fingerprint)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# Every run reads a journal whole; the run whose line would take it past an eighth of its base, or past 256 KiB
# (~1 ms of JSON), rewrites the base instead: a rewrite costs the base's size once, a long journal costs every run
# (at 10,000 targets, half the report parts' 30 MB base, the earlier limit, is 15 MB of JSON).
JOURNAL_LIMIT = 256 * 1024


def outgrown(base_size: int, journal_size: int) -> bool:
    """Whether a journal of `journal_size` bytes (with the line about to be appended) is due to be merged into its
    base of `base_size`."""
    return journal_size > min(base_size // 8, JOURNAL_LIMIT)


def journal_of(path: Path) -> Path:
    """`configs.json` -> `configs.journal`."""
    return path.with_suffix(".journal")


def read_lines(path: Path) -> tuple[list[Any], int]:
    """Each line of the journal, parsed (None for one a killed writer tore), and the journal's size (0 when it
    cannot be read)."""
    try:
        text = path.read_text()
    except OSError:
        return [], 0
    parsed = []
    for line in text.splitlines():
        try:
            parsed.append(json.loads(line))
        except ValueError:
            parsed.append(None)
    return parsed, len(text)


def append_line(path: Path, line: str) -> None:
    """Append one line on a line of its own: after a line a killed writer tore, the torn part stays alone (skipped
    by readers) instead of spoiling this one."""
    with open(path, "a+b") as handle:
        if handle.tell():
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                line = "\n" + line
        handle.write(line.encode())

