"""The processes a fork server (`epbuild.execute.fork_server`) forks, and the server's handle on a warm worker.

A forked process first drops what belongs to the server (its signal handling, sockets and wakeup pipe), then
becomes a job as `python -m MODULE request result` would: the job's folder, its output file as stdout and
stderr, its environment, `sys.path` and argv, and the module's `main()`. `run_one` runs one job and exits;
`run_many` (a warm worker) is leased to one client at a time and runs the jobs it sends, one at a time; it
retires after a failed job, after `WORKER_MAX_JOBS`, after a job whose peak, or when it holds, more than
`WORKER_MAX_GROWTH_MB` beyond what it held when forked (so a job's memory limit, polled on the worker's resident
memory, sees at most that much of earlier jobs; and a large model's job leaves no state to the next: QNN's HTP
simulator ran a large model's second session in one process many times slower than the first), when a
job left a thread running (it was forked with one: QNN's HVX threads were found spinning on both cores in an idle
worker), or when a job ran a project's own code (`ran_project_code`: a `module:function` metric), which a later job
would otherwise find imported, as it was then, instead of the bytes its fingerprint names.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import socket
import sys
import time
from typing import Any

from .python_path import library_roots

WORKER_MAX_JOBS = 200
WORKER_MAX_GROWTH_MB = 256
ALARM_GRACE_S = 2.0  # a warm worker's own time limit trails its client's, so a living client reports first


class Handoff:
    """A warm worker's job as the worker hands it to the job module's main() (`run_module`): the request when it
    came over the lease (None: the module reads its request file) and the answer the module leaves for it (no
    files). Its presence tells `child.serve` that the process runs one job after another: return, never exit."""

    __slots__ = ("request", "result")

    def __init__(self, request: dict[str, Any] | None = None):
        self.request = request
        self.result: dict[str, Any] | None = None


def enter_job(request: dict[str, Any]) -> None:
    """Become the job's process: its folder, its output file as stdout and stderr, its environment and argv."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.chdir(request["cwd"])
    output = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[:] = request["path"]
    sys.argv = [request["module"], *request["arguments"]]


def leave_server(server_sockets: list[socket.socket], wake: tuple[int, int]) -> None:
    """In a forked child: drop what belongs to the server (its signal handling, listener, connections, pipe)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for descriptor in wake:
        os.close(descriptor)
    for server_socket in server_sockets:
        server_socket.close()


def run_module(name: str, handoff: Handoff | None = None) -> None:
    """What `python -m name` runs: the module's main() (every child module has one; it is not re-executed, so a
    warm worker does not rebuild its classes for every job), given the warm worker's `handoff`."""
    import importlib

    main = importlib.import_module(name).main
    if handoff is None:
        main()
    else:
        main(handoff)


def run_one(request: dict[str, Any], server_sockets: list[socket.socket], wake: tuple[int, int]) -> None:
    """In the forked child: become `python -m module arguments` in the job's folder, output into its file."""
    try:
        leave_server(server_sockets, wake)
        enter_job(request)
        run_module(request["module"])
    except BaseException:  # noqa: BLE001 - anything here must end the child, never return into the server
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(70)


