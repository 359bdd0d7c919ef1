"""Model packages (`[packages.NAME]`): ONNX Runtime's own `ModelPackageContext` opens what a build packages and
selects each target's variant by EP; every variant is validated through the package; the package task is
incremental, restored byte for byte, and refuses what it cannot hold with one line."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import SOURCE, build_report, ran

MANIFEST = '''
[models.tinycnn]
path = "models/tinycnn.onnx"
targets = ["cpu", "openvino-cpu", "qnn-htp", "qnn-htp-embed"]

[models.encoder]
path = "models/encoder.onnx"
targets = ["cpu"]

[targets.cpu]
ep = "cpu"

[targets.openvino-cpu]
ep = "openvino@pypi"
device = "cpu"
options = { load_config = "configs/openvino_f32.json" }
option_files = ["load_config"]

[targets.qnn-htp]
ep = "qnn"
device = "npu"
options = { backend_type = "htp", soc_model = 60 }

[targets.qnn-htp-embed]
extends = "qnn-htp"
embed = true

[packages.vision]
models = ["tinycnn"]

[packages.text]
models = ["encoder"]
'''



def ort_only(project, code: str, *args: str) -> subprocess.CompletedProcess:
    """`code` run as an application with ONNX Runtime and the EP plugins alone: a Python that does not process the
    site folder's .pth files (epbuild's editable install is one), the packages themselves on its path."""
    import sysconfig

    env = {k: v for k, v in project.env.items() if not k.startswith("EPBUILD_")}
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]
    return subprocess.run([sys.executable, "-S", "-c", code, *args], cwd=project.root, env=env, capture_output=True,
                          text=True, timeout=300)


def ort_only_snippet() -> str:
    from conftest import REPO

    text = (REPO / "docs" / "packages.md").read_text()
    return re.search(r"```python\n(.*?)```", text[text.index("<!-- ort-only snippet -->"):], re.S).group(1)


def _digests(folder) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def packaged(project):
    project.manifest(MANIFEST)
    done = project.doit()
    return project, done


def test_onnx_runtime_opens_the_package_and_selects_each_targets_variant(packaged):
    project, done = packaged
    root = project.artifacts / "packages" / "vision"
    manifest = json.loads((root / "manifest.json").read_text())
    variants = manifest["components"]["tinycnn"]["variants"]
    assert sorted(variants) == ["cpu", "openvino-cpu", "qnn-htp"]
    assert variants["qnn-htp"]["ep"] == "QNNExecutionProvider" and "device" not in variants["qnn-htp"]
    assert variants["qnn-htp"]["additional_metadata"]["epbuild"]["device"] == "npu"
    # the QNN EP's x86_64 build crashes checking a compatibility string during selection: in the metadata only
    assert "compatibility_string" not in variants["qnn-htp"]
    assert variants["qnn-htp"]["additional_metadata"]["epbuild"]["compatibility"].startswith("v2:")
    assert variants["openvino-cpu"]["compatibility_string"].startswith("{")
    # the option file is a shared asset, named by ONNX Runtime's hash of its folder, not in the variant's folder
    (asset,) = (root / "shared_assets").iterdir()
    import onnxruntime as ort

    uri = ort.ModelPackage.compute_directory_hash(str(asset))
    assert asset.name == uri.replace(":", "-") and [p.name for p in asset.iterdir()] == ["load_config.json"]
    # inline: ONNX Runtime resolves a shared asset's reference in session options only
    assert variants["openvino-cpu"]["executor_info"]["ort"]["provider_options"] == {
        "load_config": (project.root / "configs" / "openvino_f32.json").read_text().strip()}
    assert not (root / "tinycnn" / "openvino-cpu" / "load_config.json").exists()
    left_out = manifest["additional_metadata"]["epbuild"]["left_out"]
    assert list(left_out) == ["tinycnn@qnn-htp-embed"] and "qnn-htp is the QNNExecutionProvider variant" in \
        left_out["tinycnn@qnn-htp-embed"]
    # every file the manifest names, with its bytes; the artifact's own bytes (a copy, not a link)
    assert {**manifest["additional_metadata"]["epbuild"]["files"], "manifest.json": None}.keys() == \
        _digests(root).keys()
    for name, digest in manifest["additional_metadata"]["epbuild"]["files"].items():
        assert hashlib.sha256((root / name).read_bytes()).hexdigest() == digest
    binary = root / "tinycnn" / "qnn-htp" / "tinycnn_qnn.bin"
    assert binary.stat().st_nlink == 1
    assert binary.read_bytes() == (project.artifacts / "qnn-htp" / "tinycnn" / "tinycnn_qnn.bin").read_bytes()
    line = next(line for line in done.stdout.splitlines() if line.startswith("packaged package:vision"))
    assert ("checked through ModelPackageContext: tinycnn@cpu passed, tinycnn@openvino-cpu passed, "
            "tinycnn@qnn-htp passed") in line
    entry = build_report(project)["package:vision"]
    assert entry["status"] == "packaged" and entry["variants"]["tinycnn@qnn-htp"]["status"] == "passed"
    # an application with ONNX Runtime alone (docs/packages.md's snippet, as it is): each variant loads and gives
    # its validated numbers (OpenVINO's load_config applied: a CPU with bf16 would otherwise run bf16)
    assert ort_only(project, "import epbuild").returncode != 0  # epbuild cannot be imported there
    import onnxruntime as ort

    from epbuild.steps import vendor_shim

    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    source = ort.InferenceSession(str(project.root / "models" / "tinycnn.onnx"), providers=["CPUExecutionProvider"])
    want = source.run(None, {"x": x})[0].ravel()
    for ep, target, provider, snr in (("cpu", "cpu", "CPUExecutionProvider", 60), ("openvino", "openvino-cpu",
                                      "OpenVINOExecutionProvider", 60), ("qnn", "qnn-htp", "QNNExecutionProvider", 40)):
        if ep == "openvino" and vendor_shim.needed():
            continue  # its CPU device is offered through epbuild's vendor-id shim only (docs/packages.md)
        chosen = ort_only(project, ort_only_snippet(), ep)
        assert chosen.returncode == 0, chosen.stderr
        name, used, values = chosen.stdout.splitlines()[-1].split(" ", 2)  # after the simulator's own lines
        got = np.array(json.loads(values), np.float64).ravel()
        assert [name, used] == [target, provider]
        noise = np.sum((got - want) ** 2)
        assert np.isfinite(got).all() and (noise == 0 or 10 * np.log10(np.sum(want ** 2) / noise) >= snr)
    # a host whose plugin offers no device (OpenVINO's on a non-Intel CPU): one sentence, not InvalidArgument's
    # traceback (`Must provide one or more OrtEpDevice instances`)
    none = ort_only(project, "import onnxruntime\nonnxruntime.get_ep_devices = lambda: []\n" + ort_only_snippet(),
                    "openvino")
    assert none.returncode == 1 and "Traceback" not in none.stderr, none.stderr
    assert none.stderr.strip().splitlines()[-1] == (
        "this host offers no OpenVINOExecutionProvider device (OpenVINO's plugin offers its CPU device on Intel CPUs "
        "only): load another variant of the package, such as cpu")


def test_a_package_is_incremental_restored_byte_for_byte_and_rebuilt_alone(packaged):
    project, _ = packaged
    root = project.artifacts / "packages" / "vision"
    before = _digests(root)
    assert ran(project.doit(), "package:") == set()  # a no-op
    (asset,) = (root / "shared_assets").glob("*/load_config.json")
    for edited in (root / "tinycnn" / "qnn-htp" / "tinycnn_qnn.bin", asset):  # a variant's file, a shared asset
        edited.write_bytes(edited.read_bytes() + b" ")  # edited after packaging
        again = project.doit()
        assert ran(again, "package:") == {"package:vision"} and "restored package:vision" in again.stdout
        assert _digests(root) == before
    import shutil

    shutil.rmtree(project.artifacts / "packages")
    project.doit()
    assert _digests(root) == before  # from the cache, byte for byte
    # one target's settings change: that model's package only
    project.manifest(MANIFEST.replace('options = { backend_type = "htp", soc_model = 60 }',
                                      'options = { backend_type = "htp", soc_model = 69 }'))
    changed = project.doit()
    assert ran(changed, "package:") == {"package:vision"}
    manifest = json.loads((root / "manifest.json").read_text())
    assert ":69:" in manifest["components"]["tinycnn"]["variants"]["qnn-htp"]["additional_metadata"]["epbuild"][
        "compatibility"]


def test_a_variant_not_validated_fails_the_package_with_one_line(project, tmp_path):
    """Its validation skipped (here: the QNN plugin hidden from the jobs): nothing is packaged, the line says which
    verdict and how to leave the target out."""
    import os

    project.manifest(MANIFEST)
    project.doit("compile")
    hidden = tmp_path / "hidden" / "onnxruntime_qnn"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('onnxruntime-qnn is not installed on this host')\n")
    project.env["PYTHONPATH"] = os.pathsep.join([str(hidden.parent), project.env["PYTHONPATH"]])
    done = project.doit("package:vision", check=False)
    assert done.returncode == 1
    line = next(line for line in (done.stdout + done.stderr).splitlines() if line.startswith("package:vision: "))
    assert line.startswith("package:vision: validate:tinycnn@qnn-htp is skipped: this host cannot run "
                           "QNNExecutionProvider")
    assert line.endswith("a package holds validated variants only: validate it where it runs, or leave qnn-htp "
                         "out (`targets` in [packages.vision])")
    assert not (project.artifacts / "packages" / "vision").exists()


def test_onnx_runtime_selecting_another_variant_fails_the_check(tmp_path):
    """Two variants for one EP: ONNX Runtime takes the first; the check of the second says so in one line."""
    import onnxruntime as ort

    from epbuild.steps.validation.artifact_session import _through_package
    from helpers import single_op_model

    for variant in ("a", "b"):
        (tmp_path / "m" / variant).mkdir(parents=True)
        single_op_model(tmp_path / "m" / variant / "m.onnx", "Relu")
    body = {"variant_directory": None, "ep": "CPUExecutionProvider", "device": "cpu",
            "executor_info": {"ort": {"model_file": "m.onnx"}}}
    (tmp_path / "manifest.json").write_text(json.dumps({"schema_version": "1.0", "components": {"m": {"variants": {
        v: {**body, "variant_directory": f"m/{v}"} for v in ("a", "b")}}}}))
    from epbuild.manifest.eps import REGISTRY

    cpu = REGISTRY["cpu"]
    session, refused = _through_package(ort, cpu, {"device": "cpu"}, {"root": str(tmp_path), "component": "m",
                                                                      "variant": "a"})
    assert refused is None and session.get_providers() == ["CPUExecutionProvider"]
    session, refused = _through_package(ort, cpu, {"device": "cpu"}, {"root": str(tmp_path), "component": "m",
                                                                      "variant": "b"})
    assert session is None and refused["status"] == "failed"
    assert refused["reason"] == "ONNX Runtime selected variant 'a' of m for this EP, not the target's 'b'"


@pytest.mark.parametrize(("package", "line"), [
    ('[packages.p]\nmodels = ["tinycnm"]',
     "error: models.toml: packages.p.models[0]: unknown model 'tinycnm' (did you mean 'tinycnn'?); declared models: "
     "tinycnn, encoder"),
    ('[packages.p]\nmodels = ["encoder"]\ntargets = ["qnn-htp"]',
     "error: models.toml: packages.p.targets[0]: 'qnn-htp' is not a target of encoder; theirs: cpu"),
    ('[packages.p]\nmodels = []', "error: models.toml: packages.p.models: a package holds at least one model or "
     "group: give `models` (or `groups`)"),
    ('[packages.p]\ngroups = ["trio"]', "error: models.toml: packages.p.groups[0]: unknown group 'trio'; declared "
     "groups: none"),
])
def test_a_package_the_manifest_cannot_hold_is_one_line(project, package, line):
    project.manifest(MANIFEST.split("[packages.vision]")[0] + package + "\n")
    done = project.doit("list", check=False)
    assert done.returncode == 2 and done.stderr.strip() == line


def test_the_readme_package_snippet_opens_the_variant_onnx_runtime_selects(packaged):
    import re

    from conftest import REPO

    text = (REPO / "README.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", text[text.index("**Model packages.**"):], re.S).group(1)
    done = subprocess.run([sys.executable, "-c", snippet], cwd=packaged[0].root, capture_output=True, text=True,
                          timeout=300, env={**packaged[0].env, "PYTHONPATH": str(SOURCE)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "QNNExecutionProvider"


def test_open_package_says_what_is_wrong_in_one_line(packaged, tmp_path):
    import epbuild
    from epbuild.errors import UserError

    with pytest.raises(UserError, match=r"no manifest\.json: give a model package folder"):
        epbuild.open_package(tmp_path)
    session = epbuild.open_package(packaged[0].artifacts / "packages" / "vision")  # one component, CPU
    assert session.get_providers() == ["CPUExecutionProvider"]
    # a package without the EP's variant: what it holds, not ONNX Runtime's "Could not determine default backend"
    with pytest.raises(UserError, match=r"no QNNExecutionProvider variant of 'encoder': its variants are cpu "
                                        r"\(CPUExecutionProvider\)$"):
        epbuild.open_package(packaged[0].artifacts / "packages" / "text", "encoder", ep="qnn")


def test_each_verdict_says_what_onnx_runtime_answers_for_this_hosts_devices(packaged):
    """ONNX Runtime's compatibility answer, asked in the validating child and shown per cell: QNN judges only on
    an NPU (off-device it does not judge or refuses to: never "compatible")."""
    project, _ = packaged
    entries = build_report(project)
    qnn = entries["validate:tinycnn@qnn-htp"]
    assert qnn["compatibility"]["answer"] in ("UNJUDGED", "EP_NOT_APPLICABLE")
    assert qnn["compatibility"]["text"].startswith(("cannot be judged here: ", "the EP does not judge it"))
    openvino = entries["validate:tinycnn@openvino-cpu"]
    assert openvino["compatibility"]["answer"] in ("EP_SUPPORTED_OPTIMAL", "EP_SUPPORTED_PREFER_RECOMPILATION",
                                                   "EP_NOT_APPLICABLE")
    assert "compatibility" not in entries["validate:tinycnn@cpu"]
    # beside the artifact the verdict stays what a restore gives: the answer is this host's, in the build report
    assert "compatibility" not in json.loads((project.artifacts / "qnn-htp" / "tinycnn" / "validation.json")
                                             .read_text())
    page = (project.artifacts / "report.html").read_text()
    said = qnn["compatibility"]
    assert f'data-compatibility="{said["answer"]}">{said["text"][:20]}' in page


def test_epbuild_run_goes_through_the_package_that_holds_the_artifact(packaged):
    project, _ = packaged
    for target, provider in (("qnn-htp", "QNNExecutionProvider"), ("cpu", "CPUExecutionProvider")):
        done = subprocess.run([sys.executable, "-m", "epbuild", "run", f"tinycnn@{target}", "--runs", "2"],
                              cwd=project.root, capture_output=True, text=True, timeout=300,
                              env={**project.env, "PYTHONPATH": str(SOURCE)})
        assert done.returncode == 0, done.stderr
        first = done.stdout.splitlines()[0]
        assert first.startswith(f"{target}/tinycnn through package vision: {provider} on {provider}"), first
    # a variant whose file is not what the package's manifest records is never run "through the package"
    copy = project.artifacts / "packages" / "vision" / "tinycnn" / "cpu" / "tinycnn.onnx"
    copy.write_bytes(copy.read_bytes() + b"\0")
    done = subprocess.run([sys.executable, "-m", "epbuild", "run", "tinycnn@cpu"], cwd=project.root,
                          capture_output=True, text=True, timeout=300, env={**project.env, "PYTHONPATH": str(SOURCE)})
    assert done.returncode == 1 and done.stdout == "" and done.stderr.strip() == (
        "error: vision's tinycnn@cpu variant is not what its manifest records (tinycnn/cpu/tinycnn.onnx differ): "
        "rebuild the package (epbuild) before running it"), done.stderr


GROUPS = """
[groups.pair-openvino]
target = "openvino-cpu"
models = ["tinycnn", "encoder"]

