"""Each stage kind's `run`, by kind: imported on a stage's child (and by an idle fork server, ahead of its jobs), not
by the build process, which needs only `output` of this package."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...contracts.jobs import StageJob
from . import fold, freeze, optimize, quantize, rewrite, shape, squash, upgrade

RUNNERS: dict[str, Callable[[StageJob], dict[str, Any]]] = {
    "upgrade": upgrade.run, "freeze": freeze.run, "shape": shape.run, "fold": fold.run, "rewrite": rewrite.run,
    "optimize": optimize.run, "quantize": quantize.run, "squash": squash.run}
