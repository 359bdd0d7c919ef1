"""Compiling a build: its members for its target, restored from the cache or produced by its compiler backend
(`epbuild.steps.compilers`) in a scratch folder, checked, and published atomically.

The child side (`_compile_in_child`, `python -m epbuild.steps.compile`) compiles with ONNX Runtime: EPContext models
with ModelCompiler or a context-enabled session, offline-optimized models for CPU targets, several members into one
shared EP context for a group.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..contracts.artifact import OMIT, read_artifact
from ..contracts.jobs import CompileAnswer, CompiledMember, CompileJob, CompileMember
from ..contracts.statuses import TaskStatus
from ..errors import BuildError, ModelCausedError, ModelError, located
from ..execute.child import serve
from ..execute.executor import run_build
from ..execute.forked_jobs import Handoff
from ..files.hashing import snapshot
from ..files.layout import Layout, write_json
from ..files.weights import FOLDER_OPTION
from ..manifest.builds import SIDECAR, Build
from ..manifest.eps import known
from ..records import record
from ..store.cache import Outcome, Workspace, cached_folder, with_download
from .compilers import compiler
from .diagnosis import OLD_OPSET, WRITER_FAULT, compile_hints, input_branches, plain_ep_error
from .fingerprint import compile_fingerprint, target_identity
from .graph import EP_CONTEXT, check_ep_contexts, dims, missing_files, names_read, placement, static_dims
from .packaging.package import write_package, write_pipeline_package
from .packaging.shared_context import SHARED_SESSION, loading_contract
from .remote_job import run_job
from .stages.output import always_written, external_output
from .toolchain.worker_needs import target_resources

CPU_LEVELS = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


@record
class Compiled:
    """What one compile or restore produced, for the printed line and the build report."""

    build: str
    status: TaskStatus  # compiled or restored
    fingerprint: str
    out_dir: Path
    files: list[dict[str, Any]]  # name, size, sha256
    seconds: float
    nodes: dict[str, Any]  # a single model's placement; for groups the counts summed over members
    usage: dict[str, float] | None  # the child's wall time and peak memory; None when restored
    outcome: Outcome  # restored from which cache, bytes moved to or from the remote
    worker: str | None  # the Dask worker that compiled it


def file_records(folder: Path, names: list[str], workspace: Workspace) -> list[dict[str, Any]]:
    return [{"name": name, "size": (folder / name).stat().st_size, "sha256": workspace.hashes.sha256(folder / name)}
            for name in names]


def compile_build(build: Build, workspace: Workspace) -> Compiled:
    """Compile `build` into its artifact folder (or restore it from the cache), atomically; raise BuildError
    naming the build."""
    started = time.monotonic()
    inputs = snapshot([*build.inputs, *build.origins])
    fingerprint = compile_fingerprint(build, workspace.hashes, workspace.provenance)
    final = build.out_dir(workspace.layout)
    usage: dict[str, float] = {}
    ran: dict[str, Any] = {}  # on a Dask worker: its name, bytes downloaded
    identity = {"kind": build.kind, "members": [m.name for m in build.members],
                "target": target_identity(build.target, workspace.provenance)}

    def produce(scratch: Path) -> None:
        if workspace.executor:
            needs = target_resources(build.target, workspace.provenance)
            ran.update(run_build(build, workspace.job_context(), workspace, run_job, scratch, fingerprint, identity,
                                 needs))
            usage.update(ran["usage"])
        else:
            usage.update(compiler(build.target).produce(build, workspace, scratch) or {})
        package = build.members[0].package
        if package and build.shared:
            write_pipeline_package(package, scratch, [(m.name, m.model_file, m.model.dims) for m in build.members],
                                   build.target.ep.alias, build.target.runtime_options(), SHARED_SESSION)
        elif package:
            write_package(package, scratch, build.members[0].model_file, build.target.ep.alias,
                          build.target.runtime_options())

    expected = list(build.outputs) if compiler(build.target).exact_outputs else None
    try:
        outcome = cached_folder(build.task, fingerprint, workspace, final, expected, produce, identity, inputs,
                                lambda scratch: publishing(build, scratch, workspace.layout))
    except BuildError as exc:
        raise with_hints(exc, build) from None
    recorded = read_artifact(final)
    if recorded.has("nodes"):
        nodes = recorded.nodes
    else:
        per_model = [m.nodes for m in recorded.members.values()]
        nodes = {key: sum(n[key] for n in per_model) for key in ("source", "ep_context", "cpu", "in_ep")
                 if key in per_model[0]}
    return Compiled(build.task, TaskStatus.RESTORED if outcome.restored else TaskStatus.COMPILED, fingerprint, final,
                    file_records(final, expected or recorded.files, workspace), time.monotonic() - started, nodes,
                    usage or None, with_download(outcome, ran), ran.get("worker"))


def with_hints(error: BuildError, build: Build) -> BuildError:
    """The failure with what would fix it where a member's graph shows a known cause, said in its first line
    (the one reports keep); the child's output excerpt stays below."""
    hints = [hint for m in build.members for hint in compile_hints(m.model.path, build.target.ep.name,
                                                                   f"models.{m.name}", bool(m.frozen), str(error))]
    first, _, rest = str(error).partition("\n")
    plain = plain_ep_error(first)
    # ONNX Runtime's own log line repeating the failure the first line gives is noise below it
    kept = [line for line in rest.splitlines() if not (
        ("[E:onnxruntime:" in line or line.strip().startswith("onnxruntime: "))
        and line.split("] ", 1)[-1].strip().removeprefix("onnxruntime: ")[:60] in first)]
    if not hints and plain == first and len(kept) == len(rest.splitlines()):
        return error
    kind = (ModelCausedError if isinstance(error, ModelCausedError) or any(h.startswith(OLD_OPSET) for h in hints)
            else BuildError)
    said = "; ".join([plain, *hints])
    if any(h.startswith(WRITER_FAULT) for h in hints) and "[ONNXRuntimeError]" in plain:  # the raw error: in the log
        said = plain[:plain.index("[ONNXRuntimeError]")] + "; ".join(hints)
    return kind(said + ("\n" + "\n".join(kept) if kept else ""))


