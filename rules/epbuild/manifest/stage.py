"""One stage of a model's chain before its compiles, as planned (`plan.stages` plans chains, `steps.preprocess`
runs them): plain data that travels to jobs."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

from ..files.weights import resolved
from ..records import record

PROTOBUF_LIMIT = 2**31 - 1  # a single-file ONNX model must serialize below 2 GiB


class StageKind(StrEnum):
    """What a stage does; its value names its task (`fold:MODEL`) and its folder under `artifacts/.stages/`."""

    FREEZE = "freeze"
    REWRITE = "rewrite"
    UPGRADE = "upgrade"
    SHAPE = "shape"
    FOLD = "fold"
    OPTIMIZE = "optimize"
    QUANTIZE = "quantize"
    SQUASH = "squash"


# Stages that change only the graph: they read it without its weights and write the graph alone, whose references
# still name the input's external-data files, read from the input's folder: their memory is the graph's and their
# output holds no copy of the weights.
WEIGHTLESS = (StageKind.REWRITE, StageKind.SHAPE, StageKind.FOLD)
# Stages only some targets' chains of one model have (an EP's minimum opset, NPU targets' static shapes and folded
# constants): a later stage of such a chain reads another input than the same kind of stage of a chain without them,
# so its name says which it follows (`squash:dyn+fold`, beside `squash:dyn` of a CPU target; `shape:old+upgrade`,
# beside `shape:old` of a target whose EP takes the model's opset); freeze and rewrite are in every chain.
TARGET_DEPENDENT = (StageKind.UPGRADE, StageKind.SHAPE, StageKind.FOLD)


@record
class Stage:
    """One step of a model's chain before its compiles (freeze, rewrite, shape, fold, ...): its own task, its
    output cached as a compile's."""

    kind: StageKind
    model: str
    flavour: str | None  # quantize: "qnn" or "generic"
    input: Path
    output: Path
    settings: dict[str, Any]
    calibration: tuple[Path, ...] = ()
    input_external: tuple[Path, ...] = ()  # the input's external-data files
    output_data: Path | None = None  # the output's own external-data file
    manifest: str = "models.toml"  # the manifest's file name, for errors about the model's keys
    after: str | None = None  # the target-dependent stage (shape or fold) earlier in its chain, if any
    input_weights: str | None = None  # where the input's external data resolves, when not in its folder

    @property
    def outputs(self) -> list[Path]:
        return [self.output, *([self.output_data] if self.output_data else [])]

    @property
    def graph_only(self) -> bool:
        """The output is the graph alone and reads the input's external-data files where they are."""
        return self.kind in WEIGHTLESS and bool(self.input_external)

    @property
    def input_folder(self) -> Path:
        """The folder the input's external data resolves in."""
        return resolved(self.input, self.input_weights) if self.input_weights else self.input.parent

    @property
    def output_external(self) -> tuple[Path, ...]:
        """The external-data files the output references."""
        if self.graph_only:
            return self.input_external
        return (self.output_data,) if self.output_data else ()

    @property
    def task(self) -> str:
        return (f"{self.kind}:{self.model}" + (f"[{self.flavour}]" if self.flavour else "")
                + (f"+{self.after}" if self.after else ""))
