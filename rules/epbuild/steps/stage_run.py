"""A stage's coordinator side: its output produced (or restored) through the cache protocol, atomically, by its
child here (`preprocess.produce_stage`) or on the cluster (`execute.executor.run_stage`, the job's worker side
`remote_job.run_job`). The child's side, what each stage does, is `preprocess`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ..contracts.jobs import StageAnswer
from ..execute.executor import run_stage as run_stage_remotely
from ..files.hashing import snapshot
from ..manifest.stage import Stage
from ..store.cache import Outcome, Workspace, cached_folder, with_download
from .fingerprint import stage_config, stage_fingerprint
from .preprocess import produce_stage
from .remote_job import run_job


def run_stage(stage: Stage, workspace: Workspace) -> tuple[Outcome, float, list[str], str | None,
                                                           dict[str, float] | None]:
    """Produce (or restore) the stage's output, atomically; (where from, seconds, tensors left dynamic, the Dask
    worker that produced it, the child's usage: seconds and peak memory, None when restored)."""
    started = time.monotonic()
    inputs = snapshot([stage.input, *stage.input_external, *stage.calibration])
    fingerprint = stage_fingerprint(stage, workspace.hashes, workspace.provenance)
    answer: dict[str, Any] = {}
    config = stage_config(stage, workspace.provenance)

    def produce(scratch: Path) -> None:
        if workspace.executor:
            answer.update(run_stage_remotely(stage, workspace.job_context(), workspace, run_job, scratch, fingerprint,
                                             config))
        else:
            answer["answer"] = produce_stage(stage, workspace, scratch)

    outcome = cached_folder(stage.task, fingerprint, workspace, stage.output.parent,
                            sorted(p.name for p in stage.outputs), produce, config, inputs)
    child = answer.get("answer")  # the child's answer, with its usage (None: restored)
    dynamic = list(StageAnswer.from_json(child).dynamic) if child is not None else []
    return (with_download(outcome, answer), time.monotonic() - started, dynamic, answer.get("worker"),
            child.get("usage") if child is not None else None)
