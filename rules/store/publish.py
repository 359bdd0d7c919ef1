"""Atomic outputs: build a folder in a scratch folder beside the final one, then swap it in with renames; put a
single file in place by linking it beside its final name, then renaming.

A reader sees either the previous complete folder or file or the new complete one, never a half-written mix; a
failed build removes the stale folder too, so nothing under a final name looks like a good artifact for new
settings.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def scratch_dir(parent: Path, label: str) -> Path:
    """A fresh private folder under `parent` (the artifacts' scratch folder), so the final rename cannot cross
    filesystems."""
    parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{label}.", dir=parent))
    folder.chmod(0o755)  # mkdtemp makes it private; a published artifact folder is read by others
    return folder


def publish(scratch: Path, final: Path) -> None:
    """Replace `final` with `scratch`: rename the old folder aside, rename the new one in, delete the old."""
    final.parent.mkdir(parents=True, exist_ok=True)
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix="replaced.", dir=scratch.parent))
        os.replace(final, old / "previous")
    os.replace(scratch, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def link_or_copy(source: Path, target: Path) -> None:
    """A hard link where the file system allows one (a cache entry and the artifacts restored from it share their
    bytes: a file changed in place fails the sha256 check on the next restore and its entry is evicted), else a
    copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def publish_file(source: Path, final: Path) -> None:
    """Replace the file `final` with `source`'s bytes atomically, sharing them where possible: link beside it
    under a private name, then rename."""
    temporary = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    temporary.unlink(missing_ok=True)  # a leftover: never written through
    try:
        link_or_copy(source, temporary)
        os.replace(temporary, final)
    finally:
        temporary.unlink(missing_ok=True)


def discard(*folders: Path) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
