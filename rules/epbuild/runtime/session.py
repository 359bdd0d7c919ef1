"""An artifact opened in one call, as an application must open it: the EP's plugin library registered (through
epbuild's vendor-id shim for OpenVINO on non-Intel hosts), the device the artifact was built for chosen, the
runtime options artifact.json lists applied (option files by their name inside the folder), and for a member of a
shared-context group the loading contract's session options, in its order."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..contracts.artifact import ArtifactFormatError, ArtifactRecord, read_artifact
from ..errors import UserError, json_value
from ..execute.host import register_plugin, select_ep_device
from ..manifest.builds import SIDECAR
from ..manifest.eps import known, lookup


def artifact_record(path: Path) -> tuple[Path, ArtifactRecord]:
    """The artifact folder and its record, for a folder or a file inside it; UserError for anything else."""
    folder = path if path.is_dir() else path.parent
    try:
        record = read_artifact(folder)
    except FileNotFoundError:
        raise UserError(str(path), None, f"no {SIDECAR} in {folder}: give an artifact folder that epbuild built "
                                         "(artifacts/<target>/<model>/ or artifacts/<target>/groups/<name>/)") from None
    except ArtifactFormatError as exc:
        raise UserError(str(folder / SIDECAR), None, f"not an artifact record this epbuild reads: {exc}") from None
    except ValueError as exc:
        raise UserError(str(folder / SIDECAR), None, f"not readable JSON: {exc}") from None
    if not record.has("ep"):
        raise UserError(str(folder / SIDECAR), None, f"a {record.compiler} artifact is not loaded by ONNX Runtime "
                                                     f"(a QPC runs with the Cloud AI runtime)")
    return folder, record


def _plugin_ready(info: Any) -> None:
    """OpenVINO on a non-Intel x86-64 host loads through the vendor-id shim, built once into the user cache."""
    if not info.vendor_shim:
        return
    from ..steps import vendor_shim

    cache = Path(os.environ.get("EPBUILD_CACHE_DIR") or Path.home() / ".cache" / "epbuild")
    found = vendor_shim.prepare(cache)
    if "reason" in found:
        raise RuntimeError(found["reason"])


def session_options_for(ort: Any, folder: Path, record: ArtifactRecord, base: Any = None) -> Any:
    """Session options that load the artifact described by `record`: its EP and device, its runtime options."""
    info = lookup(record.ep)
    if info is None:
        raise UserError(str(folder / SIDECAR), "ep", f"unknown execution provider {record.ep!r}")
    options = base or ort.SessionOptions()
    if info.is_cpu:
        return options
    _plugin_ready(info)
    register_plugin(ort, info)
    device = select_ep_device(ort, info, record.device)
    # option files (OpenVINO's load_config) travel inside the folder under their own name: given absolute
    provider = {key: str(folder / value) if "/" not in str(value) and (folder / str(value)).is_file() else value
                for key, value in (record.runtime_options if record.has("runtime_options") else {}).items()}
    options.add_provider_for_devices([device], provider)
    for key, value in (record.loading if record.has("loading") else {}).get("session_options", {}).items():
        options.add_session_config_entry(key, value)
    return options


def open_session(artifact: str | Path, member: str | None = None, session_options: Any = None) -> Any:
    """A ready `onnxruntime.InferenceSession` for an artifact folder (or its .onnx file); for a group folder,
    `member` names the model (the group's sessions are made in its `order`: `open_group`)."""
    import onnxruntime as ort

    folder, record = artifact_record(Path(artifact))
    if record.has("members"):  # a shared-context group
        names = _order(record)
        if member not in names:
            raise UserError(str(folder), None, f"a group: name its member ({', '.join(names)}), or use open_group")
        model = folder / record.members[member].model_file
    else:
        model = folder / record.model_file
    options = session_options_for(ort, folder, record, session_options)
    is_cpu = known(record.ep).is_cpu
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"] if is_cpu else None)


def open_package(package: str | Path, component: str | None = None, ep: str = "cpu",
                 device: str | None = None) -> Any:
    """The session of the variant ONNX Runtime selects from a model package (`[packages.NAME]`) for the EP an
    application offers (`ep`: an alias as models.toml spells it, cpu, qnn, openvino; `device`: its device, else
    the EP's first): the EP's plugin registered (OpenVINO through the vendor-id shim where needed) and its device
    offered, `ModelPackageContext.select_component`, and `create_session()`: ONNX Runtime applies the variant's own
    options, exactly as for an application without epbuild (docs/packages.md)."""
    info = lookup(ep)
    if info is None:
        raise UserError(str(package), None, f"unknown execution provider {ep!r}: give cpu, qnn or openvino")
    return package_session(Path(package), component, info, device)[0]


def package_session(root: Path, component: str | None, info: Any, device: str | None,
                    session_options: Any = None) -> tuple[Any, str]:
    """`open_package`'s session and the name of the variant ONNX Runtime selected: as an application with ONNX
    Runtime alone creates it (`session_options`: what it offers at selection, the EP's device added); the session
    has the variant's own provider and session options, which ONNX Runtime applies."""
    import onnxruntime as ort

    if not (root / "manifest.json").is_file():
        raise UserError(str(root), None, "no manifest.json: give a model package folder (artifacts/packages/NAME/)")
    context = ort.ModelPackageContext(str(root))
    names = context.get_component_names()
    if component is None and len(names) != 1:
        raise UserError(str(root), None, f"{len(names)} components: name one ({', '.join(names)})")
    component = component or names[0]
    manifest = json_value((root / "manifest.json").read_text())
    variants = manifest["components"].get(component, {}).get("variants", {})
    if not info.is_cpu and not any(v.get("ep") == info.name for v in variants.values()):
        # ONNX Runtime would only say it cannot find the EP's backend: say what the package holds instead
        held = ", ".join(f"{name} ({v.get('ep', 'CPUExecutionProvider')})" for name, v in variants.items()) or "none"
        left = manifest.get("additional_metadata", {}).get("epbuild", {}).get("left_out", {})
        said = "; ".join(f"{name}: {why}" for name, why in left.items() if name.startswith(f"{component}@"))
        raise UserError(str(root), None, f"no {info.name} variant of '{component}': its variants are {held}"
                        f"{'; left out: ' + said if said else ''}")
    offered = session_options or ort.SessionOptions()
    if not info.is_cpu:  # the EP's device offered with what selection needs (QNN off its device: its backend)
        _plugin_ready(info)
        register_plugin(ort, info)
        offered.add_provider_for_devices([select_ep_device(ort, info, device or info.devices[0])],
                                         dict(info.required_defaults))
    chosen = context.select_component(component, ort.ModelPackageOptions(offered))
    # as an application with ONNX Runtime alone: the variant's own provider and session options, applied by ORT
    return chosen.create_session(), chosen.get_selected_variant_name()


def packaged_in(artifacts: Path, model: str, target: str) -> Path | None:
    """The model package under `artifacts/packages/` that holds MODEL@TARGET as a variant, if one does."""
    for manifest in sorted((artifacts / "packages").glob("*/manifest.json")):
        try:
            components = json_value(manifest.read_text())["components"]
        except (OSError, ValueError, KeyError):
            continue
        if target in components.get(model, {}).get("variants", {}):
            return manifest.parent
    return None


def package_differences(package: Path, model: str, target: str) -> list[str]:
    """The files of MODEL's TARGET variant in `package` whose bytes are not those its manifest records (edited,
    replaced, removed), by their path in the package; every file, where the manifest records none."""
    import hashlib

    try:
        recorded = json_value((package / "manifest.json").read_text())["additional_metadata"]["epbuild"]["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return ["manifest.json"]
    if not isinstance(recorded, dict):
        return ["manifest.json"]
    prefix = f"{model}/{target}/"
    differ = []
    for name, digest in sorted(recorded.items()):
        if not name.startswith(prefix):
            continue
        try:
            found = hashlib.sha256((package / name).read_bytes()).hexdigest()
        except OSError:
            found = None
        if found != digest:
            differ.append(name)
    return differ


def open_group(folder: str | Path) -> dict[str, Any]:
    """Every member's session of a shared-context group, created in the loading contract's order (destroy them in
    reverse order: delete the dict's entries last to first)."""
    folder, record = artifact_record(Path(folder))
    names = _order(record) if record.has("members") else []
    return {name: open_session(folder, name) for name in names}


def _order(record: ArtifactRecord) -> list[str]:
    """A group's members in the loading contract's order."""
    return list((record.loading if record.has("loading") else {}).get("order") or record.members)
