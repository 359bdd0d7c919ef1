"""Content hashes and file identities that jobs take before and after reading their inputs: sha256 read in chunks
(memory stays flat for multi-GB models), and the identity snapshot that says whether an input changed while a job
read it. The memory of hashes by identity, kept between runs, is `state.hash_memory`."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .layout import stat_key

CHUNK = 1 << 20


def sha256_file(path: str | Path) -> str:
    """Chunked, so memory stays flat for multi-GB models."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while count := handle.readinto(buffer):
            digest.update(view[:count])
    return digest.hexdigest()


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