[groups.pair-qnn]
target = "qnn-htp"
models = ["tinycnn", "encoder"]

[packages.pairs]
groups = ["pair-openvino", "pair-qnn"]
models = ["encoder"]
"""

# both members of a group through the package, in its loading order, their sessions alive together
TOGETHER = '''
import json, sys, onnxruntime as ort, onnxruntime_ep_openvino
root, group, target = sys.argv[1:4]
ort.register_execution_provider_library("OpenVINOExecutionProvider", onnxruntime_ep_openvino.get_library_path())
options = ort.SessionOptions()
options.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == "OpenVINOExecutionProvider"][:1],
                                 {})
context = ort.ModelPackageContext(root)
components = json.load(open(f"{root}/manifest.json"))["components"]
sessions = []
for member in components[f"{group}.tinycnn"]["variants"][target]["additional_metadata"]["epbuild"]["order"]:
    chosen = context.select_component(f"{group}.{member}", ort.ModelPackageOptions(options))
    sessions.append(chosen.create_session())  # the variant's own options: its sharing session options included
    print(member, chosen.get_selected_variant_name(), sessions[-1].get_providers()[0])
'''


def test_a_group_is_one_component_per_member_loading_together(project):
    """Each member a component (`GROUP.MODEL`) whose variant is the group's folder with its sharing session options;
    the OpenVINO group runs through the package (opened together by an application with ONNX Runtime alone), the
    QNN group (which the x86_64 simulator cannot load) goes in as structurally checked."""
    from epbuild.steps import vendor_shim

    project.manifest(MANIFEST.replace('targets = ["cpu"]\n', 'targets = ["cpu", "openvino-cpu", "qnn-htp"]\n')
                     + GROUPS)
    done = project.doit()
    root = project.artifacts / "packages" / "pairs"
    manifest = json.loads((root / "manifest.json").read_text())
    assert sorted(manifest["components"]) == ["encoder", "pair-openvino.encoder", "pair-openvino.tinycnn",
                                              "pair-qnn.encoder", "pair-qnn.tinycnn"]
    # the group's and encoder's OpenVINO variants use the same option file: one shared asset, named by both
    (asset,) = (root / "shared_assets").iterdir()
    named = {component: variant["executor_info"]["ort"]["provider_options"]["load_config"]
             for component, body in manifest["components"].items() for variant in body["variants"].values()
             if variant["ep"] == "OpenVINOExecutionProvider"}
    assert set(named) == {"encoder", "pair-openvino.encoder", "pair-openvino.tinycnn"}
    assert set(named.values()) == {(asset / "load_config.json").read_text().strip()}  # inline, for ORT alone
    member = manifest["components"]["pair-qnn.encoder"]["variants"]["qnn-htp"]
    assert member["variant_directory"] == "pair-qnn/qnn-htp" and member["executor_info"]["ort"]["model_file"] == \
        "encoder.onnx"
    assert member["executor_info"]["ort"]["session_options"]["ep.share_ep_contexts"] == "1"
    assert member["additional_metadata"]["epbuild"]["order"] == ["tinycnn", "encoder"]
    line = next(line for line in done.stdout.splitlines() if line.startswith("packaged package:pairs"))
    assert ("encoder@cpu passed, encoder@openvino-cpu passed, encoder@qnn-htp passed, pair-openvino passed, "
            "pair-qnn structural") in line
    if vendor_shim.needed():
        return  # OpenVINO's CPU device is offered through epbuild's vendor-id shim only: no app without epbuild
    together = ort_only(project, TOGETHER, str(root), "pair-openvino", "openvino-cpu")
    assert together.returncode == 0, together.stderr
    assert together.stdout.splitlines()[-2:] == ["tinycnn openvino-cpu OpenVINOExecutionProvider",
                                                 "encoder openvino-cpu OpenVINOExecutionProvider"]


def test_a_groups_verdict_file_holds_no_answer_of_this_hosts_devices(project):
    """A group's verdict file stays what a restore from the cache gives (its members' compatibility answers are this
    host's devices', outside the validation's fingerprint)."""
    project.manifest(MANIFEST.replace('targets = ["cpu"]\n', 'targets = ["cpu", "openvino-cpu"]\n')
                     + GROUPS.split("[groups.pair-qnn]")[0])
    project.doit("validate:pair-openvino")
    verdict = project.artifacts / "openvino-cpu" / "groups" / "pair-openvino" / "validation.json"
    fresh = verdict.read_bytes()
    assert json.loads(fresh)["status"] == "passed" and b"compatibility" not in fresh
    verdict.unlink()
    import shutil

    shutil.rmtree(project.artifacts / ".state")  # every task checked again: the verdict comes from the cache
    project.doit("validate:pair-openvino")
    assert verdict.read_bytes() == fresh


