"""The fork server: byte-identical outputs with and without it, a crash or hang ends only its job, an EP whose
registration starts threads keeps plain children, and a replaced server leaves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, Project
from helpers import OPENVINO_CPU_TARGET, TWO_MODELS_CPU_QNN, tree_bytes
from rules.errors import BuildError
from rules.execute.child import Limits, run_child
from rules.execute.fork_server import SWITCH, fork_job

MANIFEST = TWO_MODELS_CPU_QNN + """
""" + OPENVINO_CPU_TARGET + """

[groups.pair]
target = "qnn-htp"
models = ["tinycnn", "encoder"]
"""


def test_forked_and_fresh_children_give_byte_identical_artifacts(tmp_path, host_cache):
    trees = {}
    for mode in ("1", "0"):
        folder = tmp_path / f"fork-{mode}"
        folder.mkdir()
        project = Project(folder, host_cache)
        project.env[SWITCH] = mode
        project.manifest(MANIFEST)
        done = project.doit("-n", "2")
        assert "summary: " in done.stdout and "failed" not in done.stdout
        trees[mode] = tree_bytes(project.artifacts)
    assert len(trees["1"]) > 20 and trees["1"] == trees["0"]  # stages, compiles and the group, every byte


@pytest.fixture
def crash_child(monkeypatch):
    """tests/ on this process's path: the forked child gets it from the request, a fresh one from PYTHONPATH."""
    monkeypatch.setenv("PYTHONPATH", f"{REPO / 'tests'}{os.pathsep}{REPO}")


@pytest.mark.parametrize("mode", ["1", "0"])
@pytest.mark.parametrize("signal_name", ["SIGSEGV", "SIGABRT"])
def test_a_crash_ends_only_its_job(tmp_path, monkeypatch, crash_child, mode, signal_name):
    monkeypatch.setenv(SWITCH, mode)
    with pytest.raises(BuildError, match=f"validate m@t: the child process was killed by {signal_name}"):
        run_child("crash_child", {"action": "signal", "signal": signal_name}, tmp_path / "a", Limits(60),
                  "validate m@t")
    answer = run_child("crash_child", {"action": "sleep", "seconds": 0}, tmp_path / "b", Limits(60), "validate m@t")
    assert answer["usage"]["peak_mb"] > 0  # the server (or a fresh child) serves the next job


def test_a_hung_forked_job_is_killed_at_its_timeout(tmp_path, crash_child):
    started = time.monotonic()
    with pytest.raises(BuildError, match="timed out after 1 s; killed"):
        run_child("crash_child", {"action": "sleep", "seconds": 120}, tmp_path, Limits(1), "compile m@t")
    assert time.monotonic() - started < 30


def test_a_forked_job_starts_in_milliseconds(tmp_path, crash_child):
    (tmp_path / "request.json").write_text(json.dumps({"action": "sleep", "seconds": 0}))
    first = fork_job("crash_child", "", ["request.json", "result.json"], tmp_path / "out.txt", tmp_path)
    assert first is not None  # a server answers on Linux
    while first.poll() is None:
        time.sleep(0.01)
    job = fork_job("crash_child", "", ["request.json", "result.json"], tmp_path / "out.txt", tmp_path)
    while (ended := job.poll()) is None:
        time.sleep(0.002)
    assert ended[0] == 0 and (tmp_path / "result.json").read_text() == "{}"


def test_an_ep_whose_registration_starts_threads_keeps_plain_children(tmp_path):
    script = ("import sys, threading, time\nfrom pathlib import Path\nimport rules.execute.host\n"
              "rules.execute.host.register_plugin = lambda ort, info: threading.Thread(target=time.sleep, args=(30,), "
              "daemon=True).start()\n"
              "from rules.execute.fork_server import serve\nserve(Path(sys.argv[1]), 'qnn')\n")
    socket_path = tmp_path / "server.sock"
    done = subprocess.run([sys.executable, "-c", script, str(socket_path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and not socket_path.exists()
    assert "refused: registering QNNExecutionProvider started 1 thread(s)" in done.stdout


def test_a_server_whose_socket_is_replaced_leaves(tmp_path):
    socket_path = tmp_path / "server.sock"
    server = subprocess.Popen([sys.executable, "-m", "rules.execute.fork_server", str(socket_path), ""],
                              env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True)
    try:
        assert "serving cpu jobs" in server.stdout.readline()
        socket_path.unlink()
        assert server.wait(timeout=10) == 0
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGKILL)
            server.wait()


def test_without_fork_the_plain_child_path_runs(tmp_path, monkeypatch, crash_child):
    monkeypatch.delattr(os, "fork")  # as on Windows
    assert fork_job("crash_child", "", ["r.json", "s.json"], tmp_path / "o.txt", tmp_path) is None
    assert run_child("crash_child", {"action": "sleep", "seconds": 0}, Path(tmp_path), Limits(60), "x")["usage"]
