"""Every epbuild task, for a project's one-line dodo.py: `from epbuild.dodo import *`.

doit runs a dodo.py from its own folder, so the manifest is `models.toml` there, or EPBUILD_MANIFEST (relative to
that folder; empty: models.toml). Importing this module is doit's way in (its module protocol): it reads doit's
command line from the process's arguments, once, starts a first build's fork-server imports
(`execute.warm_start`) and loads the tasks (`tasks.entry`). The `epbuild` command does
not import it: it hands doit a loader that is given the command line.
"""

import sys

from .execute.warm_start import begin
from .invocation import Invocation, manifest_path
from .steps.job_modules import JOB_MODULES

_invocation = Invocation.of(sys.argv[1:])
_early = begin(manifest_path(), _invocation, JOB_MODULES)  # a first build's server imports, begun before our own

from .tasks.entry import load, namespace  # noqa: E402 - after the start above, which it would delay

globals().update(namespace(load(manifest_path(), _invocation, _early)))

__all__ = ["DOIT_CONFIG", *(name for name in dir() if name.startswith("task_"))]  # noqa: F822 - set just above
