"""Every epbuild task, for a project's one-line dodo.py: `from epbuild.dodo import *`.

doit runs a dodo.py from its own folder, so the manifest is `models.toml` there, or EPBUILD_MANIFEST (relative to
that folder; empty: models.toml). The `epbuild` command loads this module the same way, without a dodo.py.
"""

import os
import sys
from pathlib import Path

from .fast_path import load_project

# the command line's task names: a task this host cannot build fails when named, and is skipped otherwise
project = load_project(Path.cwd() / (os.environ.get("EPBUILD_MANIFEST") or "models.toml"), sys.argv[1:])
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
