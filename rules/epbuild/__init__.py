"""Declarative, incremental build rules that turn ONNX models into EP-specific compiled artifacts.

Only the doit layer (`epbuild.tasks`, `epbuild.dodo`, `epbuild.command`) knows doit; every other module is plain
Python that tests call directly.
"""

import sys
from types import FrameType

from .version import RULES_FORMAT  # noqa: F401 - epbuild.RULES_FORMAT, as before


def open_session(artifact, member=None, session_options=None):
    """A ready onnxruntime.InferenceSession for a built artifact folder: EP registered, device chosen, options
    applied (`epbuild.runtime.session.open_session`)."""
    from .runtime.session import open_session as opened

    return opened(artifact, member, session_options)


def open_package(package, component=None, ep="cpu", device=None):
    """The session of the variant ONNX Runtime selects from a model package for `ep` (cpu, qnn, openvino)."""
    from .runtime.session import open_package as opened

    return opened(package, component, ep, device)


def open_group(folder):
    """Every member's session of a shared-context group folder, in its loading order."""
    from .runtime.session import open_group as opened

    return opened(folder)


def create_doit_tasks():
    """doit's task-creator protocol (doit calls this for any object in a dodo.py's namespace that has it): a dodo.py
    that imports epbuild (or `epbuild.dodo`) but takes no task from it would make doit build nothing and exit 0, so
    it is refused with the line to write. With the tasks taken (`from epbuild.dodo import *`) it creates none."""
    if not _tasks_taken():
        _discard_empty_dep_file()
        print("error: dodo.py imports epbuild but defines no task: write `from epbuild.dodo import *` (every "
              "task of models.toml), or run `epbuild` without a dodo.py", file=sys.stderr)
        raise SystemExit(2)
    yield from ()  # a generator, as doit requires of a task creator


def _discard_empty_dep_file() -> None:
    """doit opened its default database (dbm, without epbuild's DOIT_CONFIG) before asking for tasks: a refused run
    closes it and removes its files when they hold nothing, so the refusal leaves no stray `.doit.db.dat`."""
    from pathlib import Path

    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "execute" and frame.f_globals.get("__name__") == "doit.cmd_base":
            params, command = frame.f_locals.get("params") or {}, frame.f_locals.get("self")
            manager = getattr(command, "dep_manager", None)
            if params.get("backend") != "dbm" or manager is None or not params.get("dep_file"):
                return
            files = [Path(f"{params['dep_file']}{suffix}") for suffix in ("", ".dat", ".dir", ".bak")]
            if all(not path.exists() or path.stat().st_size == 0 for path in files):
                manager.close()
                for path in files:
                    path.unlink(missing_ok=True)
            return
        frame = frame.f_back


def _tasks_taken() -> bool:
    """Whether the namespace doit is loading tasks from holds epbuild's task generators: doit hands it to its
    `load_tasks` only, so it is read from that call's frame (where doit is not found so, the tasks module having
    been imported stands for it)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "load_tasks" and frame.f_globals.get("__name__") == "doit.loader":
            namespace = frame.f_locals.get("namespace") or {}
            return any(getattr(value, "__module__", None) == "epbuild.tasks.entry" for value in namespace.values())
        frame = frame.f_back
    return "epbuild.dodo" in sys.modules
