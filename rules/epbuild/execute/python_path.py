"""Where a new Python finds epbuild: the plain children, the fork servers and a Dask worker's job processes are
started as `python -m epbuild...` from any folder, so they must import the same epbuild code as the build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

IMPORT_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the epbuild package


def library_roots() -> tuple[str, ...]:
    """The folders a job's libraries come from, each ending in a separator: the interpreter's installation (its
    standard library and site-packages, a venv's and its base's) and epbuild's own folder. A module from elsewhere
    is a project's own code."""
    roots = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, str(IMPORT_ROOT)}
    return tuple(os.path.join(os.path.realpath(root), "") for root in roots)


def child_import_path() -> str:
    """PYTHONPATH for a new Python that runs an epbuild module: epbuild's folder in front (a clone, an editable
    install), unless it is a folder every interpreter of this environment searches anyway (site-packages)."""
    searched = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    own = [] if str(IMPORT_ROOT) in searched else [str(IMPORT_ROOT)]
    return os.pathsep.join([*own, *filter(None, [os.environ.get("PYTHONPATH")])])


def _level(value: str | None) -> int:
    """A PYTHON* switch's level as the interpreter reads it: unset or empty 0, a number itself, anything else 1."""
    return 0 if not value else int(value) if value.isdigit() else 1


ASK = "import sys, json; print(json.dumps(sys.path))"


def new_python_path(environ: Mapping[str, str]) -> list[str] | None:
    """The import path a new `python -P` of this interpreter started with `environ` has, asked of one (run in "/",
    nothing on stdin): what its start-up (the base installation's library, a venv's site-packages, the folders and
    code of .pth files) makes of this environment, however the interpreter is laid out; None where it cannot say.
    Asked rather than rebuilt from `sysconfig` names: in a venv those name the venv's folders for the standard
    library, which stays the base interpreter's."""
    try:
        done = subprocess.run([sys.executable, "-P", "-c", ASK], env=dict(environ), cwd="/", capture_output=True,
                              stdin=subprocess.DEVNULL, text=True, timeout=60, check=False)
        path = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return path if isinstance(path, list) and all(isinstance(entry, str) for entry in path) else None


def switches_match(environ: Mapping[str, str]) -> bool:
    """Whether this interpreter runs with the switches a new Python started with `environ` would have: none given on
    the command line (-I, -E, -S, -b, -X, -W) that `environ` does not carry, the PYTHON* ones it reads alike."""
    flags = sys.flags
    switches = ((flags.optimize, "PYTHONOPTIMIZE"), (flags.dont_write_bytecode, "PYTHONDONTWRITEBYTECODE"),
                (flags.no_user_site, "PYTHONNOUSERSITE"), (flags.verbose, "PYTHONVERBOSE"),
                (flags.inspect, "PYTHONINSPECT"))
    return not (flags.isolated or flags.ignore_environment or flags.no_site or flags.bytes_warning or sys._xoptions
                or sys.warnoptions or any(value != _level(environ.get(name)) for value, name in switches))


def fresh_import_path(environ: Mapping[str, str], project: Path, fresh: list[str] | None) -> list[str] | None:
    """`fresh` (`new_python_path(environ)`: the import path a new `python -P` started with `environ`, a job's
    environment, has) where this process's modules came from where a new Python's would: every entry of this
    process's path is one the new Python has too, or one the build's own start put there; every entry the new
    Python has beyond its PYTHONPATH (which names epbuild's folder and the build's own PYTHONPATH) this process has
    too. None otherwise: an entry added by a dodo.py, one removed, a switch given on the command line that
    `environ` does not carry. Ignored: what Python and doit put in front for the build's script (its folder, the
    project's, the working one), which -P leaves out."""
    if fresh is None or not switches_match(environ):
        return None
    wanted = {os.path.abspath(entry) for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry}
    own = {os.path.abspath(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry}
    script = {"", os.getcwd(), str(project), os.path.dirname(os.path.abspath(sys.argv[0])) if sys.argv[0] else ""}
    if any(entry not in fresh and entry not in own and entry not in script for entry in sys.path):
        return None
    if any(entry not in sys.path and entry not in wanted and os.path.isdir(entry) for entry in fresh):
        return None
    return fresh
