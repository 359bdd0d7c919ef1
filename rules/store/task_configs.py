"""The settings each task last succeeded with, as digests in one file (`artifacts/.state/configs.json`).

doit re-runs a task when its files change, not when its settings do; `doit.tools.config_changed` covers settings
but costs an `inspect.signature` call and a JSON decode of saved values per task on every run, which dominated a
no-op `doit` at 1000 targets. Here task creation compares each task's digest with this record once and hands doit
a plain bool. The build's reporter records a task's digest when it succeeds; a task with no record, or another
digest, runs. Two builds at once merge their records under a lock, each writing only the tasks it ran.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .layout import write_json
from .locks import file_lock


def digest(config: dict[str, Any]) -> str:
    """A task's settings as a short string: repr is stable for our dicts (built in a fixed order) and much
    cheaper than a sorted json.dumps."""
    return hashlib.md5(repr(config).encode()).hexdigest()


def _read(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class ConfigRecord:
    """Task name -> the digest of the settings it last succeeded with."""

    def __init__(self, path: Path):
        self.path = path
        self.recorded = _read(path)
        self.current: dict[str, str] = {}  # this run's digest of every task created
        self.succeeded: set[str] = set()

    def unchanged(self, task: str, config: dict[str, Any]) -> bool:
        """Whether `task` last succeeded with these settings; remembers them for `succeeded`."""
        self.current[task] = value = digest(config)
        return self.recorded.get(task) == value

    def success(self, task: str) -> None:
        if task in self.current:
            self.succeeded.add(task)

    def save(self) -> None:
        """Record the tasks that succeeded in this run, merged with what another build recorded meanwhile."""
        changed = {task: self.current[task] for task in self.succeeded if self.recorded.get(task) != self.current[task]}
        if not changed:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(self.path.with_suffix(".lock")):
            merged = {**_read(self.path), **changed}
            write_json(self.path, merged, indent=None)
        self.recorded.update(changed)
