"""`compile:MODEL@TARGET` (kind "compile") and `group:NAME` (kind "group", a shared context) tasks, and
`compile:MODEL`, every target of one model by its name alone."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ...files.publish import discard
from ...manifest.builds import Build, compile_task
from ...steps.compilers import compiler
from ...steps.fingerprint import compile_config
from ...steps.validation.fleet import chip
from ..actions import run_compile
from . import reduce

if TYPE_CHECKING:
    from ..definitions import Task, Tasks

DOCS = {"compile": "compile every model for each of its targets", "group": "compile every shared-context group"}


def tasks(source: Tasks, kind: str) -> Iterator[Task]:
    yield {"basename": kind, "name": None, "doc": DOCS[kind]}
    project = source.project
    for build in project.builds:
        if build.kind == kind and not source.skipped(build.task):
            yield source.made_or(build.task, make, build)
    if kind == "compile":
        yield from source.per_model("compile", [b for b in project.builds if not b.shared], "compile",
                                    project.requested)
        yield from reduce.tasks(source)


def make(source: Tasks, build: Build) -> Task:
    project = source.project
    target, (out_dir, out) = build.target, source.out(build)
    if build.shared:
        doc = f"{', '.join(m.name for m in build.members)} into one shared context for {target.name} ({target.ep.name})"
    elif target.fleet:
        doc = (f"{build.members[0].name} for {target.fleet}'s SoC {chip(target.options['soc_model'])} alone "
               f"({target.ep.name}): the one its validation runs")
    else:
        socs = f", SoCs {', '.join(chip(soc) for soc in target.socs)}" if target.socs else ""
        doc = f"{build.members[0].name} for {target.name} ({target.ep.name}, {target.device}{socs})"
    refused = source.unavailable(build.kind, build, doc)
    if refused:
        return refused
    checks = [build.ops_task] if compiler(target).operator_check else []
    if build.shared:  # the members alone first: the group's artifact.json compares the binaries' sizes
        checks += [compile_task(m.name, target.name) for m in build.members if target.name in m.model.targets]
    return source.task(build.kind, build.name, f"{doc} -> {out}/", run_compile, [build, project.workspace],
                       build.inputs, [os.path.join(out, name) for name in build.outputs],
                       compile_config(build, project.root, project.workspace.provenance),
                       clean=[(discard, [out_dir])], task_dep=checks)
