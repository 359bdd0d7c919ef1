"""`package:NAME`: an ONNX Runtime model package of a model's validated artifacts (`plan.packages`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ...files.publish import discard
from ...plan.packages import PackagePlan
from ...steps.packaging.model_package import package_files
from ...steps.validate import REPORT
from ...version import RULES_FORMAT
from ..actions import run_package

if TYPE_CHECKING:
    from ..definitions import Task, Tasks

DOC = "ONNX Runtime model packages of validated artifacts"


def tasks(source: Tasks) -> Iterator[Task]:
    # the group even when none is declared: doit lists a generator that yields nothing as a blank group anyway
    yield {"basename": "package", "name": None, "doc": DOC}
    for name, plan in source.packages.items():
        if not source.skipped(name):
            yield source.made_or(name, make, plan)


def make(source: Tasks, plan: PackagePlan) -> Task:
    project = source.project
    folder = project.rel(project.layout.package_dir(plan.name))
    inputs, needs = [], []
    for build in plan.variants:
        out = source.out(build)[1]
        inputs += [os.path.join(out, name) for name in build.outputs] + [os.path.join(out, REPORT)]
        needs.append(build.validate_task)
    config = {"rules_format": RULES_FORMAT, "code": project.workspace.provenance.code,
              "variants": [b.name for b in plan.variants], "left_out": [list(pair) for pair in plan.left_out]}
    files = package_files(list(plan.variants), project.workspace.hashes)
    return source.task("package", plan.name, f"model package {plan.name}: {len(plan.variants)} variant(s) -> {folder}/",
                       run_package, [plan, project.workspace], inputs, [os.path.join(folder, name) for name in files],
                       config, clean=[(discard, [project.layout.package_dir(plan.name)])], task_dep=needs)
