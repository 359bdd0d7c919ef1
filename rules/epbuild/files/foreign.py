"""Symbolic links a checkout planted under `artifacts/`: git commits links, and a pull request can force-add them
past `.gitignore`. epbuild never makes one there (artifacts are copies), but it writes through the folders it finds:
`artifacts/cpu -> ~` would have a publish move `~/<model>` aside and delete it, `.logs/cpu/m.compile.log ->
~/.bashrc` would have a compile overwrite it. Before a build writes, every link among the folders and files epbuild
writes into (the top of `artifacts/`, each target's, the stages' and the state's entries, the logs', the hash
memory's and the groups' folders, read by directory entry type: no stat per file) is removed, never followed, and said
in one line. An artifact folder's own files are replaced whole with it when it is published."""

from __future__ import annotations

import os
from pathlib import Path

from .layout import GROUPS

# folders whose folders hold files written in place, through whatever link they find: the logs (opened for writing)
# and the hash memory's shards (appended to); every other file is replaced whole (a rename moves a link aside)
DESCEND = {".logs": None, ".state": "hashes"}


def _entries(folder: str) -> list[os.DirEntry[str]]:
    try:
        return list(os.scandir(folder))
    except OSError:
        return []


def remove_links(root: Path) -> list[str]:
    """Remove the links among the folders and files a build writes into under `root`: its entries, theirs, and the
    entries of the logs', the hash memory's and the groups' folders (not an artifact's or a stage's files: a publish
    replaces those whole, moving a link aside, never following it). The paths removed."""
    found: list[str] = []
    for top in _entries(str(root)):
        if top.is_symlink():
            found.append(top.path)
            continue
        if not top.is_dir(follow_symlinks=False):
            continue
        for second in _entries(top.path):
            if second.is_symlink():
                found.append(second.path)
            elif (DESCEND.get(top.name, "") in (None, second.name) or second.name == GROUPS) and \
                    second.is_dir(follow_symlinks=False):
                found.extend(third.path for third in _entries(second.path) if third.is_symlink())
    for path in found:
        try:
            os.unlink(path)
        except OSError:
            continue
    return found
