"""Fresh child processes for compiles, stages and validations, with bounded time and memory.

A fresh process gives byte-identical outputs for identical inputs (a second compile in one process differs),
and a crash inside an EP (SIGSEGV, abort) or a hang ends that one child, not doit. Where it serves, the EP's fork
server (`execute.fork_server`) forks that fresh process from an already-initialised one, else a new Python starts.
The parent enforces the time and memory limits (resident memory is polled: address-space limits would refuse the
large virtual reservations EP libraries make without using them), prints a progress line while a long child runs,
measures its wall time and peak memory, and names the signal, the timeout or the limit. The child reports its own
errors as JSON, telling the model's problems and the EP's own words from internal errors of epbuild.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..contracts.jobs import JobFailure, JobFormatError
from ..errors import BuildError, ModelCausedError, ModelError, plain
from ..logs import configure as configure_logging
from ..logs import log as log_line
from ..logs import say
from . import forked_jobs, provenance
from .fork_server import ForkedJob, fork_job, leases_in_use
from .forked_jobs import resident_bytes
from .job_environment import job_environment
from .lifelines import DIE_WITH, die_with_parent
from .links import Links
from .memory_ledger import admitted, budget_mb
from .provenance import Provenance

if TYPE_CHECKING:
    from ..manifest.builds import Limits

PROGRESS_EVERY_S = 30.0
PROGRESS = "progress: "  # a job's line saying how far it got, repeated in the still-running line
SAMPLES_SAID_AFTER_S, SAMPLES_EVERY_S = 5.0, 2.0  # a job's own progress lines: said past this, at most this often
# a child's exit status when its result could not be written for want of space (sysexits' EX_IOERR): the disk may
# be too full for its log to say so either, so the status says it
NO_SPACE_EXIT = 74


FRAME = re.compile(r'^  File "|^    ')  # a Python traceback's frame lines ("  File ...", then its code line)


# EP libraries' prints that say nothing about a failure: kept in the log, never in a failure's lines
NOISE = re.compile(r"^\s*# LIBNATIVE:|\[[WIV]:onnxruntime[:,]")
# ONNX Runtime's log prefix (time, severity, source location) in front of an error's words
ORT_PREFIX = re.compile(r"^\S+ \S+ \[E:onnxruntime:[^\]]*\] ")


def _tail(text: str, lines: int = 12) -> str:
    """The child's last meaningful lines: logged errors (QNN's `[E:...]`, `<E>`; ONNX Runtime's without its time
    and source location), a C++ exception that ended the process (`terminate called after throwing ...` and its
    `what():`) and the final Python exception; not traceback frames, not colour codes, not the EP libraries'
    chatter (`NOISE`)."""
    all_lines = [plain(line).rstrip() for line in text.strip().splitlines()
                 if line.strip() and not NOISE.search(plain(line))]
    errors = [line for line in all_lines if "[E:" in line or "<E>" in line
              or line.lstrip().startswith(("terminate called", "what():"))]
    exceptions = [line for line in all_lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Fail)\b", line)]
    kept = errors[-lines:] + exceptions[-1:] if errors or exceptions else [
        line for line in all_lines if not line.startswith("Traceback") and not FRAME.match(line)][-lines:]
    return "\n".join(f"    {ORT_PREFIX.sub('onnxruntime: ', line.strip())}" for line in kept)


class _PlainChild:
    """A child this process started itself: waited for with wait4, which also gives its peak memory."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.pid = process.pid

    def poll(self) -> tuple[int, int] | None:
        """(exit code, peak resident kB) once it has ended, else None."""
        pid, status, usage = os.wait4(self.pid, os.WNOHANG)
        return (os.waitstatus_to_exitcode(status), usage.ru_maxrss) if pid else None

    def wait(self, timeout: float) -> tuple[int, int] | None:
        ended = self.poll()
        if ended is None:
            time.sleep(timeout)
            ended = self.poll()
        return ended

    def kill(self) -> None:
        self.process.kill()  # our own child only; waited for by poll


