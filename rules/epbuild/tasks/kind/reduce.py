"""`reduce:MODEL@TARGET`, made only when named (`epbuild reduce compile:MODEL@TARGET`): the build's failing compile
reduced to a repro folder. Never up to date: it asks the EP again (known probes are not rerun). Handed to doit with
the compile kind's generator (it is no group of its own in `doit list`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..actions import run_reduce

if TYPE_CHECKING:
    from ..definitions import Task, Tasks


def tasks(source: Tasks) -> Iterator[Task]:
    project = source.project
    for build in project.builds:
        if build.reduce_task in project.requested:
            yield {"basename": "reduce", "name": build.name,
                   "doc": f"reduce the failing {build.task} to a repro folder (artifacts/repro/{build.name}/)",
                   "actions": [(run_reduce, [build, project.workspace, project.manifest.build.reduce_budget_s])],
                   "task_dep": [stage.task for stage in build.stages], "uptodate": [False]}
