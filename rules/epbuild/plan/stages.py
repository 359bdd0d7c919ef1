"""Stages before compile, what they are and in which order (`epbuild.steps.preprocess` runs them): static shapes, ORT
graph optimization, QDQ quantization with calibration data, and external-data squash. Each stage is its own task
whose output (`artifacts/.stages/<model>/<stage>/<model>.onnx`) feeds the next stage, then the compile and
validation tasks.

A model's chain: `freeze` (when the model says `freeze`: configuration inputs become constants and ORT's basic
optimization folds the branches they select), `rewrite` (when the model says `rewrite`: `steps.diagnosis`'s graph
rewrites, such as RMSNorm's rsqrt as a division), `upgrade` (for targets whose EP takes no model below some ai.onnx
opset, QNN's 7, when the model is below it and does not say `upgrade = false`: ONNX's version converter,
`steps.stages.upgrade`), `shape` (for targets whose EP needs static shapes, and when
`inputs` is given and a later stage rewrites the model, unless every shape of the model is already static and
ONNX's inference agrees: the inputs fixed in the file, -1 and unnamed dimensions included, then shape inference so
intermediate tensors are static too; exporters leave shapes computed at run time,
e.g. the Expand before a GRU, which QNN refuses as dynamic), `fold` (NPU targets, unless the model says `optimize`:
nodes that only compute constants replaced by their values, `steps.folding`), `optimize` (when the model says
`optimize` = "basic" or "extended": ONNX Runtime's optimizer), `quantize` (for targets with `quantized = true`,
QNN's QDQ configuration for QNN targets and the generic static quantizer otherwise), `squash` (when the model says
`squash = true`). Outputs are named after the model, so compiles by file name stay unique and checkout-independent.
A stage that changes weights and whose input has external data writes its own `<model>.onnx.data` beside its
output (squash inlines it); a graph-only stage writes the graph alone, which reads its weights from its input's folder
(`files.weights`): the chain's external data stays the source's files, never copied.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..files.layout import Layout
from ..files.weights import folder_string
from ..manifest.eps import REGISTRY
from ..manifest.parse import ModelSpec
from ..manifest.stage import PROTOBUF_LIMIT, TARGET_DEPENDENT, WEIGHTLESS, Stage, StageKind
from ..records import record

# What an upgrade converts to: one opset for every EP (the highest minimum in the EP table), so that the upgraded
# model is one stage output whichever targets need it.
UPGRADE_OPSET = max(info.min_opset for info in REGISTRY.values() if info.min_opset)


@record
class Chain:
    """What a compile consumes after its stages: the model (path and remaining `inputs`), its external-data
    files, the stages that make it, and the float model before quantization (None without quantization).
    `elsewhere`: the chain's graphs whose external data resolves in another folder (graph-only stage outputs),
    with that folder as `files.weights.folder_string` names it."""

    model: ModelSpec
    external: tuple[Path, ...]
    stages: tuple[Stage, ...]
    float_model: Path | None
    elsewhere: tuple[tuple[Path, str], ...] = ()


class _ChainBuilder:
    """A chain as it grows: the current graph, its external-data files and the folder they resolve in, the last
    target-dependent stage, and the graphs whose weights live elsewhere. Each stage added reads what the previous
    one wrote."""

    def __init__(self, model: ModelSpec, layout: Layout, external: tuple[Path, ...], manifest: str):
        self.model, self.layout, self.manifest = model, layout, manifest
        self.path, self.external = model.path, external
        self.after: str | None = None  # shape and fold are in some chains of a model and not in others
        self.weights = model.path.parent  # the folder the current graph's external data resolves in
        self.elsewhere: dict[Path, str] = {}
        self.stages: list[Stage] = []

    def add(self, kind: StageKind, settings: dict[str, Any], flavour: str | None = None,
            calibration: tuple[Path, ...] = ()) -> None:
        # a stage after a target-dependent one is named so; shape and fold after an upgrade too (a chain without
        # the upgrade has them, reading the model as declared)
        upgraded = StageKind.UPGRADE if any(s.kind == StageKind.UPGRADE for s in self.stages) else None
        follows = (upgraded if kind != StageKind.UPGRADE else None) if kind in TARGET_DEPENDENT else self.after
        folder = (f"{kind}-{flavour}" if flavour else kind) + (f"+{follows}" if follows else "")
        output = self.layout.stage_output(self.model.name, folder)
        if kind in TARGET_DEPENDENT:
            self.after = f"{upgraded}+{kind}" if upgraded and kind != StageKind.UPGRADE else kind
        data = (output.with_name(f"{self.model.name}.onnx.data")
                if self.external and kind not in (*WEIGHTLESS, StageKind.SQUASH) else None)
        stage = Stage(kind, self.model.name, flavour, self.path, output, settings, calibration, self.external, data,
                      self.manifest, follows, self.elsewhere.get(self.path))
        self.stages.append(stage)
        self.path, self.external = output, stage.output_external
        if stage.graph_only:
            self.elsewhere[output] = folder_string(output, self.weights)
        else:
            self.weights = output.parent


def stage_chain(model: ModelSpec, layout: Layout, external: tuple[Path, ...], flavour: str | None,
                static_shapes: bool = False, single_file: bool = False, manifest: str = "models.toml",
                fold: bool = False, min_opset: int | None = None) -> Chain:
    """The stages a model goes through for one target. `static_shapes`: the target's EP needs every shape static
    (NPU EPs), so `inputs` are fixed in the file; `single_file`: the compiler wants one ONNX file (qaic-compile),
    so the chain ends with a squash; `fold`: constant subgraphs are folded unless the model says `optimize`
    (an NPU target: nodes that only compute constants, left on CPU in front of its EPContext node, make the
    artifact unloadable; `optimize = "none"` keeps them); `min_opset`: the lowest ai.onnx opset the target's EP
    takes, below which the model is converted to `UPGRADE_OPSET` unless it says `upgrade = false`."""
    chain = _ChainBuilder(model, layout, external, manifest)
    inputs = model.inputs
    quantize = model.quantize if flavour else None
    level = None if model.optimize == "none" else model.optimize  # ONNX Runtime's optimizer, which folds too
    fold = fold and model.optimize is None
    if model.freeze:
        chain.add(StageKind.FREEZE, {"values": {name: list(value) for name, value in sorted(model.freeze.items())}})
    if model.rewrite:  # first after freeze: every target's chain reads the same input, so one task serves all
        chain.add(StageKind.REWRITE, {"rules": list(model.rewrite)})
    if model.upgrade and min_opset and model.opset is not None and model.opset < min_opset:
        chain.add(StageKind.UPGRADE, {"opset": UPGRADE_OPSET})
    ready = model.graph_ready and not chain.stages  # the model as read is what the compile gets (no earlier stage)
    if ready:
        inputs = {}  # the model's own static shapes: the inputs check refused any other value
    elif static_shapes or (inputs and (level or quantize)):
        chain.add(StageKind.SHAPE, {"inputs": {name: list(shape) for name, shape in sorted(inputs.items())}})
        inputs = {}
    if fold and (model.constant_nodes or not ready):
        chain.add(StageKind.FOLD, {})
    if level:
        chain.add(StageKind.OPTIMIZE, {"level": level})
    float_path = chain.path if quantize else None
    if quantize:
        chain.add(StageKind.QUANTIZE, {"activation_type": quantize.activation_type,
                                       "weight_type": quantize.weight_type, "per_channel": quantize.per_channel,
                                       "random": quantize.calibration is None},
                  flavour, quantize.calibration or ())
    if model.squash or single_file:
        chain.add(StageKind.SQUASH, {"limit_bytes": PROTOBUF_LIMIT}, flavour if quantize else None)
    if not chain.stages:
        return Chain(model, external, (), None)
    return Chain(dataclasses.replace(model, path=chain.path, inputs=inputs), chain.external, tuple(chain.stages),
                 float_path, tuple(chain.elsewhere.items()))
