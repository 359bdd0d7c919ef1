"""Running the stages before compile, each in a fresh child: static shapes, graph optimization, QDQ
quantization with calibration data, external-data squash. Outputs go through the artifact cache like compiles.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .cache import Workspace, cached_folder
from .child import run_child, serve
from .fingerprint import stage_fingerprint
from .publish import discard
from .stages import PROTOBUF_LIMIT, STAGES, Stage

RANDOM_SAMPLES, RANDOM_SEED = 8, 0
STAGE_TIMEOUT_S = 3600


def squash(source: Path, output: Path, limit_bytes: int = PROTOBUF_LIMIT) -> int:
    """Write a single-file ONNX model with every external tensor inlined; refuse beyond `limit_bytes`."""
    import onnx

    model = onnx.load(str(source), load_external_data=True)
    size = model.ByteSize()
    if size > limit_bytes:
        raise ValueError(f"squash: {source.name} is {size:,} bytes with its external data inlined, over the "
                         f"{limit_bytes:,}-byte protobuf limit of a single-file ONNX model; keep external data")
    for tensor in model.graph.initializer:
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
    onnx.save(model, str(output))
    return size


def fix_shapes(source: Path, output: Path, inputs: dict[str, list[int]]) -> None:
    import onnx
    from onnxruntime.tools.onnx_model_utils import fix_output_shapes, make_input_shape_fixed

    model = onnx.load(str(source), load_external_data=False)
    names = [i.name for i in model.graph.input]
    for name, shape in inputs.items():
        if name not in names:
            raise ValueError(f"inputs.{name}: the model has no input '{name}'; its inputs: {', '.join(names)}")
        make_input_shape_fixed(model.graph, name, shape)
    fix_output_shapes(model)
    onnx.save(model, str(output))


def require_static(model: Any, task: str) -> dict[str, tuple[int, ...]]:
    """The model's input shapes, or a ValueError naming the first symbolic dimension."""
    initializers = {t.name for t in model.graph.initializer}
    shapes = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        for index, dim in enumerate(dims):
            if not dim.HasField("dim_value"):
                raise ValueError(f"{task} needs static shapes: input '{value.name}' has symbolic dimension {index} "
                                 f"('{dim.dim_param or '?'}'); set inputs.{value.name} in the model's manifest entry")
        shapes[value.name] = tuple(d.dim_value for d in dims)
    return shapes


class _Calibration:
    """A CalibrationDataReader over .npz samples (checked against the model's inputs) or a fixed-seed set."""

    def __init__(self, files: list[str], shapes: dict[str, tuple[int, ...]], dtypes: dict[str, Any]):
        import numpy as np

        samples = []
        if files:
            for file in files:
                with np.load(file) as data:
                    sample = {key: data[key] for key in data.files}
                if set(sample) != set(shapes):
                    raise ValueError(f"calibration file {Path(file).name}: keys {sorted(sample)} do not match the "
                                     f"model's inputs {sorted(shapes)}")
                for key, array in sample.items():
                    if tuple(array.shape) != shapes[key]:
                        raise ValueError(f"calibration file {Path(file).name}: '{key}' has shape "
                                         f"{list(array.shape)}, the model's input is {list(shapes[key])}")
                samples.append({key: array.astype(dtypes[key]) for key, array in sample.items()})
        else:
            rng = np.random.default_rng(RANDOM_SEED)
            samples = [{key: rng.standard_normal(shape).astype(dtypes[key]) for key, shape in shapes.items()}
                       for _ in range(RANDOM_SAMPLES)]
        self.samples = iter(samples)

    def get_next(self) -> dict[str, Any] | None:
        return next(self.samples, None)

    def rewind(self) -> None:  # part of the reader interface; each stage run reads once
        pass


def quantize(source: Path, output: Path, flavour: str, settings: dict[str, Any], files: list[str], task: str) -> None:
    import onnx
    from onnx import helper
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization import quantize as quantize_with_config
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    model = onnx.load(str(source), load_external_data=False)
    shapes = require_static(model, task)
    dtypes = {v.name: helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type) for v in model.graph.input}
    del model
    reader = _Calibration(files, shapes, dtypes)
    types = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8, "uint16": QuantType.QUInt16,
             "int16": QuantType.QInt16}
    activation, weight = types[settings["activation_type"]], types[settings["weight_type"]]
    if flavour == "qnn":
        config = get_qnn_qdq_config(str(source), reader, activation_type=activation, weight_type=weight,
                                    per_channel=settings["per_channel"])
        quantize_with_config(str(source), str(output), config)
    else:
        quantize_static(str(source), str(output), reader, quant_format=QuantFormat.QDQ, activation_type=activation,
                        weight_type=weight, per_channel=settings["per_channel"])


def _run_stage(request: dict[str, Any]) -> dict[str, Any]:
    import os

    import onnxruntime as ort

    source, output, settings = Path(request["input"]), Path(request["output"]), request["settings"]
    os.chdir(source.parent)  # external data resolves next to the model, as in compiles
    kind = request["kind"]
    if kind == "shape":
        fix_shapes(source, output, settings["inputs"])
    elif kind == "optimize":
        options = ort.SessionOptions()
        options.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}[
            settings["level"]]
        options.optimized_model_filepath = str(output)
        ort.InferenceSession(source.name, options, providers=["CPUExecutionProvider"])
    elif kind == "quantize":
        quantize(source, output, request["flavour"], settings, request["calibration"], request["task"])
    else:
        squash(source, output, settings["limit_bytes"])
    for leftover in output.parent.iterdir():  # quantizers may leave helper models next to the output
        if leftover.is_file() and leftover != output:
            leftover.unlink()
    return {"size": output.stat().st_size}


def stage_request(stage: Stage, output: Path) -> dict[str, Any]:
    return {"kind": stage.kind, "task": stage.task, "flavour": stage.flavour, "input": str(stage.input),
            "output": str(output), "settings": stage.settings, "calibration": [str(p) for p in stage.calibration]}


def run_stage(stage: Stage, workspace: Workspace, external: list[Path]) -> tuple[bool, float]:
    """Produce (or restore) the stage's output, atomically; (restored, seconds)."""
    started = time.monotonic()
    fingerprint = stage_fingerprint(stage, external, workspace.hashes)

    def produce(scratch: Path) -> None:
        workdir = workspace.artifacts / ".scratch" / f"{scratch.name}.child"
        try:
            log = workspace.artifacts / ".logs" / STAGES / f"{stage.task.replace(':', '.')}.log"
            run_child("rules.preprocess", stage_request(stage, scratch / stage.output.name), workdir,
                      STAGE_TIMEOUT_S, stage.task, log)
        finally:
            discard(workdir)

    restored = cached_folder(stage.task, fingerprint, workspace, stage.output.parent, [stage.output.name], produce)
    return restored, time.monotonic() - started


if __name__ == "__main__":
    serve(_run_stage)
