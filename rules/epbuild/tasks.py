"""doit task generators: the only module that knows doit.

Task creation reads the manifest, a cached host probe and a cached external-data index; it never imports
onnxruntime or parses an unchanged model, so `doit list` and a no-op `doit` stay near doit's own cost. Actions are
thin: they call plain functions (`epbuild.steps.compile`, `epbuild.steps.validate`, `epbuild.steps.preprocess`,
`epbuild.steps.toolchains`), print one line and return the values the build report keeps.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from doit.dependency import FileChangedChecker
from doit.exceptions import TaskFailed
from doit.reporter import ConsoleReporter

from .errors import BuildError, UserError, closest
from .execute.executor import executor_settings, run_operator_list, run_validation, unreachable, with_worker_toolchains
from .execute.fork_server import prestart, serving
from .execute.host import capabilities
from .fast_path import (
    DOIT_BASE,
    Listing,
    Stamp,
    is_default_run,
    listed,
    load_project,  # noqa: F401 - dodo.py copies made before it moved import it from here
    project_key,
)
from .manifest.builds import Build
from .manifest.eps import lookup
from .manifest.parse import Manifest, load
from .manifest.targets import plan, resolve_targets
from .report.build_report import BuildReport, usage_text
from .report.progress import LiveProgress, live_wanted, load_durations, save_durations
from .report.task_graph import write_graph
from .report.views import append_step_summary, template_prepared_meanwhile, write_views
from .steps import vendor_shim
from .steps.compile import compile_build, file_records
from .steps.compilers import COMPILERS, compiler
from .steps.fingerprint import compile_config, stage_config, validate_config, validation_fingerprint
from .steps.preprocess import run_stage
from .steps.stages import Stage
from .steps.toolchains import Toolchain, check_operators, find_qaic, find_qairt, supported_operators
from .steps.validate import REPORT, cached_validation, summary, validate
from .store.cache import Outcome, Workspace, cache_location, remote_location
from .store.external_data import ExternalDataIndex
from .store.hashing import FileHashes, snapshot
from .store.layout import STAGES, Layout, settled, stat_key
from .store.orphans import orphans, prune
from .store.owners import owner_tag, sweep
from .store.publish import discard
from .store.task_configs import ConfigRecord, published

Task = dict[str, Any]
INSPECTING = {"list", "info", "help", "clean", "forget", "ignore", "dumpdb", "strace", "tabcompletion", "reset-dep",
              "backends", "cache", "unavailable", "graph", "prune"}  # doit commands and tasks that build nothing
FAILURES = (BuildError, UserError, OSError)


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


def failure(exc: Exception, prefix: str = "") -> TaskFailed:
    """A task failure with one readable message; an OSError (a full disk, a permission) names the file."""
    if isinstance(exc, OSError) and not isinstance(exc, BuildError):
        return TaskFailed(f"{prefix}{exc.strerror or exc} ({exc.filename or 'artifacts'})")
    return TaskFailed(f"{prefix}{exc}")


def _origin(outcome: Outcome) -> str:
    """' (from the remote cache, 1.2 MB)' for a remote hit, '' otherwise."""
    if outcome.origin != "remote":
        return ""
    return f" (from the remote cache, {outcome.downloaded / 1e6:.1f} MB)"


def run_compile(build: Build, workspace: Workspace) -> TaskFailed | dict[str, Any]:
    """Compile or restore one build; print where its nodes went."""
    try:
        done = compile_build(build, workspace)
    except FAILURES as exc:
        return failure(exc)
    nodes = done.nodes
    if build.shared:
        names = ", ".join(f["name"] for f in done.files)
        detail = f"{len(build.members)} members, {nodes['ep_context']} EPContext node(s) (keep together: {names})"
    else:
        detail = compiler(build.target).describe(nodes)
    print(f"{done.status} {done.build}: {detail}, {done.seconds:.1f} s{usage_text(done.usage)} -> "
          f"{os.path.relpath(done.out_dir)}/{_origin(done.outcome)}")
    return {"status": done.status, **done.outcome.report(), **({"worker": done.worker} if done.worker else {}),
            "fingerprint": done.fingerprint, "files": done.files,
            "_published": published([done.out_dir / f["name"] for f in done.files], workspace.hashes,
                                    workspace.project_root),
            "seconds": round(done.seconds, 3), **({"child": done.usage} if done.usage else {}),
            **({"nodes": nodes} if "in_ep" in nodes else {})}


def run_stage_task(stage: Stage, workspace: Workspace) -> TaskFailed | dict[str, Any]:
    try:
        outcome, seconds, dynamic, worker = run_stage(stage, workspace)
    except FAILURES as exc:
        return failure(exc)
    if dynamic:
        print(f"warning: {stage.task}: {len(dynamic)} tensor(s) keep dynamic dimensions after shape inference, "
              f"which NPU EPs refuse: {', '.join(dynamic[:5])}{' ...' if len(dynamic) > 5 else ''}")
    if stage.kind == "quantize" and stage.settings["random"]:
        print(f"warning: {stage.task} calibrated on fixed-seed random data: for smoke tests only, the "
              "quantization ranges do not reflect real inputs")
    status = "restored" if outcome.restored else "compiled"
    print(f"{status} {stage.task}: {seconds:.1f} s -> {os.path.relpath(stage.output)}{_origin(outcome)}")
    return {"status": status, **outcome.report(), **({"worker": worker} if worker else {}),
            "seconds": round(seconds, 3),
            "files": file_records(stage.output.parent, [p.name for p in stage.outputs], workspace),
            "_published": published(stage.outputs, workspace.hashes, workspace.project_root)}


def run_validate(build: Build, workspace: Workspace, config: dict[str, Any]) -> TaskFailed | dict:
    """Validate a build's artifact, or restore a passed report for the same bytes from the cache."""
    started = time.monotonic()
    layout = workspace.layout
    folder = build.out_dir(layout)
    artifact = [folder / n for n in build.outputs]
    inputs = snapshot([*artifact, *build.sources, *build.validation_files])
    fingerprint = validation_fingerprint(artifact, config, [*build.sources, *build.validation_files], workspace.hashes)
    try:
        produce = (lambda workdir: run_validation(build, workspace)) if workspace.executor else (
            lambda workdir: validate(build, layout, workdir))
        report, outcome = cached_validation(f"validate:{build.name}", fingerprint, workspace, folder, produce, config,
                                            inputs, build.target.name)
    except (OSError, BuildError) as exc:
        return failure(exc, f"validate:{build.name}: ")
    line = f"{report['status']} validate:{build.name}: {summary(report)}"
    if report["status"] == "failed":
        return TaskFailed(line)
    print(line + (f" (restored from the {outcome.origin} cache)" if outcome.restored else ""))
    status = "restored" if outcome.restored else "skipped" if report["status"] == "skipped" else "validated"
    seconds = time.monotonic() - started if outcome.restored else report["seconds"]
    return {"status": status, **outcome.report(), **({"worker": report["worker"]} if "worker" in report else {}),
            "fingerprint": fingerprint, "validation": line, **({"child": report["usage"]} if "usage" in report else {}),
            "seconds": round(seconds, 3), "_published": published([folder / REPORT], workspace.hashes,
                                                                          workspace.project_root)}