def publishing(build: Build, folder: Path, layout: Layout) -> None:
    """What a published folder holds beyond its cached bytes: the target's name in `artifact.json` (written anew,
    never through a link into the cache) and, for a group, the loading contract with the sizes of the members
    compiled alone; after the checks that judge the recorded result (`min_offload`)."""
    recorded = read_artifact(folder)
    if build.target.min_offload is not None and not build.target.is_cpu:
        members = recorded.member_entries()
        for member in build.members:
            check_offload(member.model.path.name, members[member.name].nodes, build.target.min_offload)
    loading = loading_contract(build, folder, recorded, layout) if build.shared else OMIT
    write_json(folder / SIDECAR, recorded.replace(target=build.target.name, loading=loading).to_json())


# ---- child process ----

def inspect_output(path: Path, source_nodes: int, ep_name: str | None) -> CompiledMember:
    """Check a compiled model before it is published (every file it references is beside it; EPContext nodes
    come from `ep_name` and name binaries that exist) and say where the source's nodes ended up."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    problems = missing_files(path, model)
    if problems:
        raise ModelError("; ".join(problems))
    sdk, binaries = check_ep_contexts(model, ep_name, path.parent) if ep_name else (None, [])
    nodes = placement(source_nodes, model, ep_name)
    branches = input_branches(model.graph) if ep_name else {}
    if branches:  # If nodes the EP left on CPU that a frozen configuration input would remove
        nodes["if_on_inputs"] = branches
    graphs = [node.name for node in model.graph.node if node.op_type == EP_CONTEXT]  # what runtimes look up
    compatibility = _compatibility(path, ep_name) if ep_name else None
    return CompiledMember(nodes, sdk, binaries, graphs, compatibility)


def _compatibility(path: Path, ep_name: str) -> str | None:
    """The string the EP wrote into its compiled model for runtimes to judge it against their devices (QNN:
    `v2:6:<sdk>:<api>:...:<soc_model>:...`); None where it wrote none."""
    try:
        from onnxruntime.capi import _pybind_state

        return _pybind_state.get_compatibility_info_from_model(str(path), ep_name) or None
    except (ImportError, AttributeError, RuntimeError):
        return None


def check_offload(name: str, nodes: dict[str, Any], min_offload: float) -> None:
    """`min_offload`: the share of source nodes that must end inside EPContext nodes (judged on the placement
    `artifact.json` recorded, so a changed threshold restores rather than recompiles)."""
    if nodes["offload"] >= min_offload:
        return
    left = ", ".join(f"{op} x{count}" for op, count in nodes["cpu_op_types"].items())
    raise BuildError(f"{name}: only {nodes['offload']:.1%} of {nodes['source']} source nodes are in EPContext "
                     f"nodes, below min_offload = {min_offload:g}; left on CPU: {left}")


def _prepare(request: CompileJob) -> list[tuple[CompileMember, int, dict[str, int], bool]]:
    """Each member's source node count and free-dimension overrides, checked before the first compile, so a
    group never half-compiles."""
    import onnx

    needs_static = not known(request.ep).is_cpu
    prepared = []
    for member in request.members:
        source = onnx.load(member.model, load_external_data=False)
        with located(request.manifest, member.entry):
            overrides = static_dims(source, member.inputs, needs_static=needs_static)
        held = {t.name for t in source.graph.initializer}
        listed = any(value.name in held for value in source.graph.input)  # IR < 4: weights listed as inputs
        prepared.append((member, len(source.graph.node), overrides, listed))
        del source
    return prepared


def _optimize_for_cpu(ort: Any, options: Any, member: CompileMember, level: str, listed: bool) -> None:
    """A CPU target: ONNX Runtime's offline-optimized model, with its own external-data file when it has one."""
    output = Path(member.output)
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, CPU_LEVELS[level])
    options.optimized_model_filepath = str(output)
    external_output(options, member.external_data)  # its own weights, not the source's data file
    ort.InferenceSession(Path(member.model).name, options, providers=["CPUExecutionProvider"])
    if member.external_data:
        always_written(output.with_name(member.external_data))
    if listed:  # only a model that lists weights as inputs (IR < 4) can leave a listing behind
        _settle_listed_weights(output, Path(member.model).name, member.weights or ".")


