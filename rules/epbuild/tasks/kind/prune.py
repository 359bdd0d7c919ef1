"""`prune`: remove what removed models, targets, groups and stages left under artifacts/ (`--dry-run`: list it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..commands import run_prune

if TYPE_CHECKING:
    from ..definitions import Task, Tasks


def tasks(source: Tasks) -> Iterator[Task]:
    yield {"basename": "prune", "doc": "remove what removed models, targets, groups and stages left under "
           "artifacts/ (--dry-run: only list it)", "actions": [(run_prune, [source.project])], "uptodate": [False],
           "verbosity": 2, "params": [{"name": "dry_run", "long": "dry-run", "type": bool, "default": False,
                                       "help": "list what would be removed, remove nothing"}]}