def run_ops(build: Build, workspace: Workspace, report: Path) -> TaskFailed | None:
    """The operator check of a qaic build, before its compile; the operator list comes from a worker's
    qaic-compile when an executor runs the jobs."""
    try:
        if workspace.executor:
            supported, version = run_operator_list(build, workspace)
        else:
            found = find_qaic(build.target.sdk_root)
            if isinstance(found, str):
                return TaskFailed(f"ops:{build.name}: {found}")
            supported, version = supported_operators(found, build.log(workspace.layout, "ops")), found.version
        print(f"ops:{build.name}: " + check_operators(supported, version, build.members[0].model.path, report))
    except BuildError as exc:
        return TaskFailed(f"ops:{build.name}: {exc}")
    return None


def refuse_unavailable(task: str, reason: str, named: bool) -> TaskFailed | dict[str, str]:
    """Asked for by name (`named`), a task this host cannot build fails; reached through `doit compile` or
    `doit validate` it is skipped with its reason, like in the default run."""
    if named:
        return TaskFailed(f"{task} cannot be built on this host: {reason}")
    print(f"skipped {task}: {reason}")
    return {"status": "skipped", "reason": reason}


def report_unavailable(reasons: dict[str, str]) -> None:
    for task, reason in reasons.items():
        print(f"skipped {task}: {reason}")
    if not reasons:
        print("this host can build every task")


