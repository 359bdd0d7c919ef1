"""Scratch folders that name the process that made them, so that what a killed build left is found and removed.

Every private work folder (`artifacts/.scratch/*`, the cache's `tmp/*` staging folders) carries `~PID-START~` in its
name: the process id and its start time (a pid is reused; the pair is not). A build sweeps both places at its start
and removes the folders whose owner is gone; `doit prune` does the same and says how much space that freed.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
from pathlib import Path

OWNER = re.compile(r"~(\d+)-(\d+)~")


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
    return f"~{os.getpid()}-{_start_time(os.getpid()) or 0}~"


os.register_at_fork(after_in_child=owner_tag.cache_clear)  # a forked doit worker is another owner


def owner_gone(name: str) -> bool:
    """Whether the folder `name` was made by a process that no longer runs (False for names without a mark, and
    where processes cannot be looked up: nothing is removed on a guess)."""
    found = OWNER.search(name)
    if not found or not Path("/proc/self/stat").exists():
        return False
    return _start_time(int(found.group(1))) != found.group(2)


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
                if entry.is_dir():
                    size = sum(p.lstat().st_size for p in entry.rglob("*"))
                    shutil.rmtree(entry)
                else:
                    size = entry.lstat().st_size
                    entry.unlink()
            except OSError:
                continue
            removed.append(entry)
            freed += size
    return removed, freed
