"""The settings each task last succeeded with, as digests in one record (`artifacts/.state/configs.journaled`, one
line per task: a run decodes the lines of only the tasks it creates, `files.entry_lines`).

doit re-runs a task when its files change, not when its settings do; `doit.tools.config_changed` covers settings
but costs an `inspect.signature` call and a JSON decode of saved values per task on every run, which dominated a
no-op `doit` at 1000 targets. Here task creation compares each task's digest with this record once and hands doit
a plain bool. The build's reporter records a task's digest when it succeeds; a task with no record, or another
digest, runs. Two builds at once merge their records under a lock, each writing only the tasks it ran. A run
appends the tasks it changed to the record (one JSON line: 7 MB were rewritten per run at 10,000 targets); the
record is rewritten whole, lines merged, when they outgrow it (`state.journaled.outgrown`). A line lost or
torn (a killed build) leaves its tasks' older entries: older settings or published files, so those tasks run
again, never the reverse.

With its settings the record keeps the identity and sha256 of every file the task published (`published`): doit's
file checker (`epbuild.tasks.HashChecker`) takes a published file changed since (an `onnx.save` over it, a hex edit)
for a missing target, so the task runs again and restores it from the cache or rebuilds it. A touched but unchanged
file is hashed once.

Beside the digests, the settings themselves of each task that succeeded are kept, one small file per task under
`settings/`, written only when they change: `doit info TASK` and `epbuild explain TASK` then say which setting
changed and how (`options.soc_model: '60' -> '69'`), and no run ever reads them otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import json_value
from ..files.entry_lines import LazyEntries
from ..files.layout import stat_key
from ..state.folder import StateFolder
from ..state.hash_memory import FileHashes
from ..state.journaled import Journaled
from ..state.registry import CONFIGS

Published = dict[str, list]  # path (relative to the project) -> [*identity, sha256] of each file a task published


def digest(config: dict[str, Any]) -> str:
    """A task's settings as a short string: repr is stable for our dicts (built in a fixed order) and much
    cheaper than a sorted json.dumps."""
    return hashlib.md5(repr(config).encode()).hexdigest()


MISSING = "(unset)"
RECORD = CONFIGS


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested settings as key paths (`options.soc_model`, `members[0].thresholds.min_snr_db`) to leaf values: a
    list of tables is walked too, so a change shows as the one value that changed, never a truncated list."""
    if isinstance(value, dict) and value:
        return {key: leaf for name, item in value.items() for key, leaf in _flat(item, f"{prefix}{name}.").items()}
    if isinstance(value, list) and any(isinstance(item, (dict, list)) for item in value):
        return {key: leaf for index, item in enumerate(value)
                for key, leaf in _flat(item, f"{prefix.rstrip('.')}[{index}].").items()}
    return {prefix.rstrip("."): value}


def _shown(value: Any) -> str:
    text = value if value == MISSING else json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


class ConfigRecord:
    """Task name -> [the digest of the settings it last succeeded with, the files it published then]."""

    def __init__(self, state: StateFolder):
        self.state = state
        found = state.read_entries(RECORD)
        self.recorded: LazyEntries = found[0] if found is not None else LazyEntries()
        self.read_as: Journaled | None = found[1] if found is not None else None
        self.current: dict[str, str] = {}  # this run's digest of every task created
        self.settings: dict[str, dict[str, Any]] = {}  # this run's settings of every task created
        self.succeeded: dict[str, Published] = {}

    def explained(self, task: str) -> str:
        """Why `task` runs as far as its settings go: each one that changed since its last success, and how."""
        before = self.previous_settings(task)
        if before is None:
            return "no settings recorded: it has not succeeded here yet (or only with an epbuild that kept none)"
        now = _flat(json.loads(json.dumps(self.settings.get(task, {}), default=str)))
        then = _flat(before)
        changes = [f"{key}: {_shown(then.get(key, MISSING))} -> {_shown(value)}"
                   for key, value in now.items() if then.get(key, MISSING) != value]
        changes += [f"{key}: {_shown(value)} -> {MISSING}" for key, value in then.items() if key not in now
                    and not any(path.startswith((f"{key}.", f"{key}[")) for path in now)]  # an empty table filled
        return "settings changed since its last success: " + ("; ".join(changes) or "none (its record was lost)")

    def unchanged(self, task: str, config: dict[str, Any]) -> bool:
        """Whether `task` last succeeded with these settings; remembers them for `success`."""
        self.current[task] = value = digest(config)
        self.settings[task] = config
        recorded = self.recorded.get(task)
        return isinstance(recorded, list) and recorded[0] == value

    def settings_file(self, task: str) -> Path:
        return self.state.path(_settings_name(task))

    def previous_settings(self, task: str) -> dict[str, Any] | None:
        """The settings `task` last succeeded with, where they were kept."""
        try:
            return json_value(self.settings_file(task).read_text())
        except (OSError, ValueError):
            return None

    def published_files(self, tasks: Iterable[str] | None = None) -> dict[str, list]:
        """The published files of `tasks` (None: every task's) as recorded (path relative to the project ->
        [*identity, sha256]): a run checks the outputs of only the tasks it hands doit."""
        entries = (self.recorded.get(task) for task in (self.recorded if tasks is None else tasks))
        return {path: identity for entry in entries if isinstance(entry, list) and len(entry) == 2
                and isinstance(entry[1], dict) for path, identity in entry[1].items()}

    def success(self, task: str, published: Published | None) -> None:
        if task in self.current:
            self.succeeded[task] = published or {}

    def save(self) -> None:
        """Record the tasks that succeeded in this run, merged with what another build recorded meanwhile."""
        changed = {task: [self.current[task], published] for task, published in self.succeeded.items()
                   if self.recorded.get(task) != [self.current[task], published]}
        if not changed:
            return
        with self.state.lock():
            # a base decoded whole (not vouched for) is rewritten one line per task at once, not when the lines
            # outgrow it: until then every run would decode all of it (7 MB at 10,000 targets)
            read = self.read_as
            if read is None or not read.vouched or not self.state.append(RECORD, read, changed):
                found = self.state.read_entries(RECORD)
                merged = found[0] if found is not None else LazyEntries()
                merged.update(changed)
                self.state.write_entries(RECORD, merged)
        self.recorded.update(changed)
        for task in changed:
            self.state.write_text(_settings_name(task), json.dumps(self.settings[task], default=str, sort_keys=True))


def _settings_name(task: str) -> str:
    return f"settings/{task.replace(':', '.')}.json"


def published(paths: list[Path], hashes: FileHashes, root: Path) -> Published:
    """What a task leaves in the record for doit's file checker to compare next time: each file's identity and
    sha256, read together (a file changed while it was hashed then shows another identity), by its path inside the
    project `root`."""
    files: Published = {}
    for path in paths:
        stat = os.stat(path)
        files[Path(os.path.relpath(path, root)).as_posix()] = [*stat_key(stat), hashes.sha256(path, stat)]
    return files
