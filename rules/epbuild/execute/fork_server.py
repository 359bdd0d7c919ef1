"""A fork server per EP: one process imports ONNX Runtime, onnx and numpy and registers the EP's plugin library
once, then forks a fresh child per job, so a job does not pay a new Python's start and imports.

The server never compiles or creates a session itself: every job runs in a child forked from the same clean
state and calls the job module's `main()` as `python -m MODULE request result` would, so outputs stay
byte-identical to a fresh child's and a crash or hang ends only that child. The client
(`epbuild.execute.child.run_child`) enforces the time and memory limits on the child's pid exactly as for a plain
child; the server reaps it and reports its exit status and peak memory. A job never outlives its client: the
server ends a forked job, and kills a warm worker, whose client process is gone (the build killed or crashed),
and holds each job's limits itself too (`JobGuard`; a warm worker tells it the limits of the job it starts).

Jobs whose EP gives the same outputs when repeated in one process (`EpInfo.warm_compiles`, `warm_validations`) may
run in a warm worker instead: a child forked the same way and leased to one thread of one build process, which
sends it its jobs directly, one at a time, so what a fresh child pays for its first session is paid once
and a job costs two messages. A crash or hang still ends only the job running in it (the client kills the
worker's pid; the server reaps it, writes its end to the client, and the client leases a new worker for its next
job); a worker retires after a failed job, after 200 jobs, when a job left a thread running, or when a job's
peak or the worker holds 256 MB more than when it was forked
(`epbuild.execute.forked_jobs`), and its reported peak memory is each job's own (the kernel's high-water mark is
reset before every job). Since a worker serves one client at a time, a client's late kill can only hit its own
worker, which it then lets go.

Before it forks the first job of the build's job modules (or when idle before that) it imports those modules and
loads the EP's backend libraries (`EpInfo.backend_libraries`, QNN's HTP backend) that every job's first session
would load, so each is loaded once; a server for targets naming a backend library of their own loads none
(`EpInfo.fork_server_for`: another server key).

Fork safety is checked, not assumed: a server whose EP registration starts threads (a thread holding a lock at
fork time can deadlock the child) refuses to serve, and that EP keeps plain children. So do platforms without
fork (Windows) and `EPBUILD_FORK_SERVER=0`. A server is shared by every build process with the same Python,
epbuild sources and load-time environment (keyed by them); it exits after `IDLE_S` without jobs, and its
workers with it.

The server's own process is `execute.server_process` (started by `fork_job`, never by hand); this module is the
clients' side: the server's key, starting it, asking it for a job or a warm worker.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..files.layout import stat_key
from ..files.locks import file_lock
from ..files.owners import owner_tag
from ..logs import warn
from . import private_folder
from .job_environment import job_environment
from .provenance import Provenance, python_files, versions
from .python_path import IMPORT_ROOT
from .server_start import IDLE_S, MODULES, SWITCH, Detached, Starter

if TYPE_CHECKING:
    from .links import Links

# SWITCH ("EPBUILD_FORK_SERVER"): "0": a plain child for every job; "fork": a forked child for every job, no warm
# workers; unset or "1": warm workers where the EP allows them
START_TIMEOUT_S = 120.0
# What EP libraries, BLAS and Python may read when they load: a server serves only builds that agree on these.
LOAD_TIME_PREFIXES = ("ORT_", "OV_", "OPENVINO", "QNN_", "ADSP_", "LD_", "OMP_", "OPENBLAS_", "MKL_", "KMP_",
                      "TBB_", "PYTHON", "EPBUILD_OPENVINO", "CUDA", "PATH")


def enabled() -> bool:
    return (hasattr(os, "fork") and sys.platform.startswith("linux") and os.environ.get(SWITCH, "1") != "0"
            and _folder() is not None)


# ---- the client: in the build process, its state on the build's `Links` ----


class _Lease:
    """A warm worker held by one thread of this process: its jobs go to it directly, one at a time, without the
    server; the server only forks it, and reports its end should it die. Dropped after a failed job, a kill, or
    when the worker retires."""

    def __init__(self, key: tuple[str, int, int], connection: socket.socket, pid: int, links: Links):
        self.key, self.connection, self.pid, self.links = key, connection, pid, links
        self.killed = False

    def drop(self) -> None:
        self.links.leases.pop(self.key, None)
        self.connection.close()


class ForkedJob:
    """A job of this process in a forked child or a leased warm worker: the pid, and the exit status once it comes
    (from the server for a child, from the worker, or from the server should the worker die)."""

    def __init__(self, connection: socket.socket, pid: int, lease: _Lease | None = None):
        self.connection = connection
        self.pid = pid
        self.lease = lease
        self.buffer = b""
        self.result: dict[str, Any] | None = None  # a warm worker's answer to an inline request

    def _done(self) -> None:
        if self.lease is None:
            self.connection.close()

    def poll(self) -> tuple[int, int] | None:
        """(exit code, peak resident kB) once the job has ended, else None."""
        ended = False
        while b"\n" not in self.buffer and select.select([self.connection], [], [], 0)[0]:
            try:
                data = self.connection.recv(65536)
            except OSError:  # reset: a killed warm worker shared this connection and left data unread in it
                data = b""
            ended = not data
            if ended:
                break
            self.buffer += data
        if b"\n" in self.buffer:
            answer = json.loads(self.buffer.split(b"\n", 1)[0])
            self.result = answer.get("result")
            self._done()
            if self.lease and (self.lease.killed or answer["code"] != 0 or answer.get("retire")):
                self.lease.drop()
            return answer["code"], answer["maxrss"]
        if ended:  # the server ended (or the connection broke) without a word: the child is lost with it
            self.connection.close()
            if self.lease:
                self.lease.drop()
            return -9, 0
        return None

    def wait(self, timeout: float) -> tuple[int, int] | None:
        """poll() after waiting up to `timeout` for the end: it is seen the moment it comes."""
        if b"\n" not in self.buffer:
            select.select([self.connection], [], [], timeout)
        return self.poll()

    def kill(self) -> None:
        if self.lease:
            self.lease.killed = True  # it may have finished meanwhile: the lease ends with this job either way
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, 9)  # this process's own child or leased worker; the server reaps it and reports


@functools.lru_cache(maxsize=1)
def _sources() -> list[tuple[str, list[int]]]:
    """epbuild's sources as this build process found them (looked at once, not per job: a walk of the package)."""
    return sorted((path, stat_key(os.stat(path))) for path in python_files(IMPORT_ROOT / "epbuild"))


