"""The compiler backends a target can name (`compiler = ...`), behind one interface.

`ort` (ONNX Runtime's ModelCompiler) and `ort_session` (a session with ep.context_enable) compile in a fresh
ONNX Runtime child (`steps.compile`); `qaic` runs Qualcomm's qaic-compile to a QPC; `qairt` runs the QAIRT SDK to a
QNN context binary wrapped in an EPContext model. Each backend says which manifest keys apply, what enters the
fingerprint, which files it writes, how to produce them, how its artifacts are validated and whether this host
can run it; EP facts come from `epbuild.manifest.eps`. Adding a backend is one class here.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import BuildError, ModelError, UserError
from ..execute.child import run_child
from ..execute.host import package_reason, toolchain_versions, unavailable_reason
from ..execute.requests import CompileRequest, MemberResult
from ..files.layout import Layout, write_json
from ..files.publish import copy_file
from ..files.weights import resolved
from ..manifest.builds import QPC_PROGRAM, SIDECAR, Build, ResolvedTarget
from ..manifest.parse import TargetSpec
from ..store.cache import Workspace
from ..version import RULES_FORMAT
from . import vendor_shim
from .graph import static_dims
from .toolchains import (
    Toolchain,
    cloud_ai_devices,
    ep_context_model,
    find_qaic,
    find_qairt,
    probed_files,
    qaic_command,
    run_tool,
)


def _not_for(spec: TargetSpec, file: str, keys: tuple[str, ...], why: str) -> None:
    """Refuse the first of `keys` the target sets, saying why it does not apply."""
    for key in keys:
        value = getattr(spec, key)
        if value not in (None, False, {}, (), []):
            raise UserError(file, f"targets.{spec.name}.{key}", why)


class Compiler:
    """The interface, with ONNX Runtime's behaviour (`ort`) as the default."""

    name = "ort"
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
        what the coordinator itself needs: the package whose version enters the fingerprint."""
        if target.is_cpu:
            return None
        if caps is None:
            return package_reason(target.ep, target.source)
        return unavailable_reason(target.ep, target.source, target.device, caps)

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
        """Write the build's files into `scratch`; return the child's usage (seconds, peak memory)."""
        layout, target = workspace.layout, build.target
        what = f"{build.kind} {build.name} ({target.ep.name})"
        answer = run_child("epbuild.steps.compile", compile_request(build, scratch), scratch, target.limits(), what,
                           build.log(layout, "compile"), target.ep.fork_server, target.ep.warm_compiles)
        for key, name in target.runtime_files().items():
            shutil.copyfile(target.option_files[key], scratch / name)
        if build.shared and target.ep.shared_weights_outside:
            copy_shared_weights(build, workspace, scratch)
        write_json(scratch / SIDECAR, sidecar(build, answer["members"]))
        return answer["usage"]

    def validate(self, build: Build, layout: Layout) -> dict[str, Any] | None:
        """This backend's own validation report, or None: run the artifact in an ONNX Runtime child."""
        return None

    def describe(self, nodes: dict[str, Any]) -> str:
        """The compile line's account of where the model's nodes went."""
        if "in_ep" in nodes:
            return placement_line(nodes)
        return f"{nodes['cpu']} nodes after optimization"


class OrtSessionCompiler(Compiler):
    name = "ort_session"


class QairtCompiler(Compiler):
    """QAIRT: convert to DLC, generate the HTP context binary, wrap it in an EPContext model for the QNN EP."""

    name = "qairt"
    in_onnxruntime = False
    foreign_keys = ("qaic",)

    def check(self, spec: TargetSpec, file: str) -> None:
        super().check(spec, file)
        if spec.ep not in (None, "qnn", "QNNExecutionProvider"):
            raise UserError(file, f"targets.{spec.name}.ep",
                            "compiler = \"qairt\" builds QNN context binaries: use ep = \"qnn\"")

    def toolchain(self, target: ResolvedTarget) -> Toolchain | str:
        return find_qairt(target.sdk_root)

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

    def produce(self, build: Build, workspace: Workspace, scratch: Path) -> None:
        import onnx

        (member,) = build.members
        target, toolchain, log = build.target, self.found(build), build.log(workspace.layout, "compile")
        source = onnx.load(str(member.model.path), load_external_data=False)
        work = scratch / ".qairt"
        work.mkdir()
        what = f"compile {build.name} (QAIRT)"
        shapes = [arg for name, shape in sorted(member.model.inputs.items())
                  for arg in ("--source_model_input_shape", name, ",".join(map(str, shape)))]
        run_tool([str(toolchain.executables["converter"]), "--input_network", str(standalone(member, work)),
                  "--output_path", str(work / "model.dlc"), *shapes], log, what, target.timeout_s)
        binary = target.ep.binary_name(member.name)
        run_tool([str(toolchain.executables["context"]), "--backend", str(toolchain.executables["backend"]),
                  "--model", str(toolchain.root / "lib" / "x86_64-linux-clang" / "libQnnModelDlc.so"),
                  "--dlc_path", str(work / "model.dlc"), "--binary_file", Path(binary).stem,
                  "--output_dir", str(work)], log, what, target.timeout_s)
        if not (work / binary).is_file():
            raise BuildError(f"{what}: qnn-context-binary-generator wrote no {binary}")
        os.replace(work / binary, scratch / binary)
        shutil.rmtree(work)
        ep_context_model(source, binary, member.name, scratch / member.model_file)
        nodes = len(source.graph.node)
        data = external_sidecar(build, toolchain, nodes, list(build.outputs))
        data.update({"ep": target.ep.name, "embed": False, "runtime_options": {
            k: v for k, v in target.options.items() if k in target.ep.runtime_options}})
        data["nodes"] = {"source": nodes, "ep_context": 1, "cpu": 0, "in_ep": nodes}
        write_json(scratch / SIDECAR, data)


