"""`unavailable`: the tasks this host cannot build, and why (a default run says it once); and `blocked`, last in a
default run, failing with what the manifest must fix before its blocked tasks build."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..actions import fail_blocked, report_unavailable
from ..kinds import BLOCKED, UNAVAILABLE

if TYPE_CHECKING:
    from ..definitions import Task, Tasks


def tasks(source: Tasks) -> Iterator[Task]:
    project = source.project
    yield {"basename": UNAVAILABLE, "doc": "list the tasks this host cannot build, and why",
           "actions": [(report_unavailable, [project.skipped()])], "uptodate": [False]}
    if blocked := project.blocked_builds():  # last in a default run: after everything else was built
        yield {"basename": BLOCKED, "doc": "fail with what the manifest must fix before its blocked tasks build",
               "actions": [(fail_blocked, [blocked])], "uptodate": [False],
               "task_dep": [name for name in source.default_tasks if name != BLOCKED]}
