"""Memory-aware admission: a job starts only when its expected peak fits in what the jobs already running have left
of the memory budget, so that `-n N` (and several builds at once) never together ask this host for more memory than
it has. Compiles of real models are large (a 25 M-parameter CNN's QNN compile passed 5 GB resident): running as
many as there are cores, blindly, is what runs a CI machine out of memory.

One ledger per user and host (`memory.json` in the private folder the fork servers use, `execute.private_folder`,
so no other user can plant or read it; changed under `flock`): every build of this user on this host shares it,
whatever process or thread runs the job. An entry names its owner (`files.owners`: host, pid and start time), so a
job whose process died (killed, a crashed build) is dropped by the next look, never waited for. No claim is waited
for without bound, whoever wrote it: a running claim expires when its job's own time limit has passed (capped at
`MAX_CLAIM_S`, and at `UNJUDGED_CLAIM_S` for an owner this host cannot look up: another host's or container's mark,
or none, in a ledger folder shared through `EPBUILD_MEMORY_LEDGER`), a waiting one when its owner stopped looking
(`STALE_WAIT_S`); an entry that is not what this module writes (a torn or hand-edited ledger) is dropped. Jobs are
admitted in the order they asked (a large job is not starved by a stream of small ones); a job larger than the
whole budget waits until nothing runs and then runs alone, never refused. The budget is `EPBUILD_MEMORY_GB` (0: no
admission), else `[build] memory_gb`, else `SHARE` of this host's memory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..files.owners import owner_gone, owner_judged, owner_tag
from . import private_folder

SWITCH = "EPBUILD_MEMORY_GB"
LEDGER = "EPBUILD_MEMORY_LEDGER"
JOBS = "EPBUILD_JOBS"
SHARE = 0.8  # of MemTotal: what the jobs may hold together by default (the build process and the OS keep the rest)
SAY_EVERY_S = 30.0
POLL_S = (0.02, 0.5)  # a waiting job looks again after this long, doubling up to the second figure
GRACE_S = 60.0  # beyond a job's time limit: its admission, its result read back
MAX_CLAIM_S = 7 * 24 * 3600.0  # no claim lasts longer, whatever time limit it names
UNJUDGED_CLAIM_S = 3600.0  # the longest claim honoured from an owner this host cannot look up (a compile's default)
STALE_WAIT_S = 30.0  # a waiting job looks every POLL_S[1]: one unseen this long has stopped waiting
LARGEST_GB = 1 << 20  # as the manifest's `[build] memory_gb` allows


def default_jobs(environ: dict[str, str] | None = None, configured: int | str | None = None) -> int:
    """doit's `num_process` without `-n`: `EPBUILD_JOBS`, else `[build] jobs` (a number, or `cores`), else one job
    per core this process may use: memory admission keeps them within the host's memory. One job is doit's serial
    runner (0), as on a one-core host."""
    value = (os.environ if environ is None else environ).get(JOBS, "").strip() or str(configured or "cores")
    if value == "cores":
        cores = usable_cores()
        return cores if cores > 1 else 0
    if not (value.isascii() and value.isdigit()) or int(value) < 1:  # '²' is a digit to isdigit, not to int
        raise UserError(JOBS, None, f"{value!r}: give how many jobs a build runs at once (1 or more, or `cores`)")
    return int(value) if int(value) > 1 else 0


def ledger_path() -> Path | None:
    """This user's ledger, in the folder every build of this user finds (`EPBUILD_MEMORY_LEDGER`: another folder,
    for builds that share a budget otherwise); None where no private folder can be made (another user holds every
    name: then no admission, as fork servers are off, with the same warning)."""
    chosen = os.environ.get(LEDGER)
    if chosen:
        try:
            Path(chosen).mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(LEDGER, None, f"{chosen}: cannot make the ledger's folder ({exc.strerror or exc}): name "
                            "a folder this user may write") from None
        return Path(chosen) / "memory.json"
    folder, _ = private_folder.find(tempfile.gettempdir(), os.environ.get("XDG_RUNTIME_DIR", ""))
    return folder / "memory.json" if folder is not None else None


def _meminfo_mb(field: str) -> float | None:
    """A field of /proc/meminfo in MB (Linux), None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_memory_mb() -> float | None:
    """MemTotal of this host (Linux), None where it cannot be read."""
    return _meminfo_mb("MemTotal")