def _server_key(alias: str, expect: Provenance | None = None) -> str:
    """Which server serves this process's jobs for the EP: the interpreter, the toolchain's package versions (as
    the build names them, `expect`; else as this process reads them), epbuild's sources and the variables
    libraries read when they load must be the same (a server started before a package was replaced keeps the old
    one loaded)."""
    wanted = expect.expected()["versions"] if expect is not None else versions()
    return _key(alias, tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(LOAD_TIME_PREFIXES))),
                json.dumps(wanted, sort_keys=True))


@functools.lru_cache(maxsize=64)
def _key(alias: str, load_env: tuple[tuple[str, str], ...], wanted: str) -> str:
    """Computed once per EP, environment and versions, not per job (it hashes every source's identity)."""
    text = json.dumps([sys.executable, str(IMPORT_ROOT), alias, _sources(), load_env, json.loads(wanted)])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@functools.lru_cache(maxsize=4)
def _found_folder(root: str, runtime: str) -> Path | None:
    """This user's private folder for the servers' sockets (`execute.private_folder`) under these roots, looked
    for once per process; None, said once, when every name for it is held by another user."""
    folder, why = private_folder.find(root, runtime)
    if folder is None:
        warn(f"{why}")
    return folder


def _folder() -> Path | None:
    """The private folder, checked again at every use (a few microseconds): one removed since is made anew, one
    whose owner or mode changed is mended or passed over."""
    roots = tempfile.gettempdir(), os.environ.get("XDG_RUNTIME_DIR", "")
    folder = _found_folder(*roots)
    if folder is not None and not private_folder.make_private(folder):
        _found_folder.cache_clear()
        folder = _found_folder(*roots)
    return folder


