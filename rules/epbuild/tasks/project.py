"""A manifest loaded into everything task creation needs, computed once per run: the manifest read and checked,
the artifacts folder and cache prepared, the models' external data read, the builds planned, each target's
availability on this host (or on the Dask workers) known."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import pickle
import sys
from collections.abc import Iterable
from pathlib import Path

from ..errors import BuildError, UserError, closest
from ..execute.executor import ExecutorSettings, executor_settings, unreachable
from ..execute.fork_server import prestart, serving
from ..execute.host import capabilities
from ..execute.provenance import code_digest, use_saved, versions
from ..fast_path import DEP_FILE, is_default_run, project_key
from ..fast_path import enabled as fast_path_enabled
from ..files.layout import STAGES, Layout, now_ns
from ..files.owners import owner_tag, sweep
from ..logs import log
from ..manifest.builds import Build, ResolvedTarget
from ..manifest.eps import lookup
from ..manifest.parse import Manifest, load
from ..manifest.stage import Stage
from ..plan.declared_inputs import ModelInputs, check_declared_inputs, resolve_dims
from ..plan.external_data import ExternalDataIndex
from ..plan.saved_plan import Plan, SavedPlan
from ..plan.targets import default_memory_gb, plan, resolve_targets
from ..report.progress import live_wanted
from ..report.views import template_prepared_meanwhile
from ..steps import vendor_shim
from ..steps.compilers import COMPILERS, compiler
from ..steps.worker_needs import with_worker_toolchains
from ..store.cache import Workspace, cache_location, remote_location
from ..store.doit_database import recover as recover_doit_database
from ..store.task_configs import ConfigRecord

INSPECTING = {"list", "info", "help", "clean", "forget", "ignore", "dumpdb", "strace", "tabcompletion", "reset-dep",
              "backends", "cache", "unavailable", "graph", "prune"}  # doit commands and tasks that build nothing



class _Relative:
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


def thread_mode(argv: list[str]) -> bool:
    """Whether doit's command line asks for `-P thread` / `--parallel-type thread`."""
    for at, word in enumerate(argv):
        if word in ("-P", "--parallel-type") and argv[at + 1:at + 2] == ["thread"]:
            return True
        if word in ("-Pthread", "--parallel-type=thread"):
            return True
    return False



def with_graph_facts(manifest: Manifest, graphs: dict[str, dict[str, bool]]) -> Manifest:
    """The manifest with what the model reading found: whether each model is already static (no shape stage) and
    has nodes that only compute constants (else no fold stage)."""
    return dataclasses.replace(manifest, models={
        name: dataclasses.replace(model, graph_ready=graphs[name]["static"], constant_nodes=graphs[name]["foldable"])
        for name, model in manifest.models.items()})