def available_memory_mb() -> float | None:
    """MemAvailable now (Linux), None where it cannot be read."""
    return _meminfo_mb("MemAvailable")


def usable_cores() -> int:
    """The cores this process may use (its affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def budget_mb(environ: dict[str, str] | None = None, configured_gb: float | None = None) -> float | None:
    """The build's memory budget in MB (None: no admission): `EPBUILD_MEMORY_GB`, else `[build] memory_gb`, else
    `SHARE` of MemTotal."""
    value = (os.environ if environ is None else environ).get(SWITCH, "").strip()
    if not value and configured_gb is not None:
        return configured_gb * 1024 if configured_gb > 0 else None
    if value:
        try:
            gb = float(value)
        except ValueError:
            gb = math.nan
        if not 0 <= gb <= LARGEST_GB:  # as `[build] memory_gb`: negative, NaN and infinite refused
            raise UserError(SWITCH, None, f"{value!r} is not 0 or a positive number of GB: give the build's memory "
                                          f"budget in GB up to {LARGEST_GB} (0: no admission)")
        return gb * 1024 if gb > 0 else None
    total = host_memory_mb()
    return total * SHARE if total else None


def _entry(found: Any, kind: str, now: float) -> bool:
    """Whether `found` is a live claim of `kind`: of the form this module writes, its owner not known to be gone,
    and within its time (see the module's docstring); anything else is dropped."""
    if not isinstance(found, dict) or not all(isinstance(found.get(k), str) for k in ("id", "owner", "what")):
        return False
    numbers = [found.get(k) for k in ("mb", "since", "seen", "timeout_s")]
    if not all(isinstance(n, (int, float)) and type(n) is not bool and math.isfinite(n) and n >= 0 for n in numbers):
        return False
    if found["since"] > now + GRACE_S or found["seen"] > now + GRACE_S or owner_gone(found["owner"]):
        return False
    if kind == "waiting":
        return now - found["seen"] <= STALE_WAIT_S
    longest = MAX_CLAIM_S if owner_judged(found["owner"]) else UNJUDGED_CLAIM_S
    return now - found["since"] <= min(found["timeout_s"], longest) + GRACE_S


def _open(path: Path) -> int:
    """The ledger's descriptor; one line naming it where it cannot be the ledger (a link, a folder, unwritable)."""
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):  # a FIFO or a device: never read as the ledger
            os.close(descriptor)
            raise OSError(errno.EINVAL, "not a regular file")
        os.set_blocking(descriptor, True)
        return descriptor
    except OSError as exc:
        why = ("is a symbolic link" if exc.errno == errno.ELOOP else "is a folder" if exc.errno == errno.EISDIR
               else "is not a regular file (a FIFO, socket or device)" if exc.errno == errno.EINVAL
               else f"cannot be opened ({exc.strerror or exc})")
        raise UserError(LEDGER if os.environ.get(LEDGER) else None, None, f"the memory ledger {path} {why}: it "
                        f"must be a plain file this user may write (remove it, or name another folder in {LEDGER})"
                        ) from None


