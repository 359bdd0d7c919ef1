"""Content hashes (sha256) remembered per (path, size, mtime, ctime, inode): an unchanged file is never hashed twice.

The memory is an append-only tab-separated file in `artifacts/.state/`, so it survives a doit run that was killed
and is shared by concurrent builders (each appended line is one small write). doit's file checker uses it too
(`epbuild.tasks`): after a fresh clone doit's own md5 checker re-hashes every file on every run, this one once.
A file changed within the last clock tick (`layout.settled`) is hashed but its identity is not remembered.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from .layout import settled, stat_key, write_atomic

CHUNK = 1 << 20
COMPACT_SLACK = 1000  # superseded lines tolerated before the memory is rewritten
LOOKUPS_BEFORE_LOADING = 64  # files looked up by searching the memory's text before it is parsed whole


def sha256_file(path: str | Path) -> str:
    """Chunked, so memory stays flat for multi-GB models."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while count := handle.readinto(buffer):
            digest.update(view[:count])
    return digest.hexdigest()


class FileHashes:
    """sha256 by file identity. The memory is read on first use, so a no-op run, whose file checks all match by
    identity, never loads it."""

    def __init__(self, state_dir: Path):
        self.log = state_dir / "hashes.tsv"
        self._known: dict[str, tuple[list[int], str]] | None = None
        # a run that hashes a few files (one model changed among 10,000) searches the memory's text for them:
        # parsing every line took 0.5 s at 10,000 targets; past LOOKUPS_BEFORE_LOADING it is parsed whole
        self._text: str | None = None
        self._lookups = 0
        self._added: dict[str, tuple[list[int], str]] = {}  # remembered here while the memory is not parsed
        self._appender: Any = None  # the memory, open for appending: one write per new hash, not an open
        # digests by (device, size, mtime, ctime, inode) seen in this process: a file stored into the cache, published
        # or restored by hard links is read once, not once per name (a 1 GB artifact took 0.6 s per name)
        self._by_identity: dict[tuple[int, ...], str] = {}

    @property
    def known(self) -> dict[str, tuple[list[int], str]]:
        if self._known is None:
            self._known = {}
            lines = 0
            try:
                with open(self.log, encoding="utf-8") as handle:
                    for line in handle:
                        lines += 1
                        fields = line.rstrip("\n").split("\t")
                        if len(fields) == 6 and len(fields[5]) == 64:  # else a line cut short by a killed process
                            self._known[fields[0]] = ([int(f) for f in fields[1:5]], fields[5])
            except FileNotFoundError:
                pass
            self._known.update(self._added)
            if lines > 2 * len(self._known) + COMPACT_SLACK:
                self._compact()
        return self._known

    def _compact(self) -> None:
        """Rewrite the memory with one line per file that still exists: every rebuild appends lines, and loading
        them all is what a run pays when a file's identity changed. A line another builder appends meanwhile may
        be lost; that file is then hashed once more."""
        kept = {path: entry for path, entry in (self._known or {}).items() if os.path.exists(path)}
        write_atomic(self.log, "".join("\t".join([path, *map(str, key), digest]) + "\n"
                                       for path, (key, digest) in kept.items()))
        self._known = kept
        self._appender = None  # it appended to the file just replaced

    def copied(self, path: Path, digest: str) -> None:
        """`path` was just copied from a file whose sha256 was verified as `digest`: not read again in this
        process (a copy is new, so its identity is not remembered across processes yet)."""
        stat = os.stat(path)
        self._by_identity[(stat.st_dev, *stat_key(stat))] = digest

    def _remembered(self, absolute: str) -> tuple[list[int], str] | None:
        """The memory's (identity, sha256) of a file: its last line, as the whole memory read in order says."""
        if self._known is not None:
            return self._known.get(absolute)
        if absolute in self._added:
            return self._added[absolute]
        self._lookups += 1
        if self._lookups > LOOKUPS_BEFORE_LOADING:
            return self.known.get(absolute)
        if self._text is None:
            try:
                with open(self.log, encoding="utf-8") as handle:
                    self._text = "\n" + handle.read()
            except FileNotFoundError:
                self._text = "\n"
        start = self._text.rfind(f"\n{absolute}\t")
        while start >= 0:
            end = self._text.find("\n", start + 1)
            if end < 0:  # a line cut short by a killed process
                start = self._text.rfind(f"\n{absolute}\t", 0, start)
                continue
            fields = self._text[start + 1:end].split("\t")
            if len(fields) == 6 and len(fields[5]) == 64:
                return [int(f) for f in fields[1:5]], fields[5]
            start = self._text.rfind(f"\n{absolute}\t", 0, start)
        return None

    def sha256(self, path: str | Path, stat: os.stat_result | None = None) -> str:
        absolute = os.path.abspath(path)
        stat = stat or os.stat(absolute)
        key = stat_key(stat)
        identity = (stat.st_dev, *key)  # the same file under another name: a hard link (cache entry, artifact)
        remembered = self._remembered(absolute)
        if remembered and remembered[0] == key:
            self._by_identity[identity] = remembered[1]
            return remembered[1]
        digest = self._by_identity.get(identity) or sha256_file(absolute)
        if not settled(stat):
            return digest  # it may change again under this identity: hashed again next time
        self._by_identity[identity] = digest
        (self._known if self._known is not None else self._added)[absolute] = (key, digest)
        if "\t" not in absolute and "\n" not in absolute:
            if self._appender is None:
                self.log.parent.mkdir(parents=True, exist_ok=True)
                self._appender = open(self.log, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - kept open
            self._appender.write("\t".join([absolute, *map(str, key), digest]) + "\n")  # line-buffered: one write
        return digest


def snapshot(paths: list[Path]) -> dict[Path, list[int] | None]:
    """The identity of each input before it is hashed: compared again after the job (`changed_inputs`), so that
    what a job read is what its fingerprint names."""
    identities: dict[Path, list[int] | None] = {}
    for path in paths:
        try:
            identities[path] = stat_key(os.stat(path))
        except OSError:
            identities[path] = None
    return identities


def changed_inputs(before: dict[Path, list[int] | None]) -> list[Path]:
    """The inputs of `snapshot` whose identity is not what it was."""
    now = snapshot(list(before))
    return [path for path, identity in before.items() if now[path] != identity]