class Project:
    """A loaded manifest with everything task creation needs, computed once. `requested` are the task names
    given on doit's command line: a task this host cannot build fails when named, and is skipped otherwise."""

    def __init__(self, manifest_path: Path, requested: Iterable[str] = ()):
        requested = list(requested)
        self.command = requested[0] if requested else None
        self.requested = frozenset(requested)
        # a plain `doit list` or default run: its outcome may let the next one skip loading (epbuild.fast_path)
        self.key = project_key(manifest_path) if requested == ["list"] or is_default_run(requested) else None
        self.checked: dict[str, list[int]] = {}  # what doit's file checker found unchanged (the no-op stamp)
        self.edited: set[str] = set()  # published files found changed since (the file checker fills it)
        self.shard = shard_of(os.environ.get("EPBUILD_SHARD"))
        self.live = self.command not in INSPECTING and live_wanted(sys.stdout)  # a status area under the tasks
        self.threads = thread_mode(requested)
        self.rel = _Relative(Path.cwd())
        started = now_ns()
        saved_plan = SavedPlan(Layout(manifest_path.parent / "artifacts").state,
                               f"{self.key or project_key(manifest_path)}:{default_memory_gb()}")
        last = saved_plan.load() if fast_path_enabled() else None
        if last is not None:
            use_saved(last.code, last.versions)
        resolved = self._read_manifest(manifest_path, last)  # nothing is written before the manifest is known good
        executor = self._prepare_folders()
        builds_here = is_default_run(requested) and not executor
        servers = self._start_fork_servers(builds_here)
        index = ExternalDataIndex(self.layout.state)
        facts = self._read_models(index, servers, builds_here and not servers)
        self.external, shapes, graphs = facts  # external: by path, each model's external-data files
        fresh = None
        if last is not None and last.facts == facts:  # planned from the same manifest, files and facts
            self.manifest, builds, self.stages = last.manifest, last.builds, last.stages
        else:
            read = self.manifest if last is None else last.as_read()
            self.manifest = with_graph_facts(resolve_dims(read, shapes), graphs)
            builds, self.stages = self._plan(resolved)
            check_declared_inputs(self.manifest, builds, shapes)
            fresh = Plan(pickle.dumps(read, protocol=pickle.HIGHEST_PROTOCOL), resolved, facts, self.manifest, builds,
                         self.stages, code_digest(), versions())
        self.builds = self._with_workers(builds, executor)
        log(__name__, "debug", "%d builds and %d stages, %s", len(self.builds), len(self.stages),
            "planned anew" if fresh is not None else "from the saved plan (same manifest, files and facts)")
        if self.writable:  # only for a manifest that holds: a refused one writes nothing
            index.save()
            if fresh is not None:
                saved_plan.save(fresh, started)
        self._check_availability(executor)
        self.configs = ConfigRecord(self.layout.configs)

    def _read_manifest(self, manifest_path: Path, last: Plan | None) -> dict[str, ResolvedTarget]:
        """The manifest, parsed and checked, and every target resolved (or as the last plan has them, when it
        holds: its manifest as planned, whose models, files, cache and executor are those read); its warnings printed
        once."""
        if last is not None:
            self.manifest, resolved = last.manifest, last.resolved
        else:
            self.manifest = load(manifest_path)
            resolved = resolve_targets(self.manifest)
        self.root = self.manifest.root
        said: set[str] = set()  # once, at the first target that has it: targets that extend it inherit the value
        for where, what in (w for target in resolved.values() for w in target.warnings):
            if what not in said:
                said.add(what)
                print(f"warning: {where}: {what}", file=sys.stderr)
        return resolved

    def _prepare_folders(self) -> ExecutorSettings | None:
        """artifacts/ checked and swept of killed builds' scratch, the cache and the executor (None: run here)."""
        self.layout = Layout(self.root / "artifacts")
        if self.layout.root.is_symlink():
            raise UserError(self.manifest.path.name, None, f"{self.layout.root} is a symbolic link (to "
                            f"{os.readlink(self.layout.root)}); outputs are written only inside the project: "
                            "make artifacts/ a plain folder")
        self.writable = self._check_writable(self.command)
        said = recover_doit_database(Path(DEP_FILE).absolute()) if self.writable else None
        if said:
            print(f"warning: {said}", file=sys.stderr)
        if self.writable and self.command not in INSPECTING:  # what killed builds left behind
            sweep([self.layout.scratch_root, Path(cache_location(self.manifest.cache)[0]) / "tmp"])
        executor = executor_settings(self.manifest.executor.scheduler, self.manifest.executor.wait_s)
        if executor and self.command in INSPECTING:
            executor = None  # listing or inspecting needs no cluster
        elif executor and (reason := unreachable(executor)):
            raise self.executor_error(reason)
        self.workspace = Workspace(self.layout.root, *cache_location(self.manifest.cache),
                                   remote_location(self.manifest.cache), executor, self.manifest.cache.hard_links,
                                   self.manifest.cache.remote_budget_s, self.manifest.cache.remote_timeout_s)
        return executor

    def _start_fork_servers(self, default_run: bool) -> set[str]:
        """On a first full build here (no settings record yet), the fork servers it will use, started now: their
        imports overlap this process's start-up."""
        if not default_run or self.layout.configs.exists():
            return set()
        servers = first_build_servers(self.manifest)
        prestart(servers)
        return servers

    def _read_models(self, index: ExternalDataIndex, servers: set[str],
                     changes_build: bool) -> tuple[dict[Path, tuple[Path, ...]], dict[str, ModelInputs],
                                                   dict[str, dict[str, bool]]]:
        """The external-data files of each model and `validation.reference` (by path), each model's input shapes
        and graph facts (`plan.external_data._ready`), from the index; changed models are read by a fork server
        running or starting anyway (it has onnx loaded), the CPU-only one first. `changes_build`: a default run
        here, whose changed models' builds run next: their targets' servers are started while this process reads
        (on a CI runner after a commit none is running: their start overlapped nothing)."""
        models = self.manifest.models.values()
        references = {m.validation["reference"]: m.name for m in models if "reference" in m.validation}
        unread = index.unread(list(dict.fromkeys([*(model.path for model in models), *references])))
        if unread:
            reader = next((alias for alias in sorted(servers | {""}) if serving(alias)), None)
            if changes_build:
                changed = set(unread)
                prestart(first_build_servers(self.manifest, {name for m in models if m.path in changed
                                                             for name in m.targets}))
            made = [p for p in (self.layout.scratch_root, *self.layout.scratch_root.parents) if not p.exists()]
            with template_prepared_meanwhile() if servers else contextlib.nullcontext():
                index.read(unread, reader, self.layout.scratch(f"read-models.{owner_tag()}"))
            for folder in made:  # the reading job's folders, empty again: a manifest refused next leaves nothing
                with contextlib.suppress(OSError):
                    folder.rmdir()
        external, shapes = {}, {}
        for where, path in [*((f"{m.entry.split('.variants.')[0] or f'models.{m.name}'}.path", m.path) for m in models),
                            *((f"models.{name}.validation.reference", path) for path, name in references.items())]:
            try:
                external[path] = tuple(index.files(path))
            except UserError as exc:
                raise UserError(self.manifest.path.name, where, f"{exc.file}: {exc.message}") from None
        for name, model in self.manifest.models.items():
            shapes[name] = index.inputs(model.path)
        return external, shapes, {name: index.graph(model.path) for name, model in self.manifest.models.items()}

    def _plan(self, resolved: dict[str, ResolvedTarget]) -> tuple[list[Build], dict[str, Stage]]:
        """The builds and their stages."""
        builds = plan(self.manifest, self.external, resolved)
        stages: dict[str, Stage] = {}
        for stage in (stage for b in builds for stage in b.stages):  # one name, one input and output
            assert stages.setdefault(stage.task, stage) == stage, f"two stages named {stage.task}"
        return builds, stages

    def _with_workers(self, builds: list[Build], executor: ExecutorSettings | None) -> list[Build]:
        """With an executor, the builds with the toolchain versions the workers offer (they count, not this
        host's)."""
        if not executor:
            return builds
        try:
            return with_worker_toolchains(builds, executor)
        except BuildError as exc:
            raise self.executor_error(str(exc)) from None

    def _check_availability(self, executor: ExecutorSettings | None) -> None:
        """Which targets this host (or, with an executor, the cluster) cannot build, and why; what was probed."""
        used = {b.target.name: b.target for b in self.builds if not b.target.is_cpu}
        needs_probe = not executor and any(compiler(t).in_onnxruntime for t in used.values())
        shim = (vendor_shim.prepare(self.workspace.cache_dir, self.layout.state)
                if any(t.ep.vendor_shim for t in used.values()) else {})
        self.caps = {**capabilities(self.layout.state), "vendor_shim": shim} if needs_probe else {}
        self.unavailable: dict[str, str] = {}
        for name, target in used.items():
            reason = compiler(target).unavailable(target, None if executor else self.caps)
            if reason:
                self.unavailable[name] = reason
        # besides the tasks' files: what task creation looked at (toolchain probes, configs, calibration folders)
        self.looked_at = [*(path for t in used.values() for path in compiler(t).probed_files(t)),
                          *self.manifest.reads]
        if executor:
            self.key = None  # the workers' toolchains count: no shortcut

    def _check_writable(self, command: str | None) -> bool:
        """Whether artifacts/ takes files: a build needs it (one line and exit 2 when not); listing and the other
        inspecting commands go on without saving their state, with one warning. Asked of the file system, not
        tried: a manifest refused later must have written nothing."""
        folder = next(p for p in (self.layout.state, *self.layout.state.parents) if p.exists())
        if os.access(folder, os.W_OK):
            return True
        why = "Read-only file system" if os.statvfs(folder).f_flag & os.ST_RDONLY else "Permission denied"
        where = self.rel(self.layout.root)
        if command not in INSPECTING:
            raise UserError(self.manifest.path.name, None, f"{where}/ is not writable: {why}; outputs are written "
                            "there (make it writable, or build in a copy)")
        print(f"warning: {where}/ is not writable ({why}): nothing is saved for the next run", file=sys.stderr)
        return False

    def executor_error(self, reason: str) -> UserError:
        if os.environ.get("EPBUILD_EXECUTOR"):
            return UserError("EPBUILD_EXECUTOR", None, reason)
        return UserError(self.manifest.path.name, "executor.scheduler", reason)

    @staticmethod
    def task_names(build: Build) -> list[str]:
        return [build.task, *([build.validate_task] if build.validates else [])]

    def skipped(self) -> dict[str, str]:
        return {name: self.unavailable[b.target.name] for b in self.builds
                if b.target.name in self.unavailable for name in self.task_names(b)}

    def owned_paths(self) -> set[Path]:
        """What the current tasks publish and log: artifact and group folders, stage outputs, log files."""
        owned = set()
        for build in self.builds:
            owned |= {build.out_dir(self.layout), *(build.log(self.layout, step) for step in ("compile", "validate",
                                                                                              "ops"))}
        for stage in self.stages.values():
            owned |= {stage.output.parent, self.layout.log(STAGES, stage.task.replace(":", "."))}
        return owned

    def declared_tasks(self) -> set[str]:
        """Every task the manifest declares now, built here or not."""
        return {*self.stages, *(name for build in self.builds for name in (*self.task_names(build),
                                                                         build.ops_task))}

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



