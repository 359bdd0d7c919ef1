"""A default run hands doit only the tasks that can run, when the last run's record proves the rest up to date.

doit checks every task it is given (its database record, every file's state), and at 1,000 targets that was most of
the run after one model changed. The record (`artifacts/.state/last-run.journaled`, `tasks.run_record`), written at the
end of every default run, holds each task that run found up to date: its files (file_dep, sorted, then targets), the
identity each had when doit judged it and the tasks it names in `task_dep`; and the identity of every other file
task creation read (option files, calibration folders, probed toolchains). The next default run under the same
project key (`fast_path`: manifest, epbuild's code, environment), with doit's database, the settings record and
the build report as that run left them (no other run since), hands doit:

- every task the record lacks (it ran, failed or is new), any of whose files' identity changed, whose files are
  not the recorded ones or whose settings differ from those it last succeeded with;
- every task that reads a file such a task writes, or names one in `task_dep` (transitively);
- every task those name in `task_dep`, so that doit can resolve the names.

Every other task is one doit would find up to date: its inputs, outputs and settings are those it judged so,
and nothing it reads is rebuilt. Only the tasks that may differ from the record are made at all (their dicts
compared with it): those the record lacks or whose files changed, and every task of a model whose file changed
(what task creation reads of a model, its inputs and graph facts, is a function of its bytes); a change to any
other file task creation read makes every task. `EPBUILD_FAST_PATH=0` turns it off, as the other shortcuts.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from dataclasses import field
from typing import Any

from ..fast_path import file_identity
from ..files.layout import settled, stat_key
from ..records import record

Task = dict[str, Any]
Identity = list[int] | None
FORMAT = 2


def files_of(file_dep: Any, targets: list[str]) -> list[str]:
    """A task's files in the record's order: file_dep sorted (doit keeps them as a set), then targets."""
    return [*sorted(set(file_dep)), *targets]


@record(frozen=False)
class Recorded:
    """What the last run's record holds, and the files' identities now (each file stat'ed once)."""

    tasks: dict[str, list[str]]  # task -> its files
    files: dict[str, Identity]  # file -> its identity then
    task_deps: dict[str, list[str]] = field(default_factory=dict)
    looked_at: dict[str, Identity] = field(default_factory=dict)  # the other files task creation read
    read_as: tuple[Any, ...] | None = None  # how the record's files were when it was read (`tasks.run_record`)

    @functools.cached_property
    def changed(self) -> set[str]:
        """The recorded files whose identity is not the recorded one (each stat'ed once)."""
        return {path for path, then in self.files.items() if then is None or file_identity(path) != then}

    def unchanged(self, path: str) -> bool:
        return path in self.files and path not in self.changed

    def stale(self, task: str) -> bool:
        """Whether the record lacks the task or any of its files changed."""
        files = self.tasks.get(task)
        return files is None or not self.changed.isdisjoint(files)

    def read_the_same(self) -> bool:
        """Whether every file task creation read besides the tasks' files is as it was (present or not; an
        identity recorded as [] was taken while the file could still change: never the same)."""
        return all(file_identity(path) == then for path, then in self.looked_at.items())


def identities(paths: list[str]) -> dict[str, Identity]:
    """Each file's identity now; [] for one changed so recently that a later change could keep its identity."""
    found: dict[str, Identity] = {}
    for path in paths:
        try:
            stat = os.stat(path)
        except OSError:
            found[path] = None
            continue
        found[path] = stat_key(stat) if settled(stat) else []
    return found


def runnable(names: Iterable[str], make: Callable[[str], Task | None], record: Recorded,
             suspects: set[str] | None = None) -> tuple[set[str], dict[str, Task | None]]:
    """The names of the tasks to hand doit (see the module's docstring), and the dicts made on the way. `names`:
    every task of this run; `make(name)`: its dict (None: no such task); `suspects`: the tasks to compare with the
    record even when it holds them unchanged (None: every task)."""
    names = list(names)
    made: dict[str, Task | None] = {}

    def task(name: str) -> Task | None:
        if name not in made:
            made[name] = make(name)
        return made[name]

    selected = set()
    for name in names:
        stale = record.stale(name)
        if stale or suspects is None or name in suspects:
            found = task(name)
            if found is not None and (stale or record.tasks[name] != files_of(found["file_dep"], found["targets"])
                                      or found.get("uptodate") != [True]):
                selected.add(name)
    readers: dict[str, list[str]] = {}  # file -> tasks reading it (a task not made: every file it has)
    dependents: dict[str, list[str]] = {}  # task -> tasks naming it in task_dep
    for name in names:
        if name in made:
            found = made[name]
            if found is None:
                continue
            reads, needs = found["file_dep"], found.get("task_dep", ())
        else:
            reads, needs = record.tasks[name], record.task_deps.get(name, ())
        for path in reads:
            readers.setdefault(path, []).append(name)
        for needed in needs:
            dependents.setdefault(needed, []).append(name)
    todo = list(selected)
    while todo:  # downstream: what reads their outputs or waits for them
        name = todo.pop()
        writes = task(name)["targets"]  # type: ignore[index]
        for other in [*dependents.get(name, ()), *(r for path in writes for r in readers.get(path, ()))]:
            if other not in selected and task(other) is not None:
                selected.add(other)
                todo.append(other)
    todo = list(selected)
    while todo:  # upstream by name: doit needs every task_dep it is handed
        for needed in task(todo.pop()).get("task_dep", ()):  # type: ignore[union-attr]
            if needed not in selected and task(needed) is not None:
                selected.add(needed)
                todo.append(needed)
    return selected, made
