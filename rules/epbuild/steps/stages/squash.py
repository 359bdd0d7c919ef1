"""`squash`: a single-file model, every external tensor inlined, refused beyond protobuf's limit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...contracts.jobs import StageJob
from ...errors import ModelError
from ...files.weights import load_with_weights
from ...manifest.stage import PROTOBUF_LIMIT


def squash(source: Path, output: Path, limit_bytes: int = PROTOBUF_LIMIT, weights: Path | None = None) -> int:
    """Write a single-file ONNX model with every external tensor inlined (read from `weights`, None: beside the
    source); refuse beyond `limit_bytes`."""
    import onnx

    model = load_with_weights(source, weights)
    size = model.ByteSize()
    if size > limit_bytes:
        raise ModelError(f"squash: {source.name} is {size:,} bytes with its external data inlined, over the "
                         f"{limit_bytes:,}-byte protobuf limit of a single-file ONNX model; keep external data")
    for tensor in model.graph.initializer:
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT
    onnx.save(model, str(output))
    return size


def run(job: StageJob) -> dict[str, Any]:
    squash(job.source, job.output, job.settings["limit_bytes"], job.weights_folder)
    return {}
