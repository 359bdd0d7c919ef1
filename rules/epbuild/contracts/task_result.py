"""What a task's action returns to doit (`task.values`): doit carries it from the worker process that ran the action
to the reporter in the build's process, which files it in build-report.json and the settings record."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from ..errors import json_value
from .statuses import TaskStatus

PUBLISHED = "_published"
"""The key of the files the action published, each with its identity, for the settings record (`store.task_configs`):
the reporter takes it out; build-report.json never shows it."""


class TaskResult(TypedDict, total=False):
    status: TaskStatus
    seconds: float
    fingerprint: str
    files: list[dict[str, Any]]  # each published file: name, bytes, sha256
    worker: str  # the Dask worker that ran it
    child: dict[str, float]  # the child's usage: seconds, peak memory
    nodes: dict[str, Any]  # where the compile put the model's nodes
    validation: str  # the console line of a validation
    reason: str
    cpu_reference: dict[str, Any]  # where a validation's CPU reference came from
    origin: str  # a restored result: which cache
    _published: dict[str, Any]  # PUBLISHED


def recorded_peaks(report: Path) -> dict[str, float]:
    """Each task's child peak (resident MB, `child.peak_mb`) as a build report (`artifacts/build-report.json`, the
    entries of `TaskResult`s) recorded it; {} when there is none to read."""
    try:
        tasks = json_value(report.read_text())["tasks"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {name: float(entry["child"]["peak_mb"]) for name, entry in tasks.items()
            if isinstance(entry, dict) and isinstance(entry.get("child"), dict)
            and isinstance(entry["child"].get("peak_mb"), (int, float))}
