"""`artifacts/.state/last-run.journaled`: the record of the last default run (`tasks.selection`), written at the end
of every one.

At 10,000 targets the record is several MB, and rewriting it whole was a large share of a run that changed four
tasks (its base is a JSON record, `state.records`). A run
whose record was the one it read (no other run wrote since: its identity, checked under a lock) appends one JSON
line of what changed instead (`state.journaled`): tasks, files and task_deps added, changed or gone, and the new
watched identities. The record is rewritten whole when its lines outgrow it (`state.journaled.outgrown`), or when
another run wrote meanwhile. Each line names the base it extends; a torn line (a killed build) or a line of
another base makes the record unusable: the next run takes the full path, never a record that lost a change.

The base holds the files' identities packed (`packed`): one string of paths and one of 64-bit integers, four per
file, instead of a JSON list per file (40,000 of them at 10,000 targets were most of writing the record whole).
"""

from __future__ import annotations

import base64
import itertools
import operator
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..fast_path import DEP_FILE, file_identity
from ..files.layout import Layout
from ..state.folder import StateFolder
from ..state.registry import CONFIGS
from .checker import SEEN_CHANGING
from .selection import Identity, Recorded

FORMAT = 5  # 4: one journaled file (`state.journaled`); 5: the base's files packed (`packed`)
RECORD = "last-run.journaled"
PARTS = ("tasks", "files", "task_deps")  # laid over the base key by key; looked_at and watched are replaced
_ABSENT = object()
_WIDTH = 4  # an identity: size, mtime_ns, ctime_ns, inode (`files.layout.stat_key`)
_ZEROS = [0] * _WIDTH


def _packing(files: int) -> struct.Struct:  # the numbers of `files` identities
    return struct.Struct(f"<{_WIDTH * files}q")


def packed(files: dict[str, Identity]) -> dict[str, Any]:
    """`files` as JSON can hold them cheaply: the paths joined by NUL (no path holds one), every identity's four
    integers as little-endian signed 64-bit numbers in base64, and, by position, each identity of another form as
    it is (None: absent; `SEEN_CHANGING`; a number past 64 bits) with zeros in its place."""
    values: list[Any] = list(files.values())
    others: dict[int, Identity] = {}
    if None in values or set(map(len, values)) - {_WIDTH}:  # both checks in C: the common case has no other form
        others = {index: value for index, value in enumerate(values) if value is None or len(value) != _WIDTH}
        for index in others:
            values[index] = _ZEROS
    try:
        numbers = _packing(len(values)).pack(*itertools.chain.from_iterable(values))
    except struct.error:  # a number past 64 bits (an inode past 2**63): found one file at a time
        for index, value in enumerate(values):
            try:
                _packing(1).pack(*value)
            except struct.error:
                others[index], values[index] = value, _ZEROS
        numbers = _packing(len(values)).pack(*itertools.chain.from_iterable(values))
    return {"paths": "\0".join(files), "identities": base64.b64encode(numbers).decode("ascii"),
            "others": [[index, value] for index, value in others.items()]}


def unpacked(form: Any) -> dict[str, Identity]:
    """The files `packed` wrote; ValueError (or IndexError) for anything else: the record is then unusable."""
    if not isinstance(form, dict) or not all(isinstance(form.get(k), t) for k, t in
                                             (("paths", str), ("identities", str), ("others", list))):
        raise ValueError("not a packed record of files")
    paths = form["paths"].split("\0") if form["paths"] else []
    try:
        numbers = _packing(len(paths)).unpack(base64.b64decode(form["identities"], validate=True))
    except struct.error:
        raise ValueError("as many identities as paths") from None
    each = iter(numbers)
    identities: list[Identity] = list(map(list, zip(*[each] * _WIDTH, strict=False)))  # four at a time
    for index, value in form["others"]:
        if not isinstance(index, int) or index < 0:
            raise ValueError("a file's position")
        identities[index] = value
    return dict(zip(paths, identities, strict=True))


