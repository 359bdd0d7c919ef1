"""The tasks that inspect or tidy instead of building: `backends`, `graph`, `prune`, `cache`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from doit.exceptions import TaskFailed

from ..errors import UserError
from ..execute.host import capabilities
from ..files.owners import sweep
from ..logs import say
from ..report.build_report import BuildReport
from ..report.task_graph import write_graph
from ..steps.compilers import COMPILERS, compiler
from ..steps.toolchain.toolchains import Toolchain, find_qaic, find_qairt
from ..store.cache import Workspace, default_dir
from ..store.orphans import orphans, prune

if TYPE_CHECKING:
    from .project import Project


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
        say(json.dumps(data, indent=2))
        return
    say(f"onnxruntime {data['onnxruntime']}; compiler backends: {', '.join(in_onnxruntime)}"
          f"{''.join(f', {n}' for n, t in toolchains.items() if t['found'])}")
    for name, entry in eps.items():
        devices = ", ".join(f"{d['type']} ({d.get('ov_device') or d['vendor']})" for d in entry["devices"]) or "none"
        error = f"; error: {entry['error']}" if entry["error"] else ""
        say(f"  EP {name}: devices {devices}{error}")
    shim = data["openvino_vendor_shim"]
    if shim:
        say(f"  OpenVINO runs through epbuild's vendor-id shim on this {caps.get('key', {}).get('cpu')} CPU: "
              f"{shim.get('library') or 'unavailable: ' + shim['reason']}")
    for name, entry in toolchains.items():
        say(f"  toolchain {name}: " + (f"{entry['root']} (version {entry['version']})" if entry["found"]
                                         else f"absent: {entry['reason']}"))
    for name, entry in targets.items():
        state = "buildable" if entry["buildable"] else f"not buildable: {entry['reason']}"
        say(f"  target {name} ({entry['ep']}, {entry['device']}, {entry['compiler']}): {state}")


def show_graph(project: Project, all_tasks: Callable[[], list[dict[str, Any]]], model: str) -> TaskFailed | None:
    """`doit graph [--model M]`: the task graph, coloured by the last build report, in graph.svg (one model's in
    graph-M.svg, beside the full one)."""
    try:
        keep = project.model_tasks(model) if model else None
        say("graph: " + write_graph(all_tasks(), BuildReport(project.layout.build_report).entries,
                                      project.layout.root, keep, f"graph-{model}" if model else "graph"))
    except (UserError, OSError) as exc:
        return TaskFailed(str(exc))
    return None


def run_prune(project: Project, dry_run: bool) -> None:
    """`doit prune [--dry-run]`: what no current task owns under artifacts/, removed (or listed); and the scratch
    folders of killed builds, removed."""
    if not dry_run:
        swept, freed = sweep([project.layout.scratch_root, project.workspace.cache_dir / "tmp"])
        if swept:
            say(f"prune: removed {len(swept)} scratch folder(s) of killed builds, freed {freed / 1e6:.1f} MB")
    found = orphans(project.layout, project.owned_paths())
    for path in found:
        say(f"{'would remove' if dry_run else 'removed'} {project.rel(path)}{'/' if path.is_dir() else ''}")
    freed = prune(found, dry_run)
    verb = "would free" if dry_run else "freed"
    say(f"prune: {len(found)} orphaned output(s), {verb} {freed / 1e6:.1f} MB" if found else
          "prune: nothing under artifacts/ is left over from removed models, targets, groups or stages")


def show_cache(workspace: Workspace) -> None:
    """The local cache's folder, size and cap; the remote's location, mode and signing, probed once."""
    entries, size = workspace.cache.usage()
    cap = (f"cap {workspace.cache_max_bytes / 1e6:.0f} MB, least-recently-used entries evicted beyond it"
           if workspace.cache_max_bytes else "no size cap (`[cache] max_size_mb`)")
    count = f"{entries} entr{'y' if entries == 1 else 'ies'}"
    shared = ("; the per-user default, shared by every project of this user (a model built in one restores in "
              "another; `[cache] dir` or EPBUILD_CACHE_DIR gives a project its own)"
              if workspace.cache_dir == default_dir().absolute() else "")
    say(f"local cache: {workspace.cache_dir}: {count}, {size / 1e6:.1f} MB; {cap}{shared}")
    remote = workspace.remote
    if remote is None:
        say('remote cache: none (`[cache] remote` or EPBUILD_CACHE_REMOTE = "s3://BUCKET/PREFIX")')
        return
    settings = remote.settings()
    mode = "read-only (EPBUILD_CACHE_READONLY)" if settings["readonly"] else "read-write"
    signing = ("entries signed and checked with EPBUILD_CACHE_SIGNING_KEY" if settings["signed"] else
               "entries unsigned (EPBUILD_CACHE_SIGNING_KEY signs them and refuses unsigned ones)")
    reachable = "reachable" if settings["reachable"] is True else f"unreachable: {settings['reachable']}"
    say(f"remote cache: {settings['url']} at {settings['endpoint']}: {reachable}; {mode}; {signing}")


