"""doit task generators: the only module that knows doit.

Task creation reads the manifest, a cached host probe and a cached external-data index; it never imports
onnxruntime or parses an unchanged model, so `doit list` and a no-op `doit` stay near doit's own cost.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from doit.dependency import FileChangedChecker
from doit.exceptions import TaskFailed
from doit.reporter import ConsoleReporter
from doit.tools import config_changed

from . import RULES_FORMAT
from .cache import Workspace, cache_location
from .compile import Compiled, compile_build, file_records
from .errors import BuildError, UserError
from .external_data import ExternalDataIndex
from .fingerprint import (
    compile_config,
    group_config,
    group_validate_config,
    stage_config,
    validate_config,
    validation_fingerprint,
)
from .groups import compile_group, validate_group
from .hashing import FileHashes, stat_key
from .host import capabilities, unavailable_reason
from .manifest import load
from .preprocess import run_stage
from .publish import discard
from .stages import Stage
from .targets import Build, GroupBuild, ResolvedTarget, plan, plan_groups
from .toolchains import Toolchain, find_qaic, find_qairt, supported_operators, toolchain_identity
from .validate import REPORT, cached_validation, summary, validate_build

Task = dict[str, Any]


def _digest(config: dict[str, Any]) -> str:
    """A task's config as a short string for config_changed: repr is stable for our dicts (built in a fixed
    order) and much cheaper than config_changed's own sorted json.dumps, which ran for every task on every run."""
    return hashlib.md5(repr(config).encode()).hexdigest()


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


FAILURES = (BuildError, UserError, OSError)


def failure(exc: Exception, prefix: str = "") -> TaskFailed:
    """A task failure with one readable message; an OSError (a full disk, a permission) names the file."""
    if isinstance(exc, OSError) and not isinstance(exc, BuildError):
        return TaskFailed(f"{prefix}{exc.strerror or exc} ({exc.filename or 'artifacts'})")
    return TaskFailed(f"{prefix}{exc}")


def _usage(usage: dict[str, float] | None) -> str:
    return f", peak {usage['peak_mb']:.0f} MB" if usage else ""


def _compiled(done: Compiled, detail: str) -> dict[str, Any]:
    print(f"{done.status} {done.build}: {detail}, {done.seconds:.1f} s{_usage(done.usage)} -> "
          f"{os.path.relpath(done.out_dir)}/")
    return {"status": done.status, "fingerprint": done.fingerprint, "files": done.files,
            "seconds": round(done.seconds, 3), **({"child": done.usage} if done.usage else {}),
            **({"nodes": done.nodes} if "in_ep" in done.nodes else {})}


def placement_line(nodes: dict[str, Any]) -> str:
    """How much of the model the EP took, what stayed on CPU, and constant subgraphs that folding would remove."""
    line = (f"{nodes['in_ep']}/{nodes['source']} source nodes ({nodes.get('offload', 1):.0%}) in "
            f"{nodes['ep_context']} EPContext node(s), {nodes['cpu']} on CPU")
    if nodes.get("cpu_op_types"):
        line += f" ({', '.join(f'{op} x{n}' for op, n in nodes['cpu_op_types'].items())})"
    foldable = nodes.get("foldable_on_cpu")
    if foldable:
        line += (f"; {sum(foldable.values())} of them compute constants ({', '.join(foldable)}): set "
                 "optimize = \"basic\" on the model to fold them before the compile")
    return line


def run_compile(build: Build, workspace: Workspace) -> TaskFailed | dict[str, Any]:
    try:
        done = compile_build(build, workspace)
    except FAILURES as exc:
        return failure(exc)
    nodes = done.nodes
    if build.target.compiler == "qaic":
        taken = f"QPC from {nodes['source']} source nodes"
    elif "in_ep" in nodes:
        taken = placement_line(nodes)
    else:
        taken = f"{nodes['cpu']} nodes after optimization"
    return _compiled(done, taken)


def run_group(group: GroupBuild, workspace: Workspace) -> TaskFailed | dict:
    try:
        done = compile_group(group, workspace)
    except FAILURES as exc:
        return failure(exc)
    names = ", ".join(f["name"] for f in done.files)
    return _compiled(done, f"{len(group.members)} members, {done.nodes['ep_context']} EPContext node(s) "
                           f"(keep together: {names})")


