"""`ops:MODEL@TARGET`: a qaic target's operator check against qaic-compile (handed to doit only where a model is
built with qaic)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ...manifest.builds import Build
from ...state.folder import StateFolder
from ...steps.compilers import compiler
from ..actions import run_ops

if TYPE_CHECKING:
    from ..definitions import Task, Tasks

DOC = "check every qaic model's operators against qaic-compile"


def wanted(source: Tasks) -> bool:
    """`doit list` would show a group no target has."""
    return any(build.target.compiler == "qaic" for build in source.project.builds)


def tasks(source: Tasks) -> Iterator[Task]:
    yield {"basename": "ops", "name": None, "doc": DOC}
    for build in source.project.builds:
        name = build.ops_task
        if not source.skipped(name) and (task := source.made_or(name, make, build)) is not None:
            yield task


def make(source: Tasks, build: Build) -> Task | None:
    """None for a target without an operator check, or one this host cannot build."""
    project = source.project
    backend = compiler(build.target)
    if not backend.operator_check or build.target.name in project.unavailable or build.ops_task in project.blocked:
        return None
    report = StateFolder(project.layout.state).path(f"ops/{build.target.name}/{build.members[0].name}.json")
    return source.task("ops", build.name, f"operators of {build.members[0].name} supported by qaic-compile?", run_ops,
                       [build, project.workspace, report], [build.members[0].model.path], [report],
                       {"toolchain": backend.identity(build.target)})