def _connect(path: Path) -> socket.socket | None:
    """A connection to the server at `path`, only if the kernel says it runs as this user (never send a request
    to, or take a result from, another user's process)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(str(path))
    except OSError:
        connection.close()
        return None
    if not private_folder.trusted(connection):
        connection.close()
        warn(f"{path} is served by another user's process: not used")
        return None
    return connection


def _paths(key: str) -> tuple[Path, Path, Path]:
    """A server's socket and log, and the lock held while starting it: one of 16, so that start locks do not
    pile up in the folder with every change of epbuild's sources."""
    folder = _folder()
    assert folder is not None, "only called where enabled() holds"
    return folder / f"{key}.sock", folder / f"{key}.log", folder / f"start-{int(key[:4], 16) % 16}.lock"


def _launch(links: Links, alias: str, path: Path, log: Path) -> Starter:
    """Start the server, or make the build's candidate into it (`execute.warm_start`: its imports begun with the
    build); the starter exits as soon as it has forked the server off (`--detach`)."""
    env = job_environment()  # what its jobs' processes may read when the EP loads, not the build's secrets
    early, links.early = links.early, None
    adopted = early.adopt(path, alias, log, env) if early is not None else None
    if adopted is not None:
        return adopted
    with open(log, "w", encoding="utf-8") as output:
        return subprocess.Popen([sys.executable, "-m", "epbuild.execute.server_process", "--detach", MODULES,
                                 links.modules.argument(), str(path), alias],
                                env=env, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=path.parent)


def prestart(links: Links, aliases: set[str], expect: Provenance | None = None) -> None:
    """Start these EPs' servers now without waiting for them, so that their imports overlap the build's own
    start-up (the first job then finds its server ready, or waits less)."""
    if not enabled():
        return
    wanted = []
    for alias in sorted(aliases):
        key = _server_key(alias, expect)
        if key in links.refused or key in links.prestarted:
            continue
        path, log, _ = _paths(key)
        connection = _connect(path)
        if connection is not None:
            connection.close()
            continue
        wanted.append((key, alias, path, log))
    early, links.early = links.early, None
    if wanted and early is not None:  # a first build's candidate: it serves the first and forks off the others
        (key, alias, path, log), rest = wanted[0], wanted[1:]
        adopted = early.adopt(path, alias, log, job_environment(), [(p, a, g) for _, a, p, g in rest])
        if adopted is not None:
            now = time.monotonic()
            links.prestarted.update({key: (adopted, now), **{other: (Detached(), now) for other, *_ in rest}})
            return
    elif early is not None:
        links.early = early  # not needed here: the first server started later takes it
    for key, alias, path, log in wanted:
        links.prestarted[key] = _launch(links, alias, path, log), time.monotonic()


def serving(links: Links, alias: str, expect: Provenance | None = None) -> bool:
    """Whether the EP's server is running, or was started by this process (its warm workers are cheap to use)."""
    if not enabled():
        return False
    key = _server_key(alias, expect)
    if key in links.prestarted:
        return True
    connection = _connect(_paths(key)[0])
    if connection is not None:
        connection.close()
    return connection is not None


