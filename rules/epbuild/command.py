"""The `epbuild` command: doit's command line over epbuild's tasks, with no dodo.py needed.

    epbuild [--manifest PATH] [doit's arguments]   epbuild, epbuild list, epbuild -n 4, epbuild compile:M@T,
                                                   epbuild backends, epbuild prune --dry-run, epbuild info TASK
    epbuild explain TASK                           why TASK would run (doit's `info`: the settings that changed)
    epbuild run MODEL[@TARGET] [--inputs F.npz]    run an artifact as an application does: outputs, latency
    epbuild check                                  what ONNX Runtime says of each artifact for this host's devices
    epbuild reduce TASK                            a failing compile or validation reduced to a repro folder
    epbuild worker tcp://HOST:8786 [...]           a Dask worker for `[executor]` builds

It runs from the manifest's folder (default: ./models.toml, else EPBUILD_MANIFEST), as doit runs from a dodo.py's,
with the same tasks, state and artifacts: `doit` and `epbuild` are interchangeable in one project.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

USAGE = "usage: epbuild [--manifest PATH] [doit command and arguments] | epbuild worker tcp://HOST:PORT [...]"


def _split_manifest(argv: list[str]) -> tuple[str | None, list[str]]:
    """`--manifest PATH` or `--manifest=PATH` taken out of the arguments."""
    for index, argument in enumerate(argv):
        if argument == "--manifest":
            if index + 1 >= len(argv):
                raise SystemExit(f"error: --manifest needs a path\n{USAGE}")
            return argv[index + 1], argv[:index] + argv[index + 2:]
        if argument.startswith("--manifest="):
            return argument.split("=", 1)[1], argv[:index] + argv[index + 1:]
    return None, argv


HELP = """epbuild: ONNX models compiled per target (models.toml), built incrementally with doit

usage: epbuild [--manifest PATH] [COMMAND] [doit's options] [TASK ...]

commands:
  (none)                        build every target this host can build; `-n N` jobs at once (EPBUILD_JOBS)
  list                          every task, one line each (unavailable targets say why)
  compile:MODEL@TARGET ...      those tasks (and what they need); doit's wildcards: 'compile:*@qnn-htp'
  explain TASK                  why TASK would run: the settings that changed (exit 1: it would run, 0: up to date)
  run MODEL[@TARGET] [--inputs F.npz] [--runs N]
                                run an artifact as an application does: outputs, session time, latency
  check                         what ONNX Runtime says of each artifact for this host's devices
  reduce TASK                   a failing compile or validation (compile:M@T, validate:M@T) reduced to the
                                smallest subgraph that fails the same way: artifacts/repro/M@T/, a standalone repro.py
  backends [--json]             what this host can build: EPs, devices, toolchains, each target
  cache                         the local cache's size and cap, the remote cache's settings
  graph [--model M]             the task graph: artifacts/graph.svg
  prune [--dry-run]             remove what removed models, targets and stages left
  worker tcp://HOST:PORT        a Dask worker for `[executor]` builds
  help [COMMAND | TASK]         this; with a name, doit's help for it

options:
  --manifest PATH               the manifest (default ./models.toml, or EPBUILD_MANIFEST); runs from its folder
  --version                     epbuild's version with ONNX Runtime's and the EP plugins'

Every doit option and command applies as with `doit` in the manifest's folder (`--continue`, `-n 4 -P process`,
`clean`, `forget`): `epbuild help run` lists doit's options of a build. The reports: artifacts/report.html,
artifacts/build-report.json, artifacts/junit.xml.
"""


def version_line() -> str:
    """`epbuild --version`: this package's version and the toolchain's, as its fingerprints name them."""
    from .execute.host import package_version

    names = ("onnxruntime", "onnxruntime-qnn", "onnxruntime-ep-openvino", "onnx", "doit")
    found = ", ".join(f"{name} {package_version(name) or 'not installed'}" for name in names)
    return f"epbuild {package_version('epbuild') or 'unknown (not installed: run from a checkout)'} ({found})"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv in (["--help"], ["-h"], ["help"]):  # epbuild's own, before doit's (whose `-h` is a parse error)
        print(HELP, end="")
        return 0
    if argv == ["--version"]:
        print(version_line())
        return 0
    if argv[:1] == ["worker"]:
        from .worker import main as worker

        worker(argv[1:])
        return 0
    given, argv = _split_manifest(argv)
    if argv[:1] in (["run"], ["check"]):  # using what was built: no doit, no task
        from .runtime.check import main as check
        from .runtime.run import main as run

        manifest = Path(given or os.environ.get("EPBUILD_MANIFEST") or "models.toml").absolute()
        return run(argv[1:], manifest.parent, manifest) if argv[0] == "run" else check(argv[1:], manifest.parent)
    if argv[:1] == ["explain"]:
        argv[0] = "info"
    if argv[:1] == ["reduce"]:  # `epbuild reduce compile:m@t` (or m@t, validate:m@t): the task reduce:m@t
        from .manifest.builds import REDUCE_PREFIX, reduce_task

        argv = [reduce_task(name.split(":", 1)[-1]) if not name.startswith("-") else name for name in argv[1:]]
        if not any(name.startswith(REDUCE_PREFIX) for name in argv):
            print("error: epbuild reduce TASK: name the failing compile or validation, e.g. epbuild reduce "
                  "validate:MODEL@TARGET",
                  file=sys.stderr)
            return 2
    manifest = Path(given or os.environ.get("EPBUILD_MANIFEST") or "models.toml").absolute()
    if not manifest.parent.is_dir():
        print(f"error: {given or manifest}: no such folder {manifest.parent}", file=sys.stderr)
        return 2
    os.chdir(manifest.parent)  # as doit does for a dodo.py: relative paths are the project's
    if manifest.name == "models.toml":
        os.environ.pop("EPBUILD_MANIFEST", None)
    else:
        os.environ["EPBUILD_MANIFEST"] = manifest.name
    from .execute.warm_start import begin
    from .invocation import Invocation
    from .steps.job_modules import JOB_MODULES

    invocation = Invocation.of(argv)
    early = begin(manifest, invocation, JOB_MODULES)  # a first build's fork-server imports, begun before ours
    from .tasks.entry import quiet_when_piped, task_loader
    from .tasks.explain import EpbuildMain

    quiet_when_piped(invocation)  # `epbuild help run | head` too, which loads no task
    return EpbuildMain(task_loader(manifest, invocation, early)).run(argv)