def run_stage_task(stage: Stage, workspace: Workspace) -> TaskFailed | dict[str, Any]:
    try:
        restored, seconds, dynamic = run_stage(stage, workspace)
    except FAILURES as exc:
        return failure(exc)
    if dynamic:
        print(f"warning: {stage.task}: {len(dynamic)} tensor(s) keep dynamic dimensions after shape inference, "
              f"which NPU EPs refuse: {', '.join(dynamic[:5])}{' ...' if len(dynamic) > 5 else ''}")
    if stage.kind == "quantize" and stage.settings["random"]:
        print(f"warning: {stage.task} calibrated on fixed-seed random data: for smoke tests only, the "
              "quantization ranges do not reflect real inputs")
    status = "restored" if restored else "compiled"
    print(f"{status} {stage.task}: {seconds:.1f} s -> {os.path.relpath(stage.output)}")
    return {"status": status, "seconds": round(seconds, 3),
            "files": file_records(stage.output.parent, [p.name for p in stage.outputs], workspace)}


def run_validate(build: Build | GroupBuild, workspace: Workspace, config: dict[str, Any],
                 extra: list[Path]) -> TaskFailed | dict:
    """Validate a build's or a group's artifact, or restore a passed report for the same bytes from the cache."""
    validator = validate_group if isinstance(build, GroupBuild) else validate_build
    folder = build.out_dir(workspace.artifacts)
    fingerprint = validation_fingerprint([folder / n for n in build.output_names], config, extra, workspace.hashes)
    try:
        report, restored = cached_validation(fingerprint, workspace, folder,
                                             lambda: validator(build, workspace.artifacts))
    except OSError as exc:
        return failure(exc, f"validate:{build.name}: ")
    line = f"{report['status']} validate:{build.name}: {summary(report)}"
    if report["status"] == "failed":
        return TaskFailed(line)
    print(line + (" (restored from the cache)" if restored else ""))
    status = "restored" if restored else "skipped" if report["status"] == "skipped" else "validated"
    return {"status": status, "fingerprint": fingerprint, "validation": line, "seconds": report["seconds"]}


def _unavailable(basename: str, name: str, doc: str, reason: str) -> Task:
    """The task of a target this host cannot build: listed with the reason, refused by name."""
    return {"basename": basename, "name": name, "doc": f"{doc} [unavailable here: {reason}]",
            "actions": [(refuse_unavailable, [f"{basename}:{name}", reason])], "uptodate": [False]}


def refuse_unavailable(task: str, reason: str) -> TaskFailed | dict[str, str]:
    """Asked for by name, a task this host cannot build fails; reached through `doit compile` or `doit validate`
    it is skipped with its reason, like in the default run."""
    if task in sys.argv[1:]:
        return TaskFailed(f"{task} cannot be built on this host: {reason}")
    print(f"skipped {task}: {reason}")
    return {"status": "skipped", "reason": reason}


def report_unavailable(reasons: dict[str, str]) -> None:
    for task, reason in reasons.items():
        print(f"skipped {task}: {reason}")
    if not reasons:
        print("this host can build every task")


def target_reason(target: ResolvedTarget, caps: dict[str, Any]) -> str | None:
    """Why this host cannot build the target (EP, package, device or external toolchain), or None."""
    if target.compiler in ("qaic", "qairt"):
        found = find_qaic(target.sdk_root) if target.compiler == "qaic" else find_qairt(target.sdk_root)
        return found if isinstance(found, str) else None
    return unavailable_reason(target.ep, target.source, target.device, caps)