def _server(links: Links, alias: str, expect: Provenance | None = None) -> socket.socket | None:
    """A connection to the EP's server, starting it when none answers; None when it refuses (not fork-safe)."""
    key = _server_key(alias, expect)
    if key in links.refused:
        return None
    for starter, _ in list(links.prestarted.values()):
        starter.poll()  # reaps a starter that has exited
    path, log, lock = _paths(key)
    connection = _connect(path)
    if connection is not None:
        return connection
    with file_lock(lock):
        connection = _connect(path)
        if connection is not None:
            return connection
        starter, started = links.prestarted.pop(key, (None, 0.0))
        # a server lives at least IDLE_S: prestarted since and not answering, it is still starting (or refused)
        if starter is None or time.monotonic() - started > IDLE_S:
            starter = _launch(links, alias, path, log)
        starter.wait(timeout=60)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            connection = _connect(path)
            if connection is not None:
                return connection
            text = log.read_text(errors="replace")
            if "refused:" in text or "Traceback" in text:
                links.refused[key] = text.strip().splitlines()[-1]
                return None
            time.sleep(0.004)
    links.refused[key] = f"the fork server did not start within {START_TIMEOUT_S:.0f} s (log: {log})"
    return None


def _ask(connection: socket.socket, request: dict[str, Any]) -> ForkedJob | None:
    """Send a request to the server: the job (or lease) with the pid it answers, None when the server is gone."""
    try:
        connection.sendall(json.dumps(request).encode() + b"\n")
        answer = b""
        while b"\n" not in answer:
            data = connection.recv(4096)
            if not data:
                raise OSError("the fork server closed the connection")
            answer += data
    except OSError:
        connection.close()
        return None
    first, rest = answer.split(b"\n", 1)
    job = ForkedJob(connection, json.loads(first)["pid"])
    job.buffer = rest  # a forked child's exit status may already have come with its pid
    return job


def _lease(links: Links, alias: str, expect: Provenance | None = None, module: str = "") -> _Lease | None:
    """This thread's warm worker on the EP's server, leased now if it holds none (for a job of `module` first)."""
    key = (str(_paths(_server_key(alias, expect))[0]), os.getpid(), threading.get_ident())
    if key in links.leases:
        return links.leases[key]
    connection = _server(links, alias, expect)
    answer = (_ask(connection, {"lease": True, "module": module, "client": owner_tag()}) if connection is not None
              else None)
    if connection is None or answer is None:
        return None
    lease = links.leases[key] = _Lease(key, connection, answer.pid, links)
    return lease


def leases_in_use() -> bool:
    """Whether jobs that allow it run in a leased warm worker (else a forked child each, or a plain child)."""
    return enabled() and os.environ.get(SWITCH) != "fork"


def fork_job(links: Links, module: str, alias: str, arguments: list[str], output: Path, workdir: Path,
             reuse: bool = False, job: dict[str, Any] | None = None, limits: dict[str, float | None] | None = None,
             expect: Provenance | None = None) -> ForkedJob | None:
    """Ask the EP's server (alias "" for CPU-only work) to fork `python -m module *arguments` in `workdir` with
    stdout and stderr into `output`, or with `reuse` to run it in this thread's warm worker (which takes `job`,
    the request, over the lease instead of from a file, and answers with its result: `ForkedJob.result`); None
    when this job must use a plain child. `expect`: the versions the build names (which server is its)."""
    if not enabled():
        return None
    request = {"module": module, "arguments": arguments, "output": str(output), "cwd": str(workdir),
               "env": job_environment(), "path": sys.path, "limits": limits or {}, "client": owner_tag()}
    if reuse and leases_in_use():
        if job is not None:
            request["job"] = job
        for _ in range(2):  # a worker that retired or died since its last job: lease another once
            lease = _lease(links, alias, expect, module)
            if lease is None:
                return None
            try:
                lease.connection.sendall(json.dumps(request).encode() + b"\n")
                return ForkedJob(lease.connection, lease.pid, lease)
            except OSError:
                lease.drop()
        return None
    connection = _server(links, alias, expect)
    return _ask(connection, request) if connection is not None else None
