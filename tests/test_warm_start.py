"""A first build's fork-server imports begin before the build has read its manifest (`execute.warm_start`): the
first server it starts is that process, adopted; one not adopted exits; and the host probe forked by a fork
server answers as a fresh Python does."""

from __future__ import annotations

import contextlib
import json
import os
import select
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
from epbuild.execute.job_environment import SECRET, job_environment
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


def _server_lines(folder: Path) -> dict[str, tuple[int, str]]:
    """The servers serving under the private TMPDIR: their pid and the line their log begins with."""
    found = {}
    for log in folder.glob("epbuild-fork-*/*.log"):
        for line in log.read_text().splitlines():
            if line.startswith("serving "):
                found[line.split()[1]] = int(line.split("(pid ")[1].split(",")[0]), line
    return found


def _server_pids(folder: Path) -> dict[str, int]:
    return {alias: pid for alias, (pid, _) in _server_lines(folder).items()}


def test_a_first_build_starts_its_servers_from_the_candidate_begun_before_it_loaded(project, servers):
    project.env["TMPDIR"] = str(servers)
    project.manifest(TWO_MODELS_CPU_QNN)
    done = project.doit()
    assert "compiled compile:tinycnn@cpu" in done.stdout and "failed" not in done.stdout
    started = wait_for("both servers serving", lambda: len(_server_lines(servers)) == 2 and _server_lines(servers))
    # the first adopted, the other forked off by it with the imports made: neither started afresh
    assert all("begun with a build" in line for _, line in started.values()), started
    assert b"--detach" not in Path(f"/proc/{started['qnn'][0]}/cmdline").read_bytes()
    for answer, _ in started.values():
        os.kill(answer, signal.SIGTERM)  # this test's own servers


SHADOW = "import os\nopen(os.path.join({folder!r}, f'imported-{{os.getpid()}}'), 'w').close()\nraise ImportError()\n"


@pytest.mark.parametrize("case", ["plain", "secret", "path"])
def test_a_first_builds_candidate_is_the_build_forked_as_a_new_python(project, servers, case):
    """Forked from the build where that is what a new Python would be, else started (a secret in the build's
    environment) or replaced by one once forked (a dodo.py that adds a folder to the import path): either way
    nothing of the project folder on its import path (modules named like the toolchain's there are never imported),
    none of the files the build was started with held open (a CI runner waits for its pipe to close), no secret."""
    marker = uuid.uuid4().hex
    secret = case != "plain"  # whether the servers are new Pythons
    env = {name: value for name, value in project.env.items() if not SECRET.search(name)}
    env.update({"TMPDIR": str(servers), "EPBUILD_TEST_MARK": marker,
                **({"CI_DEPLOY_TOKEN": marker} if case == "secret" else {})})
    project.manifest(TWO_MODELS_CPU_QNN)
    if case == "path":
        (project.root / "elsewhere").mkdir()
        (project.root / "dodo.py").write_text(f"import sys\nsys.path.insert(1, {str(project.root / 'elsewhere')!r})\n"
                                              "from epbuild.dodo import *  # noqa: F403\n")
    for name in ("onnx.py", "onnxruntime_qnn.py", "numpy.py"):
        (project.root / name).write_text(SHADOW.format(folder=str(project.root)))
    read, write = os.pipe()  # the build is started holding this pipe's write end, as a CI runner's step would be
    try:
        done = subprocess.run([sys.executable, "-m", "doit"], cwd=project.root, env=env, capture_output=True,
                              text=True, timeout=900, pass_fds=(write,))
        os.close(write)
        assert done.returncode == 0 and "compiled compile:tinycnn@qnn-htp" in done.stdout, done.stdout + done.stderr
        started = wait_for("a server serving", lambda: _server_lines(servers))
        begun = [pid for pid, line in started.values() if "begun with a build" in line]  # adopted, forked off by it
        assert len(begun) == len(started) == 2, started
        for pid in begun:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            assert (b"--candidate" in cmdline) == secret  # a new Python, started or replacing the fork
            if not secret:
                assert b"doit" in cmdline and not Path(f"/proc/{pid}/environ").read_bytes().strip(b"\0")  # zeroed
        assert select.select([read], [], [], 60)[0] and os.read(read, 1) == b""  # no process holds the pipe
        for pid in begun:
            os.kill(pid, 0)  # while the servers still run
        assert not list(project.root.glob("imported-*"))
    finally:
        os.close(read)
        for answer, _ in _server_lines(servers).values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(answer, signal.SIGTERM)


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


