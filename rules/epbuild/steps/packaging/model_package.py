"""An ONNX Runtime model package (`[packages.NAME]`), made from validated artifacts and checked the way an application
loads it.

Layout (ONNX Runtime's `model_package` format, schema 1.0, portable): `artifacts/packages/NAME/manifest.json` with one
inline component per model and one variant per target, each variant the artifact folder's files copied (never
linked) under `MODEL/TARGET/`, except the option files a session needs (OpenVINO's `load_config`): those are shared
assets, stored once by content under `shared_assets/sha256-<hex>/NAME` (ONNX Runtime's directory hash of a folder
holding that one file) and named in the provider options as `sha256:<hex>/NAME`, so variants that use the same
file share it. A variant names its EP, its compatibility string and, in `executor_info["ort"]`, the model file and
the provider options a session needs; `additional_metadata["epbuild"]` keeps the target, the device it was built
for, and, at the top, the targets left out and why, and the sha256 of every file by its place in the package.

Devices: a variant declares `device` (ORT then requires the EP to offer a device of that type) except for QNN,
whose HTP simulator on x86_64 hosts is an OrtEpDevice of type CPU: declaring "npu" would make ONNX Runtime refuse
the variant wherever it is validated off-device. Nor does a QNN variant declare its `compatibility_string`: during
selection ONNX Runtime hands it to the QNN EP, whose x86_64 build crashes there (SIGSEGV in
`QnnEp::ValidateCompiledModelCompatibilityInfo`, depending on the package's path: onnxruntime-qnn 2.7.0), and with
one variant per EP and device the string would not change which variant is selected. Both stay in its metadata.

Only variants whose validation passed go in; what cannot be a variant (a target this host cannot build, validation
off, a vendor tool's program) is listed as left out. The package is checked in its scratch folder before it is
published: for each variant ONNX Runtime opens the package (`ModelPackageContext`), selects a variant for the
target's EP (which must be the target's own), creates the session and the validation runs through it against the
CPU reference with the target's thresholds (`validate.validate` with `package`). Its bytes are a function of its
manifest, which holds every file's sha256: the caches keep it like any output.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...contracts.artifact import OMIT, read_artifact
from ...contracts.statuses import Verdict
from ...contracts.validation import ValidationRecord, read_validation
from ...errors import BuildError, json_value
from ...files.layout import PACKAGES, Layout
from ...files.publish import copy_file, discard
from ...manifest.builds import Build, package_task
from ...state.hash_memory import FileHashes
from ...version import RULES_FORMAT
from .package import INLINE_OPTIONS

FORMAT = 1
MANIFEST = "manifest.json"
SCHEMA_VERSION = "1.0"
UNDECLARED = ("QNNExecutionProvider",)  # neither device nor compatibility string in the variant (see the docstring)
ASSETS = "shared_assets"


def variant_folder(build: Build) -> str:
    """`MODEL/TARGET` (a group: `GROUP/TARGET`), relative to the package root (an inline component's folder)."""
    return f"{build.folder_name}/{build.target.name}"


def component_name(build: Build, member: str) -> str:
    """A model's component is named for it; a group member's is `GROUP.MODEL`."""
    return f"{build.name}.{member}" if build.shared else member


def package_files(variants: list[Build], hashes: FileHashes) -> list[str]:
    """Every file a package of these variants holds, as sorted relative paths, known before it is made (its task's
    targets): a shared asset's place from the bytes of the target's option file, which the compile copies into
    the artifact unchanged."""
    files = {MANIFEST}
    for build in variants:
        sources = {name: build.target.option_files[key] for key, name in build.target.runtime_files().items()}
        files.update(_place(build, name, hashes.sha256(sources[name])) if name in sources
                     else f"{variant_folder(build)}/{name}" for name in build.outputs)
    return sorted(files)


def manifest_files(text: str) -> list[str]:
    """Every file the package with this manifest holds, as sorted relative paths."""
    return sorted([MANIFEST, *json_value(text)["additional_metadata"]["epbuild"]["files"]])


def asset_uri(files: dict[str, str]) -> str:
    """ONNX Runtime's content address of an asset folder (`ModelPackage.compute_directory_hash`): the sha256 of
    the lines `<sha256>  <path>` of its files, sorted by path."""
    return "sha256:" + hashlib.sha256("".join(f"{digest}  {path}\n" for path, digest in sorted(files.items()))
                                      .encode()).hexdigest()


def _asset_names(build: Build) -> set[str]:
    """The variant's files stored as shared assets: the option files its session needs."""
    return set(build.target.runtime_files().values())


def placement(build: Build, hashes: FileHashes, layout: Layout) -> dict[str, str]:
    """Where each of the variant's files lies in the package: an option file in its shared asset
    (`shared_assets/sha256-<hex>/NAME`), the others in the variant's folder."""
    folder, assets = build.out_dir(layout), _asset_names(build)
    return {name: _place(build, name, hashes.sha256(folder / name)) if name in assets
            else f"{variant_folder(build)}/{name}" for name in build.outputs}


def _place(build: Build, name: str, digest: str) -> str:
    return f"{ASSETS}/{asset_uri({name: digest}).replace(':', '-')}/{name}"


def reference(place: str) -> str:
    """How an executor info names a file in a shared asset: `sha256:<hex>/NAME`."""
    _, folder, name = place.split("/", 2)
    return f"{folder.replace('-', ':', 1)}/{name}"


def manifest_text(name: str, variants: list[Build], left_out: dict[str, str], layout: Layout,
                  hashes: FileHashes) -> str:
    """manifest.json, from the published artifacts (their records and bytes): sorted keys, so that the same
    artifacts give the same bytes."""
    components: dict[str, Any] = {}
    files: dict[str, str] = {}
    for build in variants:
        folder = build.out_dir(layout)
        record = read_artifact(folder)
        places = placement(build, hashes, layout)
        for member in build.members:
            components.setdefault(component_name(build, member.name), {"variants": {}})["variants"][
                build.target.name] = _variant(build, record, member.name, places, folder)
        for file_name, place in places.items():
            files[place] = hashes.sha256(folder / file_name)
    manifest = {"schema_version": SCHEMA_VERSION, "package_name": name, "layout": "portable",
                "description": f"built by epbuild from models.toml ([packages.{name}])", "components": components,
                "additional_metadata": {"epbuild": {"format": FORMAT, "left_out": left_out, "files": files}}}
    return json.dumps(manifest, indent=2, sort_keys=True) + "\n"


def _variant(build: Build, record: Any, member: str, places: dict[str, str], folder: Path) -> dict[str, Any]:
    """One variant's body: its folder, EP, device, compatibility string, and how ONNX Runtime opens it (a group
    member: its model in the group's folder, with the loading contract's session options). An option file the EP
    also takes as its text (OpenVINO's `load_config` JSON) is written inline: ONNX Runtime resolves a shared asset's
    `sha256:` reference in session options only, and hands one in provider options to the plugin as it is (which
    then fails to parse it, and without it runs bf16 where the CPU has it); any other option file by its asset."""
    entry = record.members[member] if build.shared else record
    ort_info: dict[str, Any] = {"model_file": entry.model_file}
    options = record.runtime_options if record.has("runtime_options") else {}
    inline = INLINE_OPTIONS.get(build.target.ep.alias, ())
    if options:
        ort_info["provider_options"] = {
            key: (folder / value).read_text().strip() if key in inline and (folder / value).is_file() else
            reference(places[value]) if places.get(value, "").startswith(ASSETS) else str(value)
            for key, value in options.items()}
    metadata: dict[str, Any] = {"target": build.target.name, "device": record.device, "compiler": record.compiler}
    if build.shared:
        loading = record.loading if record.has("loading") else {}
        if loading.get("session_options"):
            ort_info["session_options"] = {key: str(value) for key, value in loading["session_options"].items()}
        metadata.update({"group": build.name, "order": list(loading.get("order") or record.order)})
    variant: dict[str, Any] = {"variant_directory": variant_folder(build), "ep": record.ep,
                               "executor_info": {"ort": ort_info}, "additional_metadata": {"epbuild": metadata}}
    if entry.compatibility is not OMIT:
        metadata["compatibility"] = entry.compatibility
    if not build.shared and record.has("socs"):  # a multi-SoC binary: the SoCs it holds
        metadata["socs"] = dict(record.socs)
    if record.ep not in UNDECLARED:
        variant["device"] = record.device
        if entry.compatibility is not OMIT:
            variant["compatibility_string"] = entry.compatibility
    return variant


def fingerprint(text: str, code: str) -> str:
    """The cache key of a package: its manifest names every byte."""
    return hashlib.sha256(json.dumps({"kind": "package", "rules_format": RULES_FORMAT, "format": FORMAT,
                                      "code": code, "manifest": text}, sort_keys=True).encode()).hexdigest()


def assemble(variants: list[Build], text: str, layout: Layout, hashes: FileHashes, scratch: Path) -> None:
    """The package's files into `scratch`: each artifact's files copied to their place (a shared asset once),
    the manifest."""
    for build in variants:
        source = build.out_dir(layout)
        for file_name, place in placement(build, hashes, layout).items():
            if not (scratch / place).exists():
                (scratch / place).parent.mkdir(parents=True, exist_ok=True)
                copy_file(source / file_name, scratch / place)
    (scratch / MANIFEST).write_text(text)


def unvalidated(build: Build, layout: Layout) -> str | None:
    """Why a variant cannot go in though its tasks succeeded (a verdict other than passed), or None."""
    try:
        verdict = read_validation(build.out_dir(layout))
    except (OSError, ValueError) as exc:
        return f"no verdict ({exc})"
    if verdict.passed or structural(build, verdict):
        return None
    return f"{build.validate_task} is {verdict.status}: {verdict.reason or 'no reason given'}"


def structural(build: Build, verdict: ValidationRecord | Mapping[str, Any]) -> bool:
    """A group this host cannot load (QNN's shared context on x86_64) whose structural checks passed: the most
    that can be judged here, and it goes in as such (its metadata says so when checked)."""
    if not isinstance(verdict, ValidationRecord):
        verdict = ValidationRecord.from_json(verdict)
    return build.shared and verdict.status is Verdict.SKIPPED and verdict.structural is Verdict.PASSED


def check_variant(name: str, build: Build, workspace: Any, root: Path, workdir: Path) -> dict[str, Any]:
    """The variant's validation run through the package: ONNX Runtime opens `root`, selects a variant for the
    target's EP (it must be this one), creates the session; its outputs are compared with the CPU reference."""
    from ..validate import validate

    assets = {name: str(root / place) for name, place in placement(build, workspace.hashes, workspace.layout).items()
              if place.startswith(ASSETS)}
    package = {"root": str(root), "component": component_name(build, build.members[0].name),
               "variant": build.target.name, "assets": assets}
    log = workspace.layout.log(PACKAGES, f"{name}.{build.name}")
    return validate(build, workspace, workdir, folder=root / variant_folder(build), package=package, log=log)


def check_package(name: str, variants: list[Build], workspace: Any, root: Path) -> dict[str, dict[str, Any]]:
    """Every variant checked through the package in `root`; a failure raises BuildError with its line."""
    from ..validate import summary

    verdicts = {}
    workdir = root.parent / f"{root.name}.check"
    try:
        for build in variants:
            report = check_variant(name, build, workspace, root, workdir)
            # a multi-SoC binary is checked structurally through the package too (its SoCs were run alone)
            checked = "structural" if structural(build, report) or (
                build.soc_reports and report["status"] == Verdict.PASSED) else report["status"]
            verdicts[build.name] = {"status": checked, "summary": summary(report)}
            if report["status"] == Verdict.FAILED:
                raise BuildError(f"{package_task(name)}: {build.name} through the package: {summary(report)}")
    finally:
        discard(workdir)
    return verdicts