def resident_bytes(pid: int) -> int:
    """A process's resident memory now (0 once it has gone)."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _status_kb(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        line = next((line for line in status if line.startswith(field)), f"{field} 0 kB")
    return int(line.split()[1])


def ran_project_code(known: set[str], request: dict[str, Any], roots: tuple[str, ...]) -> bool:
    """Whether the job just run left code of its project in this process: a module it imported (beyond `known`,
    those imported before it) from outside the library folders (`roots`), other than the job's own module, or an
    import path it changed (a project's folder put in front to import its metric)."""
    if sys.path != request["path"]:
        return True
    for name in sys.modules.keys() - known:
        file = getattr(sys.modules.get(name), "__file__", None)
        if name != request["module"] and isinstance(file, str) and not os.path.realpath(file).startswith(roots):
            return True
    return False


def _one_of_many(request: dict[str, Any]) -> tuple[int, int, dict[str, Any] | None]:
    """Run one job in this warm worker as `python -m module arguments` would: (exit code, its peak resident kB,
    its result when the request came inline)."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w", encoding="ascii") as clear:
        clear.write("5")  # reset the peak (VmHWM) so that it is this job's own
    handoff = Handoff(request.get("job"))
    code = 0
    timeout = (request.get("limits") or {}).get("timeout_s")
    try:
        enter_job(request)
        if timeout:  # the job's time limit holds here too, should its client die: SIGALRM ends this worker
            signal.alarm(math.ceil(timeout + ALARM_GRACE_S))
        run_module(request["module"], handoff)
    except SystemExit as exc:  # `child.serve` ends every job this way here
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException:  # noqa: BLE001 - a job's failure is its exit code, the worker goes on or retires
        import traceback

        traceback.print_exc()
        code = 70
    finally:
        signal.alarm(0)
        sys.stdout.flush()
        sys.stderr.flush()
        quiet = os.open(os.devnull, os.O_WRONLY)  # nothing between jobs lands in the last job's output
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        os.close(quiet)
        os.chdir("/")  # nor does the worker hold on to the job's folder (a busy mount, a deleted folder kept)
    return code, _status_kb("VmHWM:"), handoff.result if handoff.request is not None else None


def run_many(control: socket.socket, server_sockets: list[socket.socket], wake: tuple[int, int]) -> None:
    """A warm worker forked from the server: leased to one client at a time (the server passes the client's
    connection), it runs the jobs that client sends, one at a time, answering each directly; when the client lets
    it go it tells the server and waits for the next lease, until it retires."""
    try:
        leave_server(server_sockets, wake)
        bound_kb = _status_kb("VmRSS:") + WORKER_MAX_GROWTH_MB * 1024
        roots = library_roots()
        jobs = 0
        while True:
            _, descriptors, _, _ = socket.recv_fds(control, 64, 1)
            if not descriptors:  # the server has gone
                return
            client = socket.socket(fileno=descriptors[0])
            client.setblocking(True)
            for line in client.makefile("rb"):  # until the client lets it go
                request = json.loads(line)
                _tell(control, {"job": request.get("limits") or {}})  # the server holds its limits meanwhile
                known = set(sys.modules)
                code, peak_kb, result = _one_of_many(request)
                _tell(control, {"idle": True})
                jobs += 1
                # a job that needed more than the bound (a large model: the few ms a warm worker saves are nothing
                # beside it) leaves state that burdens the next (QNN's HTP simulator runs a large graph's later
                # sessions in one process ~10x slower), and a thread it left running (QNN's HVX threads) would take
                # the cores from the next job and from the build's other jobs
                retire = (code != 0 or jobs >= WORKER_MAX_JOBS or peak_kb > bound_kb
                          or _status_kb("VmRSS:") > bound_kb or _status_kb("Threads:") > 1
                          or ran_project_code(known, request, roots))
                answer = {"code": code, "maxrss": peak_kb, "retire": retire,
                          **({"result": result} if result is not None else {})}
                client.sendall(json.dumps(answer).encode() + b"\n")
                if retire:
                    return
            client.close()
            _tell(control, {"free": True})
    finally:
        os._exit(0)


def _tell(control: socket.socket, message: dict[str, Any]) -> None:
    control.sendall(json.dumps(message).encode() + b"\n")


LIMIT_GRACE_S = 2.0  # the server's own limits trail the client's, so a living client reports first


class JobGuard:
    """A job's time and memory limits, enforced by the server itself on a forked child or a warm worker, and its
    client (`owner_tag`): they hold even when the build process that asked for the job has died."""

    def __init__(self, pid: int, limits: dict[str, float | None], client: str):
        self.pid, self.client = pid, client
        timeout = limits.get("timeout_s")
        self.deadline = time.monotonic() + timeout + LIMIT_GRACE_S if timeout else None
        memory = limits.get("max_memory_gb")
        self.max_bytes = memory * 2**30 if memory else None
        self.over_since: float | None = None  # when it went over its memory limit
        self.killed = False

    def exceeded(self) -> bool:
        """Past its time limit, or over its memory limit for LIMIT_GRACE_S (a living client, polling more often,
        ends it first and reports why)."""
        if self.killed:
            return False
        now = time.monotonic()
        if self.deadline is not None and now > self.deadline:
            return True
        if self.max_bytes is None or resident_bytes(self.pid) <= self.max_bytes:
            self.over_since = None
            return False
        self.over_since = self.over_since or now
        return now - self.over_since > LIMIT_GRACE_S

    def kill(self) -> None:
        if not self.killed:
            self.killed = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class WorkerHandle:
    """The server's side of a warm worker: its control socket, and the connection of the client it is leased to
    (the server keeps a copy, to report the worker's end should it die during a job)."""

    def __init__(self, pid: int, control: socket.socket):
        self.pid, self.control = pid, control
        self.client: socket.socket | None = None
        self.client_tag = ""  # the leasing process (`owner_tag`): gone, the worker is killed
        self.guard: JobGuard | None = None  # the limits of the job it runs now
        self.heard_so_far = b""
        self.ended = False  # its control socket closed or reset: it has exited (or is about to), reaped soon

    def lease(self, connection: socket.socket, client_tag: str) -> None:
        self.client, self.client_tag = connection, client_tag
        with contextlib.suppress(OSError):  # if it has just died, its end is reported when it is reaped
            socket.send_fds(self.control, [b"lease"], [connection.fileno()])

    def let_go(self, within_s: float) -> bool:
        """Whether its client has closed the lease (its connection at its end) and the worker says it is free
        within `within_s`: a lease asked for just after another was let go takes that worker, not a new one."""
        if self.client is None:
            return False
        # a peek that never waits and leaves the connection's flags alone. Waits: the connection keeps the timeout
        # its request was read with, and a socket with a timeout waits that long inside recv (a busy worker cost
        # each lease 10 s), so recv only once select says it returns at once. Flags: the worker reads this very
        # connection (passed to it, one open file), blocking; making it non-blocking here, even for an instant,
        # made the worker's next read fail as if its client had let it go, and the client's job was lost
        try:
            ready = select.select([self.client], [], [], 0)[0]
            closed = bool(ready) and self.client.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            closed = False
        except OSError:
            closed = True
        deadline = time.monotonic() + within_s
        while closed and self.client is not None and (left := deadline - time.monotonic()) > 0:
            if not select.select([self.control], [], [], left)[0]:
                return False
            if self.hear():
                return True
            if self.ended:  # it has ended: it is reaped and reported as such
                return False
        return False

    def hear(self) -> bool:
        """What the worker said on its control socket, taken (`heard`); whether it is free now. A worker killed
        before it read what the server sent it (the lease of a job timed out at once) leaves its socket reset:
        that is its end, reaped and reported as such, never an error that would end the server and every other
        job it runs."""
        try:
            data = self.control.recv(4096)
        except OSError:
            data = b""
        if not data:
            self.ended = True
            return False
        return self.heard(data)

    def heard(self, data: bytes) -> bool:
        """Take what the worker said on its control socket (a job started with its limits, ended, or the client
        let it go); whether it is free now."""
        *lines, self.heard_so_far = (self.heard_so_far + data).split(b"\n")
        freed = False
        for line in lines:
            message = json.loads(line)
            self.guard = JobGuard(self.pid, message["job"], self.client_tag) if "job" in message else None
            if "free" in message and self.client is not None:
                self.client.close()
                self.client, self.client_tag, freed = None, "", True
        return freed

    def end(self, status_line: bytes) -> None:
        """It has exited: its client (if any) reads this as the end of the job it ran; the server lets it go."""
        if self.client is not None:
            with contextlib.suppress(OSError):
                self.client.sendall(status_line)
            self.client.close()
        self.control.close()
