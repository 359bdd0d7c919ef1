"""A stage's child: its request read into a `contracts.jobs.StageJob`, the stage's own module run (`stages.runners`: one
module per stage kind), and what it wrote checked (leftovers removed, every file it names present, the model opening
on CPU). `produce_stage` runs this child for the coordinator (`stage_run`). Outputs go through the artifact cache
like compiles."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..contracts.jobs import StageAnswer, StageJob
from ..errors import ModelError
from ..execute.child import run_child, serve
from ..execute.forked_jobs import Handoff
from ..execute.links import SHAPE_STAGE
from ..files.layout import STAGES
from ..files.publish import discard
from ..files.weights import read_weights_from
from ..manifest.stage import Stage
from ..store.cache import Workspace
from .expected_peak import stage_limits
from .graph import missing_files

STAGE_TIMEOUT_S = 3600


def _run_stage(request: dict[str, Any]) -> dict[str, Any]:
    import onnx
    import onnxruntime as ort

    from .stages.runners import RUNNERS  # the stages' modules: a child's imports, not the build process's

    job = StageJob.from_json(request)
    source, output, data_file, elsewhere = job.source, job.output, job.data_file, job.weights_folder
    os.chdir(elsewhere or source.parent)  # external data read from bytes resolves in the working folder
    result = RUNNERS[job.kind](job)
    written = {output.name, data_file}
    for leftover in output.parent.iterdir():  # quantizers may leave helper models next to the output
        if leftover.is_file() and leftover.name not in written:
            leftover.unlink()
    # a graph-only output references its input's files, where they are
    problems = missing_files(output, onnx.load(str(output), load_external_data=False),
                             (elsewhere or source.parent) if job.graph_only else None)
    if problems:
        raise ModelError("; ".join(problems))
    if job.weights:  # a graph-only stage keeps a large model's weights on disk and out of memory: not loaded
        _loads_on_cpu(ort, output, None, job.kind)
    return StageAnswer(tuple(result.pop("dynamic", ())), result).to_json()


def _loads_on_cpu(ort: Any, output: Path, weights: Path | None, kind: str) -> None:
    """The stage's output opens in a plain CPU session (no optimization) before it is published: a stage that broke
    the graph (a body's outer-scope value dropped) says so here, instead of the EP's compile being blamed."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    read_weights_from(options, weights)
    try:
        ort.InferenceSession(str(output), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - whatever ONNX Runtime raises, the stage is at fault
        text = " ".join(str(exc).split())[:300]
        raise ModelError(f"the {kind} stage wrote a model ONNX Runtime cannot load on CPU ({text}): a fault of this "
                         "stage, not of the model or the EP") from None


def stage_request(stage: Stage, output: Path) -> StageJob:
    return StageJob(kind=str(stage.kind), task=stage.task, source=stage.input, output=output, settings=stage.settings,
                    data_file=stage.output_data.name if stage.output_data else None, graph_only=stage.graph_only,
                    weights_folder=stage.input_folder if stage.input_weights else None, flavour=stage.flavour,
                    calibration=tuple(str(p) for p in stage.calibration), manifest=stage.manifest,
                    entry=f"models.{stage.model}")


def produce_stage(stage: Stage, workspace: Workspace, scratch: Path) -> dict[str, Any]:
    """Run the stage's child, writing its output into `scratch`; the child's answer."""
    workdir = workspace.layout.scratch(f"{scratch.name}.child")
    try:
        log = workspace.layout.log(STAGES, stage.task.replace(":", "."))
        request = stage_request(stage, scratch / stage.output.name).to_json()
        return run_child("epbuild.steps.preprocess", request, workdir,
                         stage_limits(stage, workspace, STAGE_TIMEOUT_S), stage.task, log,
                         ep=SHAPE_STAGE if stage.kind == "shape" else "", expect=workspace.provenance,
                         links=workspace.links)
    finally:
        discard(workdir)


def main(handoff: Handoff | None = None) -> None:
    """`python -m` this module, or a fork server's child or warm worker, runs this."""
    serve(_run_stage, handoff)


if __name__ == "__main__":
    main()
