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
from typing import TYPE_CHECKING, Any

from ..errors import UserError, closest
from ..execute.memory_ledger import check_settings, default_jobs
from ..fast_path import DOIT_BASE, Listing, listed
from ..fast_path import enabled as fast_path_enabled
from ..files.publish import discard
from ..invocation import Invocation
from ..manifest.builds import Build, compile_task
from ..manifest.stage import Stage
from ..plan.packages import PackagePlan, plan_packages
from ..state.folder import StateFolder
from ..state.hash_memory import FileHashes
from ..steps.compilers import compiler
from ..steps.fingerprint import compile_config, stage_config, validate_config
from ..steps.packaging.model_package import package_files
from ..steps.validate import REPORT
from ..steps.validation.fleet import chip
from ..store.task_configs import ConfigRecord
from ..version import RULES_FORMAT
from .actions import (
    fail_blocked,
    refuse_blocked,
    refuse_unavailable,
    report_unavailable,
    run_compile,
    run_ops,
    run_package,
    run_reduce,
    run_stage_task,
    run_validate,
)
from .checker import HashChecker
from .commands import run_prune, show_backends, show_cache, show_graph
from .kinds import KINDS, UNAVAILABLE, is_subtask
from .loading import load_project
from .project import Project, in_shard, shard_keys
from .reporter import BuildReporter, ReportedRun
from .run_record import RunRecord
from .selection import Recorded, identities, runnable

if TYPE_CHECKING:
    from ..execute.warm_start import Candidate

