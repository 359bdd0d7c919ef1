"""What a job is expected to hold at its peak, for memory admission (`execute.memory_ledger`): the peak its task's
child reached the last time it ran (the build report's `child.peak_mb`), else an estimate from the bytes of the
models it reads (with their external data), its kind and its EP:

    expected MB = BASE_MB[EP] + FACTOR[kind, EP] x model MB

Calibrated on this repository's own figures: the corpus (`bench/results/corpus.md`: 34 models of KBs to MBs,
compile peaks 61-78 MB on CPU, 102-115 MB on OpenVINO, 143-149 MB on QNN: the bases) and a 3 GiB model
(`bench/results/large.json`: compile 3,391 MB on CPU and 6,411 MB on QNN, validations 3,394 MB, stages 48-87 MB:
the factors, 1.1 and 2.1 times the model's bytes; stages stream theirs). OpenVINO has no large figure here: it gets
QNN's factor, the larger. A real model's first compile may still go past its estimate (a 25 M-parameter CNN's QNN
compile passed 5 GB resident): its task's next run expects what it reached.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path

from ..manifest.builds import Build, Limits
from ..manifest.stage import Stage
from ..store.cache import Workspace

BASE_MB = {"cpu": 80.0, "openvino": 120.0, "qnn": 160.0}
DEFAULT_BASE_MB = 160.0
FACTOR = {("compile", "cpu"): 1.1, ("compile", "openvino"): 2.1, ("compile", "qnn"): 2.1, ("validate", ""): 1.1,
          ("stage", ""): 0.1}


def _model_mb(paths: Iterable[Path]) -> float:
    total = 0
    for path in paths:
        try:
            total += os.stat(path).st_size
        except OSError:  # not there yet (a stage's output): the last run's peak or the base
            continue
    return total / 2**20


def expected_mb(task: str, kind: str, ep: str, paths: Iterable[Path], workspace: Workspace) -> float:
    """The peak to hold for `task`'s job: its last recorded one, else the estimate (see the module's docstring)."""
    last = workspace.last_peaks.get(task)
    if last:
        return last
    factor = FACTOR.get((kind, ep), FACTOR.get((kind, ""), 2.1))
    return round(BASE_MB.get(ep, DEFAULT_BASE_MB) + factor * _model_mb(paths), 1)


def build_limits(build: Build, workspace: Workspace, kind: str, timeout_s: float | None = None) -> Limits:
    """The limits of a compile's or validation's child (`kind`), with what it is expected to hold."""
    task = build.task if kind == "compile" else build.validate_task
    paths = [path for member in build.members for path in (member.model.path, *member.external)]
    return dataclasses.replace(build.target.limits(timeout_s), budget_gb=workspace.memory_gb,
                               expected_mb=expected_mb(task, kind, build.target.ep.alias, paths, workspace))


def stage_limits(stage: Stage, workspace: Workspace, timeout_s: float) -> Limits:
    """The limits of a stage's child, with what it is expected to hold."""
    return Limits(timeout_s, budget_gb=workspace.memory_gb,
                  expected_mb=expected_mb(stage.task, "stage", "", [stage.input, *stage.input_external], workspace))