STALE = '''
[models.tinycnn]
path = "models/tinycnn.onnx"
targets = ["cpu"]

[models.encoder]
path = "models/encoder.onnx"
targets = ["cpu", "qnn-htp"]{validation}

[targets.cpu]
ep = "cpu"

[targets.qnn-htp]
ep = "qnn"
options = {{ backend_type = "htp", soc_model = 60 }}

[packages.vision]
models = ["tinycnn", "encoder"]
'''


@pytest.mark.parametrize("fails", ["compile", "validation"])
def test_a_package_that_cannot_be_rebuilt_is_removed_never_served_stale(project, fails):
    """The encoder retrained and its QNN compile fails (or its validation): the package built from the old encoder
    is removed with one line, so neither ONNX Runtime nor `epbuild run` loads the old model through it; it is
    published again once every variant passes."""
    from helpers import single_op_model

    project.manifest(STALE.format(validation=""))
    project.doit()
    package = project.artifacts / "packages" / "vision"
    assert (package / "manifest.json").is_file()
    if fails == "compile":
        single_op_model(project.root / "models" / "encoder.onnx", "Det")  # the HTP compiles nothing of it
    else:
        project.manifest(STALE.format(validation='\nvalidation = { targets = { qnn-htp = { min_snr_db = 1000 } } }'))
    done = project.doit("--continue", check=False)
    assert done.returncode != 0
    failed = "compile:encoder@qnn-htp" if fails == "compile" else "validate:encoder@qnn-htp"
    assert f"removed artifacts/packages/vision/: {failed} failed" in done.stdout, done.stdout
    # the line names the task that failed (not the validation between it and the package) and the fix
    assert f'not built package:vision: {failed} failed; to ship it without them: [packages.vision] targets = ["cpu"]' \
        in done.stdout, done.stdout
    assert not package.exists()
    again = project.doit(check=False)  # without --continue, stopping at the failure: still nothing published
    assert again.returncode != 0 and not package.exists()
    project.manifest(STALE.format(validation="").replace('targets = ["cpu", "qnn-htp"]', 'targets = ["cpu"]'))
    project.doit()
    assert (package / "manifest.json").is_file()  # every variant passes: published again