Task = dict[str, Any]


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

    def _out(self, build: Build) -> tuple[Path, str]:
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
        if source is None:
            return None
        if isinstance(source, Stage):
            return self._stage_task(source)
        if isinstance(source, PackagePlan):
            return self._package_task(source)
        by_kind = {"validate": self._validate_task, "ops": self._ops_task}  # else compile: or group:
        return by_kind.get(name.partition(":")[0], self._build_task)(source)

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

    def _made_or(self, name: str, make: Callable[..., Task | None], *args: Any) -> Task | None:
        return self._made[name] if name in self._made else make(*args)

    def _skipped(self, task: str) -> bool:
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
            default.append("blocked")
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

    def _task(self, basename: str, name: str, doc: str, action: Any, args: list[Any],
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

    def _unavailable(self, basename: str, build: Build, doc: str) -> Task | None:
        """The task of a target this host cannot build: listed with the reason, refused by name; the task of a
        build that waits for a fix to the manifest: listed with it, failing with it; None if it can be built."""
        task = f"{basename}:{build.name}"
        if task in self.project.blocked:
            return self._blocked(basename, build.name, doc)
        reason = self.project.unavailable.get(build.target.name)
        if reason is None:
            return None
        return self._task(basename, build.name, f"{doc} [unavailable here: {reason}]", refuse_unavailable,
                          [task, reason, task in self.project.requested])

    def build_tasks(self, kind: str) -> Iterator[Task]:
        """compile:MODEL@TARGET (kind "compile") or group:NAME (kind "group") tasks."""
        yield {"basename": kind, "name": None, "doc": "compile every model for each of its targets" if kind ==
               "compile" else "compile every shared-context group"}
        for build in self.project.builds:
            if build.kind == kind and not self._skipped(build.task):
                yield self._made_or(build.task, self._build_task, build)  # type: ignore[misc]
        if kind == "compile":
            yield from self._per_model("compile", [b for b in self.project.builds if not b.shared], "compile",
                                       self.project.requested)
            yield from self._reduce_tasks()

    def _reduce_tasks(self) -> Iterator[Task]:
        """reduce:MODEL@TARGET, made only when named (`epbuild reduce compile:MODEL@TARGET`): the build's failing
        compile reduced to a repro folder. Never up to date: it asks the EP again (known probes are not rerun)."""
        project = self.project
        for build in project.builds:
            if build.reduce_task in project.requested:
                yield {"basename": "reduce", "name": build.name,
                       "doc": f"reduce the failing {build.task} to a repro folder (artifacts/repro/{build.name}/)",
                       "actions": [(run_reduce, [build, project.workspace, project.manifest.build.reduce_budget_s])],
                       "task_dep": [stage.task for stage in build.stages], "uptodate": [False]}

    def _build_task(self, build: Build) -> Task:
        target, (out_dir, out) = build.target, self._out(build)
        if build.shared:
            doc = (f"{', '.join(m.name for m in build.members)} into one shared context for {target.name} "
                   f"({target.ep.name})")
        elif target.fleet:
            doc = (f"{build.members[0].name} for {target.fleet}'s SoC {chip(target.options['soc_model'])} alone "
                   f"({target.ep.name}): the one its validation runs")
        else:
            socs = f", SoCs {', '.join(chip(soc) for soc in target.socs)}" if target.socs else ""
            doc = f"{build.members[0].name} for {target.name} ({target.ep.name}, {target.device}{socs})"
        refused = self._unavailable(build.kind, build, doc)
        if refused:
            return refused
        checks = [build.ops_task] if compiler(target).operator_check else []
        if build.shared:  # the members alone first: the group's artifact.json compares the binaries' sizes
            checks += [compile_task(m.name, target.name) for m in build.members if target.name in m.model.targets]
        return self._task(build.kind, build.name, f"{doc} -> {out}/", run_compile, [build, self.project.workspace],
                          build.inputs, [os.path.join(out, name) for name in build.outputs],
                          compile_config(build, self.project.root, self.project.workspace.provenance),
                          clean=[(discard, [out_dir])], task_dep=checks)

    def validate_tasks(self) -> Iterator[Task]:
        yield {"basename": "validate", "name": None, "doc": "run every compiled artifact and compare with its source"}
        for build in self.project.builds:
            name = build.validate_task
            if build.validates and not self._skipped(name):
                yield self._made_or(name, self._validate_task, build)  # type: ignore[misc]
        yield from self._per_model("validate", [b for b in self.project.builds if b.validates and not b.shared],
                                   "validate", self.project.requested)

    def _validate_task(self, build: Build) -> Task:
        if build.shared:
            doc = f"group {build.name}: structural checks, and each member run where this host loads the context"
        elif build.soc_reports:
            doc = (f"{build.members[0].name} on {build.target.name}: the multi-SoC binary's structure, and each SoC "
                   f"compiled alone and run: {', '.join(chip(soc) for soc, _ in build.soc_reports)}")
        else:
            what = ("structural checks" if build.members[0].validation.mode == "structural"
                    else "run, compare with the source on CPU")
            doc = f"{build.members[0].name} on {build.target.name}: {what}"
        refused = self._unavailable("validate", build, doc)
        if refused:
            return refused
        out, config = self._out(build)[1], validate_config(build, self.project.root, self.project.workspace.provenance)
        external = [p for m in build.members for p in m.external]
        inputs: list[Path | str] = [*(os.path.join(out, name) for name in build.outputs), *build.sources, *external,
                                    *build.validation_files]
        return self._task("validate", build.name, doc, run_validate, [build, self.project.workspace, config], inputs,
                          [os.path.join(out, REPORT)], config)

    @staticmethod
    def _per_model(basename: str, builds: list[Build], verb: str,
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

    def package_tasks(self) -> Iterator[Task]:
        # the group even when none is declared: doit lists a generator that yields nothing as a blank group anyway
        yield {"basename": "package", "name": None, "doc": "ONNX Runtime model packages of validated artifacts"}
        for name, plan in self.packages.items():
            if not self._skipped(name):
                yield self._made_or(name, self._package_task, plan)  # type: ignore[misc]

    def _package_task(self, plan: PackagePlan) -> Task:
        project = self.project
        folder = project.rel(project.layout.package_dir(plan.name))
        inputs, needs = [], []
        for build in plan.variants:
            out = self._out(build)[1]
            inputs += [os.path.join(out, name) for name in build.outputs] + [os.path.join(out, REPORT)]
            needs.append(build.validate_task)
        config = {"rules_format": RULES_FORMAT, "code": project.workspace.provenance.code,
                  "variants": [b.name for b in plan.variants], "left_out": [list(pair) for pair in plan.left_out]}
        files = package_files(list(plan.variants), project.workspace.hashes)
        return self._task("package", plan.name, f"model package {plan.name}: {len(plan.variants)} variant(s) -> "
                          f"{folder}/", run_package, [plan, project.workspace], inputs,
                          [os.path.join(folder, name) for name in files], config,
                          clean=[(discard, [project.layout.package_dir(plan.name)])], task_dep=needs)

    def wants(self, kind: str) -> bool:
        """Whether doit is handed `kind`'s generator at all: `ops` only where a model is built with qaic (`doit list`
        showed an operator check no target has)."""
        return kind != "ops" or any(build.target.compiler == "qaic" for build in self.project.builds)

    def ops_tasks(self) -> Iterator[Task]:
        yield {"basename": "ops", "name": None, "doc": "check every qaic model's operators against qaic-compile"}
        for build in self.project.builds:
            name = build.ops_task
            if not self._skipped(name) and (task := self._made_or(name, self._ops_task, build)) is not None:
                yield task

    def _ops_task(self, build: Build) -> Task | None:
        """None for a target without an operator check, or one this host cannot build."""
        backend = compiler(build.target)
        if (not backend.operator_check or build.target.name in self.project.unavailable
                or build.ops_task in self.project.blocked):
            return None
        report = StateFolder(self.project.layout.state).path(f"ops/{build.target.name}/{build.members[0].name}.json")
        return self._task("ops", build.name, f"operators of {build.members[0].name} supported by qaic-compile?",
                          run_ops, [build, self.project.workspace, report], [build.members[0].model.path], [report],
                          {"toolchain": backend.identity(build.target)})

    def backends_task(self) -> Iterator[Task]:
        yield {"basename": "backends", "doc": "what this host can build: EPs, compilers, toolchains, targets",
               "actions": [(show_backends, [self.project])], "uptodate": [False], "verbosity": 2,
               "params": [{"name": "json_output", "long": "json", "type": bool, "default": False,
                           "help": "print JSON for machines"}]}

    def cache_task(self) -> Iterator[Task]:
        yield {"basename": "cache", "doc": "the local cache's size and the remote cache's settings",
               "actions": [(show_cache, [self.project.workspace])], "uptodate": [False], "verbosity": 2}

    def stage_tasks(self) -> Iterator[Task]:
        """shape:, optimize:, quantize:<model>[flavour] and squash: tasks, each feeding the next by file."""
        docs = {"freeze": "configuration inputs to constants, folded", "rewrite": "graph rewrites the model asks for",
                "upgrade": "the model converted to the lowest opset its targets' EP takes",
                "shape": "static shapes from `inputs`",
                "fold": "nodes that only compute constants replaced by their values (NPU targets)",
                "optimize": "ORT graph optimization",
                "quantize": "QDQ quantization with calibration data", "squash": "inline external data"}
        for kind in dict.fromkeys(str(stage.kind) for stage in self.project.stages.values()):
            yield {"basename": kind, "name": None, "doc": docs[kind]}
        for stage in self.project.stages.values():
            if not self._skipped(stage.task):
                yield self._made_or(stage.task, self._stage_task, stage)  # type: ignore[misc]

    def _blocked(self, basename: str, name: str, doc: str) -> Task:
        why = self.project.blocked[f"{basename}:{name}"]
        return self._task(basename, name, f"{doc} [blocked: {why.key_path} needs a fix]", refuse_blocked,
                          [f"{basename}:{name}", why])

    def _stage_task(self, stage: Stage) -> Task:
        doc = (f"{stage.kind} {stage.model}{f' for {stage.flavour} targets' if stage.flavour else ''} -> "
               f"{self.project.rel(stage.output)}")
        if stage.task in self.project.blocked:
            return self._blocked(str(stage.kind), stage.task.split(":", 1)[1], doc)
        return self._task(str(stage.kind), stage.task.split(":", 1)[1], doc, run_stage_task,
                          [stage, self.project.workspace], [stage.input, *stage.input_external, *stage.calibration],
                          stage.outputs, stage_config(stage, self.project.workspace.provenance),
                          clean=[(discard, [stage.output.parent])])

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
        return [*self.all_tasks(), *self._per_model("compile", [b for b in self.project.builds if not b.shared],
                                                    "compile"),
                *self._per_model("validate", [b for b in self.project.builds if b.validates and not b.shared],
                                 "validate"),
                *(task for kind in KINDS if not kind.work for task in kind.tasks(self))]

    def all_tasks(self) -> list[Task]:
        """The tasks that do work (the graph's nodes): not the per-model selections, which only name others."""
        every = [task for kind in KINDS if kind.work for task in kind.tasks(self)]
        return [task for task in every if task.get("actions") is not None or not task.get("name")]

    def prune_task(self) -> Iterator[Task]:
        yield {"basename": "prune", "doc": "remove what removed models, targets, groups and stages left under "
               "artifacts/ (--dry-run: only list it)", "actions": [(run_prune, [self.project])], "uptodate": [False],
               "verbosity": 2, "params": [{"name": "dry_run", "long": "dry-run", "type": bool, "default": False,
                                           "help": "list what would be removed, remove nothing"}]}

    def graph_task(self) -> Iterator[Task]:
        yield {"basename": "graph", "doc": "the task graph as artifacts/graph.dot and graph.svg (--model M: one model)",
               "actions": [(show_graph, [self.project, self.all_tasks])], "uptodate": [False], "verbosity": 2,
               "params": [{"name": "model", "long": "model", "type": str, "default": "",
                           "help": "only this model's tasks (its stages, compiles, checks, validations, groups)"}]}

    def unavailable_task(self) -> Iterator[Task]:
        yield {"basename": UNAVAILABLE, "doc": "list the tasks this host cannot build, and why",
               "actions": [(report_unavailable, [self.project.skipped()])], "uptodate": [False]}
        if blocked := self.project.blocked_builds():  # last in a default run: after everything else was built
            yield {"basename": "blocked", "doc": "fail with what the manifest must fix before its blocked tasks build",
                   "actions": [(fail_blocked, [blocked])], "uptodate": [False],
                   "task_dep": [name for name in self.default_tasks if name != "blocked"]}


def load_full_project(manifest_path: Path, invocation: Invocation, early: Candidate | None = None) -> Tasks:
    """The project with all its tasks (`epbuild.dodo` loads this when no shortcut holds); a user error prints one
    line and exits 2, without a traceback."""
    try:
        project = load_project(manifest_path, invocation, early)
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
