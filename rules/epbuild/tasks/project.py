"""A manifest loaded into everything task creation needs, computed once per run (`tasks.loading` makes it): the
manifest as planned, the artifacts folder and cache, the models' external data, the builds and stages, each target's
availability on this host (or on the Dask workers); and what the tasks ask of it."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import UserError, closest
from ..files.layout import PACKAGES, STAGES, Layout
from ..invocation import Invocation
from ..manifest.builds import Build, package_task
from ..manifest.parse import Manifest
from ..manifest.stage import Stage
from ..plan.declared_inputs import Blocked
from ..plan.packages import plan_packages
from ..store.cache import Workspace
from ..store.task_configs import ConfigRecord


class Relative:
    """One canonical spelling per file (doit does not normalise paths): relative to doit's working folder.

    String slicing, not os.path.relpath: this runs several times per task and relpath dominated `doit list`.
    """

    def __init__(self, root: Path):
        self.root = f"{root}{os.sep}"
        self.prefix = os.path.relpath(root)

    def __call__(self, path: Path) -> str:
        text = str(path)
        if not text.startswith(self.root):
            return os.path.relpath(text)
        inside = text[len(self.root):]
        return inside if self.prefix == "." else os.path.join(self.prefix, inside)


@dataclasses.dataclass(frozen=True)
class Availability:
    """Which targets this host (or, with an executor, the cluster) cannot build, and why; what was probed."""

    caps: dict[str, Any]  # the EP probe, empty when nothing needed it
    unavailable: dict[str, str]  # target name -> why
    looked_at: list[Path]  # besides the tasks' files: what task creation looked at (toolchain probes, configs)


@dataclasses.dataclass(eq=False, kw_only=True)
class Project:
    """A loaded manifest with everything task creation needs. Its run's state (`checked`, `edited`) is filled by
    doit's file checker during the run."""

    invocation: Invocation  # this run's command line: a task this host cannot build fails when named
    key: str | None  # the project key, when this run's outcome may let the next one skip loading (`fast_path`)
    manifest: Manifest
    layout: Layout
    writable: bool
    workspace: Workspace
    external: dict[Path, tuple[Path, ...]]  # by path: each model's external-data files
    builds: list[Build]
    stages: dict[str, Stage]
    availability: Availability
    configs: ConfigRecord
    shard: tuple[int, int] | None
    live: bool  # a status area under the tasks
    rel: Relative
    blocked: dict[str, Blocked]  # task -> the manifest fix it waits for (a model's NPU targets need static shapes)
    checked: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # unchanged, as the checker saw them
    edited: set[str] = dataclasses.field(default_factory=set)  # published files found changed since
    # a build's freshly made plan, saved while its jobs run (`tasks.run_end.PlanSave`); None: nothing to save
    save_plan: Callable[[], None] | None = None

    @functools.cached_property  # asked per task: read once
    def command(self) -> str | None:
        return self.invocation.first

    @functools.cached_property  # asked per task: read once
    def requested(self) -> frozenset[str]:
        return frozenset(self.invocation.argv)

    @functools.cached_property  # asked per task: read once
    def threads(self) -> bool:
        return self.invocation.threads

    @property
    def root(self) -> Path:
        return self.manifest.root

    @property
    def caps(self) -> dict[str, Any]:
        return self.availability.caps

    @property
    def unavailable(self) -> dict[str, str]:
        return self.availability.unavailable

    @property
    def looked_at(self) -> list[Path]:
        return self.availability.looked_at

    @staticmethod
    def task_names(build: Build) -> list[str]:
        return [build.task, *([build.validate_task] if build.validates else [])]

    def builds_here(self) -> list[Build]:
        """The builds a default run takes: those this host can build and whose manifest holds."""
        return [b for b in self.builds if b.target.name not in self.unavailable and b.task not in self.blocked]

    def blocked_builds(self) -> dict[str, Blocked]:
        """The compile and validation tasks of this shard's builds that wait for a fix to the manifest, and why."""
        keys = shard_keys(self.builds) if self.shard else {}
        return {name: self.blocked[name] for b in self.builds if in_shard(b, self.shard, keys)
                for name in self.task_names(b) if name in self.blocked}

    def skipped(self) -> dict[str, str]:
        return {name: self.unavailable[b.target.name] for b in self.builds
                if b.target.name in self.unavailable for name in self.task_names(b)}

    def owned_paths(self) -> set[Path]:
        """What the current tasks publish and log: artifact and group folders, stage outputs, model packages and
        their variants' logs, reductions' repro folders, log files."""
        owned = set()
        for build in self.builds:
            owned |= {build.out_dir(self.layout), self.layout.repro_dir(build.name),
                      *(build.log(self.layout, step) for step in ("compile", "validate", "ops"))}
        for stage in self.stages.values():
            owned |= {stage.output.parent, self.layout.log(STAGES, stage.task.replace(":", "."))}
        for plan in plan_packages(self.manifest, self.builds, self.unavailable, self.blocked):
            owned |= {self.layout.package_dir(plan.name),
                      *(self.layout.log(PACKAGES, f"{plan.name}.{build.name}") for build in plan.variants)}
        return owned

    def declared_tasks(self) -> set[str]:
        """Every task the manifest declares now, built here or not."""
        return {*self.stages, *(name for build in self.builds for name in (*self.task_names(build),
                                                                         build.ops_task, build.reduce_task)),
                *(package_task(name) for name in self.manifest.packages)}

    def model_tasks(self, model: str) -> set[str]:
        """The task names of one model: its stages, and every build it is a member of with its checks."""
        if model not in self.manifest.models:
            raise UserError(self.manifest.path.name, None, f"no model '{model}'{closest(model, self.manifest.models)};"
                            f" models: {', '.join(self.manifest.models)}")
        names = set()
        for build in self.builds:
            if model in (m.name for m in build.members):
                names |= {build.task, build.validate_task, build.ops_task, *(s.task for s in build.stages)}
        return names


def shard_keys(builds: list[Build]) -> dict[str, str]:
    """Each build's shard key: the first model name (sorted) of the models linked to it through groups. A group
    needs its members' own compiles (its artifact.json compares sizes), so the group and every build of each of
    its members fall in one shard: a shard is closed under what its tasks need, and no task is built by two."""
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent.setdefault(name, name) != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for build in builds:
        names = sorted(root(m.name) for m in build.members)
        for name in names[1:]:
            parent[name] = names[0]
    return {build.name: root(build.members[0].name) for build in builds}


def in_shard(build: Build, shard: tuple[int, int] | None, keys: dict[str, str]) -> bool:
    """A stable hash partition by linked models (`shard_keys`), so a model's stages and its groups stay in one
    shard."""
    if shard is None:
        return True
    key = keys[build.name]
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % shard[1] == shard[0] - 1


