"""Shared-context groups: several models compiled, in order, into one shared EP context, in one fresh child.

This is the manifest form of `winml compile -m a.onnx -m b.onnx --output-dir ...`: every compile sets
`ep.share_ep_contexts=1`, the last also `ep.stop_share_ep_contexts=1` (without it QNN writes no binary). The folder
is published only when every member holds EPContext nodes and every file they reference exists.
"""

from __future__ import annotations

import json
import platform
import shutil
import time
from pathlib import Path
from typing import Any

from . import RULES_FORMAT
from .cache import Workspace
from .child import run_child
from .compile import Compiled, cached_compile, compile_request
from .errors import BuildError
from .fingerprint import group_fingerprint
from .host import toolchain_versions
from .publish import discard
from .targets import SIDECAR, GroupBuild
from .validate import member_request, write_report

# Loading a multi-graph QNN context segfaults on x86_64 (the HTP simulator); it loads on the device itself.
SHARED_CONTEXT_UNLOADABLE = {("qnn", "x86_64"): "loading a multi-graph QNN context crashes the process on x86_64 "
                                                "hosts (HTP simulator); run-validate on the device"}


def compile_group(group: GroupBuild, workspace: Workspace) -> Compiled:
    target = group.target
    fingerprint = group_fingerprint(group, workspace.hashes)

    def produce(scratch: Path) -> dict[str, float]:
        request = compile_request(target, [(m, scratch / f"{m.name}.onnx", None) for m in group.members],
                                  share=True)
        log = workspace.artifacts / ".logs" / target.name / f"group.{group.name}.compile.log"
        answer = run_child("rules.compile", request, scratch / ".child", target.limits(),
                           f"group {group.name} ({target.ep.name})", log)
        results = answer["members"]
        shutil.rmtree(scratch / ".child")
        for key, name in target.runtime_files().items():
            shutil.copyfile(target.option_files[key], scratch / name)
        (scratch / SIDECAR).write_text(json.dumps(sidecar(group, results), indent=2, sort_keys=True) + "\n")
        return answer["usage"]

    return cached_compile(f"group:{group.name}", fingerprint, workspace, group.out_dir(workspace.artifacts),
                          group.output_names, produce)


def sidecar(group: GroupBuild, results: list[dict[str, Any]]) -> dict[str, Any]:
    """The files that must be kept together, and per member what a runtime needs to load it."""
    target = group.target
    runtime_options = {k: v for k, v in target.options.items() if k in target.ep.runtime_options}
    runtime_options.update(target.runtime_files())
    return {
        "format": RULES_FORMAT, "group": group.name, "target": target.name, "ep": target.ep.name,
        "ep_source": target.source, "device": target.device, "compiler": target.compiler, "embed": False,
        "files": group.output_names, "order": [m.name for m in group.members],
        "runtime_options": runtime_options, "versions": toolchain_versions(target.ep),
        "members": {m.name: {"model_file": f"{m.name}.onnx", "binaries": r["binaries"], "nodes": r["nodes"],
                             "ep_sdk_version": r["ep_sdk_version"],
                             "inputs": {k: list(v) for k, v in m.inputs.items()}}
                    for m, r in zip(group.members, results, strict=True)},
    }


def run_blocked(group: GroupBuild) -> str | None:
    """Why this host cannot load the group's shared context, decided by EP and host; None when it can."""
    machine = platform.machine().lower().replace("amd64", "x86_64")
    return SHARED_CONTEXT_UNLOADABLE.get((group.target.ep.alias, machine))


def validate_group(group: GroupBuild, artifacts: Path) -> dict[str, Any]:
    """Structural checks always; each member run against its source where the host can load the context."""
    started = time.monotonic()
    folder = group.out_dir(artifacts)
    recorded = json.loads((folder / SIDECAR).read_text())
    members = {
        model.name: member_request(model, group.target, settings, folder, recorded["files"],
                                   {**recorded["members"][model.name], "runtime_options": recorded["runtime_options"]},
                                   frozen=group.frozen.get(model.name))
        for model, settings in zip(group.members, group.validations, strict=True)
    }
    request = {"members": members, "one_binary": group.target.ep.shares_one_binary, "run_blocked": run_blocked(group)}
    timeout = sum(settings.timeout_s for settings in group.validations)
    scratch = artifacts / ".scratch" / f"validate.group.{group.name}"
    log = artifacts / ".logs" / group.target.name / f"group.{group.name}.validate.log"
    try:
        report = run_child("rules.validate", request, scratch, group.target.limits(timeout),
                           f"validate group {group.name} ({group.target.ep.name})", log)
    except BuildError as exc:
        report = {"status": "failed", "reason": str(exc)}
    finally:
        discard(scratch)
    report = {"format": RULES_FORMAT, "group": group.name, "target": group.target.name, "ep": group.target.ep.name,
              "mode": "group", "seconds": round(time.monotonic() - started, 3), **report}
    write_report(folder, report)
    return report
