"""The job's side of a validation's CPU reference: computed once per (model, inputs) and kept in the caches like
other outputs, so that every target validating the same model, and a validation after a recompile, runs only
its artifact. The outputs are the reference child's (`epbuild.steps.reference`), saved where the cache adopts them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..execute.child import run_child
from ..execute.requests import ValidationReport, ValidationRequest
from ..manifest.builds import Build
from ..store.cache import Workspace, check_inputs, restore, store
from ..store.hashing import snapshot
from ..store.publish import copy_file, discard, scratch_dir
from .fingerprint import reference_fingerprint
from .reference import REFERENCE_FILES

SEPARATE_REFERENCE_BYTES = 2**30  # a model this big (with its weights) gets its CPU reference in a child of its own


def _large(build: Build) -> bool:
    member = build.members[0]
    return sum(p.stat().st_size for p in (member.model.path, *member.external)) >= SEPARATE_REFERENCE_BYTES


def run_against_reference(build: Build, workspace: Workspace, request: ValidationRequest, workdir: Path,
                           what: str, log: Path, timeout: float) -> ValidationReport:
    """One artifact run against its CPU reference, which is computed once per (model, inputs) and kept in the
    caches (`reference_fingerprint`): a target validating the same model restores it and runs the artifact
    alone. A reference not cached is computed in the artifact's child and stored from there; a large model's
    in a child of its own that ends before the artifact's starts (never both in memory), under the reference's
    lock, so that two targets never compute it at once (small ones may: cheaper than waiting)."""
    target, (member,) = build.target, request["members"].values()
    label, files = f"the CPU reference of validate:{build.name}", list(build.members[0].reference_files)
    inputs = snapshot(files)  # before they are hashed: what the child reads must be what the key names
    key = reference_fingerprint(build.members[0], member, workspace.hashes)
    restored, limits = workdir / "reference", target.limits(timeout)

    def artifact_child(extra: dict[str, Any]) -> ValidationReport:
        return run_child("epbuild.steps.validate", {**request, **extra}, workdir, limits, what, log,
                         target.ep.fork_server, target.ep.warm_validations)

    def origin(how: str) -> dict[str, Any]:  # for the build report: outside the validation's fingerprint
        return {"cpu_reference": {"from": how, "fingerprint": key}}

    def cached() -> bool:
        if restore(label, key, workspace, restored)[0] == REFERENCE_FILES:
            return True
        discard(restored)
        return False

    if cached():
        return {**artifact_child({"phase": "artifact", "reference": str(restored)}), **origin("cache")}
    if not _large(build):
        staging = _staging(workspace, key)
        try:
            report = artifact_child({"reference_to": str(staging)})
            if report.pop("reference_saved", False):
                check_inputs(label, inputs)
                store(label, key, workspace, staging, REFERENCE_FILES, {"kind": "reference"}, adopt=True)
            return {**report, **origin("computed")}
        finally:
            discard(staging)
    computed = None
    with workspace.cache.lock(key):
        if not cached():  # not computed by another target's validation meanwhile
            staging = _staging(workspace, key)
            try:
                computed = run_child("epbuild.steps.validate", {**request, "phase": "reference",
                                                                "reference_to": str(staging)}, staging,
                                     limits, f"{what}: the CPU reference", log.with_suffix(".ref.log"))
                if computed["status"] == "failed":
                    return computed
                check_inputs(label, inputs)
                restored.mkdir(parents=True, exist_ok=True)
                for name in REFERENCE_FILES:
                    copy_file(staging / name, restored / name)
                store(label, key, workspace, staging, REFERENCE_FILES, {"kind": "reference"}, adopt=True)
            finally:
                discard(staging)
    report = artifact_child({"phase": "artifact", "reference": str(restored)})
    if computed is None:
        return {**report, **origin("cache")}
    first, second = computed["usage"], report["usage"]  # both children: their time, the larger peak
    return {**report, **origin("computed"),
            "usage": {"seconds": round(first["seconds"] + second["seconds"], 3),
                      "peak_mb": max(first["peak_mb"], second["peak_mb"])}}


def _staging(workspace: Workspace, key: str) -> Path:
    """A folder of the cache that becomes the reference's entry (in artifacts/.scratch when the cache cannot be
    written)."""
    try:
        return workspace.cache.staging(key)
    except OSError as exc:
        workspace.cache.give_up(exc, "staging")
        return scratch_dir(workspace.layout.scratch_root, f"reference.{key[:16]}")
