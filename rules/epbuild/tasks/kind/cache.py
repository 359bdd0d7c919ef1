"""`cache`: the local cache's size and the remote cache's settings."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..commands import show_cache

if TYPE_CHECKING:
    from ..definitions import Task, Tasks


def tasks(source: Tasks) -> Iterator[Task]:
    yield {"basename": "cache", "doc": "the local cache's size and the remote cache's settings",
           "actions": [(show_cache, [source.project.workspace])], "uptodate": [False], "verbosity": 2}
