"""epbuild as a user installs it: the package from this repository, a project of one's own with only models.toml and
a one-line dodo.py (beside an unrelated `rules/` folder), doit and the `epbuild` command.

The default-suite tests use this environment's epbuild; the `slow` one installs the repository into a fresh venv
with `[qnn,openvino]` from PyPI and builds there, outside the repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, SOURCE
from helpers import TINYCNN_CPU_QNN

MANIFEST = TINYCNN_CPU_QNN


def _user_project(root: Path) -> Path:
    """A user's repository: their models (generated here), models.toml, a one-line dodo.py and a `rules/` package
    of their own that has nothing to do with epbuild."""
    (root / "models").mkdir(parents=True)
    subprocess.run([sys.executable, str(REPO / "models" / "generate.py"), str(root / "models")], check=True,
                   capture_output=True, timeout=300)
    (root / "models.toml").write_text(MANIFEST)
    (root / "dodo.py").write_text("from epbuild.dodo import *  # noqa: F403\n")
    (root / "rules").mkdir()
    (root / "rules" / "__init__.py").write_text("raise ImportError('the user rules package, never epbuild')\n")
    (root / "rules" / "fast_path.py").write_text("raise ImportError('not epbuild either')\n")
    return root


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{command} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


def _assert_built(project: Path) -> None:
    for target in ("cpu", "qnn-htp"):
        folder = project / "artifacts" / target / "tinycnn"
        assert (folder / "tinycnn.onnx").stat().st_size > 0
        report = json.loads((folder / "validation.json").read_text())
        assert report["status"] == "passed", report
    sidecar = json.loads((project / "artifacts" / "qnn-htp" / "tinycnn" / "artifact.json").read_text())
    assert sidecar["nodes"]["cpu"] == 0
    tasks = json.loads((project / "artifacts" / "build-report.json").read_text())["tasks"]
    assert tasks["validate:tinycnn@qnn-htp"]["status"] == "validated"
    assert 'tests="2" failures="0"' in (project / "artifacts" / "junit.xml").read_text()
    assert "tinycnn" in (project / "artifacts" / "report.html").read_text()


@pytest.fixture
def user_env(tmp_path, host_cache) -> dict[str, str]:
    """This environment's epbuild (from the repository's source folder), nothing of the repository on the path."""
    return {**os.environ, "PYTHONPATH": str(SOURCE), "EPBUILD_CACHE_DIR": str(tmp_path / "cache")}


def test_a_one_line_dodo_builds_a_users_project_beside_their_own_rules_folder(tmp_path, user_env):
    project = _user_project(tmp_path / "mine")
    _run([sys.executable, "-m", "doit", "-n", "2"], project, user_env)
    _assert_built(project)
    again = _run([sys.executable, "-m", "epbuild"], project, user_env)  # the same tasks, state and artifacts
    assert "summary: " in again.stdout and "compiled" not in again.stdout.split("summary:")[1]
    elsewhere = _run([sys.executable, "-m", "epbuild", "list", "--manifest", str(project / "models.toml")], tmp_path,
                     user_env)
    assert "compile:tinycnn@qnn-htp" in elsewhere.stdout and "validate:tinycnn@cpu" in elsewhere.stdout


def test_the_epbuild_command_needs_no_dodo_file_and_takes_another_manifest(tmp_path, user_env):
    project = _user_project(tmp_path / "mine")
    (project / "dodo.py").unlink()
    (project / "cpu-only.toml").write_text(MANIFEST.split("[targets.qnn-htp]")[0])
    listed = _run([sys.executable, "-m", "epbuild", "--manifest", "cpu-only.toml", "list"], project, user_env)
    assert "compile:tinycnn@cpu" in listed.stdout and "qnn-htp" not in listed.stdout
    built = _run([sys.executable, "-m", "epbuild", "--manifest=cpu-only.toml", "compile:tinycnn@cpu"], project,
                 user_env)
    assert "compiled compile:tinycnn@cpu" in built.stdout
    assert (project / "artifacts" / "cpu" / "tinycnn" / "tinycnn.onnx").is_file()


def test_a_dodo_file_that_imports_epbuild_but_defines_no_task_is_refused_in_one_line(tmp_path, user_env):
    """Also beside epbuild's database of an earlier build (doit's default dbm backend, which such a dodo.py gets,
    opens `.doit.db` before any task is asked for: epbuild keeps its sqlite file under another name, and moves one
    an earlier version left there), and without leaving doit's empty default database behind."""
    import sqlite3

    project = _user_project(tmp_path / "mine")
    built = subprocess.run([sys.executable, "-m", "doit", "compile:tinycnn@cpu"], cwd=project, env=user_env,
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    os.replace(project / ".doit.db.epbuild", project / ".doit.db")  # as epbuild up to 0.2.0 named it
    again = subprocess.run([sys.executable, "-m", "doit", "compile:tinycnn@cpu"], cwd=project, env=user_env,
                           capture_output=True, text=True, timeout=300)
    assert "-- compile:tinycnn@cpu" in again.stdout  # moved, with its results: up to date
    assert not (project / ".doit.db").exists()
    with sqlite3.connect(project / ".doit.db.epbuild") as db:
        assert db.execute("SELECT count(*) FROM doit").fetchone()[0] > 0
    before = sorted(path.name for path in project.iterdir())
    for dodo in ("import epbuild.dodo\n", "import epbuild\n"):
        (project / "dodo.py").write_text(dodo)
        for command in ([], ["list"]):
            done = subprocess.run([sys.executable, "-m", "doit", *command], cwd=project, env=user_env,
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 2 and done.stdout == "", done
            assert done.stderr.strip() == ("error: dodo.py imports epbuild but defines no task: write `from "
                                           "epbuild.dodo import *` (every task of models.toml), or run `epbuild` "
                                           "without a dodo.py")
            assert sorted(path.name for path in project.iterdir()) == before  # no `.doit.db.dat`


@pytest.mark.slow
def test_pip_install_into_a_fresh_venv_then_doit_and_epbuild_outside_the_repository(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", EPBUILD_CACHE_DIR=str(tmp_path / "cache"))
    source = tmp_path / "source"  # a copy: building the wheel writes into the source tree
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", "artifacts", "__pycache__", "*.egg-info"))
    _run([str(python), "-m", "pip", "install", "-q", f"{source}[qnn,openvino]"], tmp_path, env)
    where = _run([str(python), "-c", "import epbuild, sympy; print(epbuild.__file__)"], tmp_path, env).stdout
    assert str(venv) in where  # the installed package, not a source folder
    project = _user_project(tmp_path / "mine")
    _run([str(bin_dir / "doit"), "-n", "2"], project, env)
    _assert_built(project)
    _run([str(bin_dir / "epbuild")], project, env)
    listed = _run([str(bin_dir / "epbuild"), "list", "--manifest", str(project / "models.toml")], tmp_path, env)
    assert "compile:tinycnn@qnn-htp" in listed.stdout
    backends = _run([str(bin_dir / "epbuild"), "backends", "--manifest", str(project / "models.toml")], tmp_path, env)
    assert "target qnn-htp (QNNExecutionProvider, npu, ort): buildable" in backends.stdout


def test_the_epbuild_command_runs_doits_options_and_its_own_subcommands(tmp_path, user_env):
    project = _user_project(tmp_path / "mine")
    parallel = _run([sys.executable, "-m", "epbuild", "-n", "2", "compile:tinycnn"], project, user_env)
    assert "compiled compile:tinycnn@cpu" in parallel.stdout and "compiled compile:tinycnn@qnn-htp" in parallel.stdout
    backends = _run([sys.executable, "-m", "epbuild", "backends"], project, user_env)
    assert "target qnn-htp (QNNExecutionProvider, npu, ort): buildable" in backends.stdout
    worker = subprocess.run([sys.executable, "-m", "epbuild", "worker"], cwd=tmp_path, env=user_env,
                            capture_output=True, text=True, timeout=120)
    assert worker.returncode != 0 and "usage: python -m epbuild.worker tcp://SCHEDULER:8786" in worker.stderr
    missing = subprocess.run([sys.executable, "-m", "epbuild", "--manifest", str(tmp_path / "nowhere" / "m.toml")],
                             cwd=tmp_path, env=user_env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and missing.stderr.startswith("error: ") and "no such folder" in missing.stderr
