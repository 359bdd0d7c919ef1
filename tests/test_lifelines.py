"""A build's processes end with it: a signal to doit's main process only (a CI cancel, `kill PID`) ends its `-n`
workers and every job they run, plain children included; a worker killed mid-build (as the out-of-memory killer
does) ends the build with one line instead of a wait without end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from epbuild.execute.fork_server import SWITCH
from epbuild.execute.lifelines import _ended_by
from helpers import WAIT_S, job_processes, wait_for


def _workers(build: int) -> list[int]:
    """doit's workers: children of the build with its own command line (forked, never exec'ed)."""
    try:
        own = Path(f"/proc/{build}/cmdline").read_bytes()
    except OSError:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == build and (entry / "cmdline").read_bytes() == own:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _slow_project(project, models: int) -> None:
    from helpers import slow_model

    names = [f"slow{i}" for i in range(models)]
    for name in names:
        slow_model(project.root / "models" / f"{name}.onnx", nodes=200000)
    project.manifest("".join(f'[models.{n}]\npath = "models/{n}.onnx"\ntargets = ["cpu"]\n' for n in names) +
                     '[targets.cpu]\nep = "cpu"\nvalidate = false\ntimeout_s = 600\n')


@pytest.mark.parametrize("mode", ["1", "0"], ids=["fork server", "plain children"])
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGKILL"])
def test_a_signal_to_doits_main_process_only_ends_its_workers_and_their_jobs(project, mode, signal_name):
    _slow_project(project, 2)
    project.env[SWITCH] = mode
    output = project.root / "doit.out"
    with open(output, "w") as sink:
        build = subprocess.Popen([sys.executable, "-m", "doit", "-n", "2"], cwd=project.root, env=project.env,
                                 stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)

    def both_started() -> bool:
        assert build.poll() is None, f"the build ended first:\n{output.read_text()}"
        return len(job_processes(project.root)) >= 2

    try:
        wait_for("both compiles to start", both_started)
        workers = _workers(build.pid)
        assert len(workers) == 2
        os.kill(build.pid, getattr(signal, signal_name))  # the main process alone, not its group
        build.wait(timeout=WAIT_S)
        wait_for("the workers and jobs to end",
                  lambda: not job_processes(project.root) and not any(Path(f"/proc/{w}").exists() and
                                                                      _ended_by(w) is None for w in workers), 30)
    finally:
        if build.poll() is None:
            os.killpg(build.pid, signal.SIGKILL)  # the group this test started
            build.wait()


def test_a_worker_killed_mid_build_ends_the_build_with_one_line(project):
    """The kernel's out-of-memory killer ends one worker with SIGKILL: doit's runner would wait for its answer
    forever; the build says which worker and which tasks, and exits 1."""
    _slow_project(project, 2)
    build = subprocess.Popen([sys.executable, "-m", "doit", "-n", "2"], cwd=project.root, env=project.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for("both compiles to start", lambda: len(job_processes(project.root)) >= 2)
        victim = _workers(build.pid)[0]
        os.kill(victim, signal.SIGKILL)
        _, errors = build.communicate(timeout=WAIT_S)
    finally:
        if build.poll() is None:
            os.killpg(build.pid, signal.SIGKILL)
            build.wait()
    assert build.returncode == 1, errors
    last = errors.strip().splitlines()[-1]
    assert last.startswith(f"error: doit's worker process {victim} was killed by SIGKILL") and "compile:slow" in last
    assert "Traceback" not in errors
    wait_for("the jobs to end", lambda: not job_processes(project.root), 30)


def test_a_killed_builds_scratch_that_outlived_this_runs_start_is_removed_at_its_end(project):
    """A killed build's jobs may still be writing into their folders while the next run sweeps at its start: the
    run sweeps again at its end."""
    from epbuild.files.owners import HOST

    _slow_project(project, 1)
    build = subprocess.Popen([sys.executable, "-m", "doit"], cwd=project.root, env=project.env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for("the compile to start", lambda: job_processes(project.root) or build.poll() is not None)
    left = project.artifacts / ".scratch" / f"compile.slow.cpu.~{HOST}-{os.getpid()}-1~.x"  # an owner gone
    left.mkdir(parents=True)
    (left / "slow.onnx").write_bytes(b"half written")
    assert build.wait(timeout=WAIT_S) == 0
    assert not left.exists()
