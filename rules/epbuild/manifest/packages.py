"""`[packages.NAME]`: an ONNX Runtime model package's models and groups, read and checked (`parse` reads the rest of
the manifest)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import closest
from ..records import record

if TYPE_CHECKING:
    from .parse import GroupSpec, ModelSpec, TableReader


@record
class PackageSpec:
    """An ONNX Runtime model package: its models as components, their targets as variants."""

    name: str
    models: tuple[str, ...]
    targets: tuple[str, ...] | None  # None: every target of its models
    groups: tuple[str, ...] = ()


def read_package(table: TableReader, name: str, models: dict[str, ModelSpec],
                 groups: dict[str, GroupSpec]) -> PackageSpec:
    """`[packages.NAME]`, checked against the models and groups read before it."""
    values = table.read("package")
    members, chosen, shared = values["models"], values["targets"], values["groups"]
    if not members and not shared:
        table.fail("a package holds at least one model or group: give `models` (or `groups`)", "models")
    table.declared("groups", shared, groups, "group")
    table.declared("models", members, models, "model")
    theirs = {t for member in members for t in models[member].targets}
    for index, target in enumerate(chosen or ()):
        if target not in theirs:
            table.fail(f"'{target}' is not a target of {', '.join(members)}{closest(target, theirs)}; theirs: "
                       f"{', '.join(sorted(theirs))}", f"targets[{index}]")
    return PackageSpec(name, tuple(members), tuple(chosen) if chosen is not None else None, tuple(shared))