def test_prune_keeps_the_current_packages_and_removes_only_a_removed_ones(project):
    """Right after a build, `prune --dry-run` listed artifacts/packages/ and every variant's log though the manifest
    declares the package, and `prune` removed them: it removes only what no model, target, group, stage or package
    of the manifest owns."""
    manifest = STALE.format(validation="")
    project.manifest(manifest)
    project.doit()
    package = project.artifacts / "packages" / "vision"
    logs = sorted((project.artifacts / ".logs" / "packages").glob("vision.*.log"))
    assert package.is_dir() and logs
    dry = project.doit("prune", "--dry-run")
    assert "nothing under artifacts/ is left over" in dry.stdout, dry.stdout
    project.doit("prune")
    assert (package / "manifest.json").is_file() and all(log.is_file() for log in logs)
    project.manifest(manifest.replace("[packages.vision]", "[packages.other]"))
    listed = project.doit("prune", "--dry-run").stdout
    assert "artifacts/packages/vision" in listed and all(log.name in listed for log in logs), listed
    project.doit("prune")
    assert not package.exists() and not any(log.exists() for log in logs)


def test_reordering_a_models_targets_repackages_nothing_unless_it_changes_which_variant_ships(project):
    """ONNX Runtime selects a package's variant by EP and device, and a package holds one per EP and device: the
    order of a model's targets means nothing to it, so reordering them runs nothing; it matters only where two
    targets share an EP and device (the first declared ships), and then the package changes."""
    manifest = STALE.format(validation="").replace('[targets.qnn-htp]', '[targets.qnn-embed]\nep = "qnn"\nembed = '
                                                   'true\noptions = { backend_type = "htp", soc_model = 60 }\n\n'
                                                   '[targets.qnn-htp]')
    project.manifest(manifest.replace('targets = ["cpu", "qnn-htp"]', 'targets = ["cpu", "qnn-htp", "qnn-embed"]'))
    project.doit()
    shipped = json.loads((project.artifacts / "packages" / "vision" / "manifest.json").read_text())
    assert set(shipped["components"]["encoder"]["variants"]) == {"cpu", "qnn-htp"}
    project.manifest(manifest.replace('targets = ["cpu", "qnn-htp"]', 'targets = ["qnn-htp", "cpu", "qnn-embed"]'))
    assert ran(project.doit()) <= {"unavailable"}
    project.manifest(manifest.replace('targets = ["cpu", "qnn-htp"]', 'targets = ["qnn-embed", "cpu", "qnn-htp"]'))
    assert "package:vision" in ran(project.doit())  # the QNN slot now ships qnn-embed
    shipped = json.loads((project.artifacts / "packages" / "vision" / "manifest.json").read_text())
    assert set(shipped["components"]["encoder"]["variants"]) == {"cpu", "qnn-embed"}


