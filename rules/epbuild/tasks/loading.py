"""Loading a manifest into a `Project`, as steps a reader can follow, each returning what the next needs: the saved
plan (when everything it was made from holds), the manifest read and checked, the artifacts folder and cache
prepared, fork servers started early, the models read, the builds planned, the plan saved, each target's
availability known."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from ..errors import BuildError, UserError
from ..execute.executor import ExecutorSettings, executor_settings, unreachable
from ..execute.fork_server import fork_job, prestart, serving
from ..execute.host import HostProbe
from ..execute.links import Links
from ..execute.provenance import Provenance
from ..execute.warm_start import Candidate
from ..fast_path import DEP_FILE, LEGACY_DEP_FILE, project_key
from ..fast_path import enabled as fast_path_enabled
from ..files.foreign import remove_links
from ..files.layout import Layout, now_ns
from ..files.owners import owner_tag, sweep
from ..invocation import Invocation
from ..logs import log
from ..manifest.builds import Build, ResolvedTarget
from ..manifest.eps import lookup
from ..manifest.parse import Manifest, load
from ..manifest.stage import Stage
from ..plan.declared_inputs import ModelInputs, blocked_tasks, check_declared_inputs, resolve_dims
from ..plan.external_data import ExternalDataIndex
from ..plan.saved_plan import Plan, SavedPlan
from ..plan.targets import default_memory_gb, plan, resolve_targets
from ..report.progress import live_wanted
from ..report.views import template_prepared_meanwhile
from ..state.folder import StateFolder
from ..state.registry import CONFIGS
from ..steps import vendor_shim
from ..steps.compilers import COMPILERS, compiler
from ..steps.toolchain.worker_needs import with_worker_toolchains
from ..store.cache import Workspace, cache_location, remote_location
from ..store.doit_database import migrate as migrate_doit_database
from ..store.doit_database import recover as recover_doit_database
from ..store.task_configs import ConfigRecord
from .project import Availability, Project, Relative

Facts = tuple[dict[Path, tuple[Path, ...]], dict[str, ModelInputs], dict[str, dict[str, bool]]]


def load_project(manifest_path: Path, invocation: Invocation | list[str], early: Candidate | None = None,
                 key: str | None = None) -> Project:
    """The project for this run's command line; `early`: the fork-server imports this run began before it loaded
    (`execute.warm_start`), adopted by the first server it starts, else let go here; `key`: the project key, where
    the run made it already (`fast_path.project_key`)."""
    try:
        return _load_project(manifest_path, invocation, early, key or project_key(manifest_path))
    finally:
        if early is not None:
            early.discard()


def _load_project(manifest_path: Path, invocation: Invocation | list[str], early: Candidate | None,
                  project: str) -> Project:
    if not isinstance(invocation, Invocation):
        invocation = Invocation.of(invocation)
    key = project if invocation.listing or invocation.default_run else None
    shard = shard_of(os.environ.get("EPBUILD_SHARD"))
    live = not invocation.inspecting and live_wanted(sys.stdout)
    rel = Relative(Path.cwd())
    started = now_ns()
    saved_plan = SavedPlan(Layout(manifest_path.parent / "artifacts").state,
                           f"{project}:{default_memory_gb()}")
    last = saved_plan.load() if fast_path_enabled() else None
    # what this run's fingerprints name: as the saved plan of this project key holds it, else read now
    provenance = Provenance(last.code, last.versions) if last is not None else Provenance.read()
    manifest, resolved = read_manifest(manifest_path, last)  # nothing is written before it is known good
    layout, writable, workspace, executor = prepare_folders(manifest, invocation, rel, provenance)
    builds_here = invocation.default_run and not executor
    links = workspace.links
    links.early = early
    servers = start_fork_servers(manifest, layout, builds_here, provenance, links)
    with contextlib.ExitStack() as stack:  # the probe's child ends with this run if it stops before the check
        if servers:  # the report's templates compiled while this process waits for the servers it started
            stack.enter_context(template_prepared_meanwhile())
        probe = start_probe(list(resolved.values()), layout, workspace, executor, servers)
        if probe[0] is not None:
            stack.callback(probe[0].stop)
        index = ExternalDataIndex(layout.state, provenance, links)
        facts = read_models(manifest, layout, index, servers, builds_here and not servers, provenance, links)
        external, shapes, graphs = facts
        fresh = None
        if last is not None and last.facts == Plan.digest(facts):  # planned from the same manifest, files and facts
            manifest, builds, stages, blocked = last.manifest, last.builds, last.stages, last.blocked
        else:
            read = manifest if last is None else last.as_read()
            manifest = with_graph_facts(resolve_dims(read, shapes), graphs)
            builds, stages = plan_builds(manifest, external, resolved)
            blocked = check_declared_inputs(manifest, builds, shapes)
            fresh = Plan(None, resolved, Plan.digest(facts), manifest, builds,
                         stages, provenance.code, provenance.versions, blocked)
        builds = with_workers(manifest, builds, executor)
        log(__name__, "debug", "%d builds and %d stages, %s", len(builds), len(stages),
            "planned anew" if fresh is not None else "from the saved plan (same manifest, files and facts)")
        save_plan = None
        if writable:  # only for a manifest that holds: a refused one writes nothing
            index.save()
            if fresh is not None:
                save_plan = functools.partial(saved_plan.save, fresh, started, read)
                if not invocation.default_run:  # a build encodes it while its jobs run (`tasks.run_end.PlanSave`)
                    save_plan()
                    save_plan = None
        availability = check_availability(manifest, builds, layout, workspace, executor, probe)
        if executor:
            key = None  # the workers' toolchains count: no shortcut
        return Project(invocation=invocation, key=key, manifest=manifest, layout=layout, writable=writable,
                       workspace=workspace, external=external, builds=builds, stages=stages, availability=availability,
                       configs=ConfigRecord(StateFolder(layout.state)), shard=shard, live=live, rel=rel,
                       blocked=blocked_tasks(builds, blocked), save_plan=save_plan)


def read_manifest(manifest_path: Path, last: Plan | None) -> tuple[Manifest, dict[str, ResolvedTarget]]:
    """The manifest, parsed and checked, and every target resolved (or as the last plan has them, when it holds: its
    manifest as planned, whose models, files, cache and executor are those read); its warnings printed once."""
    if last is not None:
        manifest, resolved = last.manifest, last.resolved
    else:
        manifest = load(manifest_path)
        resolved = resolve_targets(manifest)
    said: set[str] = set()  # once, at the first target that has it: targets that extend it inherit the value
    for where, what in (w for target in resolved.values() for w in target.warnings):
        if what not in said:
            said.add(what)
            print(f"warning: {where}: {what}", file=sys.stderr)
    return manifest, resolved


def prepare_folders(manifest: Manifest, invocation: Invocation, rel: Relative,
                    provenance: Provenance) -> tuple[Layout, bool, Workspace, ExecutorSettings | None]:
    """artifacts/ checked and swept of killed builds' scratch; whether it takes files; the cache and the executor
    (None: run here)."""
    layout = Layout(manifest.root / "artifacts")
    if layout.root.is_symlink():
        raise UserError(manifest.path.name, None, f"{layout.root} is a symbolic link (to "
                        f"{os.readlink(layout.root)}); outputs are written only inside the project: "
                        "make artifacts/ a plain folder")
    writable = check_writable(manifest, layout, invocation, rel)
    if writable:
        for path in remove_links(layout.root):
            print(f"warning: removed {rel(Path(path))}: a symbolic link under artifacts/, where epbuild makes none "
                  "(a checkout's files are data: a build never writes through one)", file=sys.stderr)
    if writable and StateFolder(layout.state).settle():
        log(__name__, "info", "%s held another layout's state: emptied (one full check)", layout.state)
    if writable and migrate_doit_database(Path(DEP_FILE).absolute(), Path(LEGACY_DEP_FILE).absolute()):
        log(__name__, "info", "doit's database moved from %s to %s", LEGACY_DEP_FILE, DEP_FILE)
    said = recover_doit_database(Path(DEP_FILE).absolute()) if writable else None
    if said:
        print(f"warning: {said}", file=sys.stderr)
    if writable and not invocation.inspecting:  # what killed builds left behind
        sweep([layout.scratch_root, Path(cache_location(manifest.cache)[0]) / "tmp"])
    executor = executor_settings(manifest.executor.scheduler, manifest.executor.wait_s)
    if executor and invocation.inspecting:
        executor = None  # listing or inspecting needs no cluster
    elif executor and (reason := unreachable(executor)):
        raise executor_error(manifest, reason)
    workspace = Workspace(layout.root, *cache_location(manifest.cache), remote_location(manifest.cache), executor,
                          manifest.cache.hard_links, manifest.cache.remote_budget_s, manifest.cache.remote_timeout_s,
                          manifest.build.memory_gb, provenance)
    return layout, writable, workspace, executor


def check_writable(manifest: Manifest, layout: Layout, invocation: Invocation, rel: Relative) -> bool:
    """Whether artifacts/ takes files: a build needs it (one line and exit 2 when not); listing and the other
    inspecting commands go on without saving their state, with one warning. Asked of the file system, not tried:
    a manifest refused later must have written nothing."""
    folder = next(p for p in (layout.state, *layout.state.parents) if p.exists())
    if os.access(folder, os.W_OK):
        return True
    why = "Read-only file system" if os.statvfs(folder).f_flag & os.ST_RDONLY else "Permission denied"
    where = rel(layout.root)
    if not invocation.inspecting:
        raise UserError(manifest.path.name, None, f"{where}/ is not writable: {why}; outputs are written "
                        "there (make it writable, or build in a copy)")
    print(f"warning: {where}/ is not writable ({why}): nothing is saved for the next run", file=sys.stderr)
    return False


def executor_error(manifest: Manifest, reason: str) -> UserError:
    if os.environ.get("EPBUILD_EXECUTOR"):
        return UserError("EPBUILD_EXECUTOR", None, reason)
    return UserError(manifest.path.name, "executor.scheduler", reason)


def start_fork_servers(manifest: Manifest, layout: Layout, default_run: bool, expect: Provenance,
                       links: Links) -> set[str]:
    """On a first full build here (no settings record yet), the fork servers it will use, started now: their
    imports overlap this process's start-up."""
    if not default_run or StateFolder(layout.state).path(CONFIGS).exists():
        return set()
    servers = first_build_servers(manifest)
    prestart(links, servers, expect)
    return servers


