"""What a stage's `run` is given: its request as the stage's child read it (`steps.preprocess.stage_request`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...records import record


@record
class StageJob:
    kind: str
    task: str  # the stage's task name, for messages
    source: Path  # the model the stage reads
    output: Path  # the model it writes
    settings: dict[str, Any]  # the stage's own settings (`manifest.stage.Stage.settings`)
    data_file: str | None  # the output's external-data file beside it, when it has one
    graph_only: bool  # the graph read and written without its weights (they stay where they are)
    weights_folder: Path | None  # where the input's weights are, when not beside it
    flavour: str | None  # quantize: "qnn" or the generic QDQ
    calibration: tuple[str, ...]  # quantize: the calibration files
    manifest: str  # the manifest's file name and the model's entry, for errors about its keys
    entry: str

    @property
    def weights(self) -> bool:
        """Whether the stage reads and writes the model's weights (not a graph-only stage)."""
        return not self.graph_only

    @classmethod
    def of(cls, request: dict[str, Any]) -> StageJob:
        return cls(request["kind"], request["task"], Path(request["input"]), Path(request["output"]),
                   request["settings"], request["data_file"], request["graph_only"],
                   Path(request["weights"]) if request["weights"] else None, request["flavour"],
                   tuple(request["calibration"]), request["manifest"], request["entry"])