def show_backends(project: Project, json_output: bool) -> None:
    """What this host can build: EPs, compiler backends and toolchains, and each manifest target."""
    caps = project.caps or capabilities(project.layout.state)
    eps = {name: {"devices": entry["devices"], "error": entry.get("error")}
           for name, entry in caps.get("eps", {}).items()}
    toolchains = {}
    for name, found in (("qaic", find_qaic(project.manifest.toolchains.get("qaic"))), ("qairt", find_qairt(None))):
        toolchains[name] = ({"found": True, "root": str(found.root), "version": found.version,
                             "executables": {k: str(v) for k, v in found.executables.items()}}
                            if isinstance(found, Toolchain) else {"found": False, "reason": found})
    targets = {}
    for target in {b.target.name: b.target for b in project.builds}.values():
        reason = compiler(target).unavailable(target, caps)
        targets[target.name] = {"ep": target.ep.name, "device": target.device, "compiler": target.compiler,
                                "buildable": reason is None, **({"reason": reason} if reason else {})}
    in_onnxruntime = [name for name, backend in COMPILERS.items() if backend.in_onnxruntime]
    data = {"onnxruntime": caps.get("onnxruntime"), "compilers": dict.fromkeys(in_onnxruntime, True),
            "execution_providers": eps, "toolchains": toolchains, "targets": targets,
            "openvino_vendor_shim": caps.get("vendor_shim", {})}
    if json_output:
        print(json.dumps(data, indent=2))
        return
    print(f"onnxruntime {data['onnxruntime']}; compiler backends: {', '.join(in_onnxruntime)}"
          f"{''.join(f', {n}' for n, t in toolchains.items() if t['found'])}")
    for name, entry in eps.items():
        devices = ", ".join(f"{d['type']} ({d.get('ov_device') or d['vendor']})" for d in entry["devices"]) or "none"
        error = f"; error: {entry['error']}" if entry["error"] else ""
        print(f"  EP {name}: devices {devices}{error}")
    shim = data["openvino_vendor_shim"]
    if shim:
        print(f"  OpenVINO runs through epbuild's vendor-id shim on this {caps.get('key', {}).get('cpu')} CPU: "
              f"{shim.get('library') or 'unavailable: ' + shim['reason']}")
    for name, entry in toolchains.items():
        print(f"  toolchain {name}: " + (f"{entry['root']} (version {entry['version']})" if entry["found"]
                                         else f"absent: {entry['reason']}"))
    for name, entry in targets.items():
        state = "buildable" if entry["buildable"] else f"not buildable: {entry['reason']}"
        print(f"  target {name} ({entry['ep']}, {entry['device']}, {entry['compiler']}): {state}")


def show_graph(project: Project, model: str) -> TaskFailed | None:
    """`doit graph [--model M]`: the task graph, coloured by the last build report."""
    try:
        keep = project.model_tasks(model) if model else None
        print("graph: " + write_graph(project.all_tasks(), BuildReport(project.layout.build_report).entries,
                                      project.layout.root, keep))
    except (UserError, OSError) as exc:
        return TaskFailed(str(exc))
    return None


def run_prune(project: Project, dry_run: bool) -> None:
    """`doit prune [--dry-run]`: what no current task owns under artifacts/, removed (or listed); and the scratch
    folders of killed builds, removed."""
    if not dry_run:
        swept, freed = sweep([project.layout.scratch_root, project.workspace.cache_dir / "tmp"])
        if swept:
            print(f"prune: removed {len(swept)} scratch folder(s) of killed builds, freed {freed / 1e6:.1f} MB")
    found = orphans(project.layout, project.owned_paths())
    for path in found:
        print(f"{'would remove' if dry_run else 'removed'} {project.rel(path)}{'/' if path.is_dir() else ''}")
    freed = prune(found, dry_run)
    verb = "would free" if dry_run else "freed"
    print(f"prune: {len(found)} orphaned output(s), {verb} {freed / 1e6:.1f} MB" if found else
          "prune: nothing under artifacts/ is left over from removed models, targets, groups or stages")


def show_cache(workspace: Workspace) -> None:
    """The local cache's folder, size and cap; the remote's location, mode and signing, probed once."""
    entries, size = workspace.cache.usage()
    cap = (f"cap {workspace.cache_max_bytes / 1e6:.0f} MB, least-recently-used entries evicted beyond it"
           if workspace.cache_max_bytes else "no size cap (`[cache] max_size_mb`)")
    count = f"{entries} entr{'y' if entries == 1 else 'ies'}"
    print(f"local cache: {workspace.cache_dir}: {count}, {size / 1e6:.1f} MB; {cap}")
    remote = workspace.remote
    if remote is None:
        print('remote cache: none (`[cache] remote` or EPBUILD_CACHE_REMOTE = "s3://BUCKET/PREFIX")')
        return
    settings = remote.settings()
    mode = "read-only (EPBUILD_CACHE_READONLY)" if settings["readonly"] else "read-write"
    signing = ("entries signed and checked with EPBUILD_CACHE_SIGNING_KEY" if settings["signed"] else
               "entries unsigned (EPBUILD_CACHE_SIGNING_KEY signs them and refuses unsigned ones)")
    reachable = "reachable" if settings["reachable"] is True else f"unreachable: {settings['reachable']}"
    print(f"remote cache: {settings['url']} at {settings['endpoint']}: {reachable}; {mode}; {signing}")