def _settle_listed_weights(output: Path, source_file: str, weights_folder: str) -> None:
    """IR < 4 exporters list every weight in graph.input too; where ONNX Runtime's optimizer folded a weight away
    but kept its listing, the optimized model would ask its user to feed it. Unread, the listing goes; still read,
    the weight comes back (the source's value)."""
    import onnx
    from onnx import numpy_helper

    artifact = onnx.load(str(output), load_external_data=False)
    held = {t.name for t in artifact.graph.initializer}
    stale = [v.name for v in artifact.graph.input if v.name not in held]
    source = onnx.load(source_file, load_external_data=False)
    weights = {t.name: t for t in source.graph.initializer if t.name in stale}
    if not weights:
        return
    read = {name for node in artifact.graph.node for name in names_read(node)}
    for value in [v for v in artifact.graph.input if v.name in weights]:
        if value.name in read:
            value_of = numpy_helper.to_array(weights[value.name], base_dir=weights_folder)
            artifact.graph.initializer.append(numpy_helper.from_array(value_of, value.name))
        else:
            artifact.graph.input.remove(value)
    onnx.save(artifact, str(output))


def _compile_for_ep(ort: Any, options: Any, member: CompileMember, request: CompileJob, device: Any,
                    last: bool) -> None:
    """An EP target: an EPContext model with ModelCompiler (`ort`) or a context-enabled session (`ort_session`);
    in a group every member shares one EP context and the last one stops sharing (which writes the binary)."""
    if request.share:
        options.add_session_config_entry("ep.share_ep_contexts", "1")
        if last:
            options.add_session_config_entry("ep.stop_share_ep_contexts", "1")
    options.add_provider_for_devices([device], request.options)
    model_file = Path(member.model).name
    if request.compiler == "ort":
        flags = int(ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED)
        try:
            ort.ModelCompiler(options, model_file, embed_compiled_data_into_model=request.embed,
                              flags=flags).compile_to_file(member.output)
        except Exception as exc:
            if "Unable to compile any nodes" not in str(exc) or request.share:
                raise
            sys.stderr.write(f"{' '.join(str(exc).split())}\n")  # ONNX Runtime's words stay in the job's log
            _say_which_ops(ort, device, request, Path(model_file))
            raise
    else:
        options.add_session_config_entry("ep.context_enable", "1")
        options.add_session_config_entry("ep.context_file_path", member.output)
        options.add_session_config_entry("ep.context_embed_mode", "1" if request.embed else "0")
        ort.InferenceSession(model_file, options)


def _say_which_ops(ort: Any, device: Any, request: CompileJob, model: Path) -> None:
    """ONNX Runtime's "Unable to compile any nodes" names nothing: ask the EP about each op type alone
    (`steps.toolchain.op_probe`) and fail with what it said; not for a model below the EP's opset (`diagnosis` says
    so)."""
    import onnx

    from .toolchain.op_probe import refused_line, refused_op_types

    opset = next((e.version for e in onnx.load(str(model), load_external_data=False).opset_import
                  if e.domain in ("", "ai.onnx")), None)
    if opset is not None and opset < (known(request.ep).min_opset or 0):
        return

    def options() -> Any:
        fresh = ort.SessionOptions()
        fresh.log_severity_level = 4
        fresh.add_provider_for_devices([device], request.options)
        return fresh

    found = refused_op_types(ort, model, options)
    line = refused_line(known(request.ep).name, found)
    if line:
        raise ModelError(line, in_model=True)


