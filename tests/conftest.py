"""Fixtures: throwaway projects (dodo.py, the shipped models, a manifest) built with the real doit and EPs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "rules"  # the folder that holds the epbuild package: children and doit import it from there
sys.path.insert(0, str(SOURCE))
sys.path.insert(0, str(REPO / "tests"))


def pytest_configure(config):
    """The builds these tests start are a terminal's foreground job: SIGINT at its default. A shell starts a
    background command (`pytest ... &`, a CI step beside another) with SIGINT ignored, which every process started
    from it inherits, and a Python that starts with SIGINT ignored keeps ignoring it, as Unix programs do: a test's
    Ctrl-C (`killpg(build, SIGINT)`) would reach no build, which then finished and exited 0. Caught here, the signal
    is back at its default in every program this process starts."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class Project:
    """A project folder like a user's: dodo.py, models/, configs/, models.toml; run doit in it."""

    def __init__(self, root: Path, host_cache: Path):
        self.root = root
        shutil.copy(REPO / "dodo.py", root / "dodo.py")
        shutil.copytree(REPO / "models", root / "models", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
        shutil.copytree(REPO / "configs", root / "configs")
        from epbuild.state.registry import settle_format

        state = root / "artifacts" / ".state"
        settle_format(state)  # a project of this epbuild's state layout, seeded with this host's probe
        if host_cache.exists():
            shutil.copy(host_cache, state / "host.json")
        self.cache = root.with_name(f"{root.name}-cache")
        self.env = {**os.environ, "PYTHONPATH": str(SOURCE), "EPBUILD_CACHE_DIR": str(self.cache)}

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    def manifest(self, text: str) -> None:
        (self.root / "models.toml").write_text(text)

    def doit(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "doit", *args], cwd=self.root, env=self.env,
                              capture_output=True, text=True, timeout=900)
        if check and done.returncode != 0:
            raise AssertionError(f"doit {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done


def clone(tmp_path: Path, host_cache: Path, name: str, manifest: str, **env: str) -> Project:
    """A fresh clone named `name` with its own, empty local cache (`<name>-cache`) and `env` on top."""
    (tmp_path / name).mkdir()
    project = Project(tmp_path / name, host_cache)
    project.env.update({"EPBUILD_CACHE_DIR": str(tmp_path / f"{name}-cache"), **env})
    project.manifest(manifest)
    return project


def build_report(project: Project) -> dict[str, dict]:
    """The tasks of `artifacts/build-report.json`."""
    import json

    return json.loads((project.artifacts / "build-report.json").read_text())["tasks"]


def ran(done: subprocess.CompletedProcess, prefix: str = "") -> set[str]:
    """Task names doit executed (verbosity 2 prints '.  name' for a run, '-- name' for up to date)."""
    return {line[3:].strip() for line in done.stdout.splitlines() if line.startswith(f".  {prefix}")}


@pytest.fixture(scope="session")
def host_cache(tmp_path_factory) -> Path:
    """Probe the host once per test session; every project starts with the result."""
    from epbuild.execute.host import capabilities
    from epbuild.steps import vendor_shim

    state = tmp_path_factory.mktemp("host")
    vendor_shim.prepare(tmp_path_factory.mktemp("cache"))  # as doit does on non-Intel hosts
    capabilities(state)
    return state / "host.json"


@pytest.fixture
def project(tmp_path, host_cache) -> Project:
    root = tmp_path / "proj"
    root.mkdir()
    return Project(root, host_cache)


@pytest.fixture(scope="session")
def openvino_reason(host_cache) -> str | None:
    """Why OpenVINO cannot build here (its plugin offers devices on Intel hardware only), None where it can."""
    import json

    from epbuild.execute.host import unavailable_reason
    from epbuild.manifest.eps import REGISTRY

    return unavailable_reason(REGISTRY["openvino"], "pypi", "cpu", json.loads(host_cache.read_text()))
