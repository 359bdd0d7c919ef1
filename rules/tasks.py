"""doit task generators: the only module that knows doit.

Task creation reads the manifest, a cached host probe and a cached external-data index; it never imports
onnxruntime or parses an unchanged model, so `doit list` and a no-op `doit` stay near doit's own cost.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from doit.exceptions import TaskFailed
from doit.tools import config_changed

from .compile import compile_build
from .errors import BuildError, UserError
from .external_data import ExternalDataIndex
from .fingerprint import compile_config, group_config, group_validate_config, validate_config
from .groups import compile_group, validate_group
from .host import capabilities, unavailable_reason
from .manifest import load
from .publish import discard
from .targets import Build, GroupBuild, plan, plan_groups
from .validate import REPORT, summary, validate_build

Task = dict[str, Any]


class _Relative:
    """One canonical spelling per file (doit does not normalise paths): relative to doit's working folder.

    String slicing, not os.path.relpath: this runs several times per task and relpath dominated `doit list`.
    """

    def __init__(self, root: Path):
        self.root = f"{root}{os.sep}"
        self.prefix = os.path.relpath(root)

    def __call__(self, path: Path) -> str:
        text = str(path)
        if not text.startswith(self.root):
            return os.path.relpath(text)
        inside = text[len(self.root):]
        return inside if self.prefix == "." else os.path.join(self.prefix, inside)



def run_compile(build: Build, artifacts: str) -> TaskFailed | None:
    try:
        done = compile_build(build, Path(artifacts))
    except (BuildError, UserError) as exc:
        return TaskFailed(str(exc))
    nodes = done.nodes
    taken = (f"{nodes['in_ep']}/{nodes['source']} source nodes in {nodes['ep_context']} EPContext node(s), "
             f"{nodes['cpu']} on CPU" if "in_ep" in nodes else f"{nodes['cpu']} nodes after optimization")
    print(f"compiled {done.build}: {taken}, {done.seconds:.1f} s -> {os.path.relpath(done.out_dir)}/")
    return None


def run_group(group: GroupBuild, artifacts: str) -> TaskFailed | None:
    try:
        done = compile_group(group, Path(artifacts))
    except (BuildError, UserError) as exc:
        return TaskFailed(str(exc))
    print(f"compiled {done.build}: {len(group.members)} members, {done.nodes['ep_context']} EPContext node(s), "
          f"{done.seconds:.1f} s -> {os.path.relpath(done.out_dir)}/ (keep together: {', '.join(done.files)})")
    return None


def run_group_validate(group: GroupBuild, artifacts: str) -> TaskFailed | None:
    return _report_line(f"validate:{group.name}", validate_group(group, Path(artifacts)))


def run_validate(build: Build, artifacts: str) -> TaskFailed | None:
    return _report_line(f"validate:{build.name}", validate_build(build, Path(artifacts)))


def _report_line(task: str, report: dict[str, Any]) -> TaskFailed | None:
    line = f"{report['status']} {task}: {summary(report)}"
    if report["status"] == "failed":
        return TaskFailed(line)
    print(line)
    return None


def refuse_unavailable(task: str, reason: str) -> TaskFailed:
    return TaskFailed(f"{task} cannot be built on this host: {reason}")


def report_unavailable(reasons: dict[str, str]) -> None:
    for task, reason in reasons.items():
        print(f"skipped {task}: {reason}")
    if not reasons:
        print("this host can build every task")


class Project:
    """A loaded manifest with everything task creation needs, computed once."""

    def __init__(self, manifest_path: Path):
        self.manifest = load(manifest_path)
        self.root = self.manifest.root
        self.rel = _Relative(Path.cwd())
        self.artifacts = self.root / "artifacts"
        state = self.artifacts / ".state"
        self.builds = plan(self.manifest)
        self.groups = plan_groups(self.manifest)
        used = {b.target.name: b.target for b in [*self.builds, *self.groups] if not b.target.is_cpu}
        caps = capabilities(state) if used else {}
        self.unavailable: dict[str, str] = {}
        for name, target in used.items():
            reason = unavailable_reason(target.ep, target.source, target.device, caps)
            if reason:
                self.unavailable[name] = reason
        index = ExternalDataIndex(state)
        self.external = {}
        for name, model in self.manifest.models.items():
            try:
                self.external[name] = index.files(model.path)
            except UserError as exc:
                raise UserError(self.manifest.path.name, f"models.{name}.path", f"{exc.file}: {exc.message}") from None
        index.save()

    @staticmethod
    def task_names(build: Build | GroupBuild) -> list[str]:
        if isinstance(build, GroupBuild):
            return [f"group:{build.name}", *([f"validate:{build.name}"] if build.validations[0].mode != "off" else [])]
        return [f"compile:{build.name}", *([f"validate:{build.name}"] if build.validation.mode != "off" else [])]

    def skipped(self) -> dict[str, str]:
        return {name: self.unavailable[b.target.name] for b in [*self.builds, *self.groups]
                if b.target.name in self.unavailable for name in self.task_names(b)}

    def doit_config(self) -> dict[str, Any]:
        default = [name for b in [*self.builds, *self.groups] if b.target.name not in self.unavailable
                   for name in self.task_names(b)]
        if self.unavailable:
            default.append("unavailable")
        return {"backend": "sqlite3", "dep_file": ".doit.db", "verbosity": 2, "subtasks": True,
                "default_tasks": default}

    def compile_tasks(self) -> Iterator[Task]:
        yield {"basename": "compile", "name": None, "doc": "compile every model for each of its targets"}
        for build in self.builds:
            target, out_dir = build.target, build.out_dir(self.artifacts)
            rel = self.rel
            doc = f"{build.model.name} for {target.name} ({target.ep.name}, {target.device})"
            reason = self.unavailable.get(target.name)
            if reason:
                yield {"basename": "compile", "name": build.name, "doc": f"{doc} [unavailable here: {reason}]",
                       "actions": [(refuse_unavailable, [f"compile:{build.name}", reason])], "uptodate": [False]}
                continue
            inputs = [build.model.path, *self.external[build.model.name], *target.option_files.values()]
            yield {
                "basename": "compile", "name": build.name, "doc": f"{doc} -> {rel(out_dir)}/",
                "actions": [(run_compile, [build, str(self.artifacts)])],
                "file_dep": [rel(path) for path in inputs],
                "targets": [rel(out_dir / name) for name in build.output_names],
                "uptodate": [config_changed(compile_config(build, self.root))],
                "clean": [(discard, [out_dir])],
            }

    def validate_tasks(self) -> Iterator[Task]:
        yield {"basename": "validate", "name": None, "doc": "run every compiled artifact and compare with its source"}
        for build in self.builds:
            settings, target = build.validation, build.target
            if settings.mode == "off":
                continue
            rel, out_dir = self.rel, build.out_dir(self.artifacts)
            what = "structural checks" if settings.mode == "structural" else "run, compare with the source on CPU"
            doc = f"{build.model.name} on {target.name}: {what}"
            reason = self.unavailable.get(target.name)
            if reason:
                yield {"basename": "validate", "name": build.name, "doc": f"{doc} [unavailable here: {reason}]",
                       "actions": [(refuse_unavailable, [f"validate:{build.name}", reason])], "uptodate": [False]}
                continue
            extra = [p for p in (settings.inputs, settings.reference) if p]
            inputs = [*(out_dir / name for name in build.output_names), build.model.path,
                      *self.external[build.model.name], *extra]
            yield {
                "basename": "validate", "name": build.name, "doc": doc,
                "actions": [(run_validate, [build, str(self.artifacts)])],
                "file_dep": [rel(path) for path in inputs],
                "targets": [rel(out_dir / REPORT)],
                "uptodate": [config_changed(validate_config(build, self.root))],
            }
        yield from self.group_validate_tasks()

    def group_tasks(self) -> Iterator[Task]:
        if not self.groups:
            return
        yield {"basename": "group", "name": None, "doc": "compile every shared-context group"}
        for group in self.groups:
            target, out_dir, rel = group.target, group.out_dir(self.artifacts), self.rel
            doc = (f"{', '.join(m.name for m in group.members)} into one shared context for {target.name} "
                   f"({target.ep.name})")
            reason = self.unavailable.get(target.name)
            if reason:
                yield {"basename": "group", "name": group.name, "doc": f"{doc} [unavailable here: {reason}]",
                       "actions": [(refuse_unavailable, [f"group:{group.name}", reason])], "uptodate": [False]}
                continue
            inputs = [p for m in group.members for p in (m.path, *self.external[m.name])]
            yield {
                "basename": "group", "name": group.name, "doc": f"{doc} -> {rel(out_dir)}/",
                "actions": [(run_group, [group, str(self.artifacts)])],
                "file_dep": [rel(path) for path in [*inputs, *target.option_files.values()]],
                "targets": [rel(out_dir / name) for name in group.output_names],
                "uptodate": [config_changed(group_config(group, self.root))],
                "clean": [(discard, [out_dir])],
            }

    def group_validate_tasks(self) -> Iterator[Task]:
        for group in self.groups:
            if group.validations[0].mode == "off":
                continue
            rel, out_dir = self.rel, group.out_dir(self.artifacts)
            doc = f"group {group.name}: structural checks, and each member run where this host loads the context"
            reason = self.unavailable.get(group.target.name)
            if reason:
                yield {"basename": "validate", "name": group.name, "doc": f"{doc} [unavailable here: {reason}]",
                       "actions": [(refuse_unavailable, [f"validate:{group.name}", reason])], "uptodate": [False]}
                continue
            extra = [p for v in group.validations for p in (v.inputs, v.reference) if p]
            inputs = [*(out_dir / name for name in group.output_names), *(m.path for m in group.members), *extra]
            yield {
                "basename": "validate", "name": group.name, "doc": doc,
                "actions": [(run_group_validate, [group, str(self.artifacts)])],
                "file_dep": [rel(path) for path in inputs],
                "targets": [rel(out_dir / REPORT)],
                "uptodate": [config_changed(group_validate_config(group, self.root))],
            }

    def unavailable_task(self) -> Iterator[Task]:
        yield {"basename": "unavailable", "doc": "list the tasks this host cannot build, and why",
               "actions": [(report_unavailable, [self.skipped()])], "uptodate": [False]}


def load_project(manifest_path: str | Path) -> Project:
    """Load for dodo.py: a user error prints one line and exits 2, without a traceback."""
    try:
        return Project(Path(manifest_path))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