def check_settings(configured_gb: float | None) -> None:
    """Before a build starts: the budget's variable and the ledger, each refused in one line naming it (as a
    manifest's mistake is), never a build that runs with admission silently off or a traceback in every job."""
    if budget_mb(configured_gb=configured_gb) is None or not os.environ.get(LEDGER):
        return  # this user's private folder's ledger is checked where a job opens it (`_open`): one line too
    path = ledger_path()
    if path is not None and (path.is_symlink() or (path.exists() and not path.is_file())):
        _open(path)  # says what it is


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[dict[str, list[dict[str, Any]]]]:
    """The ledger, read and written back under an exclusive lock; claims that are gone, expired or not of this
    module's form dropped (a torn or hand-edited ledger starts over)."""
    descriptor = _open(path)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        with os.fdopen(os.dup(descriptor), "r+", encoding="utf-8", errors="replace") as handle:
            try:
                state = json.loads(handle.read() or "{}")
            except (ValueError, RecursionError):  # cut short by a full disk: the jobs' processes re-enter nothing
                state = {}
            if not isinstance(state, dict):
                state = {}
            now = time.time()
            state = {kind: [e for e in state[kind] if _entry(e, kind, now)] if isinstance(state.get(kind), list)
                     else [] for kind in ("running", "waiting")}
            yield state
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(state))
    finally:
        os.close(descriptor)  # closing releases the lock


def _fits(state: dict[str, list[dict[str, Any]]], entry: dict[str, Any], budget: float) -> bool:
    """First in line, and within the budget beside what runs (or nothing runs: a job above the budget runs alone)."""
    if state["waiting"][0]["id"] != entry["id"]:
        return False
    return not state["running"] or sum(e["mb"] for e in state["running"]) + entry["mb"] <= budget


@contextlib.contextmanager
def admitted(expected_mb: float, what: str, budget: float | None, path: Path | None = None,
             on_wait: Any = None, timeout_s: float = UNJUDGED_CLAIM_S) -> Iterator[float]:
    """Hold `expected_mb` of the budget while the block runs (the job, whose time limit is `timeout_s`: its claim
    expires after it), after waiting for it in line: yields the seconds waited. `on_wait(seconds, held_mb, jobs,
    ahead)` is called when it first has to wait and every `SAY_EVERY_S` after (a console line), with what the
    running jobs hold and how many jobs wait before it (of any build of this host). With `budget` None, nothing is
    held."""
    path = path or ledger_path()
    if budget is None or path is None:
        yield 0.0
        return
    entry = {"id": f"{time.time_ns():020d}.{os.getpid()}.{threading.get_ident()}.{os.urandom(4).hex()}",
             "owner": owner_tag(), "mb": round(max(expected_mb, 1.0), 1), "what": what, "since": time.time(),
             "seen": time.time(), "timeout_s": float(timeout_s)}
    started, pause, said = time.monotonic(), POLL_S[0], None
    try:
        while True:
            with _locked(path) as state:
                entry["seen"] = time.time()
                state["waiting"] = [e for e in state["waiting"] if e["id"] != entry["id"]]
                state["waiting"].append(entry)
                state["waiting"].sort(key=lambda e: e["id"])
                if _fits(state, entry, budget):
                    state["waiting"].remove(entry)
                    entry["since"] = time.time()  # its time limit runs from now
                    state["running"].append(entry)
                    break
                held, jobs = sum(e["mb"] for e in state["running"]), len(state["running"])
                ahead = next(i for i, e in enumerate(state["waiting"]) if e["id"] == entry["id"])
            now = time.monotonic()
            if on_wait is not None and (said is None or now - said >= SAY_EVERY_S):
                on_wait(now - started, held, jobs, ahead)
                said = now
            time.sleep(pause)
            pause = min(pause * 2, POLL_S[1])
    except BaseException:
        _leave(path, entry)
        raise
    try:
        yield time.monotonic() - started
    finally:
        _leave(path, entry)


def _leave(path: Path, entry: dict[str, Any]) -> None:
    with _locked(path) as state:
        for kind in ("running", "waiting"):
            state[kind] = [e for e in state[kind] if e["id"] != entry["id"]]


def snapshot(path: Path | None = None) -> dict[str, list[dict[str, Any]]]:
    """What runs and what waits now, machine-wide (for a progress line and tests)."""
    path = path or ledger_path()
    if path is None:
        return {"running": [], "waiting": []}
    with _locked(path) as state:
        return {kind: list(entries) for kind, entries in state.items()}
