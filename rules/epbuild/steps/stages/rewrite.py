"""`rewrite`: known patterns an EP cannot take rewritten into ones it can (`steps.diagnosis.REWRITES`)."""

from __future__ import annotations

from typing import Any

from ...contracts.jobs import StageJob
from ...errors import ModelError, located
from ..diagnosis import PATTERNS, REWRITES
from .output import save


def run(job: StageJob) -> dict[str, Any]:
    import onnx

    model = onnx.load(str(job.source), load_external_data=job.weights)
    rewritten = {rule: REWRITES[rule](model.graph) for rule in job.settings["rules"]}
    missing = [rule for rule, count in rewritten.items() if not count]
    if missing:
        with located(job.manifest, job.entry):
            raise ModelError(f"the model has no {', '.join(missing)} pattern to rewrite ({PATTERNS[missing[0]]}"
                             "): remove it from rewrite", "rewrite")
    save(model, job.output, job.data_file)
    return {"rewritten": rewritten}