def test_report_html_shows_packages_counts_stages_as_staged_and_links_logs(project):
    """report.html: a section per package (variants with EP and device, what was left out and why, links to the
    folder and manifest.json); the header counts a stage that ran as staged (the console's rule), and each build's
    section links its logs and validation.json."""
    project.manifest(STALE.format(validation="").replace(
        '[models.encoder]', '[models.dyn]\npath = "models/dynbatch.onnx"\ninputs = { x = [1, 3, 32, 32] }\n'
                            'targets = ["qnn-htp"]\n\n[models.encoder]'))
    done = project.doit()
    html = (project.artifacts / "report.html").read_text()
    assert "<h2>Model packages</h2>" in html and 'data-package="vision"' in html
    assert '<a href="packages/vision/manifest.json">manifest.json</a>' in html
    assert "<td>QNNExecutionProvider</td>" in html and ">qnn-htp</a>" in html
    summary = next(line for line in done.stdout.splitlines() if line.startswith("summary:"))
    staged = int(summary.split(" staged")[0].rsplit(" ", 1)[1])
    assert staged >= 1 and f'<span class="badge good">{staged} staged</span>' in html
    assert '<a class="mono" href="qnn-htp/dyn/validation.json">validation.json</a>' in html
    log = project.artifacts / ".logs" / "qnn-htp" / "dyn.compile.log"
    link = '<a class="mono" href=".logs/qnn-htp/dyn.compile.log">'
    assert (link in html) == (log.stat().st_size > 0)  # an empty log says nothing: not linked
    with log.open("a") as written:
        written.write("what the EP said\n")
    project.env["EPBUILD_FAST_PATH"] = "0"  # a run that renders the report again
    project.doit()
    assert link in (project.artifacts / "report.html").read_text()


