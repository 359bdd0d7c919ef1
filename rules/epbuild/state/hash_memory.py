"""Content hashes (sha256) remembered per (path, size, mtime, ctime, inode): an unchanged file is never hashed twice.

The memory is append-only tab-separated files in `artifacts/.state/hashes/`, one per shard of the paths (256, by a
hash of the path), so it survives a doit run that was killed and is shared by concurrent builders (each appended
line is one small write). A lookup reads its path's shard alone: one model changed among 10,000 targets costs a few
small reads, not a search of one memory that grows with every file ever hashed. doit's file checker uses it too
(`epbuild.tasks`): after a fresh clone doit's own md5 checker re-hashes every file on every run, this one once. A file
changed within the last clock tick (`layout.settled`) is hashed but its identity is not remembered.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..files.hashing import sha256_file
from ..files.layout import settled, stat_key, write_atomic
from .registry import state_file

COMPACT_SLACK = 64  # superseded lines a shard tolerates before it is rewritten

Remembered = dict[str, str]  # path -> the rest of its last line: size, mtime, ctime, inode, sha256 (tab-separated)


def shard_of(absolute: str) -> str:
    """The shard file of a path: one of 256, by the first byte of a hash of the path."""
    return f"{hashlib.blake2b(absolute.encode(errors='surrogateescape'), digest_size=1).digest()[0]:02x}.tsv"


class FileHashes:
    """sha256 by file identity. A shard of the memory is read on its first lookup, so a no-op run, whose file
    checks all match by identity, reads none."""

    def __init__(self, state_dir: Path):
        self.state = state_dir
        self.folder = state_file(state_dir, "hashes")
        self._shards: dict[str, Remembered] = {}
        # digests by (device, size, mtime, ctime, inode) seen in this process: a file stored into the cache, published
        # or restored by hard links is read once, not once per name (a 1 GB artifact took 0.6 s per name)
        self._by_identity: dict[tuple[int, ...], str] = {}

    def _shard(self, name: str) -> Remembered:
        """The shard's last line per path, read in order, kept as the text after the path (parsed only for the
        paths looked up: after a fresh clone every file's identity differs from doit's record and all 256 shards
        are read, 270,000 lines at 10,000 targets); rewritten with one line per file that still exists when
        superseded lines pile up (a line another builder appends meanwhile may be lost: that file is then hashed
        once more)."""
        found = self._shards.get(name)
        if found is None:
            try:
                with open(self.folder / name, encoding="utf-8", errors="surrogateescape") as handle:
                    lines = handle.read().split("\n")
            except FileNotFoundError:
                lines = [""]
            lines.pop()  # what follows the last newline: nothing, or a line cut short by a killed process
            found = self._shards[name] = dict(line.partition("\t")[::2] for line in lines)
            if len(lines) > 2 * len(found) + COMPACT_SLACK:
                kept = {path: fields for path, fields in found.items()
                        if _parsed(fields) is not None and os.path.exists(path)}
                write_atomic(self.folder / name, "".join(f"{path}\t{fields}\n" for path, fields in kept.items()))
                self._shards[name] = found = kept
        return found

    def _remembered(self, absolute: str) -> tuple[list[int], str] | None:
        """The identity and sha256 the memory holds for `absolute`: its last whole line (a line that is not one,
        two appends run together after a killed process, sends the lookup through the shard line by line)."""
        name = shard_of(absolute)
        fields = self._shard(name).get(absolute)
        found = None if fields is None else _parsed(fields)
        if fields is not None and found is None:
            with open(self.folder / name, encoding="utf-8", errors="surrogateescape") as handle:
                for line in handle:
                    path, _, rest = line.rstrip("\n").partition("\t")
                    if path == absolute and line.endswith("\n") and _parsed(rest) is not None:
                        found = _parsed(rest)
        return found

    def _remember(self, absolute: str, key: list[int], digest: str) -> None:
        name = shard_of(absolute)
        self._shard(name)[absolute] = "\t".join([*map(str, key), digest])
        if "\t" in absolute or "\n" in absolute:
            return  # not a line the memory can hold: hashed again by the next process
        if not self.folder.is_dir():
            self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / name, "a", encoding="utf-8", errors="surrogateescape") as handle:
            handle.write(_line(absolute, key, digest))  # one write of one line

    def copied(self, path: Path, digest: str) -> None:
        """`path` was just copied from a file whose sha256 was verified as `digest`: not read again in this
        process (a copy is new, so its identity is not remembered across processes yet)."""
        stat = os.stat(path)
        self._by_identity[(stat.st_dev, *stat_key(stat))] = digest

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
        self._remember(absolute, key, digest)
        return digest


def _line(path: str, key: list[int], digest: str) -> str:
    return "\t".join([path, *map(str, key), digest]) + "\n"


def _parsed(fields: str) -> tuple[list[int], str] | None:
    """(identity, sha256) of a line's text after its path; None for anything else."""
    parts = fields.split("\t")
    if len(parts) != 5 or len(parts[4]) != 64:
        return None
    try:
        return [int(part) for part in parts[:4]], parts[4]
    except ValueError:
        return None
