"""`backends`: what this host can build (EPs, compilers, toolchains, targets); `--json` for machines."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..commands import show_backends

if TYPE_CHECKING:
    from ..definitions import Task, Tasks


def tasks(source: Tasks) -> Iterator[Task]:
    yield {"basename": "backends", "doc": "what this host can build: EPs, compilers, toolchains, targets",
           "actions": [(show_backends, [source.project])], "uptodate": [False], "verbosity": 2,
           "params": [{"name": "json_output", "long": "json", "type": bool, "default": False,
                       "help": "print JSON for machines"}]}
