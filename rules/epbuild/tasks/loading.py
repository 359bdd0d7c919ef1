"""Loading a manifest into a `Project`, as steps a reader can follow, each returning what the next needs: the saved
plan (when everything it was made from holds), the manifest read and checked, the workspace (cache, executor), the
models read, the builds planned (`plan.planning`, a function), each target's availability known. Every effect of that
time (folders settled, fork servers and the host probe started, the index and plan saved) is a `RunStart` step,
called here where it is due (`tasks.run_start` lists them in order)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import BuildError, UserError
from ..execute.executor import ExecutorSettings, executor_settings, unreachable
from ..execute.fork_server import serving
from ..execute.host import HostProbe
from ..execute.links import Links
from ..execute.provenance import Provenance
from ..execute.warm_start import Candidate
from ..fast_path import enabled as fast_path_enabled
from ..fast_path import project_key
from ..files.layout import Layout, now_ns
from ..files.owners import owner_tag
from ..invocation import Invocation
from ..logs import log
from ..manifest.builds import Build, ResolvedTarget
from ..manifest.parse import Manifest, load
from ..plan.declared_inputs import blocked_tasks
from ..plan.external_data import ExternalDataIndex
from ..plan.planning import Facts, planned
from ..plan.saved_plan import Plan, SavedPlan
from ..plan.targets import default_memory_gb, resolve_targets
from ..report.progress import live_wanted
from ..report.views import template_prepared_meanwhile
from ..state.folder import StateFolder
from ..steps.compilers import compiler
from ..steps.job_modules import CODE_ROOTS, JOB_MODULES
from ..steps.toolchain.worker_needs import with_worker_toolchains
from ..store.cache import Workspace, cache_location, remote_location
from ..store.task_configs import ConfigRecord
from .project import Availability, Project, Relative
from .run_start import RunStart


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
    provenance = Provenance(last.code, last.versions, CODE_ROOTS) if last is not None else Provenance.read(CODE_ROOTS)
    manifest, resolved = read_manifest(manifest_path, last)  # nothing is written before it is known good
    links = Links(JOB_MODULES)
    links.early = early
    start = RunStart(invocation, rel, links, provenance)
    layout, writable = start.folders(manifest)
    workspace, executor = workspace_of(manifest, layout, invocation, provenance, links)
    builds_here = invocation.default_run and not executor
    servers = start.servers(manifest, layout, builds_here)
    with contextlib.ExitStack() as stack:  # the probe's child ends with this run if it stops before the check
        if servers:  # the report's templates compiled while this process waits for the servers it started
            stack.enter_context(template_prepared_meanwhile())
        probe = start.probe(list(resolved.values()), layout, workspace, executor, servers)
        if probe[0] is not None:
            stack.callback(probe[0].stop)
        index = ExternalDataIndex(layout.state, provenance, links)
        facts = read_models(manifest, layout, index, servers, start if builds_here and not servers else None, links)
        made = planned(manifest, resolved, facts, last, provenance)
        builds = with_workers(made.manifest, made.builds, executor)
        log(__name__, "debug", "%d builds and %d stages, %s", len(builds), len(made.stages),
            "planned anew" if made.fresh is not None else "from the saved plan (same manifest, files and facts)")
        read = manifest if last is None else None  # the manifest as read, for a fresh plan's record
        save_plan = start.keep(index, saved_plan, made.fresh, started, read) if writable else None
        availability = check_availability(made.manifest, builds, start, workspace, executor, probe)
        if executor:
            key = None  # the workers' toolchains count: no shortcut
        return Project(invocation=invocation, key=key, manifest=made.manifest, layout=layout, writable=writable,
                       workspace=workspace, external=facts[0], builds=builds, stages=made.stages,
                       availability=availability, configs=ConfigRecord(StateFolder(layout.state)), shard=shard,
                       live=live, rel=rel, blocked=blocked_tasks(builds, made.blocked), save_plan=save_plan)


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


def workspace_of(manifest: Manifest, layout: Layout, invocation: Invocation, provenance: Provenance,
                 links: Links) -> tuple[Workspace, ExecutorSettings | None]:
    """The cache and the executor (None: run here; a listing or an inspecting command needs no cluster)."""
    executor = executor_settings(manifest.executor.scheduler, manifest.executor.wait_s)
    if executor and invocation.inspecting:
        executor = None
    elif executor and (reason := unreachable(executor)):
        raise executor_error(manifest, reason)
    workspace = Workspace(layout.root, *cache_location(manifest.cache), remote_location(manifest.cache), executor,
                          manifest.cache.hard_links, manifest.cache.remote_budget_s, manifest.cache.remote_timeout_s,
                          manifest.build.memory_gb, provenance=provenance, links=links)
    return workspace, executor


def executor_error(manifest: Manifest, reason: str) -> UserError:
    if os.environ.get("EPBUILD_EXECUTOR"):
        return UserError("EPBUILD_EXECUTOR", None, reason)
    return UserError(manifest.path.name, "executor.scheduler", reason)


def read_models(manifest: Manifest, layout: Layout, index: ExternalDataIndex, servers: set[str],
                start: RunStart | None, links: Links) -> Facts:
    """The external-data files of each model and `validation.reference` (by path), each model's input shapes
    and graph facts (`plan.external_data._ready`), from the index; changed models are read by a fork server
    running or starting anyway (it has onnx loaded), the CPU-only one first. `start`: a default run here, whose
    changed models' builds run next: their targets' servers are started while this process reads them
    (`RunStart.servers_for`)."""
    models = manifest.models.values()
    references = {m.validation["reference"]: m.name for m in models if "reference" in m.validation}
    unread = index.unread(list(dict.fromkeys([*(model.path for model in models), *references])))
    if unread:
        reader = next((alias for alias in sorted(servers | {""}) if serving(links, alias, index.expect)), None)
        if start is not None:
            start.servers_for(manifest, set(unread))
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


def with_workers(manifest: Manifest, builds: list[Build], executor: ExecutorSettings | None) -> list[Build]:
    """With an executor, the builds with the toolchain versions the workers offer (they count, not this host's)."""
    if not executor:
        return builds
    try:
        return with_worker_toolchains(builds, executor)
    except BuildError as exc:
        raise executor_error(manifest, str(exc)) from None


def check_availability(manifest: Manifest, builds: list[Build], start: RunStart, workspace: Workspace,
                       executor: ExecutorSettings | None,
                       started: tuple[HostProbe | None, dict[str, Any]] | None = None) -> Availability:
    """Which targets this host (or, with an executor, the cluster) cannot build, and why; what was probed
    (`started`: the probe `RunStart.probe` began)."""
    used = {b.target.name: b.target for b in builds if not b.target.is_cpu}
    needs_probe = not executor and any(compiler(t).in_onnxruntime for t in used.values())
    probe, shim = started if started and started[0] else start.probe(list(used.values()), workspace.layout, workspace,
                                                                     executor)
    caps = {**probe.result(), "vendor_shim": shim} if needs_probe and probe else {}
    unavailable: dict[str, str] = {}
    for name, target in used.items():
        reason = compiler(target).unavailable(target, None if executor else caps)
        if reason:
            unavailable[name] = reason
    looked_at = [*(path for t in used.values() for path in compiler(t).probed_files(t)), *manifest.reads]
    return Availability(caps, unavailable, looked_at)


def shard_of(text: str | None) -> tuple[int, int] | None:
    """EPBUILD_SHARD=I/N: this job builds shard I of N (1-based)."""
    if not text:
        return None
    index, _, count = text.partition("/")
    if not (text.isascii() and index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        raise UserError("EPBUILD_SHARD", None, f"must be I/N with 1 <= I <= N, such as 2/4, found {text!r}")
    return int(index), int(count)


