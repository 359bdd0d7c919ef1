"""Loading a compiled artifact in the validating child: the structural checks that need no session (referenced
files, EPContext attributes against the target), the artifact's session on its EP with CPU fallback disabled where
the compile left nothing on CPU, and where its nodes ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...contracts.jobs import ValidationMember, ValidationReport
from ...contracts.statuses import Verdict
from ...manifest.builds import SIDECAR
from ...manifest.eps import EpInfo, known
from ..graph import EP_CONTEXT
from ..graph import attributes as node_attributes
from .reference import seeded, session_options


def structural_problems(request: ValidationMember) -> list[str]:
    """Without running: referenced files exist; EPContext source, embed mode and SDK version match the target."""
    import onnx

    info = known(request.ep)
    artifact = Path(request.artifact)
    problems = [f"file {Path(name).name} listed in {SIDECAR} is missing" for name in request.files
                if not Path(name).is_file()]
    if problems:
        return problems
    model = onnx.load(str(artifact), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location" and not (artifact.parent / entry.value).is_file():
                problems.append(f"initializer {tensor.name} references missing file {entry.value}")
    if info.is_cpu:
        return problems
    contexts = [n for n in model.graph.node if n.op_type == EP_CONTEXT]
    if not contexts:
        problems.append(f"no EPContext node: the artifact holds nothing compiled for {info.name}")
    for node in contexts:
        attributes = node_attributes(node)
        source = attributes.get("source", b"").decode()
        if source != info.name:
            problems.append(f"EPContext node {node.name} comes from '{source}', the target's EP is {info.name}")
        embed_mode = attributes.get("embed_mode", 1)
        if embed_mode != int(request.embed):
            problems.append(f"EPContext node {node.name} has embed_mode {embed_mode}, the target says "
                            f"embed = {str(request.embed).lower()}")
        if embed_mode == 0 and attributes.get("main_context", 1) != 0:  # main_context 0: refers to the main node
            name = attributes.get("ep_cache_context", b"").decode()
            if not name or not (artifact.parent / name).is_file():
                problems.append(f"EPContext node {node.name} references missing context binary {name or '(none)'}")
        sdk = (attributes.get("ep_sdk_version") or b"").decode()
        if request.ep_sdk_version and sdk != request.ep_sdk_version:
            problems.append(f"EPContext node {node.name} has ep_sdk_version {sdk}, the build recorded "
                            f"{request.ep_sdk_version}")
    return problems


def context_binaries(artifact: str) -> set[str]:
    import onnx

    model = onnx.load(artifact, load_external_data=False)
    return {onnx.helper.get_attribute_value(a).decode() for n in model.graph.node if n.op_type == EP_CONTEXT
            for a in n.attribute if a.name == "ep_cache_context"}



def open_session(ort: Any, info: EpInfo, request: ValidationMember) -> tuple[Any, ValidationReport | None]:
    """The artifact's session on its EP with CPU fallback disabled where the compile left nothing on CPU; or a
    report: skipped when this host cannot run the EP, failed when the EP cannot load the artifact."""
    from ...execute.host import register_plugin, select_ep_device

    options = session_options(ort)
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if not info.is_cpu:
        try:
            register_plugin(ort, info)
            device = select_ep_device(ort, info, request.device)
        except (ImportError, OSError, RuntimeError) as exc:
            return None, {"status": Verdict.SKIPPED, "reason": f"this host cannot run {info.name}: {exc}"}
        options.add_provider_for_devices([device], request.options)
        if request.cpu_nodes == 0:
            options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        if request.share:  # a member of a shared context, loaded as its loading contract says
            options.add_session_config_entry("ep.share_ep_contexts", "1")
    try:
        seeded(ort)
        package = request.package
        if package:  # as an application opens it: ONNX Runtime's documented calls alone
            session, refused = _through_package(ort, info, request, package)
            if refused:
                return None, refused
        else:
            session = ort.InferenceSession(request.artifact, options,
                                           providers=["CPUExecutionProvider"] if info.is_cpu else None)
        session.disable_fallback()  # no silent retry on CPU after an EP failure
    except Exception as exc:  # noqa: BLE001 - the EP's own error is the report
        foldable = request.foldable_on_cpu or {}
        hint = (f"; {sum(foldable.values())} node(s) left on CPU only compute constants ({', '.join(foldable)}) in "
                "front of the EPContext node, which QNN does not load: fold them (the default for NPU targets, "
                "without optimize = \"none\")") if foldable else ""
        return None, {"status": Verdict.FAILED,
                      "reason": f"{info.name} could not load the artifact: {str(exc).strip()}{hint}"}
    return session, None


def _through_package(ort: Any, info: EpInfo, request: ValidationMember,
                     package: dict[str, str]) -> tuple[Any, ValidationReport | None]:
    """The session ONNX Runtime creates for the variant it selects from the model package, exactly as an
    application with only ONNX Runtime and the EP plugin does: the EP's device offered with what selection needs
    and nothing of epbuild's (QNN off its device: `backend_type = htp`), `select_component`, `create_session()`,
    which applies the variant's own provider and session options. A failed report when it cannot open the package
    or selects another variant."""
    from ...execute.host import select_ep_device

    offered = ort.SessionOptions()
    if not info.is_cpu:
        offered.add_provider_for_devices([select_ep_device(ort, info, request.device)], dict(info.required_defaults))
    try:
        context = ort.ModelPackageContext(package["root"])
        component = context.select_component(package["component"], ort.ModelPackageOptions(offered))
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime's own refusal is the report
        return None, {"status": Verdict.FAILED, "reason": f"ONNX Runtime could not select a variant of "
                                                          f"{package['component']} from the package: {exc}"}
    selected = component.get_selected_variant_name()
    if selected != package["variant"]:
        return None, {"status": Verdict.FAILED, "reason": f"ONNX Runtime selected variant '{selected}' of "
                                                          f"{package['component']} for this EP, not the target's "
                                                          f"'{package['variant']}'"}
    return component.create_session(), None


def placement_failures(session: Any, info: EpInfo, cpu_nodes: int,
                       recorded: bool = True) -> tuple[dict[str, list[str]], list[str]]:
    """Which EP ran which op types, and failures when the EPContext nodes or more nodes than the compile left
    there ran on CPU (a fallback). A session created as an application creates it (through its package) records no
    assignment: its EPs are listed, and its EPContext nodes cannot have run elsewhere (no other EP runs them), the
    placement of the same bytes being the artifact's own validation's to judge."""
    if not recorded:
        return {ep: [] for ep in session.get_providers()}, []
    assignment = session.get_provider_graph_assignment_info() or []
    ran_on: dict[str, list[str]] = {}
    for subgraph in assignment:
        ops = ran_on.setdefault(subgraph.ep_name, [])
        ops.extend(node.op_type for node in subgraph.get_nodes() if node.op_type not in ops)
    if info.is_cpu:
        return ran_on, []
    failures = []
    if "EPContext" in ran_on.get("CPUExecutionProvider", []) or "EPContext" not in ran_on.get(info.name, []):
        failures.append(f"the EPContext nodes did not run on {info.name} (assignment: {ran_on})")
    on_cpu = sum(len(sg.get_nodes()) for sg in assignment if sg.ep_name == "CPUExecutionProvider")
    if on_cpu > cpu_nodes:
        failures.append(f"{on_cpu} nodes fell back to CPU, the compiled model left {cpu_nodes} there")
    return ran_on, failures



def is_qdq(model: Any) -> bool:
    """Whether a model (a path, or a loaded ModelProto) quantizes with Q/DQ nodes."""
    import onnx

    if isinstance(model, str):
        model = onnx.load(model, load_external_data=False)
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