def read_models(manifest: Manifest, layout: Layout, index: ExternalDataIndex, servers: set[str],
                changes_build: bool, expect: Provenance, links: Links) -> Facts:
    """The external-data files of each model and `validation.reference` (by path), each model's input shapes
    and graph facts (`plan.external_data._ready`), from the index; changed models are read by a fork server
    running or starting anyway (it has onnx loaded), the CPU-only one first. `changes_build`: a default run
    here, whose changed models' builds run next: their targets' servers are started while this process reads
    (on a CI runner after a commit none is running: their start overlapped nothing)."""
    models = manifest.models.values()
    references = {m.validation["reference"]: m.name for m in models if "reference" in m.validation}
    unread = index.unread(list(dict.fromkeys([*(model.path for model in models), *references])))
    if unread:
        reader = next((alias for alias in sorted(servers | {""}) if serving(links, alias, expect)), None)
        if changes_build:
            changed = set(unread)
            prestart(links, first_build_servers(manifest, {name for m in models if m.path in changed
                                                           for name in m.targets}), expect)
        made = [p for p in (layout.scratch_root, *layout.scratch_root.parents) if not p.exists()]
        index.read(unread, reader, layout.scratch(f"read-models.{owner_tag()}"))
        for folder in made:  # the reading job's folders, empty again: a manifest refused next leaves nothing
            with contextlib.suppress(OSError):
                folder.rmdir()
    external, shapes = {}, {}
    for where, path in [*((f"{m.entry.split('.variants.')[0] or f'models.{m.name}'}.path", m.path) for m in models),
                        *((f"models.{name}.validation.reference", path) for path, name in references.items())]:
        try:
            external[path] = tuple(index.files(path))
        except UserError as exc:
            raise UserError(manifest.path.name, where, f"{exc.file}: {exc.message}") from None
    for name, model in manifest.models.items():
        shapes[name] = index.inputs(model.path)
    return external, shapes, {name: index.graph(model.path) for name, model in manifest.models.items()}


