"""Every epbuild task, for a project's one-line dodo.py: `from epbuild.dodo import *`.

doit runs a dodo.py from its own folder, so the manifest is `models.toml` there, or EPBUILD_MANIFEST (relative to
that folder; empty: models.toml). Importing this module is doit's way in (its module protocol): it reads doit's
command line from the process's arguments, once, and loads the tasks (`tasks.entry`). The `epbuild` command does
not import it: it hands doit a loader that is given the command line.
"""

import sys

from .invocation import Invocation
from .tasks.entry import load, manifest_path, namespace

globals().update(namespace(load(manifest_path(), Invocation.of(sys.argv[1:]))))

__all__ = ["DOIT_CONFIG", *(name for name in dir() if name.startswith("task_"))]  # noqa: F822 - set just above
