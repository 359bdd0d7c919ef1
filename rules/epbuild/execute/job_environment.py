"""The environment a job's process gets: what compilers, EP libraries, Python and epbuild read, never the build's
secrets.

A build's environment holds what its own process needs (the remote cache's AWS keys, the cache signing key, CI
tokens); a job (a compile, stage or validation child, forked by a fork server or started afresh) needs none of
them, and its request crosses a socket. So a job gets the variables on this list and those its user names in
`EPBUILD_JOB_ENV` (comma-separated: a toolchain's licence variable, say), and never one whose name says it is a
secret unless named there. The same environment for a forked and a fresh child keeps their outputs alike.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from .python_path import child_import_path

EXTRA = "EPBUILD_JOB_ENV"
NAMES = frozenset({"HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "TMP", "TEMP", "LANG", "LANGUAGE", "TZ", "TERM",
                   "NO_COLOR", "CC", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR", "SYSTEMROOT"})
# The variables that EP libraries, BLAS, Python and the SDKs read (`fork_server.LOAD_TIME_PREFIXES` and more), and
# epbuild's own (the shim's paths, the switches).
PREFIXES = ("ORT_", "OV_", "OPENVINO", "QNN_", "QAIC_", "QAIRT_", "SNPE_", "HEXAGON_", "ADSP_", "LD_", "OMP_",
            "OPENBLAS_", "MKL_", "KMP_", "TBB_", "PYTHON", "CUDA", "PATH", "LC_", "EPBUILD_")
SECRET = re.compile(r"KEY|SECRET|TOKEN|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)


def job_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of `environ` (this process's) a job's process is given, with PYTHONPATH finding epbuild."""
    environ = os.environ if environ is None else environ
    named = {name.strip() for name in environ.get(EXTRA, "").split(",") if name.strip()}
    kept = {name: value for name, value in environ.items()
            if name in named or ((name in NAMES or name.startswith(PREFIXES)) and not SECRET.search(name))}
    kept["PYTHONPATH"] = child_import_path()
    return kept
