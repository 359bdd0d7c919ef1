"""Exclusive locks between builders on one machine: doit -n processes, doit -P threads, several doit runs.

`fingerprint_lock`: on 64-bit Linux a fingerprint's lock is one byte of a single shared file, taken with an
open-file-description lock (`F_OFD_SETLKW`): nothing is created per fingerprint (creating a file is slow on
a disk mounted with online discard, and a clean build locks twice per model), and the folder does not fill up with
one lock file per fingerprint ever built. Elsewhere a lock file per fingerprint. Each acquisition opens its own
file description, so threads of one process exclude each other exactly as processes do, and the kernel drops a
lock when its holder exits, however it exits. `file_lock` locks a whole file: `flock`, or `filelock` on Windows.
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

SHARED_FILE = "fingerprints.lock"
_OFD = sys.platform == "linux" and sys.maxsize > 2**32  # 64-bit struct flock, as packed below


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold the lock on `path` (created if absent) for the duration of the block."""
    if fcntl is None:
        from filelock import FileLock

        with FileLock(str(path)):
            yield
        return
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing the last descriptor of the description releases its lock


def _flock(kind: int, offset: int) -> bytes:
    """struct flock {short l_type, l_whence; off_t l_start, l_len; pid_t l_pid} on 64-bit Linux: l_pid must be 0
    for open-file-description locks."""
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, offset, 1, 0)


@contextmanager
def fingerprint_lock(folder: Path, fingerprint: str) -> Iterator[None]:
    """Hold `fingerprint`'s lock (a sha256 in hex) in `folder` for the duration of the block."""
    folder.mkdir(parents=True, exist_ok=True)
    if not _OFD:
        with file_lock(folder / f"{fingerprint}.lock"):
            yield
        return
    offset = int(fingerprint[:15], 16)  # 60 bits: two fingerprints share a byte once in 10^18 pairs
    descriptor = os.open(folder / SHARED_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.fcntl(descriptor, fcntl.F_OFD_SETLKW, _flock(fcntl.F_WRLCK, offset))
        yield
    finally:
        os.close(descriptor)


@contextmanager
def fingerprint_lock_if_free(folder: Path, fingerprint: str) -> Iterator[bool]:
    """Take `fingerprint`'s lock only if no one holds it, without waiting: yields whether it was taken (then held
    for the block). Where locks cannot be looked at (Windows), yields True."""
    folder.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield True
        return
    path = folder / (SHARED_FILE if _OFD else f"{fingerprint}.lock")
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        try:
            if _OFD:
                fcntl.fcntl(descriptor, fcntl.F_OFD_SETLK, _flock(fcntl.F_WRLCK, int(fingerprint[:15], 16)))
            else:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            taken = True
        except OSError:  # EAGAIN/EACCES: held by another builder
            taken = False
        yield taken
    finally:
        os.close(descriptor)
