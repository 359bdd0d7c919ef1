"""The CI workflow for a repository of models (`ci/models-repository.yml`): its shell steps, run here as the runner
runs them, build a project from its manifest alone and leave every file its upload steps name; a second run on a
fresh clone of the project with the kept cache compiles nothing."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys

import yaml

from conftest import REPO
from helpers import TINYCNN_LISTED

WORKFLOW = REPO / "ci" / "models-repository.yml"
MANIFEST = TINYCNN_LISTED + 'options = { soc_model = "SC8380XP" }\n'


def _steps() -> tuple[dict, list[dict]]:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    (job,) = workflow["jobs"].values()
    return job, job["steps"]


def _env(job: dict, project, cache) -> dict[str, str]:
    """The job's environment as the runner sets it, its `${{ }}` expressions as a push without a remote gives them
    (no repository variables or secrets set), the cache folder here."""
    env = dict(project.env)
    for name, value in job["env"].items():
        env[name] = re.sub(r"\$\{\{.*?\}\}", "", str(value))
    env["EPBUILD_CACHE_DIR"] = str(cache)
    bin_folder = project.root.parent / "bin"  # `epbuild` as pip's script runs it: this checkout's, by its module
    bin_folder.mkdir(exist_ok=True)
    script = bin_folder / "epbuild"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m epbuild "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    env["PATH"] = f"{bin_folder}{os.pathsep}{env['PATH']}"
    return env


def _run_steps(steps: list[dict], folder, env: dict[str, str]) -> list[subprocess.CompletedProcess]:
    """Every `run:` step but the install (epbuild is not on PyPI from here: this checkout's stands in), in order;
    `if: always()` steps run after a failure too, as on the runner."""
    done = []
    failed = False
    for step in steps:
        if "run" not in step or step.get("name") == "install epbuild" or (failed and step.get("if") != "always()"):
            continue
        done.append(subprocess.run(["bash", "-e", "-c", step["run"]], cwd=folder, env=env, capture_output=True,
                                   text=True, timeout=600))
        failed = failed or done[-1].returncode != 0
    return done


def test_the_workflows_steps_build_a_models_repository_and_leave_what_it_uploads(project, tmp_path):
    job, steps = _steps()
    install = next(step for step in steps if step.get("name") == "install epbuild")
    assert 'pip install "epbuild[' in install["run"] and "==${EPBUILD_VERSION}" in install["run"]
    project.manifest(MANIFEST)
    (project.root / "dodo.py").unlink(missing_ok=True)  # a repository of models: the manifest alone
    cache = tmp_path / "cache"
    env = _env(job, project, cache)
    done = _run_steps(steps, project.root, env)
    assert [d.returncode for d in done] == [0, 0], [d.stdout[-2000:] + d.stderr[-2000:] for d in done]
    build, check = done
    assert build.stdout.startswith("epbuild ") and "summary: " in build.stdout
    assert "validated" in build.stdout and "failed" not in build.stdout.split("summary: ")[1].split("\n")[0]
    assert "qnn-htp/tinycnn: " in check.stdout and ":60:" in check.stdout  # SC8380XP is soc_model 60
    upload = next(step for step in steps if step.get("uses", "").startswith("actions/upload-artifact"))
    for path in upload["with"]["path"].split():
        assert (project.root / path).is_file(), path
    junit = next(step for step in steps if "junit" in step.get("uses", ""))
    assert junit["with"]["report_paths"] == "artifacts/junit.xml"
    # the next push: a fresh clone (no artifacts, no doit state) with the kept cache restores everything
    clone = tmp_path / "clone"
    clone.mkdir()
    shutil.copytree(project.root / "models", clone / "models")
    shutil.copy(project.root / "models.toml", clone / "models.toml")
    again = _run_steps(steps, clone, env)
    assert [d.returncode for d in again] == [0, 0]
    summary = next(line for line in again[0].stdout.splitlines() if line.startswith("summary: "))
    assert "compiled" not in summary.replace("not compiled", "") and "restored" in summary, summary
