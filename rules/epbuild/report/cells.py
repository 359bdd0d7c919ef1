"""One build's cell of the reports (a model for a target, or a group): what its build-report entries,
artifact.json, validation.json and logs say, and a digest of all of them, so that a page of 10,000 builds re-renders
only the cells a run changed (`report.views`)."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import Any

from ..contracts.validation import load_validation
from ..errors import json_value
from ..files.layout import GROUPS, Layout, settled, stat_key
from ..manifest.builds import Build
from ..records import record
from ..steps.compilers import compiler

ARTIFACT, VALIDATION = "artifact.json", "validation.json"
PENDING = "pending"  # no run has reached the task yet ("not built": a task it needs failed)
NOT_PASSED = ("failed", "skipped", "not built", "inconclusive", "interrupted", "structural")  # they carry a reason


@record(frozen=False)
class Cell:
    """One build (a model for a target, or a group) with what the last runs said about it."""

    build: str
    row: str  # the model, or the group's name
    target: str
    ep: str
    shared: bool
    members: list[str]
    compile_task: str
    validate_task: str | None
    compile: dict[str, Any]  # its build-report entry ({} when never run)
    validate: dict[str, Any]
    artifact: dict[str, Any] | None  # artifact.json
    validation: dict[str, Any] | None  # validation.json
    logs: dict[str, str] = field(default_factory=dict)  # step -> log path, relative to the project

    @property
    def folder(self) -> str:
        """The artifact's folder relative to report.html (in artifacts/): its files are links."""
        return f"{self.target}/{GROUPS}/{self.row}" if self.shared else f"{self.target}/{self.row}"

    @property
    def compile_status(self) -> str:
        return self.compile.get("status", PENDING)

    @property
    def validate_status(self) -> str:
        if self.validate_task is None:
            return "off"
        status = self.validate.get("status", PENDING)
        if status == "up-to-date" and self.validation:
            return self.validation.get("status", status)
        if status == "restored":  # a result restored from the cache for these very bytes
            return f"{(self.validation or {}).get('status', 'passed')} (restored)"
        return {"validated": "passed"}.get(status, status)

    @property
    def task(self) -> dict[str, Any] | None:
        """The task metric that decided the verdict (validation.json's `task`), if one is configured."""
        found = (self.validation or {}).get("task")
        return found if isinstance(found, dict) else None

    @property
    def size(self) -> int | None:
        files = self.compile.get("files")
        return sum(f["size"] for f in files) if files else None

    @property
    def offload(self) -> float | None:
        nodes = (self.artifact or {}).get("nodes") or self.compile.get("nodes") or {}
        return nodes.get("offload")

    @property
    def sharing(self) -> float | None:
        """A group's shared binary against its members compiled alone (artifact.json's loading contract)."""
        return ((self.artifact or {}).get("loading") or {}).get("sharing", {}).get("ratio")

    def outputs(self) -> list[tuple[str, dict[str, Any]]]:
        """(label, metrics) of every compared output; a group's labelled by member."""
        report = self.validation or {}
        if "members" in report:
            return [(f"{member} / {name}", metrics) for member, sub in sorted(report["members"].items())
                    for name, metrics in sorted(sub.get("outputs", {}).items())]
        return sorted(report.get("outputs", {}).items())

    @property
    def snr_db(self) -> float | None:
        values = [m["snr_db"] for _, m in self.outputs() if isinstance(m.get("snr_db"), (int, float))]
        return min(values) if values else None

    @property
    def reason(self) -> str | None:
        """Why the compile or the validation did not pass, as the build said it."""
        for entry in (self.compile, self.validate):
            if entry.get("status") in NOT_PASSED and entry.get("reason"):
                return entry["reason"]
        if self.validation and self.validation.get("status") in NOT_PASSED:
            return self.validation.get("reason")
        return None


def _validation(path: str) -> dict[str, Any] | None:
    """validation.json as its record reads it (`contracts.validation`); None when absent or not one."""
    try:
        return load_validation(Path(path)).to_json()
    except (OSError, ValueError):
        return None


def _json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return json_value(handle.read())
    except (OSError, ValueError):
        return None


@record
class Sources:
    """Where one build's cell comes from: its build-report entries and the files it reads."""

    build: Build
    validate_task: str | None
    files: tuple[str, ...]  # artifact.json, validation.json, then the log of each of `steps`
    steps: tuple[str, ...]  # the build's tasks that write a log: compile, and validate and ops where it has them

    def key(self, entry_text: Callable[[str], str]) -> str | None:
        """A digest of everything the cell shows: equal digests, equal cells. None while a file may still change
        under its identity (written in the last moment): such a cell is rendered, never remembered."""
        identities: list[list[int] | None] = []
        for path in self.files:
            try:
                stat = os.stat(path)
            except OSError:
                identities.append(None)
                continue
            if not settled(stat):
                return None
            identities.append(stat_key(stat))
        build = self.build
        facts = [build.name, build.target.ep.name, *(m.name for m in build.members), str(self.validate_task),
                 entry_text(build.task), entry_text(self.validate_task) if self.validate_task else "", repr(identities)]
        return hashlib.blake2b("\0".join(facts).encode(), digest_size=16).hexdigest()

    def cell(self, layout: Layout, entries: dict[str, dict[str, Any]]) -> Cell:
        build, project = self.build, layout.root.parent
        logs = {}
        for step, path in zip(self.steps, self.files[2:], strict=True):
            with contextlib.suppress(OSError):
                if os.path.getsize(path):  # an empty log says nothing
                    logs[step] = os.path.relpath(path, project)
        return Cell(build.name, build.name if build.shared else build.members[0].name, build.target.name,
                    build.target.ep.name, build.shared, [m.name for m in build.members], build.task,
                    self.validate_task, entries.get(build.task, {}),
                    entries.get(self.validate_task, {}) if self.validate_task else {},
                    _json(self.files[0]), _validation(self.files[1]), logs)


def _steps(build: Build) -> tuple[str, ...]:
    """The build's tasks a cell shows, by step: compile, then validate and ops where it has them."""
    return ("compile", *(("validate",) if build.validates else ()),
            *(("ops",) if compiler(build.target).operator_check else ()))


def cell_tasks(build: Build) -> tuple[str, ...]:
    """The tasks whose entries and files a build's cell shows."""
    return tuple(build.task if step == "compile" else f"{step}:{build.name}" for step in _steps(build))


def source_of(layout: Layout, build: Build) -> Sources:
    """The build's sources, the paths spelled as strings (pathlib's joins, per build, showed in a run's end)."""
    root, target = str(layout.root), build.target.name
    folder = f"{root}/{target}/{GROUPS}/{build.folder_name}" if build.shared else f"{root}/{target}/{build.folder_name}"
    logs = f"{layout.logs}/{target}/{build.log_stem}"
    steps = _steps(build)
    files = (f"{folder}/{ARTIFACT}", f"{folder}/{VALIDATION}", *(f"{logs}.{step}.log" for step in steps))
    return Sources(build, build.validate_task if build.validates else None, files, steps)
