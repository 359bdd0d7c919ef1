"""A fork server's imports begun at the first instant of a first build, before the build has read its manifest.

On a first build here (no settings record: a fresh clone in CI, a restore after `artifacts/` was deleted) the
build's first job, reading the models, waits for a fork server to import numpy, onnx and onnxruntime; a server
started only once the manifest is read and the build's own modules are imported puts that whole start on the
build's critical path. Those imports are the same for every EP (`PRELOAD`), so the build starts a process that
makes them while the build is still importing itself (`begin`, from `epbuild.dodo` and the `epbuild` command), and
the first server the build starts adopts it (`Candidate.adopt`): it is handed the socket and the EP, registers the
EP and listens, as a server started then would; the build's other first servers it forks off once adopted, each
registering its own EP (`adopt`'s `others`), instead of new Pythons importing the same beside it. Not adopted (no
server to start, one already running, another environment by then), its stdin is closed and it exits without
serving anything.

That process is the build's own, forked (`_forked`), where it can be made into what a new Python would be: one
thread, no open file of its own beyond stdin, stdout and stderr, no variable named as a secret, the switches a new
`python -P` with the job's environment would have (`python_path.switches_match`), and its import path: the fork asks
a new Python of that environment for it (`python_path.new_python_path`, beside the build rather than before it) and
keeps it where the build's modules came from the same folders (`fresh_import_path`). It then takes that environment
(the one it started with zeroed) and path, closes what the build inherited, leaves the build's session and folder,
and is detached like a started one. A new Python would cost its own start and epbuild's imports before the
toolchain's begin; where the fork cannot be one, a new Python is started (`python -m epbuild.execute.server_candidate
--candidate`): by the build, or by the fork itself replacing its own image with it once its path disagrees.

Standard library only, and cheap: it runs before anything heavy is imported.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ..files.layout import Layout
from ..state.registry import CONFIGS, state_file
from .job_environment import SECRET, job_environment
from .python_path import fresh_import_path, new_python_path, switches_match
from .server_start import CANDIDATE, PRELOAD, SWITCH, Starter

if TYPE_CHECKING:
    from ..invocation import Invocation
    from .links import JobModules

class _Forked:
    """The starter of a candidate forked from the build: already exited and reaped (`_forked`); `stdin` the pipe
    the candidate reads."""

    def __init__(self, stdin: IO[str]):
        self.stdin: IO[str] | None = stdin

    def poll(self) -> int | None:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0


class Candidate:
    """A process importing a fork server's preloads, waiting on its stdin for a socket and an EP."""

    def __init__(self, process: subprocess.Popen[str] | _Forked, env: dict[str, str]):
        self.process: subprocess.Popen[str] | _Forked | None = process
        self.env = env  # the environment it was given: a server started later must get the same

    def adopt(self, path: Path, alias: str, log: Path, env: dict[str, str],
              others: Sequence[tuple[Path, str, Path]] = ()) -> Starter | None:
        """The starter of the server for `alias` at `path`, this candidate made into it (its output to `log`), or
        None when it cannot be: already adopted or gone, or its environment differs from `env` (what a server
        started now gets). `others`: more servers (path, alias, log) it forks off once adopted, each as started
        then would be, instead of a new Python importing the same beside it."""
        process, self.process = self.process, None
        if process is None:
            return None
        if env != self.env:
            self._close(process)
            return None
        for each in (log, *(other for _, _, other in others)):
            each.write_text("", encoding="utf-8")  # as a server started now finds it: empty, its lines to come
        try:
            assert process.stdin is not None
            process.stdin.write(json.dumps([str(path), alias, [[str(p), a] for p, a, _ in others]]) + "\n")
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
    def _close(process: subprocess.Popen[str] | _Forked) -> None:
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
    forked = _forked(env, manifest.parent.resolve(), modules)
    if forked is not None:
        return forked
    process = subprocess.Popen(_started(modules), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=env, cwd="/", text=True)
    return Candidate(process, env)


