"""`optimize`: ONNX Runtime's offline graph optimization (basic or extended) on the CPU EP."""

from __future__ import annotations

from typing import Any

from ...contracts.jobs import StageJob
from ...files.weights import read_weights_from
from .output import always_written, external_output


def run(job: StageJob) -> dict[str, Any]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}[
        job.settings["level"]]
    options.optimized_model_filepath = str(job.output)
    external_output(options, job.data_file)
    read_weights_from(options, job.weights_folder)
    ort.InferenceSession(str(job.source), options, providers=["CPUExecutionProvider"])
    if job.data_file:
        always_written(job.output.with_name(job.data_file))
    return {}
