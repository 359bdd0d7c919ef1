"""Stages before compile, what they are and in which order (`rules.preprocess` runs them): static shapes, ORT
graph optimization, QDQ quantization with calibration data, and external-data squash. Each stage is its own task
whose output (`artifacts/.stages/<model>/<stage>/<model>.onnx`) feeds the next stage, then the compile and
validation tasks.

A model's chain: `shape` (when `inputs` is given and a later stage rewrites the model), `optimize` (when the model
says `optimize`), `quantize` (for targets with `quantized = true`, QNN's QDQ configuration for QNN targets and the
generic static quantizer otherwise), `squash` (when the model says `squash = true`). Outputs are named after the
model, so compiles by file name stay unique and checkout-independent.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .manifest import ModelSpec

STAGES = ".stages"
PROTOBUF_LIMIT = 2**31 - 1  # a single-file ONNX model must serialize below 2 GiB


@dataclass(frozen=True)
class Stage:
    kind: str  # "shape", "optimize", "quantize" or "squash"
    model: str
    flavour: str | None  # quantize: "qnn" or "generic"
    input: Path
    output: Path
    settings: dict[str, Any]
    calibration: tuple[Path, ...] = ()

    @property
    def task(self) -> str:
        return f"{self.kind}:{self.model}" + (f"[{self.flavour}]" if self.flavour else "")


def stage_chain(model: ModelSpec, artifacts: Path, flavour: str | None,
                single_file: bool = False) -> tuple[ModelSpec, tuple[Stage, ...], Path | None]:
    """(the model the compile consumes, the stages that make it, the float model before quantization or None).

    `single_file`: the compiler wants one ONNX file (qaic-compile), so the chain ends with a squash."""
    stages: list[Stage] = []
    path, inputs = model.path, model.inputs
    quantize = model.quantize if flavour else None

    def add(kind: str, settings: dict[str, Any], stage_flavour: str | None = None,
            calibration: tuple[Path, ...] = ()) -> None:
        nonlocal path
        folder = f"{kind}-{stage_flavour}" if stage_flavour else kind
        output = artifacts / STAGES / model.name / folder / f"{model.name}.onnx"
        stages.append(Stage(kind, model.name, stage_flavour, path, output, settings, calibration))
        path = output

    if inputs and (model.optimize or quantize):
        add("shape", {"inputs": {name: list(shape) for name, shape in sorted(inputs.items())}})
        inputs = {}
    if model.optimize:
        add("optimize", {"level": model.optimize})
    float_path = path if quantize else None
    if quantize:
        add("quantize", {"activation_type": quantize.activation_type, "weight_type": quantize.weight_type,
                         "per_channel": quantize.per_channel, "random": quantize.calibration is None},
            flavour, quantize.calibration or ())
    if model.squash or single_file:
        add("squash", {"limit_bytes": PROTOBUF_LIMIT}, flavour if quantize else None)
    if not stages:
        return model, (), None
    return dataclasses.replace(model, path=path, inputs=inputs), tuple(stages), float_path
