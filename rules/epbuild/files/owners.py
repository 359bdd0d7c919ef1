"""Scratch folders that name the process that made them, so that what a killed build left is found and removed.

Every private work folder (`artifacts/.scratch/*`, the cache's `tmp/*` staging folders) carries `~HOST-PID-START~`
in its name: this host (a digest of its name), the process id and its start time (a pid is reused; the pair is not).
A build sweeps both places at its start and removes the folders whose owner is gone; `doit prune` does the same and
says how much space that freed. A folder of another host (a cache shared over a network file system) is never
judged here.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
import shutil
from pathlib import Path

from .layout import size_of

OWNER = re.compile(r"~([0-9a-f]{8})-(\d+)-(\d+)~")
HOST = hashlib.sha256(platform.node().encode()).hexdigest()[:8]


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


@functools.cache
def owner_tag() -> str:
    """This process's mark for the folders it makes."""
    return f"~{HOST}-{os.getpid()}-{_start_time(os.getpid()) or 0}~"


os.register_at_fork(after_in_child=owner_tag.cache_clear)  # a forked doit worker is another owner


def owner_gone(name: str) -> bool:
    """Whether the folder `name` was made by a process of this host that no longer runs (False for names without
    a mark, of another host, and where processes cannot be looked up: nothing is removed on a guess)."""
    found = OWNER.search(name)
    if not found or found.group(1) != HOST or not Path("/proc/self/stat").exists():
        return False
    return _start_time(int(found.group(2))) != found.group(3)


def owner_judged(name: str) -> bool:
    """Whether this host can tell if the owner marked in `name` still runs (a mark of this host, with /proc)."""
    found = OWNER.search(name)
    return found is not None and found.group(1) == HOST and Path("/proc/self/stat").exists()


def sweep(folders: list[Path]) -> tuple[list[Path], int]:
    """Remove the entries of `folders` whose owner is gone: (what was removed, bytes freed)."""
    removed, freed = [], 0
    for folder in folders:
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            if not owner_gone(entry.name):
                continue
            try:
                size = size_of(entry)
                if entry.is_dir():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            except OSError:
                continue
            removed.append(entry)
            freed += size
    return removed, freed