def run_ops(build: Build, workspace: Workspace, report: Path) -> TaskFailed | None:
    """Compare the model's operators with what qaic-compile supports, before a long compile fails on them."""
    import onnx

    found = find_qaic(build.target.sdk_root)
    if isinstance(found, str):
        return TaskFailed(f"ops:{build.name}: {found}")
    log = workspace.artifacts / ".logs" / build.target.name / f"{build.model.name}.ops.log"
    try:
        supported = supported_operators(found, log)
    except BuildError as exc:
        return TaskFailed(str(exc))
    model = onnx.load(str(build.model.path), load_external_data=False)
    used = sorted({n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")})
    unsupported = [op for op in used if op not in supported]
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps({"operators": used, "unsupported": unsupported}, indent=1) + "\n")
    if unsupported:
        report.unlink()
        return TaskFailed(f"ops:{build.name}: qaic-compile does not support {', '.join(unsupported)} "
                          f"(used by {build.model.path.name})")
    print(f"ops:{build.name}: all {len(used)} operators are supported by qaic-compile {found.version}")
    return None


def show_backends(project: Project, json_output: bool) -> None:
    """What this host can build: EPs, compiler backends and toolchains, and each manifest target."""
    caps = project.caps or capabilities(project.artifacts / ".state")
    eps = {name: {"devices": entry["devices"], "error": entry.get("error")}
           for name, entry in caps.get("eps", {}).items()}
    toolchains = {}
    for name, found in (("qaic", find_qaic(project.manifest.toolchains.get("qaic"))), ("qairt", find_qairt(None))):
        toolchains[name] = ({"found": True, "root": str(found.root), "version": found.version,
                             "executables": {k: str(v) for k, v in found.executables.items()}}
                            if isinstance(found, Toolchain) else {"found": False, "reason": found})
    targets = {}
    for target in {t.name: t for t in [b.target for b in [*project.builds, *project.groups]]}.values():
        reason = None if target.is_cpu else target_reason(target, caps)
        targets[target.name] = {"ep": target.ep.name, "device": target.device, "compiler": target.compiler,
                                "buildable": reason is None, **({"reason": reason} if reason else {})}
    data = {"onnxruntime": caps.get("onnxruntime"), "compilers": {"ort": True, "ort_session": True},
            "execution_providers": eps, "toolchains": toolchains, "targets": targets}
    if json_output:
        print(json.dumps(data, indent=2))
        return
    print(f"onnxruntime {data['onnxruntime']}; compiler backends: ort, ort_session"
          f"{''.join(f', {n}' for n, t in toolchains.items() if t['found'])}")
    for name, entry in eps.items():
        devices = ", ".join(f"{d['type']} ({d.get('ov_device') or d['vendor']})" for d in entry["devices"]) or "none"
        error = f"; error: {entry['error']}" if entry["error"] else ""
        print(f"  EP {name}: devices {devices}{error}")
    for name, entry in toolchains.items():
        print(f"  toolchain {name}: " + (f"{entry['root']} (version {entry['version']})" if entry["found"]
                                         else f"absent: {entry['reason']}"))
    for name, entry in targets.items():
        state = "buildable" if entry["buildable"] else f"not buildable: {entry['reason']}"
        print(f"  target {name} ({entry['ep']}, {entry['device']}, {entry['compiler']}): {state}")


class HashChecker(FileChangedChecker):
    """doit's file checker on the shared hash memory: state is [size, mtime_ns, inode, sha256], and a file whose
    identity changed but whose bytes did not (a fresh clone, a touch) is hashed once, not on every run."""

    hashes: FileHashes  # set on a per-project subclass: doit instantiates the checker without arguments

    def check_modified(self, file_path, file_stat, state):
        if state is None or len(state) != 4:
            return True
        if stat_key(file_stat) == state[:3]:
            return False
        return self.hashes.sha256(file_path, file_stat) != state[3]

    def get_state(self, dep, current_state):
        stat = os.stat(dep)
        key = stat_key(stat)
        if current_state and current_state[:3] == key:
            return None
        return [*key, self.hashes.sha256(dep, stat)]


class BuildReporter(ConsoleReporter):
    """doit's console output, plus `artifacts/build-report.json` and a summary at the end of every run."""

    project: Project  # set on a per-project subclass

    def initialize(self, tasks, selected_tasks):
        super().initialize(tasks, selected_tasks)
        self.path = self.project.artifacts / "build-report.json"
        try:
            self.entries: dict[str, dict[str, Any]] = json.loads(self.path.read_text())["tasks"]
        except (OSError, ValueError, KeyError):
            self.entries = {}
        self.started: dict[str, float] = {}
        self.uptodate: set[str] = set()

    def execute_task(self, task):
        if task.name != "backends":  # its output, --json included, stays clean for machines
            super().execute_task(task)
        self.started[task.name] = time.monotonic()

    def add_success(self, task):
        super().add_success(task)
        if ":" in task.name and task.values.get("status"):
            self.entries[task.name] = {k: v for k, v in task.values.items() if not k.startswith("_")}

    def add_failure(self, task, fail):
        super().add_failure(task, fail)
        if ":" in task.name:
            seconds = time.monotonic() - self.started.get(task.name, time.monotonic())
            self.entries[task.name] = {"status": "failed", "reason": fail.get_msg().strip(),
                                       "seconds": round(seconds, 3)}

    def skip_uptodate(self, task):
        super().skip_uptodate(task)
        self.uptodate.add(task.name)
        if ":" in task.name:
            self.entries[task.name] = {**self.entries.get(task.name, {}), "status": "up-to-date"}

    def complete_run(self):
        seen = set(self.started) | self.uptodate
        if "unavailable" in seen:  # the default run: tasks this host cannot build were skipped
            for name, reason in self.project.skipped().items():
                self.entries[name] = {"status": "skipped", "reason": reason}
                seen.add(name)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".build-report.{os.getpid()}.tmp")
        lines = ",\n".join(f"  {json.dumps(name)}: {json.dumps(entry)}" for name, entry in sorted(self.entries.items()))
        temporary.write_text(f'{{"format": {RULES_FORMAT}, "tasks": {{\n{lines}\n}}}}\n')  # one line per task
        os.replace(temporary, self.path)
        counts = Counter(entry["status"] for name, entry in self.entries.items() if name in seen)
        ran = sorted((e["seconds"], n) for n, e in self.entries.items()
                     if n in self.started and e.get("seconds") and e["status"] != "skipped")[::-1][:3]
        slowest = ", ".join(f"{name} {seconds:.1f} s{_usage(self.entries[name].get('child'))}"
                            for seconds, name in ran)
        if counts:
            self.write(f"summary: {', '.join(f'{n} {s}' for s, n in sorted(counts.items()))}"
                       f"{f'; slowest: {slowest}' if slowest else ''}\n")
        super().complete_run()