class QaicCompiler(QairtCompiler):
    """Qualcomm Cloud AI `qaic-compile`: a single-file ONNX model to a QPC, validated with `qaic-qpc validate`."""

    name = "qaic"
    single_file = True
    operator_check = True
    exact_outputs = False  # qaic-compile decides the QPC's files
    foreign_keys = ("qnn_sdk_root",)

    def check(self, spec: TargetSpec, file: str) -> None:
        Compiler.check(self, spec, file)
        _not_for(spec, file, ("ep", "options", "embed", "option_files", "quantized"),
                 "does not apply to compiler = \"qaic\" (qaic-compile takes its flags from the `qaic` table)")
        if spec.device not in (None, "npu"):
            raise UserError(file, f"targets.{spec.name}.device", "qaic-compile builds for npu (Cloud AI 100) only")
        _not_for(spec, file, ("min_offload",), "applies to ONNX Runtime EP targets (EPContext nodes)")

    def toolchain(self, target: ResolvedTarget) -> Toolchain | str:
        return find_qaic(target.sdk_root)

    def probed_files(self, target: ResolvedTarget) -> list[Path]:
        return probed_files(self.name, target.sdk_root)

    def output_names(self, target: ResolvedTarget, members: list[Any], shared: bool) -> tuple[str, ...]:
        return (SIDECAR, "compile.log", QPC_PROGRAM)

    def produce(self, build: Build, workspace: Workspace, scratch: Path) -> None:
        """qaic-compile the single-file model into scratch/qpc; its output is kept in compile.log next to it."""
        import onnx

        (member,) = build.members
        toolchain, log = self.found(build), build.log(workspace.layout, "compile")
        source = onnx.load(str(member.model.path), load_external_data=False)
        try:
            symbols = static_dims(source, {k: list(v) for k, v in member.model.inputs.items()}, needs_static=True)
        except ModelError as exc:
            raise BuildError(f"compile {build.name}: {exc}") from None
        command = qaic_command(toolchain.executables["qaic-compile"], member.model.path, scratch / "qpc",
                               build.target.qaic, symbols)
        try:
            run_tool(command, scratch / "compile.log", f"compile {build.name} (qaic-compile)", build.target.timeout_s)
        finally:
            if (scratch / "compile.log").exists():
                log.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(scratch / "compile.log", log)
        if not (scratch / QPC_PROGRAM).is_file():
            raise BuildError(f"compile {build.name}: qaic-compile exited 0 but wrote no {QPC_PROGRAM}")
        files = sorted([SIDECAR, *(p.relative_to(scratch).as_posix() for p in scratch.rglob("*") if p.is_file())])
        write_json(scratch / SIDECAR, external_sidecar(build, toolchain, len(source.graph.node), files))

    def validate(self, build: Build, layout: Layout) -> dict[str, Any] | None:
        """`qaic-qpc validate` checks a QPC against the Cloud AI hardware installed here; without it, skipped."""
        (member,) = build.members
        program = build.out_dir(layout) / QPC_PROGRAM
        if not program.is_file():
            return {"status": "failed", "reason": f"{QPC_PROGRAM} is missing"}
        if member.validation.mode == "structural":
            return {"status": "passed"}
        found = self.toolchain(build.target)
        if isinstance(found, str):
            return {"status": "skipped", "reason": found}
        if not cloud_ai_devices():
            return {"status": "skipped", "reason": "no Cloud AI device on this host (/dev/accel/accel* or "
                                                   "/dev/qaic_*): qaic-qpc validate needs the hardware"}
        try:
            run_tool([str(found.executables["qaic-qpc"]), "validate", "-i", str(program.parent)],
                     build.log(layout, "validate"), f"validate {build.name} (qaic-qpc)", member.validation.timeout_s)
        except BuildError as exc:
            return {"status": "failed", "reason": str(exc)}
        return {"status": "passed", "ran_on": {"qaic-qpc validate": cloud_ai_devices()}}

    def describe(self, nodes: dict[str, Any]) -> str:
        return f"QPC from {nodes['source']} source nodes"


