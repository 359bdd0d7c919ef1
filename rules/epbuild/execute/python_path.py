"""Where a new Python finds epbuild: the plain children, the fork servers and a Dask worker's job processes are
started as `python -m epbuild...` from any folder, so they must import the same epbuild code as the build."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

IMPORT_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the epbuild package


def child_import_path() -> str:
    """PYTHONPATH for a new Python that runs an epbuild module: epbuild's folder in front (a clone, an editable
    install), unless it is a folder every interpreter of this environment searches anyway (site-packages)."""
    searched = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    own = [] if str(IMPORT_ROOT) in searched else [str(IMPORT_ROOT)]
    return os.pathsep.join([*own, *filter(None, [os.environ.get("PYTHONPATH")])])
