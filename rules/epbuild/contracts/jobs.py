"""A compile job as records: what the parent sends its compile child (`CompileJob`) and what the child answers
(`CompileAnswer`), frozen and versioned (`JOB_FORMAT`), as `artifact.json` is (`contracts.artifact`). They travel as
JSON (`to_json`), and are read back only through `from_json`, which refuses another format, a key the record does
not declare and a missing one: a child of another epbuild (a warm worker left from before an upgrade) answers
"internal error", never a half-understood compile. What `execute.child` adds on the way (`ENVELOPE`: the provenance
the job checks, the usage it measured) is not the job's and is ignored here."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from ..records import record

JOB_FORMAT = 1  # 1: the compile job and answer as records (were TypedDicts)
ENVELOPE = frozenset({"format", "provenance", "usage"})
R = TypeVar("R")


class JobFormatError(ValueError):
    """A job or answer this epbuild does not read: another format, unknown or missing keys."""


def _read(cls: type[R], data: Any, nested: Mapping[str, type]) -> R:
    if not isinstance(data, Mapping):
        raise JobFormatError(f"a {cls.__name__} that is not a JSON object")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    names = {f.name for f in fields}
    required = {f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    unknown, missing = data.keys() - names - ENVELOPE, required - data.keys()
    if unknown or missing:
        raise JobFormatError(f"a {cls.__name__} with {f'unknown keys {sorted(unknown)}' if unknown else ''}"
                             f"{' and ' if unknown and missing else ''}"
                             f"{f'missing keys {sorted(missing)}' if missing else ''}")
    values = {name: data[name] for name in names & data.keys()}
    for name, inner in nested.items():
        if not isinstance(values[name], list):
            raise JobFormatError(f"{cls.__name__}.{name} is not a list")
        values[name] = tuple(_read(inner, item, {}) for item in values[name])
    return cls(**values)


def _top(cls: type[R], data: Any, nested: Mapping[str, type]) -> R:
    if not isinstance(data, Mapping) or data.get("format") != JOB_FORMAT:
        found = data.get("format") if isinstance(data, Mapping) else None
        raise JobFormatError(f"a {cls.__name__} of format {found!r}; this epbuild reads format {JOB_FORMAT}")
    return _read(cls, data, nested)


def _json(value: Any) -> dict[str, Any]:
    return {"format": JOB_FORMAT, **dataclasses.asdict(value)}


@record
class CompileMember:
    """One model of a compile job."""

    model: str  # the model file the compile consumes
    output: str  # where the compiled (or optimized) model goes
    external_data: str | None  # CPU targets: the output's own external-data file name
    inputs: dict[str, list[int]]  # static shapes from the manifest
    entry: str  # the model's manifest entry (models.NAME), for errors about its keys
    weights: str | None  # the folder its external data resolves in, from its own, when not that (files.weights)


@record
class CompileJob:
    """What the compile child compiles: each member in order, with the target's settings."""

    members: tuple[CompileMember, ...]
    manifest: str  # the manifest's file name
    share: bool  # compile every member into one shared EP context
    ep: str  # EP alias
    device: str
    compiler: str  # ort or ort_session
    embed: bool
    options: dict[str, str]  # provider options, option files as absolute paths
    optimization_level: str | None  # CPU targets
    prune: dict[str, Any] | None = None  # `ship_socs`: {"python": the tool's interpreter, "keep": [SoCs]}

    NESTED: ClassVar[dict[str, type]] = {"members": CompileMember}

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, data: Any) -> CompileJob:
        return _top(cls, data, cls.NESTED)


@record
class CompiledMember:
    """What the compile made of one member."""

    nodes: dict[str, Any]  # where the source's nodes ended up (epbuild.steps.graph.placement)
    ep_sdk_version: str | None
    binaries: list[str]  # context binaries the compiled model references
    graphs: list[str] = dataclasses.field(default_factory=list)  # the EPContext nodes' names (Genie looks them up)
    compatibility: str | None = None  # the EP's compatibility string (get_compatibility_info_from_model)
    pruned: list[str] | None = None  # SoCs `ship_socs` removed from a multi-SoC binary (`steps.toolchain.soc_pruning`)


@record
class CompileAnswer:
    """The compile child's answer: each member's result, in the job's order."""

    members: tuple[CompiledMember, ...]

    NESTED: ClassVar[dict[str, type]] = {"members": CompiledMember}

    def to_json(self) -> dict[str, Any]:
        return _json(self)

    @classmethod
    def from_json(cls, data: Any) -> CompileAnswer:
        return _top(cls, data, cls.NESTED)
