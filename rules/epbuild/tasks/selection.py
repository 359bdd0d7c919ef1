"""A default run hands doit only the tasks that can run, when the last run's record proves the rest up to date.

doit checks every task it is given (its database record, every file's state), and at 1,000 targets that was
most of the run after one model changed. The record (`artifacts/.state/last-run.json`), written at the end of
every default run, holds each task that run found up to date: its files (file_dep, sorted, then targets) and
the identity each had when doit judged it. The next default run under the same project key (`fast_path`:
manifest, epbuild's code, environment), with doit's database, the settings record and the build report as that
run left them (no other run since), hands doit:

- every task the record lacks (it ran, failed or is new), whose files are not the recorded ones, whose settings
  differ from those it last succeeded with, or any of whose files' identity changed;
- every task that reads a file such a task writes, or names one in `task_dep` (transitively);
- every task those name in `task_dep`, so that doit can resolve the names.

Every other task is one doit would find up to date: its inputs, outputs and settings are those it judged so,
and nothing it reads is rebuilt. `EPBUILD_FAST_PATH=0` turns it off, as the other shortcuts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..fast_path import DEP_FILE, file_identity
from ..store.layout import Layout, write_json

Task = dict[str, Any]
FORMAT = 1


def files_of(file_dep: Any, targets: list[str]) -> list[str]:
    """A task's files in the record's order: file_dep sorted (doit keeps them as a set), then targets."""
    return [*sorted(set(file_dep)), *targets]


def full_name(task: Task) -> str:
    return f"{task['basename']}:{task['name']}"


class RunRecord:
    """`artifacts/.state/last-run.json`: the tasks the last default run found up to date, with their files."""

    def __init__(self, layout: Layout):
        self.path = layout.state / "last-run.json"
        self.watched = [layout.configs, layout.build_report, Path(DEP_FILE)]

    def load(self, key: str) -> tuple[dict[str, list[str]], dict[str, list[int] | None]] | None:
        """(task -> files, file -> identity) when the record was written under `key` and no run wrote doit's
        database, the settings record or the build report since; else None."""
        try:
            record = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("key") != key:
            return None
        if any(file_identity(str(path)) != record["watched"].get(str(path)) for path in self.watched):
            return None
        return record["tasks"], record["files"]

    def write(self, key: str, tasks: dict[str, list[str]], files: dict[str, list[int] | None]) -> None:
        watched = {str(path): file_identity(str(path)) for path in self.watched}
        if None in watched.values():
            return  # a run without them left no state to compare with
        write_json(self.path, {"format": FORMAT, "key": key, "watched": watched, "tasks": tasks, "files": files},
                   indent=None)


def runnable(tasks: list[Task], recorded: dict[str, list[str]], identities: dict[str, list[int] | None]) -> set[str]:
    """The names of the tasks to hand doit (see the module's docstring); `tasks` are every task's dicts."""
    named = {full_name(task): task for task in tasks if task.get("name")}
    seen: dict[str, list[int] | None] = {}

    def unchanged(path: str) -> bool:
        if path not in seen:
            seen[path] = file_identity(path)
        recorded_identity = identities.get(path)
        return recorded_identity is not None and seen[path] == recorded_identity

    selected = {name for name, task in named.items()
                if recorded.get(name) != files_of(task["file_dep"], task["targets"]) or task.get("uptodate") != [True]
                or not all(unchanged(path) for path in recorded[name])}
    readers: dict[str, list[str]] = {}  # file -> tasks reading it
    dependents: dict[str, list[str]] = {}  # task -> tasks naming it in task_dep
    for name, task in named.items():
        for path in task["file_dep"]:
            readers.setdefault(path, []).append(name)
        for needed in task.get("task_dep", ()):
            dependents.setdefault(needed, []).append(name)
    todo = list(selected)
    while todo:  # downstream: what reads their outputs or waits for them
        name = todo.pop()
        later = [*dependents.get(name, ()), *(r for path in named[name]["targets"] for r in readers.get(path, ()))]
        for other in later:
            if other not in selected:
                selected.add(other)
                todo.append(other)
    todo = list(selected)
    while todo:  # upstream by name: doit needs every task_dep it is handed
        for needed in named[todo.pop()].get("task_dep", ()):
            if needed in named and needed not in selected:
                selected.add(needed)
                todo.append(needed)
    return selected
