"""What backends outside ONNX Runtime share (`qairt`, `qaic`): a toolchain found on this host (or offered by the
Dask workers), its version in the fingerprint, and the artifact.json they write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...contracts.artifact import ArtifactRecord
from ...errors import BuildError
from ...files.publish import copy_file
from ...files.weights import resolved
from ...manifest.builds import Build, ResolvedTarget
from ...version import RULES_FORMAT
from ..toolchain.toolchains import Toolchain, probed_files
from .base import Compiler


class ExternalToolCompiler(Compiler):
    """A backend that runs a vendor tool: available when the tool is (here, or on the workers)."""

    in_onnxruntime = False

    def toolchain(self, target: ResolvedTarget) -> Toolchain | str:
        """The tool found from the target's `sdk_root`, or why it is not."""
        raise NotImplementedError

    def probed_files(self, target: ResolvedTarget) -> list[Path]:
        return probed_files(self.name, target.sdk_root)

    def identity(self, target: ResolvedTarget) -> dict[str, str] | None:
        found = self.toolchain(target)
        version = found.version if isinstance(found, Toolchain) else target.toolchain_version or "absent"
        return {"name": self.name, "version": version}

    def unavailable(self, target: ResolvedTarget, caps: dict[str, Any] | None) -> str | None:
        found = self.toolchain(target)
        return found if isinstance(found, str) and target.toolchain_version is None else None

    def found(self, build: Build) -> Toolchain:
        found = self.toolchain(build.target)
        if isinstance(found, str):
            raise BuildError(f"compile {build.name}: {found}")
        return found


def standalone(member: Any, work: Path) -> Path:
    """The model for a tool that reads external data beside the file it is given: a graph that reads its weights
    from another folder (`files.weights`) gets a working copy in `work`, the weights beside it (reflinks where the
    file system has them), gone with `work`."""
    folder = member.weights.get(str(member.model.path))
    if folder is None:
        return member.model.path
    base, copy = resolved(member.model.path, folder), work / "input" / member.model.path.name
    copy.parent.mkdir()
    copy_file(member.model.path, copy)
    for path in member.external:
        (copy.parent / path.relative_to(base)).parent.mkdir(parents=True, exist_ok=True)
        copy_file(path, copy.parent / path.relative_to(base))
    return copy


def external_sidecar(build: Build, toolchain: Toolchain, source_nodes: int, files: list[str]) -> ArtifactRecord:
    """The artifact record of a vendor tool's compile: the tool and its version in place of ONNX Runtime's."""
    (member,) = build.members
    return ArtifactRecord(format=RULES_FORMAT, model=member.name, compiler=build.target.compiler,
                          device=build.target.device, files=files,
                          toolchain={"name": toolchain.name, "version": toolchain.version},
                          nodes={"source": source_nodes},
                          inputs={name: list(shape) for name, shape in member.model.inputs.items()})