def plan_builds(manifest: Manifest, external: dict[Path, tuple[Path, ...]],
                resolved: dict[str, ResolvedTarget]) -> tuple[list[Build], dict[str, Stage]]:
    """The builds and their stages."""
    builds = plan(manifest, external, resolved)
    stages: dict[str, Stage] = {}
    for stage in (stage for b in builds for stage in b.stages):  # one name, one input and output
        assert stages.setdefault(stage.task, stage) == stage, f"two stages named {stage.task}"
    return builds, stages


def with_workers(manifest: Manifest, builds: list[Build], executor: ExecutorSettings | None) -> list[Build]:
    """With an executor, the builds with the toolchain versions the workers offer (they count, not this host's)."""
    if not executor:
        return builds
    try:
        return with_worker_toolchains(builds, executor)
    except BuildError as exc:
        raise executor_error(manifest, str(exc)) from None


def start_probe(targets: list[ResolvedTarget], layout: Layout, workspace: Workspace,
                executor: ExecutorSettings | None,
                servers: AbstractSet[str] = frozenset()) -> tuple[HostProbe | None, dict[str, Any]]:
    """The host probe, started before the models are read when a target may need it (an EP inside ONNX Runtime):
    its child registers the plugins while this process waits for the model reading, forked by one of the fork
    servers this build started (`servers`), which has imported onnxruntime already (a second Python importing it
    beside them would slow both on a small runner), else a fresh Python; and the vendor-id shim it runs under (the
    shim's library is part of the probe's key)."""
    used = [t for t in targets if not t.is_cpu]
    if executor or not any(compiler(t).in_onnxruntime for t in used):
        return None, {}
    shim = vendor_shim.prepare(workspace.cache_dir, layout.state) if any(t.ep.vendor_shim for t in used) else {}
    links, expect = workspace.links, workspace.provenance
    alias = next((a for a in sorted(servers) if serving(links, a, expect)), None)

    def fork(arguments: list[str], output: Path, folder: Path) -> Any:
        return fork_job(links, "epbuild.execute.host", alias or "", arguments, output, folder, expect=expect)

    return HostProbe(layout.state, workspace.provenance.version, fork if alias is not None else None), shim


