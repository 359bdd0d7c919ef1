"""`upgrade:`, `freeze:`, `rewrite:`, `shape:`, `fold:`, `optimize:`, `quantize:` and `squash:` tasks: each stage
of a model (`manifest.stage`) writes the file the next one reads, the last feeds the compile."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ...files.publish import discard
from ...manifest.stage import Stage
from ...steps.fingerprint import stage_config
from ..actions import run_stage_task

if TYPE_CHECKING:
    from ..definitions import Task, Tasks

DOCS = {"freeze": "configuration inputs to constants, folded", "rewrite": "graph rewrites the model asks for",
        "upgrade": "the model converted to the lowest opset its targets' EP takes",
        "shape": "static shapes from `inputs`",
        "fold": "nodes that only compute constants replaced by their values (NPU targets)",
        "optimize": "ORT graph optimization",
        "quantize": "QDQ quantization with calibration data", "squash": "inline external data"}


def tasks(source: Tasks) -> Iterator[Task]:
    """One group per stage kind the plan has, then its stages' tasks."""
    stages = source.project.stages
    for kind in dict.fromkeys(str(stage.kind) for stage in stages.values()):
        yield {"basename": kind, "name": None, "doc": DOCS[kind]}
    for stage in stages.values():
        if not source.skipped(stage.task):
            yield source.made_or(stage.task, make, stage)


def make(source: Tasks, stage: Stage) -> Task:
    project = source.project
    doc = f"{stage.kind} {stage.model}{f' for {stage.flavour} targets' if stage.flavour else ''} -> " \
          f"{project.rel(stage.output)}"
    name = stage.task.split(":", 1)[1]
    if stage.task in project.blocked:
        return source.blocked(str(stage.kind), name, doc)
    return source.task(str(stage.kind), name, doc, run_stage_task, [stage, project.workspace],
                       [stage.input, *stage.input_external, *stage.calibration], stage.outputs,
                       stage_config(stage, project.workspace.provenance), clean=[(discard, [stage.output.parent])])