def _compile_in_child(sent: dict[str, Any]) -> dict[str, Any]:
    """Compile each member in order (with `share`, all into one shared EP context), then check every output."""
    import onnxruntime as ort

    request = CompileJob.from_json(sent)
    from ..execute.host import register_plugin, select_ep_device

    info = known(request.ep)
    prepared = _prepare(request)
    device = None
    if not info.is_cpu:
        register_plugin(ort, info)
        device = select_ep_device(ort, info, request.device)
    for index, (member, _, overrides, listed) in enumerate(prepared):
        options = ort.SessionOptions()
        options.log_severity_level = 3
        for name, value in overrides.items():
            options.add_free_dimension_override_by_name(name, value)
        # Compile by file name from the model's folder: ONNX Runtime hashes the model path into partition (graph)
        # names, so an absolute path would make two checkouts produce different bytes, and bytes without a path
        # give every member of a shared context the same graph names.
        os.chdir(Path(member.model).parent)
        if member.weights:  # relative, through the model's folder: it names the graphs instead (files.weights)
            options.add_session_config_entry(FOLDER_OPTION, member.weights)
        if info.is_cpu:
            _optimize_for_cpu(ort, options, member, request.optimization_level or "extended", listed)
        else:
            _compile_for_ep(ort, options, member, request, device, last=index == len(prepared) - 1)
        if not Path(member.output).is_file():
            raise ModelError(f"{info.name} wrote no compiled model for {Path(member.model).name}")
    pruned = _prune(request, prepared[0][0]) if request.prune else None
    # Check after the last compile: a shared context binary is written only when sharing stops.
    results = []
    for member, source_nodes, _, _ in prepared:
        results.append(inspect_output(Path(member.output), source_nodes, None if info.is_cpu else info.name))
    if pruned is not None:
        results[0] = dataclasses.replace(results[0], pruned=pruned)
    # a group's members load together once published (its loading contract places the weights its binaries refer
    # to; QNN's shared context crashes an x86 host); a multi-SoC binary loads on none of its SoCs' simulators (its
    # validation runs each SoC compiled alone: steps.validation.fleet)
    multi_soc = "," in request.options.get("soc_model", "")
    if not info.is_cpu and not request.share and not multi_soc:
        for (member, _, _, _), result in zip(prepared, results, strict=True):
            _opens(ort, info, device, request.options, Path(member.output), result.nodes.get("foldable_on_cpu") or {})
    return CompileAnswer(tuple(results)).to_json()


def _prune(request: CompileJob, member: CompileMember) -> list[str]:
    """`ship_socs`: the multi-SoC binary beside the compiled model pruned to the SoCs shipped; the SoCs removed."""
    from .toolchain.soc_pruning import prune

    output = Path(member.output)
    binary = output.with_name(f"{output.stem}{known(request.ep).binary_suffix}")
    shipped = request.prune
    assert shipped is not None, "called for a job with `prune` only"
    return prune(shipped["python"], output, binary, shipped["keep"])


def _opens(ort: Any, info: Any, device: Any, provider_options: dict[str, str], output: Path,
           foldable: dict[str, int] | None = None) -> None:
    """Open the compiled model on its EP (QNN through the HTP simulator here) as a loader would; a model the EP
    cannot load fails the compile, naming its EPContext partitions and those fed by tensors of dynamic shape (the
    usual cause: shape arithmetic the shape stage could not make static)."""
    import onnx

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_provider_for_devices([device], provider_options)
    try:
        ort.InferenceSession(str(output), options)
    except Exception as exc:  # noqa: BLE001 - the EP's own words are the message
        model = onnx.shape_inference.infer_shapes(onnx.load(str(output), load_external_data=False))
        shapes = {v.name: dims(v) for v in [*model.graph.value_info, *model.graph.input]}
        contexts = [node for node in model.graph.node if node.op_type == EP_CONTEXT]
        unfixed = {name for name, found in shapes.items() if not all(isinstance(d, int) for d in found)}
        dynamic = [f"partition {index} of {len(contexts)} ({node.name}) reads "
                   f"{', '.join(name for name in node.input if name in unfixed)}"
                   for index, node in enumerate(contexts, 1) if unfixed.intersection(node.input)]
        cause = (f"; {'; '.join(dynamic)} with dynamic dimensions: give them static shapes (inputs or dims)"
                 if dynamic else "")
        if foldable:
            cause += (f"; {sum(foldable.values())} node(s) left on CPU only compute constants ({', '.join(foldable)})"
                      " in front of the EPContext node, which QNN does not load: fold them (the default for NPU "
                      "targets, without optimize = \"none\")")
        raise ModelError(f"{info.name} compiled {output.name} ({len(contexts)} EPContext partition(s)) but cannot "
                         f"open it: {' '.join(str(exc).split())[:400]}{cause}") from None


def main(handoff: Handoff | None = None) -> None:
    """`python -m` this module, or a fork server's child or warm worker, runs this."""
    serve(_compile_in_child, handoff)


if __name__ == "__main__":
    main()
