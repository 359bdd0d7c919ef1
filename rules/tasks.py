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
from .fingerprint import compile_config, validate_config
from .host import capabilities, unavailable_reason
from .manifest import load
from .publish import discard
from .targets import Build, plan
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


def run_validate(build: Build, artifacts: str) -> TaskFailed | None:
    report = validate_build(build, Path(artifacts))
    line = f"{report['status']} validate:{build.name}: {summary(report)}"
    if report["status"] == "failed":
        return TaskFailed(line)
    print(line)
    return None


def refuse_unavailable(task: str, reason: str) -> TaskFailed:
    return TaskFailed(f"{task} cannot be built on this host: {reason}")


def report_unavailable(reasons: dict[str, str]) -> None:
    for task, reason in reasons.items():
        print(f"skipped {task}: {reason}")


class Project:
    """A loaded manifest with everything task creation needs, computed once."""

    def __init__(self, manifest_path: Path):
        self.manifest = load(manifest_path)
        self.root = self.manifest.root
        self.rel = _Relative(Path.cwd())
        self.artifacts = self.root / "artifacts"
        state = self.artifacts / ".state"
        self.builds = plan(self.manifest)
        needs_probe = any(not build.target.is_cpu for build in self.builds)
        caps = capabilities(state) if needs_probe else {}
        self.unavailable: dict[str, str] = {}
        for build in self.builds:
            target = build.target
            if not target.is_cpu and target.name not in self.unavailable:
                reason = unavailable_reason(target.ep, target.source, target.device, caps)
                if reason:
                    self.unavailable[target.name] = reason
        index = ExternalDataIndex(state)
        self.external = {}
        for name, model in self.manifest.models.items():
            try:
                self.external[name] = index.files(model.path)
            except UserError as exc:
                raise UserError(self.manifest.path.name, f"models.{name}.path", f"{exc.file}: {exc.message}") from None
        index.save()

    def task_names(self, build: Build) -> list[str]:
        names = [f"compile:{build.name}"]
        if build.validation.mode != "off":
            names.append(f"validate:{build.name}")
        return names

    def skipped(self) -> dict[str, str]:
        return {name: self.unavailable[b.target.name] for b in self.builds if b.target.name in self.unavailable
                for name in self.task_names(b)}

    def doit_config(self) -> dict[str, Any]:
        default = [name for b in self.builds if b.target.name not in self.unavailable for name in self.task_names(b)]
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

    def unavailable_task(self) -> Iterator[Task]:
        if self.unavailable:
            yield {"basename": "unavailable", "doc": "list the targets this host cannot build, and why",
                   "actions": [(report_unavailable, [self.skipped()])], "uptodate": [False]}


def load_project(manifest_path: str | Path) -> Project:
    """Load for dodo.py: a user error prints one line and exits 2, without a traceback."""
    try:
        return Project(Path(manifest_path))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
