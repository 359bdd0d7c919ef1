"""`fold`: nodes that only compute constants folded (`steps.folding`), and the outer-scope initializers subgraphs
read passed to them as the EPContext writer keeps them."""

from __future__ import annotations

from typing import Any

from ...contracts.jobs import StageJob
from ..folding import fold_constants, into_bodies
from .output import save


def run(job: StageJob) -> dict[str, Any]:
    import onnx

    model = onnx.load(str(job.source), load_external_data=job.weights)  # values it folds: from the working folder
    result = {"folded": fold_constants(model), "into_bodies": into_bodies(model.graph)}
    save(model, job.output, job.data_file)
    return result
