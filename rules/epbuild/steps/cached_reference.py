"""The job's side of a validation's CPU reference: computed once per (model, inputs) and kept in the caches like
other outputs, so that every target validating the same model, and a validation after a recompile, runs only
its artifact. The outputs are the reference child's (`epbuild.steps.reference`), saved where the cache adopts them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..contracts.requests import ValidationReport, ValidationRequest
from ..contracts.statuses import ValidationMode, Verdict
from ..execute.child import run_child
from ..files.hashing import snapshot
from ..files.publish import discard, scratch_dir
from ..logs import warn
from ..manifest.builds import Build
from ..store.cache import Workspace, check_inputs, restore, store
from .fingerprint import pipeline_fingerprint, reference_fingerprint
from .pipeline import PIPELINE_FILES
from .reference import REFERENCE_FILES

SEPARATE_REFERENCE_BYTES = 2**30  # a model this big (with its weights) gets its CPU reference in a child of its own


def _large(build: Build) -> bool:
    member = build.members[0]
    return sum(p.stat().st_size for p in (member.model.path, *member.external)) >= SEPARATE_REFERENCE_BYTES


def run_against_reference(build: Build, workspace: Workspace, request: ValidationRequest, workdir: Path,
                          what: str, log: Path, timeout: float, reuse: bool) -> ValidationReport:
    """One artifact run against its CPU reference, which is computed once per (model, inputs) and kept in the
    caches (`reference_fingerprint`): a target validating the same model restores it and runs the artifact
    alone. A reference not cached is computed in the artifact's child and stored from there; a large model's
    in a child of its own that ends before the artifact's starts (never both in memory), under the reference's
    lock, so that two targets never compute it at once (small ones may: cheaper than waiting)."""
    (member,) = request["members"].values()
    label = f"the CPU reference of validate:{build.name}"
    inputs = snapshot(list(build.members[0].reference_files))  # before they are hashed: the child reads those
    key = reference_fingerprint(build.members[0], member, workspace.hashes, workspace.provenance)
    # among the artifacts, like every restore (the validation's own folder may be in a full cache)
    restored = _staging(workspace, key)
    target = build.target
    limits, fork_server = target.limits(timeout), target.ep.fork_server

    def artifact_child(extra: dict[str, Any]) -> ValidationReport:
        return run_child("epbuild.steps.validate", {**request, **extra}, workdir, limits, what, log,
                         ep=fork_server, reuse=reuse, expect=workspace.provenance)

    def origin(how: str) -> dict[str, Any]:  # for the build report: outside the validation's fingerprint
        return {"cpu_reference": {"from": how, "fingerprint": key}}

    def cached() -> bool:
        if restore(label, key, workspace, restored)[0] == REFERENCE_FILES:
            return True
        discard(restored)
        return False

    try:
        if cached():
            return {**artifact_child({"phase": "artifact", "reference": str(restored)}), **origin("cache")}
        if not _large(build):
            staging = _staging(workspace, key)
            try:
                report = artifact_child({"reference_to": str(staging)})
                _keep(report, staging, key, label, inputs, workspace)
                return {**report, **origin("computed")}
            finally:
                discard(staging)
        computed = None
        with workspace.cache.lock(key):
            if not cached():  # not computed by another target's validation meanwhile
                computed = run_child("epbuild.steps.validate", {**request, "phase": "reference",
                                                                "reference_to": str(restored)}, restored,
                                     limits, f"{what}: the CPU reference", log.with_suffix(".ref.log"),
                                     expect=workspace.provenance)
                if computed["status"] == Verdict.FAILED:
                    return computed
                if not _keep(computed, restored, key, label, inputs, workspace):
                    discard(restored)
        # the reference kept (cached or just computed), or where it could not be written computed again by the
        # artifact's child (a full disk costs the memory split, not the validation)
        report = artifact_child({"phase": "artifact", "reference": str(restored)} if restored.is_dir() else {})
        if computed is None:
            return {**report, **origin("cache")}
        first, second = computed["usage"], report["usage"]  # both children: their time, the larger peak
        return {**report, **origin("computed"),
                "usage": {"seconds": round(first["seconds"] + second["seconds"], 3),
                          "peak_mb": max(first["peak_mb"], second["peak_mb"])}}
    finally:
        discard(restored)


def run_group_against_references(build: Build, workspace: Workspace, request: ValidationRequest, workdir: Path,
                                 what: str, log: Path, timeout: float) -> ValidationReport:
    """A group whose members run here: each member's reference restored from the caches where one is kept
    (the same key as a standalone validation of that model: those of a full build are there), the others computed
    in the group's child and stored from there."""
    label = f"the CPU references of validate:{build.name}"
    runs = {m.name: m for m in build.members if request["members"][m.name]["mode"] == ValidationMode.RUN}
    inputs = snapshot([path for member in runs.values() for path in member.reference_files])
    keys = {name: reference_fingerprint(m, request["members"][name], workspace.hashes,
                                        workspace.provenance) for name, m in runs.items()}
    folders = {name: _staging(workspace, key) for name, key in keys.items()}
    try:
        restored = {name for name, key in keys.items()
                    if restore(label, key, workspace, folders[name])[0] == REFERENCE_FILES}
        report = run_child("epbuild.steps.validate", {
            **request, "references": {name: str(folders[name]) for name in restored},
            "references_to": {name: str(folders[name]) for name in keys if name not in restored}},
            workdir, build.target.limits(timeout), what, log, ep=build.target.ep.fork_server,
            reuse=build.target.ep.warm_validations, expect=workspace.provenance)
        answers = report.pop("references", {})
        for name, answer in answers.items():
            _keep(answer, folders[name], keys[name], label, inputs, workspace)
        origins = {name: {"from": "cache" if name in restored else "computed", "fingerprint": key}
                   for name, key in keys.items() if name in answers}
        return {**report, **({"cpu_reference": {"members": origins}} if origins else {})}
    finally:
        for folder in folders.values():
            discard(folder)


