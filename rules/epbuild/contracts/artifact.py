"""`artifact.json`, the record beside every built artifact: what a runtime needs to load it (EP, device, options,
files, each model file), what the compile did (nodes per place, binaries, SDK and compatibility strings) and, once
published, the target's name and a group's loading contract. Written only through `ArtifactRecord.to_json`, read
only through `read_artifact`; its `format` is `RULES_FORMAT`, and a record of another format is refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..errors import json_value
from ..version import RULES_FORMAT

NAME = "artifact.json"


class _Omitted:
    """A key the record does not have (distinct from a key whose value is null)."""

    def __repr__(self) -> str:
        return "OMIT"


OMIT: Any = _Omitted()


class ArtifactFormatError(ValueError):
    """An artifact.json this version of epbuild does not read: another format, or keys it does not know."""


@dataclasses.dataclass(frozen=True)
class ArtifactMember:
    """One model of a shared-context group."""

    model_file: str
    binaries: list[str]
    nodes: dict[str, Any]
    ep_sdk_version: str | None
    graphs: list[str]
    inputs: dict[str, list[int]]
    compatibility: str = OMIT


@dataclasses.dataclass(frozen=True)
class ArtifactRecord:
    """Every key artifact.json may hold; a key is written only when set (`OMIT` otherwise)."""

    format: int
    compiler: str  # ort, ort_session, qairt, qaic
    device: str
    files: list[str]  # every file of the artifact folder, this one included
    ep: str = OMIT  # the EP's registered name (absent for qaic: a QPC is not an ONNX Runtime artifact)
    ep_source: str = OMIT  # pypi or bundled
    embed: bool = OMIT
    runtime_options: dict[str, str] = OMIT  # the provider options a session needs; option files by their name here
    versions: dict[str, str | None] = OMIT  # onnxruntime and the EP plugin the compile ran
    vendor_shim: dict[str, Any] = OMIT  # the OpenVINO vendor-id shim the compile ran under
    model: str = OMIT  # a single model's name
    model_file: str = OMIT
    inputs: dict[str, list[int]] = OMIT
    ep_sdk_version: str | None = OMIT
    nodes: dict[str, Any] = OMIT  # where the source's nodes went: source, ep_context, cpu, in_ep, ...
    graphs: list[str] = OMIT  # the EPContext nodes' graph names
    compatibility: str = OMIT  # the EP's compatibility string
    socs: dict[str, str] = OMIT  # a multi-SoC QNN binary: each SoC it holds, number -> chip name
    soc_pruning: dict[str, Any] = OMIT  # `ship_socs`: {"kept", "removed"}, or {"skipped": why}
    frozen: dict[str, list[float]] = OMIT  # inputs made constants (`freeze`)
    optimization_level: str = OMIT  # cpu targets
    toolchain: dict[str, str] = OMIT  # qaic, qairt: the vendor tool's name and version
    group: str = OMIT  # a shared-context group's name
    order: list[str] = OMIT  # its members, in loading order
    members: dict[str, ArtifactMember] = OMIT
    target: str = OMIT  # added when the folder is published (the target's name is not in the fingerprint)
    loading: dict[str, Any] = OMIT  # a group's loading contract, added when published

    def has(self, key: str) -> bool:
        return getattr(self, key) is not OMIT

    def to_json(self) -> dict[str, Any]:
        """The JSON object (written with sorted keys by `files.layout.write_json`)."""
        data = _present(self)
        if self.has("members"):
            data["members"] = {name: _present(member) for name, member in self.members.items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ArtifactRecord:
        if data.get("format") != RULES_FORMAT:
            raise ArtifactFormatError(f"format {data.get('format')!r}, this epbuild reads format {RULES_FORMAT}: "
                                      "rebuild the artifact")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ArtifactFormatError(f"unknown key(s) {', '.join(unknown)}")
        values = dict(data)
        if "members" in values:
            values["members"] = {name: ArtifactMember(**m) for name, m in values["members"].items()}
        return cls(**values)

    def replace(self, **changes: Any) -> ArtifactRecord:
        return dataclasses.replace(self, **changes)

    def member_entries(self) -> dict[str, Any]:
        """Each model's entry by name: a group's members, or the single model's own record."""
        return dict(self.members) if self.has("members") else {self.model: self}


def _present(record: ArtifactRecord | ArtifactMember) -> dict[str, Any]:
    """A record's keys that are set."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record) if getattr(record, f.name) is not OMIT}


def read_artifact(folder: Path) -> ArtifactRecord:
    """The record of a built artifact folder; OSError when absent, ArtifactFormatError when not this format."""
    return ArtifactRecord.from_json(json_value((folder / NAME).read_text()))
