"""Where a new Python finds epbuild: the plain children, the fork servers and a Dask worker's job processes are
started as `python -m epbuild...` from any folder, so they must import the same epbuild code as the build."""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

IMPORT_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the epbuild package


def child_import_path() -> str:
    """PYTHONPATH for a new Python that runs an epbuild module: epbuild's folder in front (a clone, an editable
    install), unless it is a folder every interpreter of this environment searches anyway (site-packages)."""
    searched = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    own = [] if str(IMPORT_ROOT) in searched else [str(IMPORT_ROOT)]
    return os.pathsep.join([*own, *filter(None, [os.environ.get("PYTHONPATH")])])


def _level(value: str | None) -> int:
    """A PYTHON* switch's level as the interpreter reads it: unset or empty 0, a number itself, anything else 1."""
    return 0 if not value else int(value) if value.isdigit() else 1


def _standard_entries() -> tuple[list[str], set[str]]:
    """The entries every interpreter of this environment starts with: the standard library's and those `site` adds
    (site-packages, the user's, the folders .pth files name; their `import` lines are run, not read, by `site`);
    the first list those whose folder exists (a new Python has each of them)."""
    names = {"stdlib", "platstdlib"}
    library = [sysconfig.get_path(name) for name in sorted(names)]
    found = {*library, os.path.join(sysconfig.get_path("platstdlib"), "lib-dynload"),
             os.path.join(os.path.dirname(sysconfig.get_path("stdlib")),
                          f"python{sys.version_info[0]}{sys.version_info[1]}.zip")}
    sites = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    for folder in sites:
        found.add(folder)
        try:
            pth_files = sorted(name for name in os.listdir(folder) if name.endswith(".pth"))
        except OSError:
            continue
        for name in pth_files:
            try:
                with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as handle:
                    lines = handle.read().splitlines()
            except OSError:
                continue
            found.update(os.path.abspath(os.path.join(folder, line.rstrip())) for line in lines
                         if line.strip() and not line.startswith(("#", "import ", "import\t")))
    return [entry for entry in [*library, *sites] if os.path.isdir(entry)], found


def fresh_import_path(environ: Mapping[str, str], project: Path) -> list[str] | None:
    """The import path (and interpreter switches) a new `python -P` started with `environ` (a job's environment,
    `job_environment`) would have, made from this process's; None where this process's cannot say it: an entry
    neither a new Python nor the build's own start put there (added by a dodo.py, or by a .pth file's code), a
    standard entry removed, or a switch given on the command line (-O, -X, -W, ...) that `environ` does not carry.
    Dropped: what Python and doit put in front for the build's script (its folder, the project's, the working one)."""
    flags = sys.flags
    switches = ((flags.optimize, "PYTHONOPTIMIZE"), (flags.dont_write_bytecode, "PYTHONDONTWRITEBYTECODE"),
                (flags.no_user_site, "PYTHONNOUSERSITE"), (flags.verbose, "PYTHONVERBOSE"),
                (flags.inspect, "PYTHONINSPECT"))
    if (flags.isolated or flags.ignore_environment or flags.no_site or flags.bytes_warning or sys._xoptions
            or sys.warnoptions or any(value != _level(environ.get(name)) for value, name in switches)):
        return None
    wanted = [os.path.abspath(entry) for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    own = {os.path.abspath(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry}
    script = {"", os.getcwd(), str(project), os.path.dirname(os.path.abspath(sys.argv[0])) if sys.argv[0] else ""}
    required, standard = _standard_entries()
    if any(entry not in standard and entry not in own and entry not in script for entry in sys.path) or any(
            entry not in sys.path for entry in required):
        return None
    path: list[str] = []
    for entry in [*wanted, *(entry for entry in sys.path if entry in standard)]:
        if entry not in path:  # as `site` leaves it: each folder once, at its first place
            path.append(entry)
    return path
