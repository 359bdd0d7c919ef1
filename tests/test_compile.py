"""Real compiles through doit: artifacts, incrementality, reproducibility, failures, unavailable EPs."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import onnxruntime as ort
import pytest

from conftest import REPO, build_report, ran
from helpers import ep_context_nodes, perturb_weights, single_op_model, tree_bytes

QNN_TARGETS = """
[targets.cpu]
ep = "cpu"

[targets.qnn-htp]
ep = "qnn"
options = { backend_type = "htp", soc_model = 60 }

[targets.qnn-embed]
extends = "qnn-htp"
embed = true
"""

TWO_MODELS = """
[models.tinycnn]
path = "models/tinycnn.onnx"

[models.encoder]
path = "models/encoder.onnx"
""" + QNN_TARGETS


def test_shipped_example_builds_real_artifacts(project, openvino_reason):
    shutil.copy(REPO / "models.toml", project.root / "models.toml")
    done = project.doit()
    expected_ran = {"compile:tinycnn@cpu", "compile:tinycnn@qnn-htp", "compile:tinycnn@qnn-htp-embed",
                    "compile:encoder@cpu", "compile:encoder@qnn-htp", "compile:dynbatch@cpu",
                    "compile:dynbatch@qnn-htp", "compile:tinycnn_qdq@cpu", "compile:tinycnn_qdq@qnn-htp-qdq"}
    assert expected_ran <= ran(done, "compile:")
    art = project.artifacts
    for model in ("tinycnn", "encoder", "dynbatch"):
        nodes = ep_context_nodes(art / "qnn-htp" / model / f"{model}.onnx")
        assert len(nodes) == 1 and nodes[0]["source"] == b"QNNExecutionProvider" and nodes[0]["embed_mode"] == 0
        assert nodes[0]["ep_cache_context"] == f"{model}_qnn.bin".encode()
        assert (art / "qnn-htp" / model / f"{model}_qnn.bin").stat().st_size > 1000
        sidecar = json.loads((art / "qnn-htp" / model / "artifact.json").read_text())
        assert sidecar["ep"] == "QNNExecutionProvider" and sidecar["device"] == "npu"
        assert sidecar["versions"]["onnxruntime-qnn"] == "2.7.0"
        assert sidecar["nodes"]["in_ep"] == sidecar["nodes"]["source"] and sidecar["nodes"]["cpu"] == 0
    embedded = art / "qnn-htp-embed" / "tinycnn"
    assert sorted(p.name for p in embedded.iterdir()) == ["artifact.json", "tinycnn.onnx", "validation.json"]
    assert ep_context_nodes(embedded / "tinycnn.onnx")[0]["embed_mode"] == 1
    qdq = json.loads((art / "qnn-htp-qdq" / "tinycnn_qdq" / "artifact.json").read_text())
    assert qdq["nodes"]["ep_context"] == 1 and qdq["nodes"]["in_ep"] > 0
    # the dynbatch artifact has the static shape from `inputs`
    session = ort.InferenceSession(str(art / "cpu" / "dynbatch" / "dynbatch.onnx"))
    assert session.get_inputs()[0].shape[1:] == [3, 32, 32]
    # CPU artifacts compute what the source computes
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    source = ort.InferenceSession(str(project.root / "models" / "tinycnn.onnx")).run(None, {"x": x})[0]
    optimized = ort.InferenceSession(str(art / "cpu" / "tinycnn" / "tinycnn.onnx")).run(None, {"x": x})[0]
    np.testing.assert_allclose(optimized, source, rtol=1e-5, atol=1e-6)
    if openvino_reason:
        assert f"skipped compile:tinycnn@openvino-cpu: {openvino_reason}" in done.stdout
    else:
        ov = ep_context_nodes(art / "openvino-cpu" / "tinycnn" / "tinycnn.onnx")
        assert ov and ov[0]["source"] == b"OpenVINOExecutionProvider"
        assert (art / "openvino-cpu" / "tinycnn" / "load_config.json").is_file()


def test_second_run_and_touch_compile_nothing(project):
    project.manifest(TWO_MODELS)
    first = project.doit()
    assert len(ran(first, "compile:")) == 6
    stamp = {p: p.stat().st_mtime_ns for p in project.artifacts.rglob("*.onnx")}
    assert ran(project.doit(), "compile:") == set()
    for model in (project.root / "models").glob("*.onnx"):
        os.utime(model)
    assert ran(project.doit(), "compile:") == set()
    assert stamp == {p: p.stat().st_mtime_ns for p in project.artifacts.rglob("*.onnx")}


def test_changing_model_bytes_recompiles_exactly_its_targets(project):
    project.manifest(TWO_MODELS)
    project.doit()
    perturb_weights(project.root / "models" / "encoder.onnx", seed=5)
    assert ran(project.doit(), "compile:") == {f"compile:encoder@{t}" for t in ("cpu", "qnn-htp", "qnn-embed")}


def test_option_value_and_option_file_changes_recompile_exactly_their_target(project):
    (project.root / "configs" / "profile.txt").write_text("one")
    project.manifest(TWO_MODELS.replace('[targets.qnn-embed]', """
