"""What shapes an output: the settings that go into each task's `config_changed`.

Files (model, external data, option files) are tracked by content through doit's `file_dep`; everything else
that changes the bytes is here. Paths appear relative to the manifest's folder, so a checkout can move.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from . import RULES_FORMAT
from .host import toolchain_versions
from .targets import Build, GroupBuild


@functools.cache
def relative(path: Path, root: Path) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def compile_config(build: Build, root: Path) -> dict[str, Any]:
    target = build.target
    return {
        "rules_format": RULES_FORMAT,
        "model": relative(build.model.path, root),
        "inputs": {name: list(shape) for name, shape in sorted(build.model.inputs.items())},
        "ep": target.ep.name, "ep_source": target.source, "device": target.device,
        "compiler": target.compiler, "embed": target.embed, "options": target.options,
        "option_files": sorted(target.option_files), "optimization_level": target.optimization_level,
        "versions": toolchain_versions(target.ep),
    }


def validate_config(build: Build, root: Path) -> dict[str, Any]:
    settings, target = build.validation, build.target
    return {
        "rules_format": RULES_FORMAT, "mode": settings.mode, "thresholds": dict(sorted(settings.thresholds.items())),
        "inputs": relative(settings.inputs, root) if settings.inputs else None,
        "reference": relative(settings.reference, root) if settings.reference else None,
        "timeout_s": settings.timeout_s, "ep": target.ep.name, "device": target.device,
        "versions": toolchain_versions(target.ep),
    }


def group_config(group: GroupBuild, root: Path) -> dict[str, Any]:
    """Members in order (the order shapes the shared binary) with their shapes, plus the target's settings."""
    target = group.target
    return {
        "rules_format": RULES_FORMAT,
        "members": [[relative(m.path, root), {k: list(v) for k, v in sorted(m.inputs.items())}]
                    for m in group.members],
        "ep": target.ep.name, "ep_source": target.source, "device": target.device, "compiler": target.compiler,
        "options": target.options, "option_files": sorted(target.option_files),
        "versions": toolchain_versions(target.ep),
    }


def group_validate_config(group: GroupBuild, root: Path) -> dict[str, Any]:
    return {"rules_format": RULES_FORMAT, "group": group_config(group, root),
            "members": [{"mode": v.mode, "thresholds": dict(sorted(v.thresholds.items())),
                         "inputs": relative(v.inputs, root) if v.inputs else None,
                         "reference": relative(v.reference, root) if v.reference else None,
                         "timeout_s": v.timeout_s} for v in group.validations]}
