"""Outputs no current task owns: what a removed model, target, group or stage left under `artifacts/`.

`doit clean` reaches only the tasks the manifest still declares, so these folders would stay forever, looking like
good artifacts; `doit prune` lists them (`--dry-run`) or removes them, and says how much space that frees.
"""

from __future__ import annotations

from pathlib import Path

from ..files.layout import Layout, size_of
from ..files.publish import discard

KEPT = {".state", ".scratch", ".logs"}  # the build's own state; scratch folders belong to running builds


def orphans(layout: Layout, owned: set[Path]) -> list[Path]:
    """The folders and logs under `layout.root` that hold outputs of no task: `owned` are the current tasks'
    published folders (artifacts, groups, stage outputs) and log files."""
    ancestors = {parent for path in owned for parent in path.parents}
    found: list[Path] = []

    def walk(folder: Path) -> None:
        for entry in sorted(folder.iterdir()):
            if entry in owned:
                continue
            if entry in ancestors and entry.is_dir():
                walk(entry)
            else:
                found.append(entry)

    if layout.root.is_dir():
        for top in sorted(layout.root.iterdir()):
            if not top.is_dir() or top.name in KEPT:
                continue  # the reports beside the folders are rewritten by every run
            if top in ancestors:
                walk(top)
            else:
                found.append(top)  # a whole target, or every stage output, that nothing uses
    if layout.logs.is_dir():
        found.extend(log for log in sorted(layout.logs.rglob("*")) if log.is_file() and log not in owned)
    return found


def prune(paths: list[Path], dry_run: bool) -> int:
    """Remove `paths` (unless `dry_run`); the bytes they held."""
    freed = 0
    for path in paths:
        freed += size_of(path)
        if not dry_run:
            path.unlink() if path.is_file() else discard(path)
    return freed
