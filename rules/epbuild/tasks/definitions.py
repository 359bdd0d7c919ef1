"""A loaded project (`tasks.project.Project`) as doit's task dicts and settings: one `Tasks` per run, whose
generators `epbuild.dodo` hands to doit. Every task's files are spelled relative to doit's folder, and its settings
are compared with those it last succeeded with (`store.task_configs`)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..errors import UserError, closest
from ..execute.memory_ledger import check_settings, default_jobs
from ..fast_path import DOIT_BASE, Listing, listed
from ..fast_path import enabled as fast_path_enabled
from ..invocation import Invocation
from ..manifest.builds import Build
from ..manifest.stage import Stage
from ..plan.packages import PackagePlan, plan_packages
from ..state.hash_memory import FileHashes
from ..steps.compilers import compiler
from ..store.task_configs import ConfigRecord
from .actions import refuse_blocked, refuse_unavailable
from .checker import HashChecker
from .kinds import BLOCKED, BY_NAME, KINDS, UNAVAILABLE, is_subtask
from .loading import load_project
from .project import Project, in_shard, shard_keys
from .reporter import BuildReporter, ReportedRun
from .run_record import RunRecord
from .selection import Recorded, identities, runnable

if TYPE_CHECKING:
    from ..execute.warm_start import Candidate

Task = dict[str, Any]
Made = TypeVar("Made", bound="Task | None")


class SettingsChanged:
    """doit's `uptodate` for a task whose settings differ from those it last succeeded with: false, and what
    `doit info` prints for it is the change itself."""

    def __init__(self, task: str, configs: ConfigRecord):
        self.task, self.configs = task, configs

    def __call__(self) -> bool:
        return False

    def __str__(self) -> str:
        return self.configs.explained(self.task)


class Tasks:
    """The task generators of one loaded project (and its doit settings)."""

    def __init__(self, project: Project):
        self.project = project
        self.selection: set[str] | None = None  # a default run's tasks for doit (tasks.selection); None: all
        self.record: Recorded | None = None  # the last run's record, when it holds
        self.hidden: list[str] = []  # the others, up to date by that record
        self._made: dict[str, Task | None] = {}  # task dicts made while selecting (None: no such task)
        self._outs: dict[str, tuple[Path, str]] = {}

    def out(self, build: Build) -> tuple[Path, str]:
        """The build's output folder, and as doit spells it: made once per run (its compile and its validation
        both need it, and a selecting run makes every task twice)."""
        found = self._outs.get(build.name)
        if found is None:
            folder = build.out_dir(self.project.layout)
            found = self._outs[build.name] = (folder, self.project.rel(folder))
        return found

    def _select(self, default: list[str]) -> list[str]:
        """On a default run whose last run's record holds, keep only the tasks that can run (`tasks.selection`),
        making only the task dicts that may differ from the record."""
        project = self.project
        if project.key is None or project.command == "list" or not fast_path_enabled():
            return default
        record = RunRecord(project.layout).load(project.key)
        if record is None:
            return default
        planned = self._planned()
        suspects = self._suspects(record) if record.read_the_same() else None
        self.selection, self._made = runnable(planned, lambda name: self._make(name, planned.get(name)), record,
                                              suspects)
        self.record = record
        self.hidden = [name for name in planned if name not in self.selection and name in record.tasks
                       and self._made.get(name, True) is not None]
        return [name for name in default if name in self.selection or not is_subtask(name)]

    def _planned(self) -> dict[str, Build | Stage | PackagePlan]:
        """Every task of the plan that does work, by name, with the build, stage or package it is made from."""
        project = self.project
        planned: dict[str, Build | Stage | PackagePlan] = {stage.task: stage for stage in project.stages.values()}
        planned.update(self.packages)
        for build in project.builds:
            planned[build.task] = build
            if build.validates:
                planned[build.validate_task] = build
            if compiler(build.target).operator_check and build.target.name not in project.unavailable:
                planned[build.ops_task] = build
        return planned

    def _make(self, name: str, source: Build | Stage | PackagePlan | None) -> Task | None:
        """One task, by its kind's `make` (a stage's task is named for the stage: `shape:m`)."""
        if source is None:
            return None
        return BY_NAME["stages" if isinstance(source, Stage) else name.partition(":")[0]].make(self, source)

    def _suspects(self, record: Recorded) -> set[str]:
        """The tasks of every model whose file changed: what task creation read of it may differ (its stages,
        inputs and external data), so their dicts are compared with the record even where their files are not
        the model's; and those of targets this host cannot build."""
        project = self.project
        changed = {name for name, model in project.manifest.models.items()
                   if not all(record.unchanged(project.rel(path))
                              for path in (model.path, *project.external.get(model.path, ())))}
        found: set[str] = set()
        for build in project.builds:  # a target this host cannot build now has refusing tasks, never the record's
            if build.target.name in project.unavailable or changed.intersection(m.name for m in build.members):
                found |= {build.task, build.validate_task, build.ops_task, *(s.task for s in build.stages)}
        return found

    def made_or(self, name: str, make: Callable[[Tasks, Any], Made], item: Any) -> Made:
        """Task `name`, as made while selecting, else by `make` (its kind's) from `item` now."""
        return cast(Made, self._made[name]) if name in self._made else make(self, item)

    def skipped(self, task: str) -> bool:
        return self.selection is not None and task not in self.selection

    @functools.cached_property
    def default_tasks(self) -> list[str]:
        """What a plain `doit` runs: every build this host can build (in this shard), the packages, and the lines
        for the targets it cannot build and the builds that wait for a fix to the manifest (`blocked`, last)."""
        project = self.project
        keys = shard_keys(project.builds) if project.shard else {}
        builds = [b for b in project.builds_here() if in_shard(b, project.shard, keys)]
        default = [name for b in builds for name in project.task_names(b)]
        default += list(self.packages)
        if project.unavailable:
            default.append(UNAVAILABLE)
        default = self._select(default)
        if self.project.blocked_builds():
            default.append(BLOCKED)
        return default

    def doit_config(self) -> dict[str, Any]:
        project = self.project
        default = self.default_tasks
        # the outputs of the tasks doit is handed (all, without a selection), by their paths relative to the project;
        # doit's are relative to its folder
        recorded = project.configs.published_files(self.selection)
        inside = project.rel(project.root)
        published = recorded if inside == "." else {os.path.join(inside, p): v for p, v in recorded.items()}
        checker = partial(HashChecker, FileHashes(project.layout.state), published, project.checked, project.edited)
        looked_at = identities([project.rel(path) for path in project.looked_at]) if project.key else {}
        reporter = BuildReporter.for_run(ReportedRun(project, self.hidden, self.record, looked_at))
        # Live: doit captures each task's output (verbosity 1) and the reporter prints it above the status area;
        # threads share one sys.stdout, which doit's capture would race on, so there the status area catches prints.
        verbosity = 1 if project.live and not project.threads else 2
        check_settings(project.manifest.build.memory_gb)
        return {**DOIT_BASE, "verbosity": verbosity, "default_tasks": default, "check_file_uptodate": checker,
                "reporter": reporter, "num_process": default_jobs(configured=project.manifest.build.jobs)}

    def task(self, basename: str, name: str, doc: str, action: Any, args: list[Any],
              file_dep: Iterable[Path | str] = (), targets: Iterable[Path | str] = (),
              config: dict[str, Any] | None = None, **extra: Any) -> Task:
        """One doit task: files spelled relative to doit's folder (a str is spelled so already: paths inside an
        output folder, joined as strings, cost a tenth of pathlib's joins), settings compared with those it last
        succeeded with (`config`; None: it always runs). With `-P thread`,
        doit's output capture is off: it swaps sys.stdout per running task, and CPython 3.11's print() holds a
        borrowed reference to sys.stdout, so a swap in another thread can free it mid-print (a segfault)."""
        task, rel = f"{basename}:{name}", self.project.rel
        unchanged = config is not None and self.project.configs.unchanged(task, config)
        return {"basename": basename, "name": name, "doc": doc, "actions": [(action, args)],
                "file_dep": [p if isinstance(p, str) else rel(p) for p in file_dep],
                "targets": [p if isinstance(p, str) else rel(p) for p in targets],
                "uptodate": [unchanged or (config is not None and SettingsChanged(task, self.project.configs))],
                **({"io": {"capture": False}} if self.project.threads else {}), **extra}

    def unavailable(self, basename: str, build: Build, doc: str) -> Task | None:
        """The task of a target this host cannot build: listed with the reason, refused by name; the task of a
        build that waits for a fix to the manifest: listed with it, failing with it; None if it can be built."""
        task = f"{basename}:{build.name}"
        if task in self.project.blocked:
            return self.blocked(basename, build.name, doc)
        reason = self.project.unavailable.get(build.target.name)
        if reason is None:
            return None
        return self.task(basename, build.name, f"{doc} [unavailable here: {reason}]", refuse_unavailable,
                          [task, reason, task in self.project.requested])

    def blocked(self, basename: str, name: str, doc: str) -> Task:
        """The task of a build or stage that waits for a fix to the manifest: listed with it, failing with it."""
        why = self.project.blocked[f"{basename}:{name}"]
        return self.task(basename, name, f"{doc} [blocked: {why.key_path} needs a fix]", refuse_blocked,
                         [f"{basename}:{name}", why])

    @staticmethod
    def per_model(basename: str, builds: list[Build], verb: str,
                   wanted: frozenset[str] | None = None) -> Iterator[Task]:
        """compile:MODEL and validate:MODEL: every target of one model by its name alone (a target this host
        cannot build is skipped with its reason, as in the default run). Made only when named on the command line
        (`wanted`; None: all): a listing of 10,000 models stays 10,000 compile lines."""
        names: dict[str, list[str]] = {}
        for build in builds:
            names.setdefault(build.members[0].name, []).append(f"{basename}:{build.name}")
        for model, tasks in names.items():
            if wanted is not None and f"{basename}:{model}" not in wanted:
                continue
            yield {"basename": basename, "name": model, "doc": f"{verb} {model} for each of its {len(tasks)} "
                   f"target(s)", "actions": None, "task_dep": tasks}

    @functools.cached_property
    def packages(self) -> dict[str, PackagePlan]:
        """The model packages of the manifest, by task name (none in a sharded run: a package spans shards)."""
        project = self.project
        if project.shard:
            return {}
        return {plan.task: plan for plan in plan_packages(project.manifest, project.builds, project.unavailable,
                                                          project.blocked)}

    def announced_by_workers(self, config: dict[str, Any]) -> bool:
        """Whether each task's worker says its `.  name` line itself, before its own lines: with doit's worker
        processes (`-n 1` or more; 0 is its serial runner) the main process says it when the worker's message
        reaches it, which a task restored from the cache outran (its `passed ...` line came first). Not with a
        live status area (it shows what runs), nor with threads (their output is not captured), nor for commands
        that build nothing."""
        project = self.project
        given = project.invocation.processes
        processes = given if given is not None else config.get("num_process") or 0
        return processes >= 1 and not project.live and not project.threads and not project.invocation.inspecting

    def wants(self, kind: str) -> bool:
        """Whether doit is handed `kind`'s generator at all (`TaskKind.wanted`)."""
        return BY_NAME[kind].wanted(self)

    def save_listing(self) -> None:
        """What `doit list` shows, for the next one under the same key (epbuild.fast_path)."""
        # a generator that yields nothing is still a (blank) group in doit's listing: `stages` without a stage
        project = self.project
        if project.key is None:  # no shortcut for this run (an executor's): no listing to answer the next with
            return
        read = [model.path for model in project.manifest.models.values()]
        read += [path for files in project.external.values() for path in files]
        Listing(project.layout).write(project.key, {
            kind.name: [listed(task) for task in kind.tasks(self)] or [{"basename": kind.name}]
            for kind in KINDS if self.wants(kind.name)}, [*read, *project.looked_at])

    def every_task(self) -> list[Task]:
        """Every task dict that can be named, the inspecting ones and every per-model selection included."""
        return [*self.all_tasks(), *self.per_model("compile", [b for b in self.project.builds if not b.shared],
                                                    "compile"),
                *self.per_model("validate", [b for b in self.project.builds if b.validates and not b.shared],
                                 "validate"),
                *(task for kind in KINDS if not kind.work for task in kind.tasks(self))]

    def all_tasks(self) -> list[Task]:
        """The tasks that do work (the graph's nodes): not the per-model selections, which only name others."""
        every = [task for kind in KINDS if kind.work for task in kind.tasks(self)]
        return [task for task in every if task.get("actions") is not None or not task.get("name")]



def load_full_project(manifest_path: Path, invocation: Invocation, early: Candidate | None = None,
                      key: str | None = None) -> Tasks:
    """The project with all its tasks (`epbuild.dodo` loads this when no shortcut holds); a user error prints one
    line and exits 2, without a traceback."""
    try:
        project = load_project(manifest_path, invocation, early, key)
        default_jobs(configured=project.manifest.build.jobs)  # EPBUILD_JOBS checked here: one line, not doit's trace
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    tasks = Tasks(project)
    named = invocation.tasks
    if named:
        known = {f"{t['basename']}:{t['name']}" if t.get("name") else t["basename"] for t in tasks.every_task()}
        for name in named:
            if name not in known and not any(char in name for char in "*?[") and not Path(name).exists():
                print(f"error: no task '{name}'{closest(name, known)}; `doit list` shows every task",
                      file=sys.stderr)
                raise SystemExit(2)
    if invocation.listing and project.writable:
        tasks.save_listing()
    return tasks