PATHS = """import json, subprocess, sys
from pathlib import Path
{before}
from epbuild.execute.job_environment import job_environment
from epbuild.execute.python_path import fresh_import_path, new_python_path
env = job_environment()
fresh = subprocess.run([sys.executable, "-P", "-c", "import sys, json; print(json.dumps(sys.path))"], env=env,
                       capture_output=True, text=True, check=True).stdout
print(json.dumps([fresh_import_path(env, Path.cwd(), new_python_path(env)), json.loads(fresh)]))
"""


@pytest.mark.parametrize(("flags", "before", "environ", "said"), [
    ([], "", {}, True),
    (["-O"], "", {"PYTHONOPTIMIZE": "1"}, True),  # the switch the job's environment carries too
    (["-O"], "", {}, False),  # a switch a new Python would not have
    (["-X", "importtime"], "", {}, False),
    (["-W", "error"], "", {}, False),
    ([], "sys.path.insert(1, '/opt/elsewhere')", {}, False),  # added by a dodo.py: a new Python lacks it
    ([], "sys.path.remove(next(p for p in sys.path if p.endswith('site-packages')))", {}, False),  # a new Python has it
    ([], "sys.path.insert(0, str(Path.cwd()))", {}, True),  # the project's folder: dropped, as -P drops it
])
def test_the_import_path_a_new_python_would_have(tmp_path, flags, before, environ, said):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}, "PYTHONPATH": str(SOURCE),
           **environ}
    done = subprocess.run([sys.executable, *flags, "-c", PATHS.format(before=before)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    made, fresh = json.loads(done.stdout.splitlines()[-1])
    assert made == (fresh if said else None)


def _interpreters() -> list[str]:
    """Every CPython 3.11+ this machine has (pyenv's versions, Debian's, the one running the tests), once each."""
    found = {sys.executable}
    found.update(shutil.which(f"python3.{minor}") or "" for minor in range(11, 15))
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found.update(str(p) for p in Path(pyenv, "versions").glob("3.1[1-9]*/bin/python3"))
    usable = {}
    for candidate in filter(None, found):
        done = subprocess.run([candidate, "-c", "import sys; print(sys.version_info >= (3, 11), sys.version[:4])"],
                              capture_output=True, text=True, timeout=60)
        if done.returncode == 0 and done.stdout.startswith("True"):
            usable.setdefault(done.stdout.split()[1], candidate)
    return [usable[version] for version in sorted(usable)]


@pytest.mark.parametrize("site", [False, True], ids=["venv", "venv with system site-packages"])
def test_the_import_path_a_new_python_would_have_in_a_venv(tmp_path, site):
    """A venv's standard library is its base interpreter's (its `sysconfig` scheme names the venv's folder for
    platstdlib): the path a new Python of the venv has is said, not refused, on every Python here."""
    interpreters = _interpreters()
    assert interpreters
    for interpreter in interpreters:
        venv = tmp_path / Path(interpreter).parent.parent.name / ("site" if site else "bare")
        subprocess.run([interpreter, "-m", "venv", "--without-pip", *(["--system-site-packages"] if site else []),
                        str(venv)], check=True, timeout=300)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}, "PYTHONPATH": str(SOURCE)}
        done = subprocess.run([str(venv / "bin" / "python"), "-c", PATHS.format(before="")], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (interpreter, done.stderr)
        made, fresh = json.loads(done.stdout.splitlines()[-1])
        assert made == fresh and any(entry.endswith("lib-dynload") for entry in made), (interpreter, made)