DOIT_COMMANDS = {"run", "list", "info", "clean", "forget", "ignore", "strace", "reset-dep"}  # those taking tasks
VALUE_OPTIONS = {"-n", "--process", "-P", "--parallel-type", "-f", "--file", "-d", "--dir", "--db-file",
                 "--backend", "--check_file_uptodate", "--reporter", "-v", "--verbosity", "-o", "--output-file",
                 "--model", "--codec-cls", "--template", "--status", "-s"}


def named_tasks(argv: list[str]) -> list[str]:
    """The task names on doit's command line (after its command, if any), without options and their values."""
    words = list(argv)
    if words and words[0] in ("help", "dumpdb", "tabcompletion"):
        return []
    if words and words[0] in DOIT_COMMANDS:
        words = words[1:]
    names, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word.startswith("-"):
            skip = word in VALUE_OPTIONS
        elif "=" not in word:
            names.append(word)
    return names


def shard_of(text: str | None) -> tuple[int, int] | None:
    """EPBUILD_SHARD=I/N: this job builds shard I of N (1-based)."""
    if not text:
        return None
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        raise UserError("EPBUILD_SHARD", None, f"must be I/N with 1 <= I <= N, such as 2/4, found {text!r}")
    return int(index), int(count)


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


def first_build_servers(manifest: Manifest, targets: set[str] | None = None) -> set[str]:
    """The fork servers a first full build here (`doit` with no settings record yet: a clean checkout, CI)
    certainly uses: those of its ONNX Runtime targets' EPs (of `targets` only, when given)."""
    specs = [t for name, t in manifest.targets.items() if (targets is None or name in targets)
             and t.ep and (backend := COMPILERS.get(t.compiler)) and backend.in_onnxruntime]
    return {info.fork_server for t in specs if (info := lookup(t.ep))}
