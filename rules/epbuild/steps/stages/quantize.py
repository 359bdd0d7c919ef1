"""`quantize`: QDQ quantization (QNN's configuration, or the generic one) calibrated on the model's .npz samples
or a fixed-seed set."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...contracts.jobs import StageJob
from ...errors import ModelError
from ...files.weights import load_with_weights
from ..graph import dims, refuse_zero_size, true_inputs
from ..validation.validation_inputs import read_npz

RANDOM_SAMPLES, RANDOM_SEED = 8, 0


def require_static(model: Any, task: str) -> dict[str, tuple[int, ...]]:
    """The model's input shapes, or a ModelError naming the first symbolic dimension."""
    shapes: dict[str, tuple[int, ...]] = {}
    for value in true_inputs(model.graph):
        found = dims(value)
        for index, dim in enumerate(found):
            if not isinstance(dim, int):
                refuse_zero_size(value)
                raise ModelError(f"{task} needs static shapes: input '{value.name}' has symbolic dimension {index} "
                                 f"('{dim or '-1'}'); set inputs.{value.name} in the model's manifest entry")
        shapes[value.name] = tuple(dim for dim in found if isinstance(dim, int))
    return shapes


class _Calibration:
    """A CalibrationDataReader over .npz samples (checked against the model's inputs) or a fixed-seed set."""

    def __init__(self, files: list[str], shapes: dict[str, tuple[int, ...]], dtypes: dict[str, Any]):
        import numpy as np

        samples = []
        if files:
            for file in files:
                sample = read_npz(file, "calibration file")
                if set(sample) != set(shapes):
                    raise ModelError(f"calibration file {Path(file).name}: keys {sorted(sample)} do not match the "
                                     f"model's inputs {sorted(shapes)}")
                for key, array in sample.items():
                    if tuple(array.shape) != shapes[key]:
                        raise ModelError(f"calibration file {Path(file).name}: '{key}' has shape "
                                         f"{list(array.shape)}, the model's input is {list(shapes[key])}")
                    wanted = np.dtype(dtypes[key])
                    if array.dtype.kind.replace("u", "i") != wanted.kind.replace("u", "i"):  # ints for a float
                        # input (or floats for indices): a cast would hide a wrong file
                        raise ModelError(f"calibration file {Path(file).name}: '{key}' is {array.dtype}, the "
                                         f"model's input is {wanted}: save it as {wanted}")
                    if array.dtype.kind == "f" and not np.isfinite(array).all():
                        raise ModelError(f"calibration file {Path(file).name}: '{key}' holds NaN or infinite "
                                         "values, from which no quantization range can be computed")
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


def quantize(source: Path, output: Path, flavour: str, settings: dict[str, Any], files: list[str], task: str,
             data_file: str | None, weights: Path | None = None) -> None:
    """QDQ quantization; a graph whose weights are in another folder (`weights`) is handed to the quantizers with
    its tensors read from there (they resolve external data beside the file they are given)."""
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
    external = data_file is not None  # the quantizers write <output>.data, which is `data_file`
    given = load_with_weights(source, weights) if weights else str(source)
    os.chdir(output.parent)  # onnx refuses to save a data file whose name exists in the working folder
    if flavour == "qnn":
        config = get_qnn_qdq_config(given, reader, activation_type=activation, weight_type=weight,
                                    per_channel=settings["per_channel"])
        config.use_external_data_format = external
        quantize_with_config(given, str(output), config)
    else:
        quantize_static(given, str(output), reader, quant_format=QuantFormat.QDQ, activation_type=activation,
                        weight_type=weight, per_channel=settings["per_channel"], use_external_data_format=external)


def run(job: StageJob) -> dict[str, Any]:
    assert job.flavour is not None, "a quantize stage names its flavour"
    quantize(job.source, job.output, job.flavour, job.settings, list(job.calibration), job.task, job.data_file,
             job.weights_folder)
    return {}