COMPILERS: dict[str, Compiler] = {c.name: c for c in (Compiler(), OrtSessionCompiler(), QaicCompiler(),
                                                        QairtCompiler())}


def shared_weights(members: list[Any]) -> list[str]:
    """The external-data files a weight-sharing group ships, one per name (`copy_shared_weights` checks that
    members agree on each)."""
    return sorted({path.name for member in members for path in member.external})


def copy_shared_weights(build: Build, workspace: Workspace, scratch: Path) -> None:
    """The weights a weight-sharing group's binaries refer to by file name, beside them: members may share a name
    only with the same bytes (variants of one model, models exported with one weights file)."""
    by_name: dict[str, Path] = {}
    for member in build.members:
        for path in member.external:
            other = by_name.setdefault(path.name, path)
            if workspace.hashes.sha256(other) != workspace.hashes.sha256(path):
                raise BuildError(f"{build.task}: members' external-data files are both named {path.name} with "
                                 "different bytes; the shared context refers to its weights by file name: export "
                                 "the members with one weights file, or with differently named ones")
    for name, path in by_name.items():
        copy_file(path, scratch / name)


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


def compiler(target: ResolvedTarget) -> Compiler:
    return COMPILERS[target.compiler]


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


def compile_request(build: Build, scratch: Path) -> CompileRequest:
    """The ONNX Runtime child's request: each member in order, where its output goes, and the target's settings."""
    target = build.target
    return {
        "members": [{"model": str(m.model.path), "output": str(scratch / m.model_file),
                     "external_data": m.data_file if target.is_cpu and m.external else None,
                     "inputs": {name: list(shape) for name, shape in m.model.inputs.items()},
                     "entry": f"models.{m.name}", "weights": m.weights.get(str(m.model.path))}
                    for m in build.members],
        "manifest": build.manifest, "share": build.shared, "ep": target.ep.alias, "device": target.device,
        "compiler": target.compiler, "embed": target.embed, "options": target.session_options(),
        "optimization_level": target.optimization_level,
    }


def sidecar(build: Build, results: list[MemberResult]) -> dict[str, Any]:
    """`artifact.json`: what a runtime needs to load the artifact (per member for a group), and how much of each
    model the EP took. The target's name is not in the fingerprint, so it is added when the folder is published
    (`compile.publishing`), never cached."""
    target = build.target
    common = {"format": RULES_FORMAT, "ep": target.ep.name, "ep_source": target.source,
              "device": target.device, "compiler": target.compiler, "files": list(build.outputs),
              "runtime_options": target.runtime_options(), "versions": toolchain_versions(target.ep),
              **({"vendor_shim": vendor_shim.identity()} if target.ep.vendor_shim and vendor_shim.active() else {})}
    if build.shared:
        return {**common, "group": build.name, "embed": False, "order": [m.name for m in build.members],
                "members": {m.name: {"model_file": m.model_file, "binaries": r["binaries"], "nodes": r["nodes"],
                                     "ep_sdk_version": r["ep_sdk_version"], "graphs": r.get("graphs", []),
                                     **({"compatibility": r["compatibility"]} if r.get("compatibility") else {}),
                                     "inputs": {k: list(v) for k, v in m.model.inputs.items()}}
                            for m, r in zip(build.members, results, strict=True)}}
    (member,), (result,) = build.members, results
    return {
        **common, "model": member.name, "embed": target.embed, "model_file": member.model_file,
        "inputs": {name: list(shape) for name, shape in member.model.inputs.items()},
        "ep_sdk_version": result.get("ep_sdk_version"), "nodes": result["nodes"],
        **({"graphs": result["graphs"]} if result.get("graphs") else {}),
        **({"compatibility": result["compatibility"]} if result.get("compatibility") else {}),
        **({"frozen": {k: list(v) for k, v in member.frozen.items()}} if member.frozen else {}),
        **({"optimization_level": target.optimization_level} if target.is_cpu else {}),
    }


def external_sidecar(build: Build, toolchain: Toolchain, source_nodes: int, files: list[str]) -> dict[str, Any]:
    (member,) = build.members
    return {"format": RULES_FORMAT, "model": member.name,
            "compiler": build.target.compiler, "device": build.target.device, "files": files,
            "toolchain": {"name": toolchain.name, "version": toolchain.version}, "nodes": {"source": source_nodes},
            "inputs": {name: list(shape) for name, shape in member.model.inputs.items()}}

