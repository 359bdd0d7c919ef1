"""A lock per fingerprint, held by one builder at a time: doit -n processes, doit -P threads, several doit runs.

On 64-bit Linux a fingerprint's lock is one byte of a single shared file, taken with an open-file-description lock
(`F_OFD_SETLKW`): nothing is created per fingerprint (creating a file costs 0.1-0.8 ms on a disk mounted with
online discard, and a clean build locks twice per model), the folder does not fill up with one lock file per
fingerprint ever built, and each acquisition opens its own description, so threads of one process exclude each
other exactly as processes do. The kernel drops the lock when its holder exits, however it exits. Elsewhere
(macOS, Windows: no such locks) a `filelock` file per fingerprint.
"""

from __future__ import annotations

import os
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SHARED_FILE = "fingerprints.lock"
_OFD = sys.platform == "linux" and sys.maxsize > 2**32  # 64-bit struct flock, as packed below


def _flock(kind: int, offset: int) -> bytes:
    """struct flock {short l_type, l_whence; off_t l_start, l_len; pid_t l_pid} on 64-bit Linux: l_pid must be 0
    for open-file-description locks."""
    return struct.pack("hhqqi4x", kind, os.SEEK_SET, offset, 1, 0)


@contextmanager
def fingerprint_lock(folder: Path, fingerprint: str) -> Iterator[None]:
    """Hold `fingerprint`'s lock (a sha256 in hex) in `folder` for the duration of the block."""
    folder.mkdir(parents=True, exist_ok=True)
    if not _OFD:
        from filelock import FileLock  # imported here: it costs ~10 ms, and task creation never locks

        with FileLock(str(folder / f"{fingerprint}.lock")):
            yield
        return
    import fcntl

    offset = int(fingerprint[:15], 16)  # 60 bits: two fingerprints share a byte once in 10^18 pairs
    descriptor = os.open(folder / SHARED_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.fcntl(descriptor, fcntl.F_OFD_SETLKW, _flock(fcntl.F_WRLCK, offset))
        yield
    finally:
        os.close(descriptor)  # closing the last descriptor of the description releases its locks
