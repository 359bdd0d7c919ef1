"""Atomic outputs: build a folder in a scratch folder beside the final one, then swap it in with renames.

A reader sees either the previous complete folder or file or the new complete one, never a half-written mix; a
failed build removes the stale folder too, so nothing under a final name looks like a good artifact for new
settings. Files move between the cache and the artifacts folder as copies (reflinks where the file system has
them), never as hard links unless `[cache] hard_links` asks for them: onnx refuses to load external data that has
several links, and an in-place edit of a linked artifact would change the cache entry and every clone's copy.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from .owners import owner_tag

FICLONE = 0x40049409  # linux/fs.h: share the source's extents copy-on-write (btrfs, XFS, bcachefs)


def scratch_dir(parent: Path, label: str) -> Path:
    """A fresh private folder under `parent` (the artifacts' scratch folder), so the final rename cannot cross
    filesystems."""
    parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{label}.{owner_tag()}.", dir=parent))
    folder.chmod(0o755)  # mkdtemp makes it private; a published artifact folder is read by others
    return folder


def publish(scratch: Path, final: Path) -> None:
    """Replace `final` with `scratch`: rename the old folder aside, rename the new one in, delete the old."""
    final.parent.mkdir(parents=True, exist_ok=True)
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=f"replaced.{owner_tag()}.", dir=scratch.parent))
        os.replace(final, old / "previous")
    os.replace(scratch, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def copy_file(source: Path, target: Path, hard_link: bool = False) -> None:
    """`target` gets `source`'s bytes as a file of its own: a reflink where the file system has them, else an
    in-kernel copy; with `hard_link`, a hard link where possible (the risks are in the module's docstring)."""
    if hard_link:
        try:
            os.link(source, target)
            return
        except OSError:
            pass
    if not sys.platform.startswith("linux"):
        shutil.copyfile(source, target)
    else:
        import fcntl

        with open(source, "rb") as reader, open(target, "wb") as writer:
            try:
                fcntl.ioctl(writer.fileno(), FICLONE, reader.fileno())
            except OSError:  # no shared extents here (ext4, tmpfs, across file systems)
                _sendfile(reader, writer)
    shutil.copymode(source, target)


def _sendfile(reader, writer) -> None:
    """An in-kernel copy: no bytes pass through Python."""
    size, offset = os.fstat(reader.fileno()).st_size, 0
    while offset < size:
        sent = os.sendfile(writer.fileno(), reader.fileno(), offset, size - offset)
        if sent == 0:
            raise OSError(f"{reader.name} shrank while it was copied")
        offset += sent


def discard(*folders: Path) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