class HashChecker(FileChangedChecker):
    """doit's file checker on the shared hash memory: state is [size, mtime_ns, ctime_ns, inode, sha256], and a file
    whose identity changed but whose bytes did not (a fresh clone, a touch) is hashed once, not on every run. It
    keeps the identity of every file it judged unchanged or found present (`checked`): a full no-op's stamp."""

    hashes: FileHashes  # set on a per-project subclass: doit instantiates the checker without arguments
    checked: dict[str, list[int]]
    published: dict[str, list]  # target -> [*identity, sha256] its task recorded when it published it
    edited: set[str]  # published targets found changed since: their tasks run again

    def check_modified(self, file_path, file_stat, state):
        if state is None or len(state) != 5:
            return True
        key = stat_key(file_stat)
        if key != state[:4] and self.hashes.sha256(file_path, file_stat) != state[4]:
            return True
        self.checked[file_path] = key
        return False

    def exists(self, file_path):
        """Present, and as its task published it: a published file changed since counts as missing, so that its
        task restores or rebuilds it (a touched one is hashed once and found unchanged)."""
        try:
            stat = os.stat(file_path)
        except OSError:
            return False
        key = self.checked[file_path] = stat_key(stat)
        recorded = self.published.get(file_path)
        if recorded and key != recorded[:4] and self.hashes.sha256(file_path, stat) != recorded[4]:
            self.edited.add(file_path)
            return False
        return True

    def get_state(self, dep, current_state):
        stat = os.stat(dep)
        key = stat_key(stat)
        if current_state and current_state[:4] == key:
            return None
        if not settled(stat):  # it may change again under this identity: compared by content next time
            key = [*key[:2], -1, key[3]]
        return [*key, self.hashes.sha256(dep, stat)]


def thread_mode(argv: list[str]) -> bool:
    """Whether doit's command line asks for `-P thread` / `--parallel-type thread`."""
    for at, word in enumerate(argv):
        if word in ("-P", "--parallel-type") and argv[at + 1:at + 2] == ["thread"]:
            return True
        if word in ("-Pthread", "--parallel-type=thread"):
            return True
    return False


def _closure(tasks: dict[str, Any], selected: list[str]) -> list[str]:
    """The tasks a run may execute: the selected ones and everything they depend on, named subtasks only."""
    seen: set[str] = set()
    todo = list(selected)
    while todo:
        name = todo.pop()
        if name in seen or name not in tasks:
            continue
        seen.add(name)
        todo.extend(tasks[name].task_dep)
        todo.extend(tasks[name].setup_tasks)
    return sorted(name for name in seen if ":" in name and tasks[name].actions)


