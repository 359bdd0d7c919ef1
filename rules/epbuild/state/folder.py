"""`StateFolder`: the one interface to `artifacts/.state/`. Every file under it is declared in `state.registry` and
read and written here, in one of four forms: a record (`records`: key, vouched files, then a JSON body, typed where it
holds epbuild's objects), a journaled record (a base with lines appended since: `journaled`), a JSON document, and
the hash memory's shards (`hash_memory`). Every form is data: nothing read here is unpickled, imported or run, since a
checkout can bring any file under `artifacts/`. Whatever cannot be read as its form, or is stale by its record's key,
is a miss, never an error: a full check writes it again.

Each record says what makes it stale by one rule (`records.current`): its `key` (the project key for the no-op
stamp, the listing and the plan; the record's format with it for the run record; the renderer's version for the
report's parts; the probe's inputs for the host probe) checked on read, and, where it vouches for files, their
identities (`vouches_for`, ctime included). The entry records (settings, external-data index) are judged entry by
entry: a task's settings digest, a model file's identity. One key for all would be wrong: a change of epbuild's code
must drop the plan, not make a run hash a 3 GiB model again (the hash memory and the external-data index are keyed
by the files they describe)."""

from __future__ import annotations

import json
import shutil
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from ..errors import json_value
from ..files.entry_lines import LazyEntries, entry_lines, plain_texts
from ..files.layout import write_atomic, write_json
from .codec import Classes
from .journaled import Journaled, append, read_journaled, write_journaled
from .records import current, decode_record, encode_record, read_key, read_record, write_record
from .registry import records_lock, settle_format, state_file


class StateFolder:
    """`artifacts/.state/` of one project (a plain object: made wherever a module needs it, no state of its own)."""

    __slots__ = ("root",)

    def __init__(self, root: Path):
        self.root = root

    def path(self, name: str) -> Path:
        """A declared file's path (`state.registry` refuses any other name): to watch its identity, or for the
        forms that keep their own format (the hash shards, the build report's digest)."""
        return state_file(self.root, name)

    def _writable(self, name: str) -> Path:
        """The path to write `name` at, its folder made; a folder found where the file belongs (a checkout's, or a
        hand's) removed first: it is no record, and every later run would fail to replace it."""
        path = self.path(name)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def drop(self, name: str) -> None:
        """Forget a record (the next run takes the full path for what it would have shortened)."""
        path = self.path(name)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        path.unlink(missing_ok=True)

    def lock(self) -> AbstractContextManager[None]:
        """Held while a build merges into a record other builds write too (the run record, the settings record)."""
        self.root.mkdir(parents=True, exist_ok=True)
        return records_lock(self.root)

    def settle(self) -> str | None:
        """Make the folder this layout's and this user's (`registry.settle_format`): why it was emptied, else None."""
        return settle_format(self.root)

    # records and JSON documents: current by one rule (`records.current`: their key, their files)

    def read_record(self, name: str, key: Any, classes: Classes | None = None) -> dict[str, Any] | None:
        """`classes`: the objects the record's body may hold (typed JSON, `codec`); else plain JSON."""
        return read_record(self.path(name), key, classes)

    def write_record(self, name: str, record: dict[str, Any], classes: Classes | None = None) -> None:
        write_record(self._writable(name), record, classes)

    def read_key(self, name: str) -> Any:
        """The key a record was written under (`records.read_key`), its body not read."""
        return read_key(self.path(name))

    # journaled records: a base and the lines appended since

    def read_journaled(self, name: str, key: Any) -> tuple[dict[str, Any], Journaled] | None:
        """A journaled record whose base (a plain record) is current under `key` (the files it vouches for are judged
        by its owner, after its lines), and what was read (for `append`)."""
        found = read_journaled(self.path(name))
        if found is None:
            return None
        base = decode_record(found.data, key, None, found.start, found.end)
        return (base, found) if base is not None else None

    def write_journaled(self, name: str, record: dict[str, Any]) -> None:
        write_journaled(self._writable(name), encode_record(record))

    def append(self, name: str, read: Journaled, line: dict[str, Any]) -> bool:
        """Append `line` to the record as it was read; False when it is to be written whole (it changed since, or
        its lines outgrew the base)."""
        return append(self.path(name), read, json.dumps(line, separators=(",", ":"), check_circular=False))

    # entry records: a JSON object of one entry per line, decoded entry by entry, with lines of changed entries

    def read_entries(self, name: str) -> tuple[LazyEntries, Journaled] | None:
        """The entries, with each appended line's laid over them (a torn line is skipped: its entries keep their
        older values), and what was read."""
        found = read_journaled(self.path(name), vouch=True)
        if found is None:
            return None
        try:
            text = found.base.decode()
            texts = plain_texts(text) if found.vouched else None
            if texts is not None:
                entries = LazyEntries(texts)
            else:
                data = json_value(text)
                if not isinstance(data, dict):
                    return None
                entries = LazyEntries(decoded=data)
        except ValueError:
            return None
        for added in found.lines:
            if isinstance(added, dict):
                entries.update(added)
        return entries, found

    def write_entries(self, name: str, entries: LazyEntries) -> None:
        """The entries as the base of a record with no lines: those not set since they were read are written as
        read, without encoding them again."""
        text = "{\n" + entry_lines({key: entries.text(key) for key in entries}) + "\n}\n"
        write_journaled(self._writable(name), text.encode(), vouch=True)

    # JSON documents: records people may read (the host probe, the listing), and the settings kept for `explain`

    def read_document(self, name: str, key: Any) -> dict[str, Any] | None:
        """A JSON record (`write_document`), when current under `key`."""
        try:
            return current(json_value(self.path(name).read_text()), key)
        except (OSError, ValueError):
            return None

    def write_document(self, name: str, data: Any, indent: int | None = None) -> None:
        write_json(self._writable(name), data, indent=indent)

    def write_text(self, name: str, text: str) -> None:
        write_atomic(self._writable(name), text)
