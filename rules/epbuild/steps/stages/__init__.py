"""The stages that can run before a compile, one module each, every one a `run(job)` on the stage's child
(`steps.preprocess`, which reads its request, dispatches by kind through `RUNNERS` and checks what it wrote):
`upgrade` (ONNX's version converter), `freeze` (configuration inputs made constants), `shape` (static shapes),
`fold` (constant subgraphs folded), `rewrite` (known patterns rewritten), `optimize` (ONNX Runtime's offline
optimization), `quantize` (QDQ with calibration data), `squash` (external data inlined). `job` is what each is
given, `output` how each writes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import fold, freeze, optimize, quantize, rewrite, shape, squash, upgrade
from .job import StageJob

RUNNERS: dict[str, Callable[[StageJob], dict[str, Any]]] = {
    "upgrade": upgrade.run, "freeze": freeze.run, "shape": shape.run, "fold": fold.run, "rewrite": rewrite.run,
    "optimize": optimize.run, "quantize": quantize.run, "squash": squash.run}
