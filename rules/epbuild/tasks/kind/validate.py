"""`validate:MODEL@TARGET` and `validate:GROUP` tasks (the artifact run and compared with its source, or checked for
its structure), and `validate:MODEL`, every target of one model by its name alone."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ...manifest.builds import Build
from ...steps.fingerprint import validate_config
from ...steps.validate import REPORT
from ...steps.validation.fleet import chip
from ..actions import run_validate

if TYPE_CHECKING:
    from ..definitions import Task, Tasks

DOC = "run every compiled artifact and compare with its source"


def tasks(source: Tasks) -> Iterator[Task]:
    yield {"basename": "validate", "name": None, "doc": DOC}
    project = source.project
    for build in project.builds:
        name = build.validate_task
        if build.validates and not source.skipped(name):
            yield source.made_or(name, make, build)
    yield from source.per_model("validate", [b for b in project.builds if b.validates and not b.shared], "validate",
                                project.requested)


def make(source: Tasks, build: Build) -> Task:
    project = source.project
    if build.shared:
        doc = f"group {build.name}: structural checks, and each member run where this host loads the context"
    elif build.soc_reports:
        doc = (f"{build.members[0].name} on {build.target.name}: the multi-SoC binary's structure, and each SoC "
               f"compiled alone and run: {', '.join(chip(soc) for soc, _ in build.soc_reports)}")
    else:
        what = ("structural checks" if build.members[0].validation.mode == "structural"
                else "run, compare with the source on CPU")
        doc = f"{build.members[0].name} on {build.target.name}: {what}"
    refused = source.unavailable("validate", build, doc)
    if refused:
        return refused
    out, config = source.out(build)[1], validate_config(build, project.root, project.workspace.provenance)
    external = [p for m in build.members for p in m.external]
    inputs: list[Path | str] = [*(os.path.join(out, name) for name in build.outputs), *build.sources, *external,
                                *build.validation_files]
    return source.task("validate", build.name, doc, run_validate, [build, project.workspace, config], inputs,
                       [os.path.join(out, REPORT)], config)