def _changes(before: dict[str, Any], after: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The entries `after` adds or changes, and the keys it drops. An entry holding the very object `before` holds
    is unchanged: found without a Python-level step per entry (`next_record` keeps the last record's objects), so
    a run that changed four tasks of 20,000 compares four."""
    keys = list(after)
    then = map(before.get, keys, itertools.repeat(_ABSENT))  # an absent key is not a None entry
    differ = itertools.compress(keys, map(operator.is_not, then, after.values()))
    return {k: after[k] for k in differ if k not in before or before[k] != after[k]}, list(before.keys() - after.keys())


def next_record(old: Recorded | None, kept: list[str], found: dict[str, list[str]],
                found_deps: dict[str, list[str]], checked: Mapping[str, Identity]) -> Recorded:
    """The record of this run: the tasks not handed to doit (`kept`, up to date by `old`) as `old` has them (its
    very objects), and those doit found up to date (`found`: their files; `found_deps`: their task_dep) with the
    identities its checks saw (`checked`). A kept file that doit saw with another identity in this run is recorded
    as seen changing (`tasks.checker.saw`), so that neither task's record vouches for it. Costs what doit was
    handed, not what the record holds: a record of 20,000 tasks is copied, not walked, in Python."""
    tasks: dict[str, list[str]] = {}
    task_deps: dict[str, list[str]] = {}
    files: dict[str, Identity] = {}
    kept_paths: set[str] = set()
    if old is not None:
        tasks, task_deps, files = dict(old.tasks), dict(old.task_deps), dict(old.files)
        for name in tasks.keys() - set(kept):
            del tasks[name]
        for name in task_deps.keys() - tasks.keys():
            del task_deps[name]
        kept_paths = set().union(*tasks.values())
        for path in files.keys() - kept_paths:
            del files[path]
        for path in kept_paths.intersection(checked):
            if checked[path] != files[path]:
                files[path] = SEEN_CHANGING
    tasks.update(found)
    task_deps.update(found_deps)
    for path in set().union(*found.values()).difference(kept_paths):
        files[path] = checked.get(path)
    return Recorded(tasks, files, task_deps)


class RunRecord:
    """The record: loaded as base plus lines, written as a line where it can be."""

    def __init__(self, layout: Layout):
        self.state = StateFolder(layout.state)
        self.watched = [self.state.path(CONFIGS), layout.build_report, Path(DEP_FILE)]

    def _read(self, key: str) -> tuple[dict[str, Any], Any] | None:
        """The record as base and lines make it, and what was read; None when absent, unreadable, torn, mixed or
        written under another key."""
        found = self.state.read_journaled(RECORD, f"{FORMAT}:{key}")
        if found is None:
            return None
        record, read = found
        try:
            record["files"] = unpacked(record["files"])
        except (ValueError, TypeError, IndexError):  # torn, foreign, edited by hand: the full path
            return None
        for line in read.lines:
            if not isinstance(line, dict) or line.get("base") != record["generation"]:
                return None
            for part in PARTS:
                record[part].update(line[part])
                for gone in line["gone"][part]:
                    record[part].pop(gone, None)
            record["looked_at"], record["watched"] = line["looked_at"], line["watched"]
        return record, read

    def _now(self) -> dict[str, Any]:
        return {str(path): file_identity(str(path)) for path in self.watched}

    def load(self, key: str) -> Recorded | None:
        """The record when it was written under `key` and no run wrote doit's database, the settings record or the
        build report since; else None."""
        found = self._read(key)
        if found is None:
            return None
        record, read_as = found
        if record["watched"] != self._now():
            return None
        return Recorded(record["tasks"], record["files"], record["task_deps"], record["looked_at"],
                        (read_as, record["generation"]))

    def write(self, key: str | None, recorded: Recorded, before: Recorded | None) -> None:
        """Record this run (`before`: the record it loaded, if any)."""
        watched = self._now()
        if any(identity is None for identity in watched.values()):
            return  # a run without them left no state to compare with
        with self.state.lock():
            if before is not None and before.read_as is not None and self._append(recorded, before, watched):
                return
            record = {"key": f"{FORMAT}:{key}", "generation": os.urandom(8).hex(), "watched": watched,
                      "tasks": recorded.tasks, "files": packed(recorded.files), "task_deps": recorded.task_deps,
                      "looked_at": recorded.looked_at}
            self.state.write_journaled(RECORD, record)

    def _append(self, recorded: Recorded, before: Recorded, watched: dict[str, Any]) -> bool:
        """Append what changed since `before`, when the record is still as it was read and its lines are not due
        to be merged (`state.journaled.append`); False when the record is to be written whole."""
        assert before.read_as is not None  # `write` appends only to a record read whole
        read, generation = before.read_as
        line: dict[str, Any] = {"base": generation, "gone": {}, "looked_at": recorded.looked_at, "watched": watched}
        for part in PARTS:
            line[part], line["gone"][part] = _changes(getattr(before, part), getattr(recorded, part))
        return self.state.append(RECORD, read, line)
