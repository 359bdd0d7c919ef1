"""A fork server's imports begun at the first instant of a first build, before the build has read its manifest.

On a first build here (no settings record: a fresh clone in CI, a restore after `artifacts/` was deleted) the
build's first job, reading the models, waits for a fork server to import numpy, onnx and onnxruntime; a server
started only once the manifest is read and the build's own modules are imported puts that whole start on the
build's critical path. Those imports are the same for every EP (`fork_server.PRELOAD`), so the build starts one
Python that makes them while the build is still importing itself (`begin`, from `epbuild.dodo` and the `epbuild`
command), and the first server the build starts adopts it (`Candidate.adopt`): it is handed the socket and the EP,
registers the EP and listens, as a server started then would. Not adopted (no server to start, one already
running, another environment by then), its stdin is closed and it exits without serving anything.

Standard library only, and cheap: it runs before anything heavy is imported.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..files.layout import Layout
from ..state.registry import CONFIGS, state_file
from .job_environment import job_environment

if TYPE_CHECKING:
    from ..invocation import Invocation
    from .links import JobModules

SWITCH = "EPBUILD_FORK_SERVER"  # "0": a plain child for every job (`fork_server.enabled`); no candidate either
CANDIDATE = "--candidate"  # `python -m epbuild.execute.fork_server --candidate`: preload, then wait to be adopted


class Candidate:
    """A started Python importing a fork server's preloads, waiting on its stdin for a socket and an EP."""

    def __init__(self, process: subprocess.Popen, env: dict[str, str]):
        self.process: subprocess.Popen | None = process
        self.env = env  # the environment it was given: a server started later must get the same

    def adopt(self, path: Path, alias: str, log: Path, env: dict[str, str]) -> subprocess.Popen | None:
        """The starter of the server for `alias` at `path`, this candidate made into it (its output to `log`), or
        None when it cannot be: already adopted or gone, or its environment differs from `env` (what a server
        started now gets)."""
        process, self.process = self.process, None
        if process is None:
            return None
        if env != self.env:
            self._close(process)
            return None
        log.write_text("", encoding="utf-8")  # as a server started now finds it: empty, its lines to come
        try:
            assert process.stdin is not None
            process.stdin.write(json.dumps([str(path), alias]) + "\n")
            process.stdin.close()
        except OSError:  # it died (its pipe has no reader): the caller starts a server
            return None
        return process

    def discard(self) -> None:
        """Not wanted: its stdin closed, it exits (idempotent)."""
        process, self.process = self.process, None
        if process is not None:
            self._close(process)

    @staticmethod
    def _close(process: subprocess.Popen) -> None:
        with contextlib.suppress(OSError):
            assert process.stdin is not None
            process.stdin.close()
        process.poll()  # the starter exits once it has forked the candidate off: reaped here when it has


def begin(manifest: Path, invocation: Invocation, modules: JobModules) -> Candidate | None:
    """A candidate for this run, when it is a first build here (a default run, no settings record under the
    project's `artifacts/.state/`) on a host where fork servers can run; else None. `modules`: the jobs' modules
    it imports while it waits (`links.JobModules.idle`)."""
    if not invocation.default_run or not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return None
    if os.environ.get(SWITCH, "1") == "0" or not manifest.is_file():
        return None
    if state_file(Layout(manifest.parent / "artifacts").state, CONFIGS).exists():
        return None
    env = job_environment()
    # -P: nothing from the working folder on its import path (it starts before its private folder is known)
    process = subprocess.Popen([sys.executable, "-P", "-m", "epbuild.execute.fork_server", CANDIDATE,
                                modules.argument()],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=env, cwd="/", text=True)
    return Candidate(process, env)