class BuildReporter(ConsoleReporter):
    """doit's console output (with a live status area on a terminal), plus `artifacts/build-report.json`,
    `report.html`, `junit.xml` and a summary at the end of every run."""

    project: Project  # set on a per-project subclass

    def initialize(self, tasks, selected_tasks):
        super().initialize(tasks, selected_tasks)
        self.report = BuildReport(self.project.layout.build_report)
        self.started: dict[str, float] = {}
        self.uptodate: set[str] = set()
        self.durations = load_durations(self.project.layout.durations)
        self.live = None
        if self.project.live and not {"backends", "cache"} & set(selected_tasks):
            self.live = LiveProgress(self.outstream, _closure(tasks, selected_tasks), self.durations,
                                     catch_prints=self.project.threads)

    def write(self, text):
        if self.live is not None:
            self.live.print(text)
        else:
            super().write(text)

    def execute_task(self, task):
        edited = [target for target in task.targets if target in self.project.edited]
        if edited:
            self.write(f"warning: {', '.join(edited)} changed since it was published; restoring or rebuilding "
                       f"it\n")
        if self.live is not None:
            self.live.started(task.name)
        elif task.name != "backends":  # its output, --json included, stays clean for machines
            super().execute_task(task)
        self.started[task.name] = time.monotonic()

    def add_success(self, task):
        super().add_success(task)
        if self.live is not None:
            if not self.project.threads:  # captured (verbosity 1): shown above the status area
                self.write("".join(action.out for action in task.actions if action.out))
            self.live.finished(task.name)
        self.project.configs.success(task.name, task.values.get("_published"))
        if ":" in task.name and task.values.get("status"):
            self.report.succeeded(task.name, task.values)

    def add_failure(self, task, fail):
        super().add_failure(task, fail)
        if self.live is not None:
            self.live.finished(task.name, failed=True)
        if ":" in task.name:
            seconds = time.monotonic() - self.started.get(task.name, time.monotonic())
            self.report.failed(task.name, fail.get_msg().strip(), seconds)

    def skip_uptodate(self, task):
        if self.live is not None:
            self.live.finished(task.name)
        else:
            super().skip_uptodate(task)
        self.uptodate.add(task.name)
        if ":" in task.name:
            self.report.up_to_date(task.name)

    def complete_run(self):
        if self.live is not None:
            self.live.stop()
            self.live = None
        seen = set(self.started) | self.uptodate
        if "unavailable" in seen:  # the default run: tasks this host cannot build were skipped
            for name, reason in self.project.skipped().items():
                self.report.skipped(name, reason)
                seen.add(name)
        layout = self.project.layout
        self.report.keep_only(self.project.declared_tasks())  # a removed model's entries would keep CI red
        try:  # the views are for people: one that cannot be written is a warning, never a failed build
            if self.report.write() or not layout.html_report.exists():
                write_views(layout, self.project.builds, self.report.entries)
            if os.environ.get("GITHUB_STEP_SUMMARY") and seen:
                append_step_summary(layout, self.project.builds, self.report.entries)
        except Exception as exc:  # noqa: BLE001 - any rendering error, reported with its type
            self.write(f"warning: report.html / junit.xml not written: {type(exc).__name__}: {exc}\n")
        try:  # a record that cannot be written makes the next run check, and possibly re-run, more: never wrong
            self.project.configs.save()
            if self.project.key and not (self.failures or self.runtime_errors) and set(self.started) <= {"unavailable"}:
                up_to_date = [name for name in self.uptodate if ":" in name]
                skipped = self.project.skipped() if "unavailable" in seen else {}
                Stamp(layout).write(self.project.key, self.project.checked, self.project.looked_at, len(up_to_date),
                                    skipped)
            save_durations(layout.durations, self.durations, self.report.entries, set(self.started))
        except OSError as exc:
            self.write(f"warning: build state not saved ({exc.strerror or exc}: {exc.filename}); the next run "
                       "re-checks the tasks\n")
        line = self.report.summary(seen, set(self.started))
        if line:
            self.write(line + "\n")
        super().complete_run()


