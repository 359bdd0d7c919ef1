"""Each task's `.  name` line said by the worker that runs it, before the task's own lines: with doit's worker
processes the main process says it when the worker's message reaches it, and a task restored from the cache (or
prune's first lines) came first. A first action of the task says it (`announcing`, where
`Tasks.announced_by_workers` holds), and the reporter leaves out its own line for such a task (`announced`)."""

from __future__ import annotations

from typing import Any


def announcing(task: dict[str, Any]) -> dict[str, Any]:
    """The task (a fresh dict of its kind's generator, changed in place) with a first action that says its `.  name`
    line in the worker that runs it, in order with its other lines (`Tasks.announced_by_workers`); the reporter
    knows such a task by that action (`announced`). Cheap: no copy of the task, no import (10,000 targets make
    25,000 tasks)."""
    actions = task.get("actions")
    if actions and not (isinstance(actions[0], tuple) and actions[0][0] is announce):  # said once
        name = task.get("name")
        task["actions"] = [(announce, (f"{task['basename']}:{name}" if name else task["basename"],)), *actions]
    return task


def announced(actions: list[Any]) -> bool:
    """Whether doit's actions of a task begin with `announce` (its worker says its name)."""
    return bool(actions) and getattr(actions[0], "py_callable", None) is announce


def announce(name: str) -> None:
    from ..logs import say

    say(f".  {name}")