def _started(modules: JobModules) -> list[str]:
    """A new Python's candidate command line (-P: nothing from the working folder on its import path; it starts
    before its private folder is known)."""
    return [sys.executable, "-P", "-m", "epbuild.execute.server_candidate", CANDIDATE, modules.argument()]


def _inherited() -> list[int] | None:
    """The file descriptors past stdin, stdout and stderr this process was started with (inheritable: Python opens
    its own not so), closed in a forked candidate as a started one never gets them; None where this process holds
    one of its own (a lock, a file being read), which a fork would keep open beside its Python object."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            inheritable = os.get_inheritable(int(name))
        except OSError:  # the listing's own, closed by now
            continue
        if int(name) > 2 and not inheritable:
            return None
        found += [int(name)] if int(name) > 2 else []
    return found


def _forked(env: dict[str, str], project: Path, modules: JobModules) -> Candidate | None:
    """The candidate as a fork of this process, or None where the fork would not be what a new Python is: another
    thread (forking it is not safe), a variable whose name says it is a secret (a job never gets one), another open
    file (a lock, a pipe a CI runner waits on: a server would hold it open; those it was started with are closed in
    the fork), a switch a new Python would not have. The import path is judged in the fork (`_become_candidate`)."""
    if any(SECRET.search(name) for name in os.environ.keys() - env.keys()):
        return None  # never in a server's memory, even forgotten (`_forget_environment`)
    inherited = _inherited()
    if not switches_match(env) or inherited is None or len(os.listdir("/proc/self/task")) != 1:
        return None
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # never written twice
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            for descriptor in [write, *inherited]:
                os.close(descriptor)
            if os.fork():  # detached as a started one is: the server is not the build's child
                os._exit(0)
            _become_candidate(read, env, fresh_import_path(env, project, new_python_path(env)), modules)
        except BaseException:  # noqa: BLE001 - never back into the build's code: said into the candidate's output
            traceback.print_exc()
        finally:
            os._exit(0)
    os.close(read)
    os.waitpid(pid, 0)  # the first child exits as soon as it has forked the candidate
    return Candidate(_Forked(os.fdopen(write, "w", encoding="utf-8")), env)


def _forget_environment() -> None:
    """Zero the environment this process was started with (what /proc/PID/environ shows, and its forked jobs'),
    once libc's environment no longer points into it: the variables a job is not given are not in its memory there
    either."""
    import ctypes

    with open("/proc/self/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    start, end = int(fields[47]), int(fields[48])  # env_start and env_end, fields 50 and 51 of proc(5)'s stat
    if 0 < start < end:
        ctypes.memset(start, 0, end - start)


def _become_candidate(read: int, env: dict[str, str], path: list[str] | None, modules: JobModules) -> None:
    """In the forked candidate: as a started one is (its own session, stdin the pipe, output to nowhere until
    adopted, in "/", the job's environment and import path, Python's own SIGINT handling), then preload and wait.
    `path` None (the build's modules did not all come from where a new Python's would): a new Python replaces this
    one, with what `begin` would have started it with (the same stdin, output, folder and environment)."""
    os.setsid()
    os.dup2(read, 0)
    os.close(read)
    nothing = os.open(os.devnull, os.O_WRONLY)
    for stream in (1, 2):
        os.dup2(nothing, stream)
    os.close(nothing)
    os.chdir("/")
    if path is None:
        os.execve(sys.executable, _started(modules), env)
    os.environ.clear()
    _forget_environment()
    os.environ.update(env)
    sys.path[:] = path
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - the process's own stdin, for its life
    for cached in ("epbuild.execute.provenance", "epbuild.execute.host"):  # what it loaded is read after its imports
        for function in vars(sys.modules.get(cached, object)).values():
            getattr(function, "cache_clear", lambda: None)()
    for module in PRELOAD:  # before the server's own modules: the toolchain's imports are the long part
        importlib.import_module(module)
    from .server_candidate import candidate  # only here: the build itself never imports the server's modules

    candidate(modules, detached=True)