class Project:
    """A loaded manifest with everything task creation needs, computed once. `requested` are the task names
    given on doit's command line: a task this host cannot build fails when named, and is skipped otherwise."""

    def __init__(self, manifest_path: Path, requested: Iterable[str] = ()):
        requested = list(requested)
        command = requested[0] if requested else None
        # a plain `doit list` or default run: its outcome may let the next one skip loading (epbuild.fast_path)
        self.key = project_key(manifest_path) if requested == ["list"] or is_default_run(requested) else None
        self.checked: dict[str, list[int]] = {}
        self.edited: set[str] = set()  # published files found changed since (the file checker fills it)
        self.shard = shard_of(os.environ.get("EPBUILD_SHARD"))
        self.live = command not in INSPECTING and live_wanted(sys.stdout)  # a status area under the task lines
        self.threads = thread_mode(requested)
        self.manifest = load(manifest_path)
        self.root = self.manifest.root
        self.requested = frozenset(requested)
        self.rel = _Relative(Path.cwd())
        resolved = resolve_targets(self.manifest)
        for warning in (w for target in resolved.values() for w in target.warnings):
            print(warning, file=sys.stderr)
        self.layout = Layout(self.root / "artifacts")
        if self.layout.root.is_symlink():
            raise UserError(self.manifest.path.name, None, f"{self.layout.root} is a symbolic link (to "
                            f"{os.readlink(self.layout.root)}); outputs are written only inside the project: "
                            "make artifacts/ a plain folder")
        self.writable = self._check_writable(command)
        if self.writable and command not in INSPECTING:  # what killed builds left behind
            sweep([self.layout.scratch_root, Path(cache_location(self.manifest.cache)[0]) / "tmp"])
        executor = executor_settings(self.manifest.executor.scheduler, self.manifest.executor.wait_s)
        if executor and command in INSPECTING:
            executor = None  # listing or inspecting needs no cluster
        elif executor and (reason := unreachable(executor)):
            raise self.executor_error(reason)
        self.workspace = Workspace(self.layout.root, *cache_location(self.manifest.cache),
                                   remote_location(self.manifest.cache), executor, self.manifest.cache.hard_links)
        servers: set[str] = set()
        if is_default_run(requested) and not executor and not self.layout.configs.exists():
            servers = first_build_servers(self.manifest)
            prestart(servers)  # their imports overlap this process's start-up
        index = ExternalDataIndex(self.layout.state)
        unread = index.unread([model.path for model in self.manifest.models.values()])
        if unread:  # read by a fork server running or starting anyway (it has onnx loaded), the CPU-only one first
            reader = next((alias for alias in sorted(servers | {""}) if serving(alias)), None)
            with template_prepared_meanwhile() if servers else contextlib.nullcontext():
                index.read(unread, reader, self.layout.scratch(f"read-models.{owner_tag()}"))
        external = {}
        for name, model in self.manifest.models.items():
            try:
                external[name] = tuple(index.files(model.path))
            except UserError as exc:
                raise UserError(self.manifest.path.name, f"models.{name}.path", f"{exc.file}: {exc.message}") from None
        if self.writable:
            index.save()
        self.builds = plan(self.manifest, external, resolved)
        if executor:  # the workers' toolchains and devices count, not this host's
            try:
                self.builds = with_worker_toolchains(self.builds, executor)
            except BuildError as exc:
                raise self.executor_error(str(exc)) from None
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
        self.stages = {stage.task: stage for b in self.builds for stage in b.stages}
        # besides the tasks' files: what task creation looked at (toolchain probes, configs, calibration folders)
        self.looked_at = [*(path for t in used.values() for path in compiler(t).probed_files(t)),
                          *self.manifest.reads]
        if executor:
            self.key = None  # the workers' toolchains count: no shortcut
        self.configs = ConfigRecord(self.layout.configs)

    def _check_writable(self, command: str | None) -> bool:
        """Whether artifacts/ takes files: a build needs it (one line and exit 2 when not); listing and the other
        inspecting commands go on without saving their state, with one warning."""
        probe = self.layout.state / f".writable.{os.getpid()}"
        try:
            self.layout.state.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
            return True
        except OSError as exc:
            where = self.rel(self.layout.root)
            if command not in INSPECTING:
                raise UserError(self.manifest.path.name, None, f"{where}/ is not writable: {exc.strerror or exc}; "
                                "outputs are written there (make it writable, or build in a copy)") from None
            print(f"warning: {where}/ is not writable ({exc.strerror or exc}): nothing is saved for the next run",
                  file=sys.stderr)
            return False

    def executor_error(self, reason: str) -> UserError:
        if os.environ.get("EPBUILD_EXECUTOR"):
            return UserError("EPBUILD_EXECUTOR", None, reason)
        return UserError(self.manifest.path.name, "executor.scheduler", reason)

    @staticmethod
    def task_names(build: Build) -> list[str]:
        return [build.task, *([f"validate:{build.name}"] if build.validates else [])]

    def skipped(self) -> dict[str, str]:
        return {name: self.unavailable[b.target.name] for b in self.builds
                if b.target.name in self.unavailable for name in self.task_names(b)}

    def doit_config(self) -> dict[str, Any]:
        default = [name for b in self.builds if b.target.name not in self.unavailable and in_shard(b, self.shard)
                   for name in self.task_names(b)]
        if self.unavailable:
            default.append("unavailable")
        recorded = self.configs.published_files()  # paths relative to the project; doit's are relative to its folder
        inside = self.rel(self.root)
        published = recorded if inside == "." else {os.path.join(inside, p): v for p, v in recorded.items()}
        checker = type("ProjectHashChecker", (HashChecker,), {"hashes": FileHashes(self.layout.state), "checked": {},
                                                              "published": published, "edited": set()})
        self.checked, self.edited = checker.checked, checker.edited
        reporter = type("ProjectBuildReporter", (BuildReporter,), {"project": self})
        # Live: doit captures each task's output (verbosity 1) and the reporter prints it above the status area;
        # threads share one sys.stdout, which doit's capture would race on, so there the status area catches prints.
        verbosity = 1 if self.live and not self.threads else 2
        return {**DOIT_BASE, "verbosity": verbosity, "default_tasks": default, "check_file_uptodate": checker,
                "reporter": reporter}

    def _task(self, basename: str, name: str, doc: str, action: Any, args: list[Any], file_dep: Iterable[Path] = (),
              targets: Iterable[Path] = (), config: dict[str, Any] | None = None, **extra: Any) -> Task:
        """One doit task: files spelled relative to doit's folder, settings compared with those it last succeeded
        with (`config`; None: it always runs). With `-P thread`,
        doit's output capture is off: it swaps sys.stdout per running task, and CPython 3.11's print() holds a
        borrowed reference to sys.stdout, so a swap in another thread can free it mid-print (a segfault)."""
        unchanged = config is not None and self.configs.unchanged(f"{basename}:{name}", config)
        return {"basename": basename, "name": name, "doc": doc, "actions": [(action, args)],
                "file_dep": [self.rel(p) for p in file_dep], "targets": [self.rel(p) for p in targets],
                "uptodate": [unchanged], **({"io": {"capture": False}} if self.threads else {}), **extra}

    def _unavailable(self, basename: str, build: Build, doc: str) -> Task | None:
        """The task of a target this host cannot build: listed with the reason, refused by name; None if it can."""
        reason = self.unavailable.get(build.target.name)
        if reason is None:
            return None
        task = f"{basename}:{build.name}"
        return self._task(basename, build.name, f"{doc} [unavailable here: {reason}]", refuse_unavailable,
                          [task, reason, task in self.requested])

    def build_tasks(self, kind: str) -> Iterator[Task]:
        """compile:MODEL@TARGET (kind "compile") or group:NAME (kind "group") tasks."""
        yield {"basename": kind, "name": None, "doc": "compile every model for each of its targets" if kind ==
               "compile" else "compile every shared-context group"}
        for build in self.builds:
            if build.kind != kind:
                continue
            target, out_dir = build.target, build.out_dir(self.layout)
            if build.shared:
                doc = (f"{', '.join(m.name for m in build.members)} into one shared context for {target.name} "
                       f"({target.ep.name})")
            else:
                doc = f"{build.members[0].name} for {target.name} ({target.ep.name}, {target.device})"
            refused = self._unavailable(kind, build, doc)
            if refused:
                yield refused
                continue
            checks = [f"ops:{build.name}"] if compiler(target).operator_check else []
            yield self._task(kind, build.name, f"{doc} -> {self.rel(out_dir)}/", run_compile, [build, self.workspace],
                             build.inputs, [out_dir / name for name in build.outputs],
                             compile_config(build, self.root), clean=[(discard, [out_dir])], task_dep=checks)

    def validate_tasks(self) -> Iterator[Task]:
        yield {"basename": "validate", "name": None, "doc": "run every compiled artifact and compare with its source"}
        for build in self.builds:
            if not build.validates:
                continue
            if build.shared:
                doc = f"group {build.name}: structural checks, and each member run where this host loads the context"
            else:
                what = ("structural checks" if build.members[0].validation.mode == "structural"
                        else "run, compare with the source on CPU")
                doc = f"{build.members[0].name} on {build.target.name}: {what}"
            refused = self._unavailable("validate", build, doc)
            if refused:
                yield refused
                continue
            out_dir, config = build.out_dir(self.layout), validate_config(build, self.root)
            external = [p for m in build.members for p in m.external]
            inputs = [*(out_dir / name for name in build.outputs), *build.sources, *external,
                      *build.validation_files]
            yield self._task("validate", build.name, doc, run_validate, [build, self.workspace, config], inputs,
                             [out_dir / REPORT], config)

    def ops_tasks(self) -> Iterator[Task]:
        yield {"basename": "ops", "name": None, "doc": "check every qaic model's operators against qaic-compile"}
        for build in self.builds:
            backend = compiler(build.target)
            if not backend.operator_check or build.target.name in self.unavailable:
                continue
            report = self.layout.ops_report(build.target.name, build.members[0].name)
            yield self._task("ops", build.name, f"operators of {build.members[0].name} supported by qaic-compile?",
                             run_ops, [build, self.workspace, report], [build.members[0].model.path], [report],
                             {"toolchain": backend.identity(build.target)})

    def backends_task(self) -> Iterator[Task]:
        yield {"basename": "backends", "doc": "what this host can build: EPs, compilers, toolchains, targets",
               "actions": [(show_backends, [self])], "uptodate": [False], "verbosity": 2,
               "params": [{"name": "json_output", "long": "json", "type": bool, "default": False,
                           "help": "print JSON for machines"}]}

    def cache_task(self) -> Iterator[Task]:
        yield {"basename": "cache", "doc": "the local cache's size and the remote cache's settings",
               "actions": [(show_cache, [self.workspace])], "uptodate": [False], "verbosity": 2}

    def stage_tasks(self) -> Iterator[Task]:
        """shape:, optimize:, quantize:<model>[flavour] and squash: tasks, each feeding the next by file."""
        docs = {"freeze": "configuration inputs to constants, folded", "shape": "static shapes from `inputs`",
                "optimize": "ORT graph optimization",
                "quantize": "QDQ quantization with calibration data", "squash": "inline external data"}
        for kind in dict.fromkeys(stage.kind for stage in self.stages.values()):
            yield {"basename": kind, "name": None, "doc": docs[kind]}
        for stage in self.stages.values():
            doc = (f"{stage.kind} {stage.model}{f' for {stage.flavour} targets' if stage.flavour else ''} -> "
                   f"{self.rel(stage.output)}")
            yield self._task(stage.kind, stage.task.split(":", 1)[1], doc, run_stage_task, [stage, self.workspace],
                             [stage.input, *stage.input_external, *stage.calibration], stage.outputs,
                             stage_config(stage), clean=[(discard, [stage.output.parent])])

    def save_listing(self) -> None:
        """What `doit list` shows, for the next one under the same key (epbuild.fast_path)."""
        generators = {"stages": self.stage_tasks, "compile": lambda: self.build_tasks("compile"),
                      "group": lambda: self.build_tasks("group"), "validate": self.validate_tasks,
                      "ops": self.ops_tasks, "backends": self.backends_task, "cache": self.cache_task,
                      "unavailable": self.unavailable_task, "graph": self.graph_task, "prune": self.prune_task}
        Listing(self.layout).write(self.key, {name: [listed(task) for task in make()]
                                              for name, make in generators.items()})

    def all_tasks(self) -> list[Task]:
        return [*self.stage_tasks(), *self.build_tasks("compile"), *self.build_tasks("group"),
                *self.validate_tasks(), *self.ops_tasks()]

    def prune_task(self) -> Iterator[Task]:
        yield {"basename": "prune", "doc": "remove what removed models, targets, groups and stages left under "
               "artifacts/ (--dry-run: only list it)", "actions": [(run_prune, [self])], "uptodate": [False],
               "verbosity": 2, "params": [{"name": "dry_run", "long": "dry-run", "type": bool, "default": False,
                                           "help": "list what would be removed, remove nothing"}]}

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
                                                                         f"ops:{build.name}"))}

    def graph_task(self) -> Iterator[Task]:
        yield {"basename": "graph", "doc": "the task graph as artifacts/graph.dot and graph.svg (--model M: one model)",
               "actions": [(show_graph, [self])], "uptodate": [False], "verbosity": 2,
               "params": [{"name": "model", "long": "model", "type": str, "default": "",
                           "help": "only this model's tasks (its stages, compiles, checks, validations, groups)"}]}

    def model_tasks(self, model: str) -> set[str]:
        """The task names of one model: its stages, and every build it is a member of with its checks."""
        if model not in self.manifest.models:
            raise UserError(self.manifest.path.name, None, f"no model '{model}'{closest(model, self.manifest.models)};"
                            f" models: {', '.join(self.manifest.models)}")
        names = set()
        for build in self.builds:
            if model in (m.name for m in build.members):
                names |= {build.task, f"validate:{build.name}", f"ops:{build.name}", *(s.task for s in build.stages)}
        return names

    def unavailable_task(self) -> Iterator[Task]:
        yield {"basename": "unavailable", "doc": "list the tasks this host cannot build, and why",
               "actions": [(report_unavailable, [self.skipped()])], "uptodate": [False]}


