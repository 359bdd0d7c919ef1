"""The task kinds doit is handed, in one registry: each kind's generator (doit's basename for it), the `Tasks`
method that makes its task dicts, and whether its tasks do the work (the task graph's nodes) or answer a command
(backends, cache, unavailable, graph, prune: run when named, or once by a default run to say what it skipped).
The generators doit collects (`entry.namespace`), the cached listing (`Tasks.save_listing`) and the selections
(`Tasks.all_tasks`, `Tasks.every_task`) all read `KINDS`; a task's own name (`KIND:NAME`) is made in
`manifest.builds`. Light: the shortcuts import it before anything heavy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..records import record

UNAVAILABLE = "unavailable"  # the kind whose one task says which targets this host cannot build, and why


@record
class TaskKind:
    name: str  # the generator's name: doit's basename, `doit list`'s group
    method: str  # the `Tasks` method that yields its task dicts
    argument: str | None = None  # the method's one argument, where one method makes two kinds
    work: bool = True  # its tasks are the graph's nodes (stages, compiles, validations ...), not a command's

    def tasks(self, source: Any) -> Iterator[dict[str, Any]]:
        """Its task dicts, as `source` (a `Tasks`) makes them."""
        method = getattr(source, self.method)
        return method(self.argument) if self.argument is not None else method()


KINDS: tuple[TaskKind, ...] = (
    TaskKind("stages", "stage_tasks"),
    TaskKind("compile", "build_tasks", "compile"),
    TaskKind("group", "build_tasks", "group"),
    TaskKind("validate", "validate_tasks"),
    TaskKind("ops", "ops_tasks"),
    TaskKind("package", "package_tasks"),
    TaskKind("backends", "backends_task", work=False),
    TaskKind("cache", "cache_task", work=False),
    TaskKind(UNAVAILABLE, "unavailable_task", work=False),
    TaskKind("graph", "graph_task", work=False),
    TaskKind("prune", "prune_task", work=False),
)


def is_subtask(name: str) -> bool:
    """Whether doit's task `name` is one model's, target's, group's, package's or stage's (`KIND:NAME`), not the
    group task doit makes for a generator (`compile`) or a command (`prune`)."""
    return ":" in name