def _progress(output: Path | None) -> str:
    """The last `progress: ...` line the job wrote to its output (a validation's samples), as `; ...` or ""."""
    if output is None:
        return ""
    try:
        with open(output, "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - 4096))
            tail = handle.read().decode(errors="replace")
    except OSError:
        return ""
    said = [line for line in tail.splitlines() if line.startswith(PROGRESS)]
    return f"; {said[-1][len(PROGRESS):].strip()}" if said else ""


def _wait(child: _PlainChild | ForkedJob, limits: Limits, what: str,
          output: Path | None = None) -> tuple[int, float, float, str | None]:
    """Wait for the child within its limits: (exit code, seconds, peak resident MB, why it was killed or None);
    every PROGRESS_EVERY_S a line says it still runs, and past SAMPLES_SAID_AFTER_S each new `progress: ...` line of
    the job's (`output`: a validation's samples on a slow EP) is said as it comes, at most every SAMPLES_EVERY_S."""
    started = time.monotonic()
    limit_bytes = limits.max_memory_gb * 2**30 if limits.max_memory_gb else None
    peak, pause, next_progress = 0, 0.002, started + PROGRESS_EVERY_S
    killed = None
    looked, last_said = started + SAMPLES_SAID_AFTER_S, ""
    while True:
        ended = child.wait(pause)
        if ended:
            peak = max(peak, ended[1] * 1024)  # kilobytes on Linux
            return ended[0], time.monotonic() - started, peak / 2**20, killed
        resident = resident_bytes(child.pid)
        peak = max(peak, resident)
        now = time.monotonic()
        if killed is None and limit_bytes and resident > limit_bytes:
            killed = (f"exceeded {limits.max_memory_gb:g} GB of memory ({resident / 2**30:.2f} GB resident); killed "
                      f"after {now - started:.0f} s")
            child.kill()
        elif killed is None and now - started > limits.timeout_s:
            killed = f"timed out after {limits.timeout_s:g} s; killed"
            child.kill()
        if now >= next_progress:
            last_said = _progress(output)
            say(f"still running {what}: {now - started:.0f} s, {resident / 2**30:.2f} GB resident{last_said}")
            next_progress += PROGRESS_EVERY_S
        elif output is not None and now >= looked:
            looked = now + SAMPLES_EVERY_S
            progress = _progress(output)
            if progress and progress != last_said:
                last_said = progress
                say(f"{what}: {progress[2:]} ({now - started:.0f} s)")
        pause = min(pause * 2, 0.1)


def _waiting(what: str, limits: Limits, budget: float | None, seconds: float, held: float, jobs: int,
             ahead: int = 0) -> None:
    """The waiting line: what runs holds, and the jobs in line before this one (first come, first admitted)."""
    line = f", {ahead} job(s) ahead in line" if ahead else ""
    say(f"waiting for memory: {what} expects {limits.expected_mb:.0f} MB; {jobs} job(s) hold {held:.0f} MB of the "
        f"{budget:.0f} MB budget{line} ({seconds:.0f} s so far)")


def run_child(module: str, request: Mapping[str, Any], workdir: Path, limits: Limits, what: str,
              log: Path | None = None, *, ep: str = "", reuse: bool = False,
              expect: Provenance | None = None, links: Links | None = None) -> dict[str, Any]:
    """Run `python -m module request.json result.json` within `limits`, forked by the fork server of EP alias
    `ep` ("" for CPU-only work) where it serves (with `reuse`, in one of its warm workers), else as a fresh
    process; return its result with `usage` (seconds, peak_mb) added, or raise BuildError naming `what` and the
    cause. The request carries what the build's fingerprints name (`expect`; None: what this process reads),
    and the job refuses a process that loaded other versions or code. `links`: the build's (`execute.links`);
    without them the job gets links of its own, let go when it ends."""
    workdir.mkdir(parents=True, exist_ok=True)
    # removed before returning, so `workdir` may be the folder the child writes its outputs into
    request_file, result_file = workdir / ".request.json", workdir / ".result.json"
    output_file = log if log is not None else workdir / ".output.txt"  # the child writes its log directly
    output_file.parent.mkdir(parents=True, exist_ok=True)
    request = {**request, "provenance": (expect.expected() if expect else provenance.versions_expected())}
    own_links = links is None
    links = Links() if links is None else links
    inline = reuse and leases_in_use()  # a warm worker gets the request and answers over its lease
    if not inline:
        request_file.write_text(json.dumps(request))
    arguments = [str(request_file), str(result_file)]
    try:
        # the job's expected peak held free under the machine's memory budget until it ends (`memory_ledger`)
        budget = budget_mb(configured_gb=limits.budget_gb)
        with admitted(limits.expected_mb, what, budget, on_wait=functools.partial(_waiting, what, limits, budget),
                      timeout_s=limits.timeout_s) as waited:
            if waited >= 0.05:
                log_line(__name__, "debug", "%s: admitted after %.2f s waiting for %.0f MB", what, waited,
                         limits.expected_mb)
            child: ForkedJob | _PlainChild | None = fork_job(
                links, module, ep, arguments, output_file, workdir, reuse, request if inline else None,
                             {"timeout_s": limits.timeout_s, "max_memory_gb": limits.max_memory_gb}, expect)
            if child is None:
                if inline:
                    request_file.write_text(json.dumps(request))
                child = _plain_child(module, arguments, output_file, workdir)
            runner = ("a plain child" if isinstance(child, _PlainChild) else "a warm worker" if inline
                      else "a forked child")
            log_line(__name__, "debug", "%s: running %s in %s", what, module, runner)
            code, seconds, peak_mb, killed = _wait(child, limits, what, output_file)
        log_line(__name__, "debug", "%s: exit %s after %.2f s, peak %.0f MB%s", what, code, seconds, peak_mb,
                 f" ({killed})" if killed else "")
        try:
            text = output_file.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:  # killed before it opened its output (a forked job's first instants)
            text = ""
    finally:
        request_file.unlink(missing_ok=True)
        if log is None:
            output_file.unlink(missing_ok=True)
        if own_links:
            links.close()
    result = _judged(what, getattr(child, "result", None), result_file, code, killed, peak_mb, text, log, workdir)
    result["usage"] = {"seconds": round(seconds, 3), "peak_mb": round(peak_mb, 1)}
    return result


def _plain_child(module: str, arguments: list[str], output_file: Path, workdir: Path) -> _PlainChild:
    """A fresh Python for the job, tied to this process (it dies with it)."""
    env = {**job_environment(), DIE_WITH: str(os.getpid())}
    with open(output_file, "w", encoding="utf-8") as output:
        return _PlainChild(subprocess.Popen([sys.executable, "-m", module, *arguments], stdout=output,
                                            stderr=subprocess.STDOUT, env=env, cwd=workdir))


def _judged(what: str, answer: dict[str, Any] | None, result_file: Path, code: int, killed: str | None,
            peak_mb: float, text: str, log: Path | None, workdir: Path) -> dict[str, Any]:
    """The job's result (a warm worker's `answer`, else its result file), or the BuildError that says why there is
    none: killed, a signal, a full disk, no answer, or the error the job reported (`text`: its output)."""
    see_log = f" (full output: {log})" if log is not None else ""
    failure: JobFailure | None = None
    if answer is None and result_file.exists():
        try:
            answer = json.loads(result_file.read_text())
        except ValueError:  # cut short, e.g. by a full disk
            why = "No space left on device" if code == NO_SPACE_EXIT else "a full disk?"
            answer, failure = {}, JobFailure(f"its result file was cut short ({why}){see_log}\n{_tail(text)}")
        result_file.unlink()
    result: dict[str, Any] = answer if isinstance(answer, dict) else {}
    if failure is None and JobFailure.answered(result):
        try:
            failure = JobFailure.from_json(result)
        except JobFormatError as exc:  # a child of another epbuild: its words, said as ours could not read them
            failure = JobFailure(f"{exc}: {str(result.get('error'))[:500]}", internal=True)
    if killed:
        raise BuildError(f"{what}: {killed}, peak {peak_mb / 1024:.2f} GB{see_log}\n{_tail(text)}")
    if code < 0:
        name = signal.Signals(-code).name
        raise BuildError(f"{what}: the child process was killed by {name}{see_log}\n{_tail(text)}")
    if answer is None and code == NO_SPACE_EXIT:
        raise BuildError(f"{what}: No space left on device: the child could not write its result into {workdir}"
                         f"{see_log}\n{_tail(text)}")
    if answer is None and code == 0:  # never a success without its answer: a worker that died flushing its log
        raise BuildError(f"{what}: the child exited without its answer{see_log}\n{_tail(text)}")
    if failure is not None:
        if failure.internal:
            raise BuildError(f"{what}: internal error in epbuild: {failure.error}, see {log or 'the output'}")
        logged = "\n".join(line for line in text.splitlines() if "[E:" in line or "<E>" in line)
        kind = ModelCausedError if failure.in_model else BuildError
        raise kind(plain(f"{what}: {failure.error}") + (f"\n{_tail(logged)}" if logged else ""))
    if code != 0:
        raise BuildError(f"{what}: exited with status {code}{see_log}\n{_tail(text)}")
    return result


def describe(exc: BaseException) -> JobFailure:
    """An exception as the parent reports it: ours and the toolchain's as their text, anything else as an
    internal error (a bug of epbuild, not a problem of the user's model)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ModelError):
        return JobFailure(text, in_model=exc.in_model)
    module = type(exc).__module__ or ""
    if module.startswith(("onnxruntime", "onnx")):
        return JobFailure(text)
    frames = traceback.extract_tb(exc.__traceback__)
    inside = next((f.filename for f in reversed(frames) if f"{os.sep}site-packages{os.sep}" in f.filename), None)
    if inside and frames and frames[-1].filename == inside:
        package = inside.split(f"{os.sep}site-packages{os.sep}", 1)[1].split(os.sep, 1)[0]
        return JobFailure(f"{package} failed: {type(exc).__name__}: {text}")
    return JobFailure(f"{type(exc).__name__}: {text}", internal=True)


def serve(function: Callable[[Any], Mapping[str, Any]], handoff: forked_jobs.Handoff | None = None) -> None:
    """The child's main: read the request, call `function`, write its result or its error as JSON. In a warm
    worker (`handoff`), the request may have come over the lease and the answer goes back so."""
    parent = os.environ.pop(DIE_WITH, None)  # a plain child: tied to the build process that started it
    if parent and parent.isdigit():
        die_with_parent(int(parent))
    configure_logging()
    request_file, result_file = Path(sys.argv[1]), Path(sys.argv[2])
    inline = handoff.request if handoff is not None else None  # it came over the lease: no request file
    request = inline if inline is not None else json.loads(request_file.read_text())
    try:
        refused = provenance.check(request.get("provenance"))
        if refused:
            raise ModelError(refused)
        result = function(request)
        status = 0
    except Exception as exc:  # noqa: BLE001 - every failure is reported to the parent as text
        with contextlib.suppress(OSError):  # a full disk takes the log too: the result, or the status, says why
            traceback.print_exc()
        result = describe(exc).to_json()
        status = 1
    if handoff is not None and inline is not None:
        handoff.result = dict(result)
    else:
        try:
            result_file.write_text(json.dumps(result))
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            os._exit(NO_SPACE_EXIT)  # nothing more can be written: the status tells the parent
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):
            stream.flush()
    if handoff is not None:
        sys.exit(status)  # back to the fork server's warm worker, which runs the next job
    os._exit(status)  # skip EP library teardown at exit, which can abort after a good compile
