"""The task kinds doit is handed, in one registry: each kind's generator (doit's basename for it), the module that
makes its task dicts (`tasks.kind.*`: its doc, what it wants, `tasks` and, for a kind whose tasks do work, `make`),
and whether its tasks do the work (the task graph's nodes) or answer a command (backends, cache, unavailable, graph,
prune: run when named, or once by a default run to say what it skipped). The generators doit collects
(`entry.namespace`), the cached listing (`Tasks.save_listing`), the selections (`Tasks.all_tasks`,
`Tasks.every_task`) and a selecting run's single tasks (`Tasks._make`) all read `KINDS`; a task's own name
(`KIND:NAME`) is made in `manifest.builds`. Light: the shortcuts import it before anything heavy, and a kind's
module is imported when its tasks are first made."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from ..records import record

UNAVAILABLE = "unavailable"  # the kind whose one task says which targets this host cannot build, and why
BLOCKED = "blocked"  # that kind's other task: last in a default run, failing with what the manifest must fix


@record
class TaskKind:
    name: str  # the generator's name: doit's basename, `doit list`'s group
    module: str  # its module under `tasks.kind`
    argument: str | None = None  # the generator's one argument, where one module makes two kinds
    work: bool = True  # its tasks are the graph's nodes (stages, compiles, validations ...), not a command's

    @functools.cached_property
    def code(self) -> ModuleType:
        """Its module (imported at its first task: a run that makes none, a no-op's shortcut, imports none)."""
        return importlib.import_module(f"{__package__}.kind.{self.module}")

    def tasks(self, source: Any) -> Iterator[dict[str, Any]]:
        """Its task dicts, as made from `source` (a `Tasks`)."""
        generate = self.code.tasks
        return generate(source, self.argument) if self.argument is not None else generate(source)

    def make(self, source: Any, item: Any) -> dict[str, Any] | None:
        """One of its tasks, from its build, stage or package (a kind that does work)."""
        return self.code.make(source, item)

    def wanted(self, source: Any) -> bool:
        """Whether doit is handed this kind's generator at all (a kind's `wanted`; else always)."""
        wanted = getattr(self.code, "wanted", None)
        return wanted is None or bool(wanted(source))


KINDS: tuple[TaskKind, ...] = (
    TaskKind("stages", "stages"),
    TaskKind("compile", "compile", "compile"),
    TaskKind("group", "compile", "group"),
    TaskKind("validate", "validate"),
    TaskKind("ops", "ops"),
    TaskKind("package", "package"),
    TaskKind("backends", "backends", work=False),
    TaskKind("cache", "cache", work=False),
    TaskKind(UNAVAILABLE, "unavailable", work=False),
    TaskKind("graph", "graph", work=False),
    TaskKind("prune", "prune", work=False),
)
BY_NAME = {kind.name: kind for kind in KINDS}


def is_subtask(name: str) -> bool:
    """Whether doit's task `name` is one model's, target's, group's, package's or stage's (`KIND:NAME`), not the
    group task doit makes for a generator (`compile`) or a command (`prune`)."""
    return ":" in name
