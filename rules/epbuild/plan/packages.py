"""Which builds a model package (`[packages.NAME]`) holds as variants, and which of its models' targets it leaves
out and why, as far as is known before anything runs: a target outside its `targets`, a vendor tool's program (not
an ONNX Runtime model), a target this host cannot build, a target whose validation is off, and a second target of
one model for the same EP and device: ONNX Runtime selects a variant by EP, device and the EP's compatibility
verdict, and where the EP cannot judge (QNN off-device says "not applicable") it takes the first declared, so a
second one would never be selected where it is validated (name the one to ship with `targets`). A variant whose
validation then does not pass (skipped, inconclusive) fails the package task instead: a package holds validated
variants only."""

from __future__ import annotations

from collections.abc import Mapping

from ..manifest.builds import Build, package_task
from ..manifest.parse import Manifest
from ..records import record
from ..steps.compilers import compiler
from ..steps.packaging.model_package import UNDECLARED


@record
class PackagePlan:
    name: str
    variants: tuple[Build, ...]  # single-model builds by model then target, then its groups' builds
    left_out: tuple[tuple[str, str], ...]  # (MODEL@TARGET or GROUP, why)

    @property
    def task(self) -> str:
        return package_task(self.name)


def plan_packages(manifest: Manifest, builds: list[Build], unavailable: dict[str, str],
                  blocked: Mapping[str, object]) -> list[PackagePlan]:
    singles = {b.name: b for b in builds if not b.shared}
    shared = {b.name: b for b in builds if b.shared}
    plans = []
    for spec in manifest.packages.values():
        variants: list[Build] = []
        left_out: list[tuple[str, str]] = []
        for model in spec.models:
            chosen: list[Build] = []
            taken: dict[tuple[str, str | None], str] = {}  # (EP, declared device) -> the target that has it
            for target in manifest.models[model].targets:
                name, build = f"{model}@{target}", singles.get(f"{model}@{target}")
                why = (f"not among [packages.{spec.name}] targets" if spec.targets is not None
                       and target not in spec.targets else _left_out(build, target, unavailable, blocked))
                if why is None:
                    assert build is not None  # `_left_out` gives a reason for a target without a build
                    ep = build.target.ep.name
                    slot = (ep, None if ep in UNDECLARED else build.target.device)
                    if slot in taken:
                        why = (f"{taken[slot]} is the {ep} variant: ONNX Runtime selects one per EP and device where "
                               "the EP cannot judge compatibility")
                    taken.setdefault(slot, target)
                if why is None and build is not None:
                    chosen.append(build)
                else:
                    left_out.append((name, why or "no build for it in this plan"))
            # by target name: one variant per EP and device, so their order means nothing to ONNX Runtime's
            # selection, and reordering a model's targets changes no package (which target a slot takes does)
            variants.extend(sorted(chosen, key=lambda build: build.target.name))
        for group in spec.groups:
            build = shared.get(group)
            why = _left_out(build, manifest.groups[group].target, unavailable, blocked)
            if why is None and build is not None:
                variants.append(build)
            else:
                left_out.append((group, why or "no build for it in this plan"))
        plans.append(PackagePlan(spec.name, tuple(variants), tuple(sorted(left_out))))
    return plans


def _left_out(build: Build | None, target: str, unavailable: dict[str, str],
              blocked: Mapping[str, object]) -> str | None:
    """Why a model's or group's build cannot be a variant, as far as the plan knows; None: it can."""
    if build is None:
        return "no build for it in this plan"
    if not compiler(build.target).in_onnxruntime:
        return f"a {build.target.compiler} program is not an ONNX Runtime model"
    if target in unavailable:
        return f"not built on this host: {unavailable[target]}"
    if build.task in blocked:
        return f"not built: {blocked[build.task]}"
    if not build.validates:
        return "its validation is off: a package holds validated variants only"
    if build.members[0].validation.mode == "structural":
        return 'its validation is structural (nothing run): a package holds variants whose outputs passed only'

    return None