class Project:
    """A loaded manifest with everything task creation needs, computed once."""

    def __init__(self, manifest_path: Path):
        self.manifest = load(manifest_path)
        self.root = self.manifest.root
        self.rel = _Relative(Path.cwd())
        self.artifacts = self.root / "artifacts"
        if self.artifacts.is_symlink():
            raise UserError(self.manifest.path.name, None, f"{self.artifacts} is a symbolic link (to "
                            f"{os.readlink(self.artifacts)}); outputs are written only inside the project: "
                            "make artifacts/ a plain folder")
        self.workspace = Workspace(self.artifacts, *cache_location(self.manifest.cache))
        state = self.artifacts / ".state"
        index = ExternalDataIndex(state)
        external = {}
        for name, model in self.manifest.models.items():
            try:
                external[name] = tuple(index.files(model.path))
            except UserError as exc:
                raise UserError(self.manifest.path.name, f"models.{name}.path", f"{exc.file}: {exc.message}") from None
        index.save()
        self.builds = plan(self.manifest, external)
        self.groups = plan_groups(self.manifest, external)
        used = {b.target.name: b.target for b in [*self.builds, *self.groups] if not b.target.is_cpu}
        caps = capabilities(state) if any(t.compiler in ("ort", "ort_session") for t in used.values()) else {}
        self.unavailable: dict[str, str] = {}
        self.caps = caps
        for name, target in used.items():
            reason = target_reason(target, caps)
            if reason:
                self.unavailable[name] = reason
        self.stages = {stage.task: stage for b in [*self.builds, *self.groups] for stage in b.stages}
        self.outputs = {}  # build name -> (artifact folder, its spelling for doit)
        for build in self.builds:
            out_dir = build.out_dir(self.artifacts)
            self.outputs[build.name] = (out_dir, self.rel(out_dir))

    @staticmethod
    def task_names(build: Build | GroupBuild) -> list[str]:
        if isinstance(build, GroupBuild):
            return [f"group:{build.name}", *([f"validate:{build.name}"] if build.validations[0].mode != "off" else [])]
        return [f"compile:{build.name}", *([f"validate:{build.name}"] if build.validation.mode != "off" else [])]

    def skipped(self) -> dict[str, str]:
        return {name: self.unavailable[b.target.name] for b in [*self.builds, *self.groups]
                if b.target.name in self.unavailable for name in self.task_names(b)}

    def doit_config(self) -> dict[str, Any]:
        default = [name for b in [*self.builds, *self.groups] if b.target.name not in self.unavailable
                   for name in self.task_names(b)]
        if self.unavailable:
            default.append("unavailable")
        checker = type("ProjectHashChecker", (HashChecker,), {"hashes": FileHashes(self.artifacts / ".state")})
        reporter = type("ProjectBuildReporter", (BuildReporter,), {"project": self})
        return {"backend": "sqlite3", "dep_file": ".doit.db", "verbosity": 2, "subtasks": True,
                "default_tasks": default, "check_file_uptodate": checker, "reporter": reporter}

    def compile_tasks(self) -> Iterator[Task]:
        yield {"basename": "compile", "name": None, "doc": "compile every model for each of its targets"}
        rel = self.rel
        for build in self.builds:
            target, (out_dir, out) = build.target, self.outputs[build.name]
            doc = f"{build.model.name} for {target.name} ({target.ep.name}, {target.device})"
            reason = self.unavailable.get(target.name)
            if reason:
                yield _unavailable("compile", build.name, doc, reason)
                continue
            inputs = [build.model.path, *build.external, *target.option_files.values()]
            checks = [f"ops:{build.name}"] if target.compiler == "qaic" else []
            yield {
                "basename": "compile", "name": build.name, "doc": f"{doc} -> {out}/",
                "actions": [(run_compile, [build, self.workspace])],
                "file_dep": [rel(path) for path in inputs],
                "targets": [f"{out}/{name}" for name in build.output_names],
                "uptodate": [config_changed(_digest(compile_config(build, self.root)))],
                "clean": [(discard, [out_dir])],
                "task_dep": checks,
            }

    def validate_tasks(self) -> Iterator[Task]:
        yield {"basename": "validate", "name": None, "doc": "run every compiled artifact and compare with its source"}
        for build in self.builds:
            settings, target = build.validation, build.target
            if settings.mode == "off":
                continue
            rel, out = self.rel, self.outputs[build.name][1]
            what = "structural checks" if settings.mode == "structural" else "run, compare with the source on CPU"
            doc = f"{build.model.name} on {target.name}: {what}"
            reason = self.unavailable.get(target.name)
            if reason:
                yield _unavailable("validate", build.name, doc, reason)
                continue
            extra = [p for p in (settings.inputs, settings.reference, build.float_model) if p]
            sources = [build.model.path, *build.external, *extra]
            config = validate_config(build, self.root)
            yield {
                "basename": "validate", "name": build.name, "doc": doc,
                "actions": [(run_validate, [build, self.workspace, config, [build.model.path, *extra]])],
                "file_dep": [*(f"{out}/{name}" for name in build.output_names), *map(rel, sources)],
                "targets": [f"{out}/{REPORT}"],
                "uptodate": [config_changed(_digest(config))],
            }
        yield from self.group_validate_tasks()

    def ops_tasks(self) -> Iterator[Task]:
        yield {"basename": "ops", "name": None, "doc": "check every qaic model's operators against qaic-compile"}
        for build in self.builds:
            if build.target.compiler != "qaic" or build.target.name in self.unavailable:
                continue
            report = self.artifacts / ".state" / "ops" / build.target.name / f"{build.model.name}.json"
            yield {"basename": "ops", "name": build.name,
                   "doc": f"operators of {build.model.name} supported by qaic-compile?",
                   "actions": [(run_ops, [build, self.workspace, report])],
                   "file_dep": [self.rel(build.model.path)], "targets": [self.rel(report)],
                   "uptodate": [config_changed({"toolchain": toolchain_identity("qaic", build.target.sdk_root)})]}

    def backends_task(self) -> Iterator[Task]:
        yield {"basename": "backends", "doc": "what this host can build: EPs, compilers, toolchains, targets",
               "actions": [(show_backends, [self])], "uptodate": [False], "verbosity": 2,
               "params": [{"name": "json_output", "long": "json", "type": bool, "default": False,
                           "help": "print JSON for machines"}]}

    def stage_tasks(self) -> Iterator[Task]:
        """shape:, optimize:, quantize:<model>[flavour] and squash: tasks, each feeding the next by file."""
        rel = self.rel
        docs = {"freeze": "configuration inputs to constants, folded", "shape": "static shapes from `inputs`",
                "optimize": "ORT graph optimization",
                "quantize": "QDQ quantization with calibration data", "squash": "inline external data"}
        for kind in dict.fromkeys(stage.kind for stage in self.stages.values()):
            yield {"basename": kind, "name": None, "doc": docs[kind]}
        for stage in self.stages.values():
            yield {
                "basename": stage.kind, "name": stage.task.split(":", 1)[1],
                "doc": f"{stage.kind} {stage.model}{f' for {stage.flavour} targets' if stage.flavour else ''} -> "
                       f"{rel(stage.output)}",
                "actions": [(run_stage_task, [stage, self.workspace])],
                "file_dep": [rel(p) for p in (stage.input, *stage.input_external, *stage.calibration)],
                "targets": [rel(p) for p in stage.outputs],
                "uptodate": [config_changed(_digest(stage_config(stage)))],
                "clean": [(discard, [stage.output.parent])],
            }

    def group_tasks(self) -> Iterator[Task]:
        yield {"basename": "group", "name": None, "doc": "compile every shared-context group"}
        for group in self.groups:
            target, out_dir, rel = group.target, group.out_dir(self.artifacts), self.rel
            doc = (f"{', '.join(m.name for m in group.members)} into one shared context for {target.name} "
                   f"({target.ep.name})")
            reason = self.unavailable.get(target.name)
            if reason:
                yield _unavailable("group", group.name, doc, reason)
                continue
            inputs = [p for m in group.members for p in (m.path, *group.external[m.name])]
            yield {
                "basename": "group", "name": group.name, "doc": f"{doc} -> {rel(out_dir)}/",
                "actions": [(run_group, [group, self.workspace])],
                "file_dep": [rel(path) for path in [*inputs, *target.option_files.values()]],
                "targets": [rel(out_dir / name) for name in group.output_names],
                "uptodate": [config_changed(_digest(group_config(group, self.root)))],
                "clean": [(discard, [out_dir])],
            }

    def group_validate_tasks(self) -> Iterator[Task]:
        for group in self.groups:
            if group.validations[0].mode == "off":
                continue
            rel, out_dir = self.rel, group.out_dir(self.artifacts)
            doc = f"group {group.name}: structural checks, and each member run where this host loads the context"
            reason = self.unavailable.get(group.target.name)
            if reason:
                yield _unavailable("validate", group.name, doc, reason)
                continue
            extra = [p for v in group.validations for p in (v.inputs, v.reference) if p]
            inputs = [*(out_dir / name for name in group.output_names), *(m.path for m in group.members), *extra]
            config = group_validate_config(group, self.root)
            sources = [m.path for m in group.members]
            yield {
                "basename": "validate", "name": group.name, "doc": doc,
                "actions": [(run_validate, [group, self.workspace, config, [*sources, *extra]])],
                "file_dep": [rel(path) for path in inputs],
                "targets": [rel(out_dir / REPORT)],
                "uptodate": [config_changed(_digest(config))],
            }

    def unavailable_task(self) -> Iterator[Task]:
        yield {"basename": "unavailable", "doc": "list the tasks this host cannot build, and why",
               "actions": [(report_unavailable, [self.skipped()])], "uptodate": [False]}


def load_project(manifest_path: str | Path) -> Project:
    """Load for dodo.py: a user error prints one line and exits 2, without a traceback."""
    try:
        return Project(Path(manifest_path))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