def check_availability(manifest: Manifest, builds: list[Build], layout: Layout, workspace: Workspace,
                       executor: ExecutorSettings | None,
                       started: tuple[HostProbe | None, dict[str, Any]] | None = None) -> Availability:
    """Which targets this host (or, with an executor, the cluster) cannot build, and why; what was probed
    (`started`: the probe `start_probe` began)."""
    used = {b.target.name: b.target for b in builds if not b.target.is_cpu}
    needs_probe = not executor and any(compiler(t).in_onnxruntime for t in used.values())
    probe, shim = started if started and started[0] else start_probe(list(used.values()), layout, workspace, executor)
    caps = {**probe.result(), "vendor_shim": shim} if needs_probe and probe else {}
    unavailable: dict[str, str] = {}
    for name, target in used.items():
        reason = compiler(target).unavailable(target, None if executor else caps)
        if reason:
            unavailable[name] = reason
    looked_at = [*(path for t in used.values() for path in compiler(t).probed_files(t)), *manifest.reads]
    return Availability(caps, unavailable, looked_at)


def with_graph_facts(manifest: Manifest, graphs: dict[str, dict[str, bool]]) -> Manifest:
    """The manifest with what the model reading found: whether each model is already static (no shape stage), has
    nodes that only compute constants (else no fold stage), and its ai.onnx opset (an upgrade stage below an EP's)."""
    return dataclasses.replace(manifest, models={
        name: dataclasses.replace(model, graph_ready=graphs[name]["static"], constant_nodes=graphs[name]["foldable"],
                                  opset=graphs[name]["opset"])
        for name, model in manifest.models.items()})


def shard_of(text: str | None) -> tuple[int, int] | None:
    """EPBUILD_SHARD=I/N: this job builds shard I of N (1-based)."""
    if not text:
        return None
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        raise UserError("EPBUILD_SHARD", None, f"must be I/N with 1 <= I <= N, such as 2/4, found {text!r}")
    return int(index), int(count)


def first_build_servers(manifest: Manifest, targets: set[str] | None = None) -> set[str]:
    """The fork servers a first full build here (`doit` with no settings record yet: a clean checkout, CI)
    certainly uses: those of its ONNX Runtime targets' EPs (of `targets` only, when given)."""
    specs = [t for name, t in manifest.targets.items() if (targets is None or name in targets)
             and t.ep and (backend := COMPILERS.get(t.compiler)) and backend.in_onnxruntime]
    return {info.fork_server for t in specs if (info := lookup(t.ep or ""))}
