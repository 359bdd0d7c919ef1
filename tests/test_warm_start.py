"""A first build's fork-server imports begin before the build has read its manifest (`execute.warm_start`): the
first server it starts is that process, adopted; one not adopted exits; and the host probe forked by a fork
server answers as a fresh Python does."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from conftest import SOURCE
from epbuild.execute import fork_server, warm_start
from epbuild.execute.fork_server import fork_job
from epbuild.execute.host import HostProbe
from epbuild.execute.job_environment import job_environment
from epbuild.execute.links import Links
from epbuild.invocation import Invocation
from epbuild.steps.job_modules import JOB_MODULES
from helpers import TWO_MODELS_CPU_QNN, wait_for


@pytest.fixture
def servers(monkeypatch):
    """A private TMPDIR, so that the servers and candidates here are this test's own (and its socket paths short);
    removing it at the end makes any server started here leave."""
    folder = Path(tempfile.mkdtemp(prefix="epw", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("PYTHONPATH", str(SOURCE))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _marked(marker: str) -> list[int]:
    """Processes whose environment holds this test's marker (a candidate, a server it became)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"EPBUILD_TEST_MARK={marker}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _server_pids(folder: Path) -> dict[str, int]:
    """The servers serving under the private TMPDIR: their log's first line names the pid."""
    found = {}
    for log in folder.glob("epbuild-fork-*/*.log"):
        for line in log.read_text().splitlines():
            if line.startswith("serving "):
                found[line.split()[1]] = int(line.split("(pid ")[1].split(",")[0])
    return found


def test_a_first_build_starts_one_server_the_candidate_begun_before_it_loaded(project, servers):
    project.env["TMPDIR"] = str(servers)
    project.manifest(TWO_MODELS_CPU_QNN)
    done = project.doit()
    assert "compiled compile:tinycnn@cpu" in done.stdout and "failed" not in done.stdout
    started = wait_for("a server serving", lambda: _server_pids(servers))
    pid = started["cpu"]
    assert b"--candidate" in Path(f"/proc/{pid}/cmdline").read_bytes()  # adopted, not started afresh
    for answer in started.values():
        os.kill(answer, signal.SIGTERM)  # this test's own servers


def test_only_a_first_default_run_begins_a_candidate(tmp_path, monkeypatch):
    manifest = tmp_path / "models.toml"
    assert warm_start.begin(manifest, Invocation.of([]), JOB_MODULES) is None  # no manifest: nothing to build
    manifest.write_text(TWO_MODELS_CPU_QNN)
    assert warm_start.begin(manifest, Invocation.of(["list"]), JOB_MODULES) is None
    assert warm_start.begin(manifest, Invocation.of(["compile:tinycnn@cpu"]), JOB_MODULES) is None
    monkeypatch.setenv(warm_start.SWITCH, "0")
    assert warm_start.begin(manifest, Invocation.of([]), JOB_MODULES) is None
    monkeypatch.delenv(warm_start.SWITCH)
    (tmp_path / "artifacts" / ".state").mkdir(parents=True)
    (tmp_path / "artifacts" / ".state" / "configs.journaled").write_text("")
    assert warm_start.begin(manifest, Invocation.of([]), JOB_MODULES) is None  # built here before: maybe nothing to do


@pytest.mark.parametrize("how", ["discarded", "another environment"])
def test_a_candidate_not_adopted_exits_without_serving(tmp_path, servers, monkeypatch, how):
    marker = uuid.uuid4().hex
    monkeypatch.setenv("EPBUILD_TEST_MARK", marker)  # an EPBUILD_ variable: the candidate's environment has it
    manifest = tmp_path / "models.toml"
    manifest.write_text(TWO_MODELS_CPU_QNN)
    candidate = warm_start.begin(manifest, Invocation.of(["-n", "2"]), JOB_MODULES)
    assert candidate is not None
    wait_for("the candidate to start", lambda: _marked(marker))
    if how == "discarded":
        candidate.discard()
    elif how == "another environment":
        socket_path = servers / "s.sock"
        other = {**job_environment(), "OMP_NUM_THREADS": "3"}
        assert candidate.adopt(socket_path, "", socket_path.with_suffix(".log"), other) is None
        assert not socket_path.with_suffix(".log").exists()
    wait_for("the candidate to exit", lambda: not _marked(marker))


def test_a_candidate_whose_build_was_killed_exits(tmp_path, servers, monkeypatch):
    marker = uuid.uuid4().hex
    monkeypatch.setenv("EPBUILD_TEST_MARK", marker)
    (tmp_path / "models.toml").write_text(TWO_MODELS_CPU_QNN)
    script = ("import os, signal, sys\nfrom pathlib import Path\nfrom epbuild.execute.warm_start import begin\n"
              "from epbuild.invocation import Invocation\nfrom epbuild.steps.job_modules import JOB_MODULES\n"
              "begin(Path(sys.argv[1]), Invocation.of([]), JOB_MODULES)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    build = subprocess.run([sys.executable, "-c", script, str(tmp_path / "models.toml")], timeout=120)
    assert build.returncode == -signal.SIGKILL
    wait_for("the candidate to exit", lambda: not _marked(marker))


def test_an_adopted_candidate_serves_jobs_and_the_host_probe(tmp_path, servers, monkeypatch):
    marker = uuid.uuid4().hex
    monkeypatch.setenv("EPBUILD_TEST_MARK", marker)
    manifest = tmp_path / "models.toml"
    manifest.write_text(TWO_MODELS_CPU_QNN)
    links = Links(JOB_MODULES)
    links.early = warm_start.begin(manifest, Invocation.of([]), JOB_MODULES)
    try:
        fork_server.prestart(links, {"qnn"})
        assert links.early is None  # the first server started took it
        state = tmp_path / "state"
        state.mkdir()

        def fork(arguments, output, folder):
            return fork_job(links, "epbuild.execute.host", "qnn", arguments, output, folder)

        forked = HostProbe(state, fork=fork)
        assert forked.forked is not None and forked.child is None
        answer = forked.result()
        assert [b"--candidate" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in _marked(marker)] == [True]
        (state / "host.json").unlink()
        fresh = HostProbe(state)  # a fresh Python, as before
        assert fresh.child is not None
        expected = fresh.result()
        assert {k: v for k, v in answer.items() if k != "key"} == {k: v for k, v in expected.items() if k != "key"}
        assert "QNNExecutionProvider" in answer["eps"] and not list(servers.glob("epbuild-probe-*"))
    finally:
        links.close()
        for pid in _marked(marker):
            os.kill(pid, signal.SIGTERM)
        wait_for("the server to leave", lambda: not _marked(marker))


def test_a_probe_no_server_forks_runs_in_a_fresh_python(tmp_path, servers):
    probe = HostProbe(tmp_path, fork=lambda arguments, output, folder: None)  # a server that refused
    assert probe.forked is None and probe.child is not None
    assert json.loads((tmp_path / "host.json").read_text())["eps"] if probe.result() else False
    assert not list(servers.glob("epbuild-probe-*"))