def shard_of(text: str | None) -> tuple[int, int] | None:
    """EPBUILD_SHARD=I/N: this job builds shard I of N (1-based)."""
    if not text:
        return None
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        raise UserError("EPBUILD_SHARD", None, f"must be I/N with 1 <= I <= N, such as 2/4, found {text!r}")
    return int(index), int(count)


def in_shard(build: Build, shard: tuple[int, int] | None) -> bool:
    """A stable hash partition by model (a compile) or group name, so a model's stages stay in one shard."""
    if shard is None:
        return True
    key = build.name if build.shared else build.members[0].name
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % shard[1] == shard[0] - 1


def first_build_servers(manifest: Manifest) -> set[str]:
    """The fork servers a first full build here (`doit` with no settings record yet: a clean checkout, CI)
    certainly uses: those of its ONNX Runtime targets' EPs."""
    specs = [t for t in manifest.targets.values()
             if t.ep and (backend := COMPILERS.get(t.compiler)) and backend.in_onnxruntime]
    return {info.fork_server for t in specs if (info := lookup(t.ep))}


def load_full_project(manifest_path: Path, requested: list[str]) -> Project:
    """The project with all its tasks (`epbuild.fast_path.load_project` calls this when no shortcut holds); a user
    error prints one line and exits 2, without a traceback."""
    try:
        project = Project(manifest_path, requested)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if requested == ["list"] and project.writable:
        project.save_listing()
    return project