def run_pipeline_against_cache(build: Build, workspace: Workspace, request: ValidationRequest, workdir: Path,
                               what: str, log: Path, timeout: float) -> ValidationReport:
    """A pipeline group: its CPU run (prompt, then the token steps, on the source models) restored from the caches
    where one is kept (`pipeline_fingerprint`), else computed in the group's child and stored from there; the EP's
    run is compared with it step by step."""
    label = f"the CPU run of validate:{build.name}"
    inputs = snapshot([path for member in build.members for path in member.reference_files])
    key = pipeline_fingerprint(build, request, workspace.hashes, workspace.provenance)
    folder = _staging(workspace, key)
    try:
        kept = restore(label, key, workspace, folder)[0] == PIPELINE_FILES
        if not kept:
            discard(folder)
        pipeline = {**request["pipeline"], **({"cpu": str(folder)} if kept else {"cpu_to": str(folder)})}
        report = run_child("epbuild.steps.validate", {**request, "pipeline": pipeline}, workdir,
                           build.target.limits(timeout), what, log, ep=build.target.ep.fork_server,
                           reuse=build.target.ep.warm_validations, expect=workspace.provenance)
        if not kept:
            _keep(report, folder, key, label, inputs, workspace, PIPELINE_FILES, "pipeline")
        if "pipeline" not in report:  # it failed or was skipped before running the pipeline
            return report
        return {**report, "cpu_reference": {"from": "cache" if kept else "computed", "fingerprint": key}}
    finally:
        discard(folder)


def _keep(answer: dict[str, Any], folder: Path, key: str, label: str, inputs: dict[Path, list[int] | None],
          workspace: Workspace, files: list[str] = REFERENCE_FILES, kind: str = "reference") -> bool:
    """Store what a child saved in `folder` (`files`) under `key`, its inputs checked unchanged first; whether it
    saved it (one line when the disk refused it)."""
    if "reference_unsaved" in answer:
        warn(f"{label} could not be kept ({answer.pop('reference_unsaved')}); it is computed where it "
             "is needed")
    if not answer.pop("reference_saved", False):
        return False
    check_inputs(label, inputs)
    store(label, key, workspace, folder, files, {"kind": kind})
    return True


def _staging(workspace: Workspace, key: str) -> Path:
    """A scratch folder among the artifacts for the child to save the reference in; the cache copies it from
    there (a full or read-only cache costs one warning, never the validation)."""
    return scratch_dir(workspace.layout.scratch_root, f"reference.{key[:16]}")
