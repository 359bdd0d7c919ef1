"""The plan of a run, as a function: the manifest read and its targets resolved, the models' facts (what reading
them found), and the last saved plan in, the builds and stages out. It writes nothing and starts nothing (what a run
does to the world is `tasks.run_start`'s), so the loader, a test or a tool can plan without building."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..execute.provenance import Provenance
from ..manifest.builds import Build, ResolvedTarget
from ..manifest.parse import Manifest
from ..manifest.stage import Stage
from ..records import record
from .declared_inputs import Blocked, ModelInputs, check_declared_inputs, resolve_dims
from .saved_plan import Plan
from .targets import plan

# what reading the models found: each model's (and validation reference's) external-data files by path, each
# model's inputs and graph facts by name (`plan.external_data.ExternalDataIndex`)
Facts = tuple[dict[Path, tuple[Path, ...]], dict[str, ModelInputs], dict[str, dict[str, bool]]]


@record
class Planned:
    """The builds and stages of a run, its manifest as planned (the models' facts applied), why some models' NPU
    builds wait (`blocked`), and the plan to save when it was made afresh (`fresh`; None: taken from `last`)."""

    manifest: Manifest
    builds: list[Build]
    stages: dict[str, Stage]
    blocked: dict[str, Blocked]
    fresh: Plan | None


def planned(manifest: Manifest, resolved: dict[str, ResolvedTarget], facts: Facts, last: Plan | None,
            provenance: Provenance) -> Planned:
    """The last plan when it was planned from the same manifest, files and facts; else a fresh one from the
    manifest as read (the last plan's, when it was taken for the manifest: `last.as_read`)."""
    digest = Plan.digest(facts)
    if last is not None and last.facts == digest:
        return Planned(last.manifest, last.builds, last.stages, last.blocked, None)
    external, shapes, graphs = facts
    read = manifest if last is None else last.as_read()
    manifest = with_graph_facts(resolve_dims(read, shapes), graphs)
    builds, stages = plan_builds(manifest, external, resolved)
    blocked = check_declared_inputs(manifest, builds, shapes)
    # the manifest as read: the last plan's text when it was taken for the manifest, else made when saved
    fresh = Plan(None if last is None else last.read, resolved, digest, manifest, builds, stages, provenance.code,
                 provenance.versions, blocked)
    return Planned(manifest, builds, stages, blocked, fresh)


def plan_builds(manifest: Manifest, external: dict[Path, tuple[Path, ...]],
                resolved: dict[str, ResolvedTarget]) -> tuple[list[Build], dict[str, Stage]]:
    """The builds and their stages."""
    builds = plan(manifest, external, resolved)
    stages: dict[str, Stage] = {}
    for stage in (stage for b in builds for stage in b.stages):  # one name, one input and output
        assert stages.setdefault(stage.task, stage) == stage, f"two stages named {stage.task}"
    return builds, stages


def with_graph_facts(manifest: Manifest, graphs: dict[str, dict[str, bool]]) -> Manifest:
    """The manifest with what the model reading found: whether each model is already static (no shape stage), has
    nodes that only compute constants (else no fold stage), and its ai.onnx opset (an upgrade stage below an EP's)."""
    return dataclasses.replace(manifest, models={
        name: dataclasses.replace(model, graph_ready=graphs[name]["static"], constant_nodes=graphs[name]["foldable"],
                                  opset=graphs[name]["opset"])
        for name, model in manifest.models.items()})
