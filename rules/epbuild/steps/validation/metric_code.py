"""A project's own metric (`metric = "module:function"`), imported from the project's folder as its source is now:
compiled from the source files (never a cached .pyc: judged by mtime in seconds and size, an edit within the same
second that kept the size ran the old code under the new fingerprint), no module of the project kept from an earlier
import (a warm worker retires after such a job: `forked_jobs.ran_project_code`)."""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
from pathlib import Path
from typing import Any

from ...errors import ModelError
from ...execute.python_path import library_roots


class _SourceOnly(importlib.machinery.SourceFileLoader):
    """Compiles a project module from its source file as it is now, never from a cached .pyc: the cache is
    judged by the source's mtime in seconds and its size, so an edit within the same second that keeps the size
    would run the old code under the new fingerprint."""

    def get_code(self, fullname: str) -> Any:
        return self.source_to_code(self.get_data(self.path), self.path)


def _from_source(root: Path) -> None:
    """Modules found under `root` (the project's folder; not epbuild's nor the interpreter's folders inside it)
    are compiled from their source (`_SourceOnly`), none of them taken from an earlier import; a warm worker
    retires after such a job (`forked_jobs.ran_project_code`). Once per process and root."""
    prefix, libraries = os.path.join(os.path.realpath(root), ""), library_roots()

    def project(entry: str) -> bool:
        real = os.path.join(os.path.realpath(entry), "")
        return real.startswith(prefix) and not real.startswith(libraries)

    def hook(entry: str) -> importlib.machinery.FileFinder:
        if not project(entry):
            raise ImportError(entry)
        return importlib.machinery.FileFinder(entry, (_SourceOnly, importlib.machinery.SOURCE_SUFFIXES))

    if any(getattr(each, "root", None) == prefix for each in sys.path_hooks):
        return
    hook.root = prefix  # type: ignore[attr-defined]
    sys.path_hooks.insert(0, hook)
    for entry in [entry for entry in sys.path_importer_cache if project(entry)]:
        del sys.path_importer_cache[entry]
    for name, loaded in list(sys.modules.items()):
        file = getattr(loaded, "__file__", None)
        if isinstance(file, str) and project(os.path.dirname(file)):
            del sys.modules[name]


def custom_metric(task: dict[str, Any]) -> Any:
    """The project's `module:function`, imported from the project's folder from its source as it is now; one line
    with its exception's first line when it cannot be."""
    module, function = task["metric"].split(":", 1)
    file = Path(task["metric_file"])
    base = file.parent if file.name == "__init__.py" else file.with_suffix("")
    root = base.parents[len(module.split(".")) - 1]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    _from_source(root)
    try:
        return getattr(importlib.import_module(module), function)
    except Exception as exc:  # noqa: BLE001 - the user's module: its error, in one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelError(f"'{task['metric']}' cannot be imported: {type(exc).__name__}: {first}",
                         "validation.metric") from None
