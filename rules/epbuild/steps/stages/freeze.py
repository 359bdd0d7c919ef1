"""`freeze`: configuration inputs made constants, and what they select folded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...contracts.jobs import StageJob
from ...errors import ModelError, located
from ..graph import check_input_names, dims
from .output import always_written, external_output


def freeze(source: Path, output: Path, values: dict[str, list[float]], data_file: str | None) -> None:
    """Turn configuration inputs into constants and fold what they select (If branches on a sample rate, a mode
    flag) with ONNX Runtime's basic optimization."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    model = onnx.load(str(source), load_external_data=False)
    check_input_names(model.graph, list(values), "freeze")
    for name, given in values.items():
        value = next(v for v in model.graph.input if v.name == name)
        shape = [d if isinstance(d, int) else 1 for d in dims(value)]
        count = int(np.prod(shape)) if shape else 1
        if len(given) not in (1, count):
            raise ModelError(f"the input has shape {dims(value)}, so it takes 1 or {count} values, the "
                             f"manifest gives {len(given)}", f"freeze.{name}")
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        array = np.full(shape, given[0]) if len(given) == 1 else np.array(given).reshape(shape)
        model.graph.input.remove(value)
        model.graph.initializer.append(numpy_helper.from_array(array.astype(dtype), name))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(output)
    external_output(options, data_file)
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run(job: StageJob) -> dict[str, Any]:
    with located(job.manifest, job.entry):
        freeze(job.source, job.output, job.settings["values"], job.data_file)
    if job.data_file:
        always_written(job.output.with_name(job.data_file))
    return {}
