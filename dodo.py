"""Build every target in models.toml: `doit`, `doit list`, `doit compile:MODEL@TARGET`.

EPBUILD_MANIFEST names another manifest (relative to this folder; empty: models.toml).
"""

import os
import sys
from pathlib import Path

from rules.fast_path import load_project

# the command line's task names: a task this host cannot build fails when named, and is skipped otherwise
project = load_project(Path(__file__).parent / (os.environ.get("EPBUILD_MANIFEST") or "models.toml"), sys.argv[1:])
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
