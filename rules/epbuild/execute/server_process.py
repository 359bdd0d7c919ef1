"""A fork server's own process (`execute.fork_server` says what it is for and is its clients' side): the toolchain
preloaded, the EP registered, fork safety checked, then a child forked per job request or a warm worker leased per
client (`execute.forked_jobs`), until idle; one object holds what the server tracks between two wake-ups.

    python -m epbuild.execute.server_process [--detach] [--modules JSON] SOCKET EP_ALIAS   (started by a build)
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..files.owners import owner_gone
from .forked_jobs import JobGuard, WorkerHandle, run_many, run_one
from .host import load_backend
from .links import NO_MODULES, SHAPE_STAGE, JobModules
from .provenance import record_loaded
from .server_start import IDLE_S, MODULES, PRELOAD

if TYPE_CHECKING:
    from ..manifest.eps import EpInfo

LET_GO_WAIT_S = 1.0  # how long a lease waits for a worker whose client has just let it go
# the job modules a build names (`links.JobModules.idle`) are imported once the server serves and is idle (no
# request for IDLE_PRELOAD_S, no forked job running), so that a first build's host probe and model reading (which
# need none of them) are not kept waiting; every job forked after that has them loaded, one forked before imports
# what it needs itself
IDLE_PRELOAD_S = 0.005


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def serve(path: Path, alias: str, modules: JobModules = NO_MODULES, preloaded: bool = False) -> None:
    """Preload, register the EP, check that no thread was started, then fork a child per job request, or lease a
    warm worker to a client that asks for one, until idle."""
    if not preloaded:
        for module in PRELOAD:
            importlib.import_module(module)
    for module, function in modules.calls_for(alias):
        getattr(importlib.import_module(module), function)()
    record_loaded(modules.code)  # what every job forked from here has loaded: a job expecting other ones refuses
    baseline = threads()
    backend: EpInfo | None = None  # an EP whose backend libraries are loaded before the first job is forked
    if alias and alias != SHAPE_STAGE:
        import onnxruntime as ort

        from ..manifest.eps import served_ep
        from .host import register_plugin

        info, ahead = served_ep(alias)
        backend = info if ahead else None
        register_plugin(ort, info)
        if threads() > baseline:
            print(f"refused: registering {info.name} started {threads() - baseline} thread(s); forking after it is "
                  "not safe, so its jobs run in plain children", flush=True)
            return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    listener.bind(str(temporary))
    listener.listen(64)
    os.replace(temporary, path)  # clients see a listening server or none
    identity = path.stat().st_ino  # before it says it serves: a client may replace or remove the socket after
    print(f"serving {alias or 'cpu'} jobs on {path} (pid {os.getpid()}, {baseline} threads"
          f"{', begun with a build' if preloaded else ''})", flush=True)
    server = _Server(path, identity, listener, modules, baseline, backend)
    server.run()
    if not server.replaced:
        path.unlink(missing_ok=True)
        path.with_suffix(".log").unlink(missing_ok=True)


class _Server:
    """A serving server's state: its socket, the jobs it forked (each one's client and limits), its warm workers,
    and what it has still to load before the build's job modules run."""

    def __init__(self, path: Path, identity: int, listener: socket.socket, modules: JobModules, baseline: int,
                 backend: EpInfo | None):
        self.path, self.listener, self.modules, self.baseline, self.backend = path, listener, modules, baseline, backend
        self.identity = identity  # the socket's inode when it was made: another one there means replaced
        # a child's end wakes the loop at once: SIGCHLD writes a byte into this pipe (Python's wakeup fd)
        self.wake = os.pipe()
        for descriptor in self.wake:
            os.set_blocking(descriptor, False)
        signal.set_wakeup_fd(self.wake[1])
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.jobs: dict[int, socket.socket] = {}  # pid of a child forked for one job -> its client
        self.guards: dict[int, JobGuard] = {}  # the same pids -> the job's limits, held here even if its client dies
        self.workers: dict[int, WorkerHandle] = {}
        self.last_job = time.monotonic()
        self.deferred = [module for module in modules.idle if module not in sys.modules]  # a candidate may have them
        self.pending = bool(self.deferred or backend)
        self.replaced = False

    def run(self) -> None:
        """Until idle for IDLE_S, or the socket's path taken by another server: a job never outlives its build, so
        each wake-up first ends the jobs whose build is gone."""
        while True:
            leased: list[Any] = [w.control for w in self.workers.values() if w.client and not w.ended]
            readable = select.select([self.listener, self.wake[0], *leased], [], [],
                                     IDLE_PRELOAD_S if self.pending else 0.2)[0]
            if self.pending and not readable and not self.jobs:  # idle, no forked job (a host probe) beside it
                self.settle()
                continue
            self.end_orphans()
            if self.wake[0] in readable:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self.wake[0], 4096):
                        pass
            for worker in list(self.workers.values()):
                if worker.control in readable and worker.control in leased and worker.hear():
                    self.last_job = time.monotonic()  # its client let it go
            if self.listener in readable:
                self.accept()
            self.reap()
            if self.finished():
                return

    def end_orphans(self) -> None:
        """The process that asked for a job gone (killed, crashed): its forked job and its warm worker end (a pid and
        its start time: a reused pid is another process); so does a job past its limits."""
        for guard in [*self.guards.values(), *(w.guard for w in self.workers.values() if w.guard)]:
            if owner_gone(guard.client) or guard.exceeded():
                guard.kill()
        for worker in self.workers.values():
            if worker.client is not None and owner_gone(worker.client_tag):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, signal.SIGKILL)

    def accept(self) -> None:
        """One client's request: a job forked, or a warm worker leased; its pid answered."""
        connection, _ = self.listener.accept()
        connection.settimeout(10)
        try:
            request = json.loads(connection.makefile("rb").readline())
        except (OSError, ValueError):
            connection.close()
            return
        sys.stdout.flush()
        pid = self.start(request, connection)
        if pid is None:
            connection.close()
            return
        with contextlib.suppress(OSError):
            connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")

    def sockets(self) -> list[socket.socket]:
        """Every socket of this process's: a child forked from it closes them all but its own client's."""
        owned = [self.listener, *self.jobs.values()]
        for worker in self.workers.values():
            owned += [worker.control] + ([worker.client] if worker.client else [])
        return owned

    def start(self, request: dict[str, Any], connection: socket.socket) -> int | None:
        """The pid of the child forked for `request`, or of the warm worker leased to its client; None: refused
        (the client runs the job in a plain child)."""
        if self.pending and request.get("module") in self.modules.idle:  # the job would load it all: loaded here
            self.settle()  # first, so that every later job (or warm worker) has it
            if not self.path.exists():
                return None  # refused (settle said why)
        if not request.get("lease"):
            pid = os.fork()
            if pid == 0:
                run_one(request, [*self.sockets(), connection], self.wake)
            self.jobs[pid] = connection
            self.guards[pid] = JobGuard(pid, request.get("limits") or {}, request.get("client", ""))
            return pid
        worker = (next((w for w in self.workers.values() if w.client is None and not w.ended), None) or
                  next((w for w in self.workers.values() if w.let_go(LET_GO_WAIT_S)), None))
        if worker is None:
            control, worker_end = socket.socketpair()
            pid = os.fork()
            if pid == 0:
                control.close()
                run_many(worker_end, [*self.sockets(), connection], self.wake)
            worker_end.close()
            worker = self.workers[pid] = WorkerHandle(pid, control)
        worker.lease(connection, request.get("client", ""))
        return worker.pid

    def settle(self) -> None:
        """What every job of the build's job modules loads: imported, and the EP's backend loaded, once."""
        self.pending = False
        for module in self.deferred:
            importlib.import_module(module)
        if self.backend is not None:
            load_backend(self.backend)
        if threads() > self.baseline:  # a load that started a thread: no fork after it; the socket goes, the server
            # leaves once its jobs end, and the next build's jobs start another
            print(f"refused: loading {', '.join(self.modules.idle) or (self.backend and self.backend.name)} started "
                  f"{threads() - self.baseline} thread(s)", flush=True)
            self.path.unlink(missing_ok=True)

    def reap(self) -> None:
        """Every child that ended: its exit status and peak memory to its client (a warm worker's to its lease)."""
        while self.jobs or self.workers:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
            if not pid:
                break
            end = json.dumps({"code": os.waitstatus_to_exitcode(status), "maxrss": usage.ru_maxrss}).encode() + b"\n"
            if pid in self.workers:  # retired (its client has its last answer), or killed or crashed during a job
                self.workers.pop(pid).end(end)
            elif pid in self.jobs:
                self.guards.pop(pid, None)
                connection = self.jobs.pop(pid)
                with contextlib.suppress(OSError):
                    connection.sendall(end)
                connection.close()
            self.last_job = time.monotonic()

    def finished(self) -> bool:
        """Nothing running, and idle for IDLE_S or its socket's path taken by another server."""
        try:
            self.replaced = self.path.stat().st_ino != self.identity
        except OSError:
            self.replaced = True
        working = self.jobs or any(worker.client for worker in self.workers.values())
        return not working and (self.replaced or time.monotonic() - self.last_job > IDLE_S)


def main(argv: list[str]) -> None:
    """`[--detach] [--modules JSON] PATH ALIAS` (a first build's candidate: `execute.server_candidate`)."""
    detach = argv[0] == "--detach"
    modules = JobModules.of(argv[argv.index(MODULES) + 1]) if MODULES in argv[:-2] else JobModules()
    path, alias = argv[-2:]
    if detach and os.fork():  # the starter waits for this first process only; the server is not its child
        os._exit(0)
    if detach:
        os.setsid()
    serve(Path(path), alias, modules)


if __name__ == "__main__":
    main(sys.argv[1:])
