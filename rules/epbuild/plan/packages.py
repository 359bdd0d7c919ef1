"""Which builds a model package (`[packages.NAME]`) holds as variants, and which of its models' targets it leaves
out and why, as far as is known before anything runs: a target outside its `targets`, a vendor tool's program (not
an ONNX Runtime model), a target this host cannot build, a target whose validation is off, and a second target of
one model for the same EP and device: ONNX Runtime selects a variant by EP, device and the EP's compatibility
verdict, and where the EP cannot judge (QNN off-device says "not applicable") it takes the first declared, so a
second one would never be selected where it is validated (name the one to ship with `targets`). A variant whose
validation then does not pass (skipped, inconclusive) fails the package task instead: a package holds validated
variants only."""

from __future__ import annotations

from ..manifest.builds import Build, package_task
from ..manifest.parse import Manifest
from ..records import record
from ..steps.compilers import compiler
from ..steps.model_package import DEVICE_UNDECLARED


@record
class PackagePlan:
    name: str
    variants: tuple[Build, ...]  # single-model builds by model then target, then its groups' builds
    left_out: tuple[tuple[str, str], ...]  # (MODEL@TARGET or GROUP, why)

    @property
    def task(self) -> str:
        return package_task(self.name)


def plan_packages(manifest: Manifest, builds: list[Build], unavailable: dict[str, str]) -> list[PackagePlan]:
    singles = {b.name: b for b in builds if not b.shared}
    shared = {b.name: b for b in builds if b.shared}
    plans = []
    for spec in manifest.packages.values():
        variants: list[Build] = []
        left_out: list[tuple[str, str]] = []
        for model in spec.models:
            taken: dict[tuple[str, str | None], str] = {}  # (EP, declared device) -> the target that has it
            for target in manifest.models[model].targets:
                name = f"{model}@{target}"
                build = singles.get(name)
                if spec.targets is not None and target not in spec.targets:
                    left_out.append((name, f"not among [packages.{spec.name}] targets"))
                elif build is None:
                    left_out.append((name, "no build for it in this plan"))
                elif not compiler(build.target).in_onnxruntime:
                    left_out.append((name, f"a {build.target.compiler} program is not an ONNX Runtime model"))
                elif target in unavailable:
                    left_out.append((name, f"not built on this host: {unavailable[target]}"))
                elif not build.validates:
                    left_out.append((name, "its validation is off: a package holds validated variants only"))
                else:
                    ep = build.target.ep.name
                    slot = (ep, None if ep in DEVICE_UNDECLARED else build.target.device)
                    if slot in taken:
                        left_out.append((name, f"{taken[slot]} is the {ep} variant: ONNX Runtime selects one per EP "
                                               "and device where the EP cannot judge compatibility"))
                        continue
                    taken[slot] = target
                    variants.append(build)
        for group in spec.groups:
            build = shared.get(group)
            target = manifest.groups[group].target
            if build is None:
                left_out.append((group, "no build for it in this plan"))
            elif not compiler(build.target).in_onnxruntime:
                left_out.append((group, f"a {build.target.compiler} program is not an ONNX Runtime model"))
            elif target in unavailable:
                left_out.append((group, f"not built on this host: {unavailable[target]}"))
            elif not build.validates:
                left_out.append((group, "its validation is off: a package holds validated variants only"))
            else:
                variants.append(build)
        plans.append(PackagePlan(spec.name, tuple(variants), tuple(left_out)))
    return plans
