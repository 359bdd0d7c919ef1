"""The contract a loader of a shared-context group must follow, recorded in the group's `artifact.json` when it is
published: the session options, the order of the members, whether all use one binary, and the binary's size against
the members compiled alone (the sharing ratio: weights stored once; for OpenVINO, whose shared binaries refer to the
models' external-data files by name, those files ship with the group and count in). QNN's weight-shared binaries are not
byte-stable from one compile to the next (a few hundred bytes differ), so a group's identity is its fingerprint,
never its bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...contracts.artifact import ArtifactRecord, read_artifact
from ...files.layout import Layout
from ...manifest.builds import SIDECAR, Build
from ..compilers.base import shared_weights

SHARED_SESSION = {"ep.share_ep_contexts": "1"}  # what every member's session sets: the later ones reuse the first's


def _binary_bytes(folder: Path, names: list[str]) -> int:
    return sum((folder / name).stat().st_size for name in names)


def loading_contract(build: Build, folder: Path, recorded: ArtifactRecord, layout: Layout) -> dict[str, Any]:
    """`loading` for a group's artifact.json. The members' own compiles for the group's target run before the
    group (a task dependency), so the ratio is known whenever each member is also built alone for that target."""
    target = build.target
    binaries = sorted({name for member in recorded.members.values() for name in member.binaries})
    weights = shared_weights(list(build.members)) if target.ep.shared_weights_outside else []
    shared = _binary_bytes(folder, binaries + weights)
    contract: dict[str, Any] = {
        "session_options": dict(SHARED_SESSION), "order": [m.name for m in build.members],
        "one_binary": len(binaries) == 1, "binaries": {name: (folder / name).stat().st_size for name in binaries},
        **({"weights": {name: (folder / name).stat().st_size for name in weights}} if weights else {}),
        "how": "create the members' sessions in this order, each with these session options (the first loads the "
               "shared binary, the later ones take their graphs from it), and destroy them in reverse order"}
    alone, missing = {}, []
    for member in build.members:
        own = layout.build_dir(target.name, member.name, False)
        if target.name not in member.model.targets or not (own / SIDECAR).is_file():
            missing.append(member.name)
            continue
        files = read_artifact(own).files
        alone[member.name] = _binary_bytes(own, [f for f in files if target.ep.binary_suffix
                                                 and f.endswith(target.ep.binary_suffix)])
    if missing:
        contract["sharing"] = {"shared_bytes": shared, "alone_bytes": None,
                               "why": f"{', '.join(missing)} not built alone for {target.name} (add the target to "
                                      "the model's targets to measure the sharing ratio)"}
    else:
        total = sum(alone.values())
        contract["sharing"] = {"shared_bytes": shared, "alone_bytes": alone,
                               "ratio": round(shared / total, 4) if total else None}
    return contract