[targets.qnn-file]
ep = "qnn"
options = { soc_model = 60, profiling_file_path = "configs/profile.txt" }   # read only when profiling is on
option_files = ["profiling_file_path"]

[targets.qnn-embed]"""))
    project.doit()
    (project.root / "configs" / "profile.txt").write_text("two")
    assert ran(project.doit(), "compile:") == {"compile:tinycnn@qnn-file", "compile:encoder@qnn-file"}
    text = (project.root / "models.toml").read_text()
    project.manifest(text.replace('[targets.qnn-embed]\nextends = "qnn-htp"',
                                  '[targets.qnn-embed]\nextends = "qnn-htp"\noptions = { soc_model = 69 }'))
    assert ran(project.doit(), "compile:") == {"compile:tinycnn@qnn-embed", "compile:encoder@qnn-embed"}


def test_ep_package_upgrade_recompiles_exactly_that_eps_targets(project, tmp_path):
    """importlib.metadata sees a newer onnxruntime-qnn first on the path, as after `pip install -U`."""
    project.manifest(TWO_MODELS)
    project.doit()
    shadow = tmp_path / "shadow" / "onnxruntime_qnn-2.7.1.dist-info"
    shadow.mkdir(parents=True)
    (shadow / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-qnn\nVersion: 2.7.1\n")
    project.env["PYTHONPATH"] = os.pathsep.join([str(shadow.parent), project.env["PYTHONPATH"]])
    done = project.doit()
    expected = {f"compile:{m}@{t}" for m in ("tinycnn", "encoder") for t in ("qnn-htp", "qnn-embed")}
    assert ran(done, "compile:") == expected
    sidecar = json.loads((project.artifacts / "qnn-htp" / "tinycnn" / "artifact.json").read_text())
    assert sidecar["versions"]["onnxruntime-qnn"] == "2.7.1"


def test_two_clean_builds_are_byte_identical(project, tmp_path, host_cache):
    from conftest import Project

    project.manifest(TWO_MODELS)
    project.doit()
    (tmp_path / "other").mkdir()
    other = Project(tmp_path / "other", host_cache)
    other.manifest(TWO_MODELS)
    other.doit("-n", "2", "-P", "process")
    first, second = tree_bytes(project.artifacts), tree_bytes(other.artifacts)
    assert len(first) == 14  # per model: cpu and qnn artifacts (both are static, nothing to fold: no stage)
    assert first == second


def test_failed_compile_leaves_nothing_and_others_build(project):
    single_op_model(project.root / "models" / "det.onnx", "Det")
    project.manifest(TWO_MODELS + '\n[models.det]\npath = "models/det.onnx"\ntargets = ["qnn-htp"]\n')
    stale = project.artifacts / "qnn-htp" / "det"
    stale.mkdir(parents=True)
    (stale / "det.onnx").write_text("an artifact from older settings")
    done = project.doit("--continue", check=False)
    assert done.returncode != 0
    assert "compile det@qnn-htp (QNNExecutionProvider): " in done.stdout + done.stderr
    assert "QNNExecutionProvider took none of the model's nodes; alone, it takes no node of Det" in done.stdout
    assert not stale.exists()
    assert not list((project.artifacts / ".scratch").iterdir())
    assert len(ran(done, "compile:")) == 7
    assert (project.artifacts / "qnn-htp" / "encoder" / "encoder_qnn.bin").is_file()


def test_unavailable_ep_is_listed_skipped_and_refused_by_name(project):
    project.manifest(TWO_MODELS + '\n[targets.dml-gpu]\nep = "dml"\n')
    listing = project.doit("list").stdout
    assert "compile:tinycnn@dml-gpu" in listing and "unavailable here: DmlExecutionProvider exists only on win32" \
        in listing
    done = project.doit()
    assert "skipped compile:tinycnn@dml-gpu: DmlExecutionProvider exists only on win32" in done.stdout
    assert "compile:tinycnn@dml-gpu" not in ran(done) and "compile:tinycnn@qnn-htp" in ran(done)
    by_name = project.doit("compile:tinycnn@dml-gpu", check=False)
    assert by_name.returncode != 0
    assert "compile:tinycnn@dml-gpu cannot be built on this host: DmlExecutionProvider exists only on win32" \
        in by_name.stdout + by_name.stderr


def test_a_model_without_static_shapes_holds_back_only_its_npu_builds(project):
    """Its NPU targets wait for the manifest's fix (named once, after everything else was built, and when one of
    them is asked for by name); its CPU target, which keeps it dynamic, and every other model build."""
    import numpy as np

    np.savez(project.root / "x.npz", x=np.ones((2, 3, 32, 32), np.float32))
    only = 'targets = ["cpu", "qnn-htp"]\n'
    project.manifest('[models.dynbatch]\npath = "models/dynbatch.onnx"\nvalidation = { inputs = "x.npz" }\n' + only +
                     '[models.tinycnn]\npath = "models/tinycnn.onnx"\n' + only + QNN_TARGETS +
                     '[packages.p]\nmodels = ["dynbatch"]\n')
    line = ("models.toml: models.dynbatch.inputs: input 'x' ([?, 3, 32, 32]) has symbolic dimension 0 ('batch'); "
            "target 'qnn-htp' needs static shapes: set dims = { batch = ... } (every input with that dimension) or "
            "inputs = { x = [...] }")
    listing = project.doit("list").stdout
    assert "compile:dynbatch@qnn-htp " in listing and "[blocked: models.dynbatch.inputs needs a fix]" in listing
    done = project.doit(check=False)
    assert done.returncode == 1
    assert ran(done) == {"compile:tinycnn@cpu", "validate:tinycnn@cpu", "compile:tinycnn@qnn-htp",
                         "validate:tinycnn@qnn-htp", "compile:dynbatch@cpu", "validate:dynbatch@cpu",
                         "package:p", "blocked"}
    assert done.stdout.count(line) == 1
    assert (f"error: {line} (2 task(s) wait for it: compile:dynbatch@qnn-htp, validate:dynbatch@qnn-htp; the rest "
            "were built)") in done.stdout
    report = build_report(project)
    assert report["validate:dynbatch@cpu"]["status"] == "validated"
    assert report["compile:dynbatch@qnn-htp"] == {"status": "not built", "reason": f"waits for a fix: {line}"}
    assert not (project.artifacts / "qnn-htp" / "dynbatch").exists()
    package = json.loads((project.artifacts / "packages" / "p" / "manifest.json").read_text())
    assert package["additional_metadata"]["epbuild"]["left_out"] == {"dynbatch@qnn-htp": f"not built: {line}"}
    by_name = project.doit("compile:dynbatch@qnn-htp", check=False)
    assert by_name.returncode == 1 and f"compile:dynbatch@qnn-htp waits for a fix: {line}" in by_name.stdout
    project.manifest(project.root.joinpath("models.toml").read_text().replace(
        'validation = { inputs = "x.npz" }', 'validation = { inputs = "x.npz" }\ndims = { batch = 2 }'))
    assert "compiled compile:dynbatch@qnn-htp" in project.doit().stdout  # fixed: it builds, the rest up to date


@pytest.mark.parametrize("inputs, message", [
    ("{ y = [1, 3, 32, 32] }", "models.toml: models.dynbatch.inputs.y: the model has no input 'y'; its inputs: x"),
    ("{ x = [1, 3, 32] }",
     "models.toml: models.dynbatch.inputs.x: the model's input has rank 4, the manifest gives 3 dimensions"),
    ("{ x = [1, 3, 32, 31] }",
     "models.toml: models.dynbatch.inputs.x: dimension 3 is fixed to 32 in the model, the manifest gives 31"),
])
def test_inputs_that_do_not_fit_the_model(project, inputs, message):
    project.manifest(f'[models.dynbatch]\npath = "models/dynbatch.onnx"\ninputs = {inputs}\n'
                     '[targets.cpu]\nep = "cpu"\n')
    done = project.doit(check=False)
    assert done.returncode == 2 and message in done.stderr and ran(done) == set()  # once, before any task
    assert not (project.artifacts / "cpu" / "dynbatch").exists()
