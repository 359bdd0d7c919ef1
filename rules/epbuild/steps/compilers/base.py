"""The interface every compiler backend implements (`steps.compilers`), and what backends share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import UserError
from ...files.layout import Layout
from ...manifest.builds import SIDECAR, Build, ResolvedTarget
from ...manifest.parse import TargetSpec
from ...store.cache import Workspace


def _not_for(spec: TargetSpec, file: str, keys: tuple[str, ...], why: str) -> None:
    """Refuse the first of `keys` the target sets, saying why it does not apply."""
    for key in keys:
        value = getattr(spec, key)
        if value not in (None, False, {}, (), []):
            raise UserError(file, f"targets.{spec.name}.{key}", why)


class Compiler:
    """The interface. Its defaults are those of an artifact ONNX Runtime loads (an EPContext model and its
    binaries, validated in an ONNX Runtime child); each backend says how it is produced and when it is available."""

    name = ""
    in_onnxruntime = True  # the EP compiles inside ONNX Runtime: static-shape stage, shared contexts
    single_file = False  # needs a single-file model (a squash stage before the compile)
    operator_check = False  # an `ops:` task checks the model's operators against the tool first
    exact_outputs = True  # `output_names` is the exact file set; else the files doit tracks, the tool adds more
    foreign_keys: tuple[str, ...] = ("qaic", "qnn_sdk_root")  # target keys for other backends

    def check(self, spec: TargetSpec, file: str) -> None:
        """Raise UserError for target keys that do not apply to this backend."""
        for key in self.foreign_keys:
            if getattr(spec, key) is not None:
                owner = "qaic" if key == "qaic" else "qairt"
                raise UserError(file, f"targets.{spec.name}.{key}", f"applies only to compiler = \"{owner}\"")

    def identity(self, target: ResolvedTarget) -> dict[str, str] | None:
        """The external toolchain and its version, for configs and fingerprints; None inside ONNX Runtime."""
        return None

    def probed_files(self, target: ResolvedTarget) -> list[Path]:
        """Files outside the project whose presence or bytes decide `unavailable` and `identity` (an SDK)."""
        return []

    def unavailable(self, target: ResolvedTarget, caps: dict[str, Any] | None) -> str | None:
        """Why this host cannot build the target, or None. With `caps` None (a Dask executor runs the jobs), only
        what the coordinator itself needs: the package or tool whose version enters the fingerprint."""
        raise NotImplementedError

    def output_names(self, target: ResolvedTarget, members: list[Any], shared: bool) -> tuple[str, ...]:
        """The files a build publishes, known before it runs; `members` are `epbuild.manifest.builds.Member`s."""
        ep = target.ep
        names = [SIDECAR, *target.runtime_files().values(), *(m.model_file for m in members)]
        if target.is_cpu:
            names += [m.data_file for m in members if m.external]
        if not target.embed:
            stems = [members[0].name] if shared and ep.shares_one_binary else [m.name for m in members]
            names += [ep.binary_name(stem) for stem in stems if ep.binary_name(stem)]
        if shared and ep.shared_weights_outside:
            names += shared_weights(members)
        return tuple(sorted(set(names)))

    def produce(self, build: Build, workspace: Workspace, scratch: Path) -> dict[str, float] | None:
        """Write the build's files into `scratch`; return the child's usage (seconds, peak memory), if any."""
        raise NotImplementedError

    def validate(self, build: Build, layout: Layout) -> dict[str, Any] | None:
        """This backend's own validation report, or None: run the artifact in an ONNX Runtime child."""
        return None

    def describe(self, nodes: dict[str, Any]) -> str:
        """The compile line's account of where the model's nodes went."""
        if "in_ep" in nodes:
            return placement_line(nodes)
        return f"{nodes['cpu']} nodes after optimization"


def shared_weights(members: list[Any]) -> list[str]:
    """The external-data files a weight-sharing group ships, one per name (`copy_shared_weights` checks that
    members agree on each)."""
    return sorted({path.name for member in members for path in member.external})


def placement_line(nodes: dict[str, Any]) -> str:
    """How much of the model the EP took, what stayed on CPU, and constant subgraphs that folding would remove."""
    line = (f"{nodes['in_ep']}/{nodes['source']} source nodes ({nodes.get('offload', 1):.0%}) in "
            f"{nodes['ep_context']} EPContext node(s), {nodes['cpu']} on CPU")
    if nodes.get("cpu_op_types"):
        line += f" ({', '.join(f'{op} x{n}' for op, n in nodes['cpu_op_types'].items())})"
    if nodes["ep_context"] > 1 and nodes.get("cpu_op_types"):
        line += (f"; split into {nodes['ep_context']} partitions with CPU work between them (activations cross "
                 f"between the EP and the CPU at each): the EP does not take "
                 f"{', '.join(op for op in nodes['cpu_op_types'])}; min_offload fails such builds")
    foldable = nodes.get("foldable_on_cpu")
    if foldable:
        line += (f"; {sum(foldable.values())} of them only compute constants ({', '.join(foldable)}) and may keep "
                 "the artifact from loading: fold them (the default for NPU targets, without optimize = \"none\")")
    for node, fed_by in nodes.get("if_on_inputs", {}).items():
        line += (f"; If '{node}' stays on CPU because it branches on input {', '.join(repr(n) for n in fed_by)}: "
                 f"if that is a configuration input, freeze = {{ {', '.join(f'{n} = ...' for n in fed_by)} }} "
                 "compiles the branch it selects")
    return line
