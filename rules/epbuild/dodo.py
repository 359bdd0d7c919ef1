"""Every epbuild task, for a project's one-line dodo.py: `from epbuild.dodo import *`.

doit runs a dodo.py from its own folder, so the manifest is `models.toml` there, or EPBUILD_MANIFEST (relative to
that folder; empty: models.toml). The `epbuild` command loads this module the same way, without a dodo.py. When a
shortcut holds (`fast_path`: a no-op run or an unchanged listing) nothing heavy is imported and no task is made;
else the project is loaded in full (`tasks`).
"""

import gc
import os
import sys
from pathlib import Path
from typing import Any

from .fast_path import shortcut
from .invocation import Invocation
from .logs import configure as configure_logging


def _interrupted(kind: type[BaseException], value: BaseException, trace: Any) -> None:
    """Ctrl-C: one line instead of a traceback (the exit status stays 130). doit has saved what finished, and
    the fork servers end the jobs of this build once its process is gone."""
    if kind.__name__ == "WorkerLost":  # a worker killed mid-build (`execute.lifelines`): its line, exit status 1
        sys.stdout.flush()
        sys.stderr.write(f"{value}\n")
        sys.stderr.flush()
        os._exit(1)
    if issubclass(kind, KeyboardInterrupt):
        sys.stderr.write("interrupted: the build stopped; finished tasks are kept, and a rerun does the rest\n")
        return
    sys.__excepthook__(kind, value, trace)



def _load(manifest: Path, invocation: Invocation) -> Any:
    sys.excepthook = _interrupted
    configure_logging()
    # what loading makes (the plan, the records, the task dicts) lives as long as doit and holds no cycle worth the
    # collector's passes over it: off until doit has the tasks, when epbuild's wrapper of doit's task loader turns
    # it on again and freezes them (`epbuild._refuse_a_dodo_file_without_tasks`; outside doit it stays on). Then
    # doit reads every task's record from its database, ever more long-lived dicts: at the default thresholds the
    # full collections over them took 1.1 s of a 10,000-target no-op; one young collection per 100,000 objects
    # instead of 700 keeps 32 collections (0.18 s) and still collects what the run's own actions leave
    if getattr(getattr(sys.modules.get("doit.loader"), "load_tasks", None), "epbuild_checked", False):
        gc.disable()
        gc.set_threshold(100_000, 50, 100)
    quick = shortcut(manifest, invocation)
    if isinstance(quick, str):  # `doit list` unchanged: printed here, doit has nothing left to do
        sys.stdout.write(quick)
        sys.stdout.flush()
        raise SystemExit(0)
    if quick is not None:
        return quick
    from .tasks.definitions import load_full_project

    return load_full_project(manifest, invocation)


# the command line's task names: a task this host cannot build fails when named, and is skipped otherwise
project = _load(Path.cwd() / (os.environ.get("EPBUILD_MANIFEST") or "models.toml"), Invocation.of(sys.argv[1:]))
DOIT_CONFIG = project.doit_config()


def task_stages():
    yield from project.stage_tasks()


def task_compile():
    yield from project.build_tasks("compile")


def task_group():
    yield from project.build_tasks("group")


def task_validate():
    yield from project.validate_tasks()


def task_ops():
    yield from project.ops_tasks()


def task_backends():
    yield from project.backends_task()


def task_cache():
    yield from project.cache_task()


def task_unavailable():
    yield from project.unavailable_task()


def task_graph():
    yield from project.graph_task()


def task_prune():
    yield from project.prune_task()


__all__ = ["DOIT_CONFIG", *(name for name in dir() if name.startswith("task_"))]
