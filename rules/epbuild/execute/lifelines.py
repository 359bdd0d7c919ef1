"""A build's processes end with it: doit's worker processes (`-n`) and plain job children die when the process
that started them dies, and a worker the kernel kills mid-build ends the build with one line instead of leaving
doit waiting for its answer forever.

A CI cancel or `kill PID` signals doit's main process only. Its jobs on fork servers end with their client (the
server watches it), but doit's workers are its own forked children and knew nothing of it: they kept taking jobs
and writing cache entries for a build that was gone. Linux's parent-death signal (`PR_SET_PDEATHSIG`) ties each
worker, and each plain job child, to its parent: SIGKILL the moment the parent ends, however it ends. A worker
killed by a signal (the out-of-memory killer's SIGKILL) leaves doit's multiprocess runner waiting on a result
that never comes; `WorkerWatch` sees it as a zombie child of the build (its exit status readable in
`/proc/PID/stat` without reaping it) and calls back.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
DIE_WITH = "EPBUILD_DIE_WITH"  # a plain job child's parent pid: the child dies with that process
WATCH_EVERY_S = 0.25
# how doit itself ends its workers (terminate) and how Ctrl-C reaches the whole process group: not "lost"
EXPECTED_ENDS = (signal.SIGTERM, signal.SIGINT)


class WorkerLost(KeyboardInterrupt):
    """Raised in doit's main thread when one of its workers was killed: as for Ctrl-C, doit ends the other
    workers and saves what finished; its text is the run's last line."""


def die_with_parent(parent: int) -> None:
    """In a child of `parent`: be sent SIGKILL when `parent` ends, and end now if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes  # here: only the processes tied to a parent load it

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it ended before the tie was made
        os._exit(1)


@functools.cache
def tie_forked_children(parent: int) -> None:
    """From now on every child `parent` (this process) forks (doit's workers) dies with it. Once per process:
    a child's own forks are not tied to it (the hook runs only for forks made by `parent` itself)."""
    forking: list[int] = [0]

    def before() -> None:
        forking[0] = os.getpid()

    def after_in_child() -> None:
        if forking[0] == parent:
            die_with_parent(parent)

    os.register_at_fork(before=before, after_in_child=after_in_child)


def _ended_by(pid: int) -> int | None:
    """The signal that ended child `pid` while it waits to be reaped (a zombie), 0 for a normal end, None while
    it runs or once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] != "Z" or len(fields) < 50:
        return None
    return int(fields[49]) & 0x7F  # field 52, exit_code: the wait status


class WorkerWatch(threading.Thread):
    """Watches this process's doit workers; `lost(pid, signal)` is called once, for the first killed by a signal
    other than doit's own terminate or a Ctrl-C."""

    def __init__(self, pids: list[int], lost: Callable[[int, int], None]):
        super().__init__(name="epbuild-worker-watch", daemon=True)
        self.pids, self.lost = list(pids), lost
        self.stopping = threading.Event()

    def run(self) -> None:
        while self.pids and not self.stopping.wait(WATCH_EVERY_S):
            for pid in list(self.pids):
                ended = _ended_by(pid)
                if ended is None and os.path.exists(f"/proc/{pid}"):
                    continue
                self.pids.remove(pid)
                if ended and ended not in EXPECTED_ENDS and not self.stopping.is_set():
                    self.lost(pid, ended)
                    return

    def stop(self) -> None:
        self.stopping.set()
