"""Declarative, incremental build rules that turn ONNX models into EP-specific compiled artifacts.

Only the doit layer (`epbuild.tasks`, `epbuild.dodo`, `epbuild.command`) knows doit; every other module is plain
Python that tests call directly.
"""

import gc
import sys

from .version import RULES_FORMAT  # noqa: F401 - epbuild.RULES_FORMAT, as before


def open_session(artifact, member=None, session_options=None):
    """A ready onnxruntime.InferenceSession for a built artifact folder: EP registered, device chosen, options
    applied (`epbuild.runtime.session.open_session`)."""
    from .runtime.session import open_session as opened

    return opened(artifact, member, session_options)


def open_group(folder):
    """Every member's session of a shared-context group folder, in its loading order."""
    from .runtime.session import open_group as opened

    return opened(folder)


def _refuse_a_dodo_file_without_tasks() -> None:
    """A dodo.py that imports epbuild but defines no task would make doit build nothing and exit 0: doit's task
    loader is wrapped so that it says what to write instead (and keeps Python's cyclic collector off its task
    dicts). Only inside a doit process, before it loads tasks."""
    loader = sys.modules.get("doit.loader")
    if loader is None or getattr(loader.load_tasks, "epbuild_checked", False):
        return
    original = loader.load_tasks

    def load_tasks(namespace, *args, **kwargs):
        gc.disable()  # creating thousands of task dicts makes no cycles worth the collector's passes over them
        try:
            tasks = original(namespace, *args, **kwargs)
        finally:
            gc.enable()
        gc.freeze()  # they live as long as doit: later collections skip them
        if not tasks and any(getattr(value, "__name__", "").startswith("epbuild") or
                             str(getattr(value, "__module__", "")).startswith("epbuild")
                             for value in namespace.values()):
            print("error: dodo.py imports epbuild but defines no task: write `from epbuild.dodo import *` (every "
                  "task of models.toml), or run `epbuild` without a dodo.py", file=sys.stderr)
            raise SystemExit(2)
        return tasks

    load_tasks.epbuild_checked = True
    loader.load_tasks = load_tasks


_refuse_a_dodo_file_without_tasks()