@pytest.mark.parametrize("command", [["doit"], ["epbuild"]])
def test_a_failed_validation_exits_1_with_or_without_a_package_after_it(project, command):
    """One rule: 1 when tasks failed, whatever was not built because of them (doit calls the package not built
    for a failed validation an error, 2); 2 stays for a build that could not run at all (a manifest error)."""
    failing = STALE.format(validation='\nvalidation = { targets = { qnn-htp = { min_snr_db = 1000 } } }')
    for manifest in (failing.split("[packages.vision]")[0], failing):
        project.manifest(manifest)
        done = subprocess.run([sys.executable, "-m", *command, "--continue"], cwd=project.root, env=project.env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 1, (manifest, done.stdout[-2000:])
    project.manifest(failing.replace('ep = "cpu"', 'ep = "cpux"'))
    broken = subprocess.run([sys.executable, "-m", *command], cwd=project.root, env=project.env, capture_output=True,
                            text=True, timeout=600)
    assert broken.returncode == 2


def test_a_package_stopped_by_a_failure_suggests_only_targets_that_passed(project):
    """The line that ships a package without its failed variants listed a target that had failed too in the same
    build: it lists only targets whose every validation of the package's models passed."""
    failing = "validation = { targets = { qnn-htp = { min_snr_db = 1000 }, cpu2 = { min_snr_db = 1000 } } }"
    manifest = STALE.replace('targets = ["cpu", "qnn-htp"]{validation}',
                             f'targets = ["cpu", "cpu2", "qnn-htp"]\n{failing}')
    cpu2 = '\n[targets.cpu2]\nep = "cpu"\noptimization_level = "basic"\n'
    manifest = manifest.replace('[targets.cpu]\nep = "cpu"\n', '[targets.cpu]\nep = "cpu"\n' + cpu2)
    project.manifest(manifest.replace("{{", "{").replace("}}", "}"))
    done = project.doit("--continue", check=False)
    assert done.returncode != 0
    line = next(line for line in done.stdout.splitlines() if line.startswith("not built package:vision"))
    assert line.endswith('; to ship it without them: [packages.vision] targets = ["cpu"]'), done.stdout
