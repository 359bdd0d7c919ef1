"""`graph`: the task graph as artifacts/graph.dot and graph.svg (`--model M`: one model's)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..commands import show_graph

if TYPE_CHECKING:
    from ..definitions import Task, Tasks


def tasks(source: Tasks) -> Iterator[Task]:
    yield {"basename": "graph", "doc": "the task graph as artifacts/graph.dot and graph.svg (--model M: one model)",
           "actions": [(show_graph, [source.project, source.all_tasks])], "uptodate": [False], "verbosity": 2,
           "params": [{"name": "model", "long": "model", "type": str, "default": "",
                       "help": "only this model's tasks (its stages, compiles, checks, validations, groups)"}]}
