"""Validation tasks: real runs on the EP (QNN HTP simulator here), CPU fallback refused, failures reported."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import onnx
import pytest

from conftest import REPO, ran
from epbuild.errors import BuildError
from epbuild.execute.child import run_child
from epbuild.manifest.builds import Limits
from epbuild.manifest.parse import load
from epbuild.plan.targets import plan
from epbuild.steps.validate import validate, validate_member
from epbuild.store.cache import Workspace
from helpers import single_op_model, validation_member, workspace

QNN = """
[models.tinycnn]
path = "models/tinycnn.onnx"

[models.encoder]
path = "models/encoder.onnx"

[targets.qnn-htp]
ep = "qnn"
options = { soc_model = 60 }
"""


def _workspace(project, cache: str = "cache.test") -> Workspace:
    """The project's artifacts with a cache of the test's own (validations keep their CPU reference there)."""
    return workspace(project.artifacts, project.root / cache)


def report(project, target: str, model: str) -> dict:
    return json.loads((project.artifacts / target / model / "validation.json").read_text())


def test_every_shipped_artifact_validates(project, openvino_reason):
    shutil.copy(REPO / "models.toml", project.root / "models.toml")
    done = project.doit()
    for target, model in (("qnn-htp", "tinycnn"), ("qnn-htp", "encoder"), ("qnn-htp", "dynbatch"),
                          ("qnn-htp-embed", "tinycnn"), ("qnn-htp-qdq", "tinycnn_qdq"), ("cpu", "encoder")):
        result = report(project, target, model)
        assert result["status"] == "passed", result
        assert f"passed validate:{model}@{target}: SNR" in done.stdout
    qnn = report(project, "qnn-htp", "encoder")
    assert qnn["ran_on"] == {"QNNExecutionProvider": ["EPContext"]} and qnn["precision"] == "fp16"
    assert qnn["outputs"]["y"]["snr_db"] > 40 and qnn["outputs"]["y"]["nan_count"] == 0
    qdq = report(project, "qnn-htp-qdq", "tinycnn_qdq")
    assert qdq["precision"] == "qdq" and "EPContext" in qdq["ran_on"]["QNNExecutionProvider"]
    assert report(project, "cpu", "tinycnn")["precision"] == "fp32"
    if openvino_reason:
        assert f"skipped validate:tinycnn@openvino-cpu: {openvino_reason}" in done.stdout
    else:
        assert report(project, "openvino-cpu", "tinycnn")["status"] == "passed"
    assert "packaged package:vision: " in done.stdout  # the shipped package, each variant checked through it
    assert (project.artifacts / "packages" / "vision" / "tinycnn" / "qnn-htp" / "tinycnn_qnn.bin").is_file()
    assert not {name for name in ran(project.doit()) if name.startswith(("compile:", "validate:", "package:"))}


def test_corrupted_context_binary_fails_validation_without_crashing_doit(project):
    project.manifest(QNN)
    project.doit()
    binary = project.artifacts / "qnn-htp" / "tinycnn" / "tinycnn_qnn.bin"
    data = bytearray(binary.read_bytes())
    data[2000:6000] = bytes(b ^ 0xFF for b in data[2000:6000])
    binary.write_bytes(bytes(data))
    done = project.doit("-s", "validate:tinycnn@qnn-htp", check=False)  # alone: a plain run restores the binary
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    assert ran(done) == {"validate:tinycnn@qnn-htp"}
    result = report(project, "qnn-htp", "tinycnn")
    assert result["status"] == "failed"
    assert "could not load the artifact" in result["reason"] and "QNN_CONTEXT_ERROR_CREATE_FROM_BINARY" in \
        result["reason"]


def test_another_models_binary_fails_with_the_eps_message_and_no_cpu_retry(project):
    project.manifest(QNN)
    project.doit()
    shutil.copy(project.artifacts / "qnn-htp" / "encoder" / "encoder_qnn.bin",
                project.artifacts / "qnn-htp" / "tinycnn" / "tinycnn_qnn.bin")
    done = project.doit("-s", "validate:tinycnn@qnn-htp", check=False)
    assert done.returncode == 1
    assert "Falling back" not in done.stdout + done.stderr
    result = report(project, "qnn-htp", "tinycnn")
    assert result["status"] == "failed" and "QNNExecutionProvider could not run the artifact" in result["reason"]
    assert "data size does not match" in result["reason"]


def test_runtime_options_from_the_sidecar_reach_the_validating_session(project):
    project.manifest(QNN)
    project.doit()
    sidecar_path = project.artifacts / "qnn-htp" / "tinycnn" / "artifact.json"
    sidecar = json.loads(sidecar_path.read_text())
    sidecar["runtime_options"]["qnn_context_priority"] = "bogus"
    sidecar_path.write_text(json.dumps(sidecar))
    project.doit("-s", "validate:tinycnn@qnn-htp", check=False)
    assert "Invalid Qnn context priority" in report(project, "qnn-htp", "tinycnn")["reason"]


def test_openvino_load_config_reaches_the_validating_session(project, openvino_reason):
    """On CPUs with bf16, OpenVINO without the f32 load_config misses fp32 thresholds by orders of magnitude."""
    if openvino_reason:
        pytest.skip(f"OpenVINO cannot run here: {openvino_reason}")
    project.manifest("""
[models.encoder]
path = "models/encoder.onnx"

[targets.ov-f32]
ep = "openvino"
options = { load_config = "configs/openvino_f32.json" }
option_files = ["load_config"]
""")
    project.doit()
    result = report(project, "ov-f32", "encoder")
    assert result["status"] == "passed" and result["outputs"]["y"]["max_rel_error"] < 1e-3


def test_threshold_failure_names_output_metric_value_and_threshold(project):
    project.manifest(QNN.replace('options = { soc_model = 60 }', 'options = { soc_model = 60 }\n'
                                 'validation = { min_snr_db = 100 }'))
    done = project.doit("--continue", check=False)
    assert done.returncode == 1
    reason = report(project, "qnn-htp", "tinycnn")["reason"]
    assert reason.startswith("output 'logits': snr_db ") and reason.endswith(" < min_snr_db 100")
    assert "failed validate:tinycnn@qnn-htp: output 'logits': snr_db" in done.stdout + done.stderr


def test_model_thresholds_override_the_targets(project):
    project.manifest(QNN.replace('options = { soc_model = 60 }', 'options = { soc_model = 60 }\n'
                                 'validation = { min_snr_db = 100 }').replace(
        'path = "models/tinycnn.onnx"', 'path = "models/tinycnn.onnx"\nvalidation = { min_snr_db = 45 }'))
    done = project.doit("--continue", check=False)
    assert report(project, "qnn-htp", "tinycnn")["status"] == "passed"
    assert report(project, "qnn-htp", "tinycnn")["thresholds"]["min_snr_db"] == 45
    assert report(project, "qnn-htp", "encoder")["status"] == "failed" and done.returncode == 1


def test_skipped_when_the_ep_cannot_be_loaded_here_and_never_counted_as_passed(project, tmp_path):
    project.manifest(QNN)
    project.doit("compile")
    hidden = tmp_path / "hidden" / "onnxruntime_qnn"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('onnxruntime-qnn is not installed on this host')\n")
    project.env["PYTHONPATH"] = os.pathsep.join([str(hidden.parent), project.env["PYTHONPATH"]])
    done = project.doit("validate")
    result = report(project, "qnn-htp", "tinycnn")
    assert result["status"] == "skipped" and "not installed on this host" in result["reason"]
    assert "skipped validate:tinycnn@qnn-htp: this host cannot run QNNExecutionProvider" in done.stdout
    assert "passed validate" not in done.stdout


def test_structural_mode_catches_a_missing_binary(project):
    project.manifest(QNN.replace('options = { soc_model = 60 }', 'options = { soc_model = 60 }\n'
                                 'validate = "structural"'))
    done = project.doit()
    assert "structural validate:tinycnn@qnn-htp: structural checks only" in done.stdout
    (project.artifacts / "qnn-htp" / "tinycnn" / "tinycnn_qnn.bin").unlink()
    build = next(b for b in plan(load(project.root / "models.toml")) if b.members[0].name == "tinycnn")
    result = validate(build, _workspace(project), project.root / "work")
    assert result["status"] == "failed" and "tinycnn_qnn.bin listed in artifact.json is missing" in result["reason"]


def test_a_structural_check_is_its_own_verdict_everywhere_never_passed(project):
    """`validate = "structural"` said "passed" on the console, a green unlabelled cell in report.html and a passing
    junit case, while nothing it computes was judged: it is "structural" in every place, with its own colour and
    word, a skipped junit case with the reason, and its own count in the summary."""
    import json
    import xml.etree.ElementTree as ElementTree

    project.manifest(QNN.replace('options = { soc_model = 60 }', 'options = { soc_model = 60 }\n'
                                 'validate = "structural"'))
    done = project.doit()
    assert "passed validate" not in done.stdout
    assert "structural validate:tinycnn@qnn-htp: structural checks only" in done.stdout
    summary = next(line for line in done.stdout.splitlines() if line.startswith("summary:"))
    assert "2 structural" in summary and "validated" not in summary  # tinycnn and encoder
    assert report(project, "qnn-htp", "tinycnn")["status"] == "structural"
    entry = json.loads((project.artifacts / "build-report.json").read_text())["tasks"]["validate:tinycnn@qnn-htp"]
    assert entry["status"] == "structural" and "nothing was run" in entry["reason"]
    html = (project.artifacts / "report.html").read_text()
    assert '<td class="checked" data-build="tinycnn@qnn-htp">' in html
    assert '<span class="badge checked">structural</span>' in html
    cases = list(ElementTree.parse(project.artifacts / "junit.xml").getroot().iter("testcase"))
    assert cases and all((skipped := case.find("skipped")) is not None and "nothing was run" in skipped.get("message")
                         for case in cases)
    again = project.doit("--always-execute", "validate:tinycnn@qnn-htp")
    assert "structural validate:tinycnn@qnn-htp" in again.stdout


def test_structural_mode_catches_an_embed_mismatch(project):
    project.manifest(QNN.replace('options = { soc_model = 60 }', 'options = { soc_model = 60 }\n'
                                 'validate = "structural"'))
    project.doit()
    build = next(b for b in plan(load(project.root / "models.toml")) if b.members[0].name == "tinycnn")
    embedded = dataclasses.replace(build.target, embed=True)
    result = validate(dataclasses.replace(build, target=embedded), _workspace(project), project.root / "work")
    assert result["status"] == "failed" and "has embed_mode 0, the target says embed = true" in result["reason"]


def test_inputs_file_is_used_and_tracked(project):
    import numpy as np

    (project.root / "data").mkdir()
    np.savez(project.root / "data" / "x.npz", x=np.full((1, 3, 64, 64), 0.5, np.float32))
    project.manifest(QNN.replace('path = "models/tinycnn.onnx"',
                                 'path = "models/tinycnn.onnx"\nvalidation = { inputs = "data/x.npz" }'))
    project.doit()
    assert report(project, "qnn-htp", "tinycnn")["inputs"]["from"].endswith("x.npz")
    np.savez(project.root / "data" / "x.npz", y=np.zeros((1, 3, 64, 64), np.float32))
    done = project.doit("--continue", check=False)
    assert ran(done) == {"validate:tinycnn@qnn-htp"}
    reason = report(project, "qnn-htp", "tinycnn")["reason"]
    assert "validation.inputs x.npz: the model has no input 'y'; its inputs: x" in reason


def test_a_validation_timeout_fails_that_task_naming_the_timeout(project):
    project.manifest(QNN.replace('options = { soc_model = 60 }', 'options = { soc_model = 60 }\n'
                                 'validation = { timeout_s = 0.001 }'))  # a warm QNN validation takes ~10 ms
    done = project.doit("--continue", check=False)
    assert done.returncode == 1 and (project.artifacts / "qnn-htp" / "tinycnn" / "validation.json").is_file(), \
        done.stdout + done.stderr
    assert "timed out after 0.001 s" in report(project, "qnn-htp", "tinycnn")["reason"]
    assert {"compile:tinycnn@qnn-htp", "compile:encoder@qnn-htp"} <= ran(done)


@pytest.mark.parametrize("signal_name", ["SIGSEGV", "SIGABRT", "SIGKILL"])
def test_a_crashing_child_is_reported_by_signal(tmp_path, signal_name):
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), env_path])
    try:
        with pytest.raises(BuildError, match=f"validate m@t: the child process was killed by {signal_name}"):
            run_child("crash_child", {"action": "signal", "signal": signal_name}, tmp_path, Limits(60), "validate m@t")
    finally:
        os.environ["PYTHONPATH"] = env_path


def test_no_op_run_revalidates_nothing(project):
    project.manifest(QNN)
    project.doit()
    stamp = (project.artifacts / "qnn-htp" / "tinycnn" / "validation.json").stat().st_mtime_ns
    assert ran(project.doit()) == set()
    assert (project.artifacts / "qnn-htp" / "tinycnn" / "validation.json").stat().st_mtime_ns == stamp


def test_a_separate_reference_model_is_compared_against(project):
    """validation.reference: here the QDQ version of tinycnn stands as the reference, so the fp16 artifact is
    compared with quantized numbers and the report says which model it used."""
    project.manifest(QNN.replace('path = "models/tinycnn.onnx"', 'path = "models/tinycnn.onnx"\n'
                                 'validation = { reference = "models/tinycnn_qdq.onnx", min_snr_db = 15, '
                                 'min_cosine = 0.9 }'))
    project.doit()
    result = report(project, "qnn-htp", "tinycnn")
    assert result["status"] == "passed" and result["precision"] == "qdq"
    assert 15 < result["outputs"]["logits"]["snr_db"] < 60  # quantization error, not fp16 rounding


def _reference_request(tmp_path, reference, declared, reference_is):
    artifact = single_op_model(tmp_path / "artifact.onnx", "Relu")
    return validation_member(artifact=str(artifact), reference=str(reference), declared=str(declared),
                             reference_is=reference_is)


def _unloadable(path):
    """A model onnx reads and ONNX Runtime refuses (an op no EP implements), as some stages' outputs are."""
    model = onnx.load(single_op_model(path, "Relu"))
    model.graph.node[0].op_type, model.graph.node[0].domain = "NoSuchOp", "com.example"
    model.opset_import.append(onnx.helper.make_opsetid("com.example", 1))
    onnx.save(model, path)
    return path


def test_a_stage_output_the_cpu_cannot_run_gives_way_to_the_model_as_declared_and_says_so(tmp_path):
    declared = single_op_model(tmp_path / "m.onnx", "Relu")
    result = validate_member(_reference_request(tmp_path, _unloadable(tmp_path / "stage.onnx"), declared,
                                                "the output of fold:m"))
    assert result["status"] == "passed", result
    assert result["outputs"]["y"]["snr_db"] == 200.0
    (note,) = result["notes"]
    assert note.startswith("the CPU reference, the output of fold:m, could not run on CPU (") and "NoSuchOp" in note
    assert note.endswith("compared with the model as declared instead")


def test_a_reference_the_cpu_cannot_run_is_named_and_not_blamed_on_the_ep(tmp_path):
    broken = _unloadable(tmp_path / "m.onnx")
    result = validate_member(_reference_request(tmp_path, broken, broken, "the model as declared (m.onnx)"))
    assert result["status"] == "failed"
    assert result["reason"].startswith("the CPU reference, the model as declared (m.onnx), could not run on CPU: ")
    assert "NoSuchOp" in result["reason"] and "ExecutionProvider could not" not in result["reason"]
    user = validate_member(_reference_request(tmp_path, broken, tmp_path / "artifact.onnx",
                                              "validation.reference (m.onnx)"))
    assert user["status"] == "failed" and user["reason"].startswith("the CPU reference, validation.reference (m.onnx)")


def test_a_large_models_reference_runs_in_a_child_of_its_own_with_the_same_result(project, monkeypatch):
    """Past SEPARATE_REFERENCE_BYTES the CPU reference runs in a first child that ends before the artifact's starts
    (never both in memory); the report is the one a single child gives."""
    import epbuild.steps.validation.cached_reference as cached_reference

    project.manifest('[models.encoder]\npath = "models/encoder.onnx"\n[targets.cpu]\nep = "cpu"\n')
    project.doit()
    (build,) = plan(load(project.root / "models.toml"))  # a cpu target: no stage, as the build planned it
    together = validate(build, _workspace(project, "cache.together"), project.root / "together")
    monkeypatch.setattr(cached_reference, "SEPARATE_REFERENCE_BYTES", 0)
    apart = validate(build, _workspace(project, "cache.apart"), project.root / "apart")
    assert apart["status"] == together["status"] == "passed", apart
    assert apart["outputs"] == together["outputs"] and apart["inputs"] == together["inputs"]
    assert (project.artifacts / ".logs" / "cpu" / "encoder.validate.ref.log").is_file()
    assert apart["cpu_reference"] == together["cpu_reference"] and apart["cpu_reference"]["from"] == "computed"
    (project.artifacts / ".logs" / "cpu" / "encoder.validate.ref.log").unlink()
    again = validate(build, _workspace(project, "cache.apart"), project.root / "again")  # the kept reference
    assert again["cpu_reference"]["from"] == "cache" and again["outputs"] == apart["outputs"]
    assert not (project.artifacts / ".logs" / "cpu" / "encoder.validate.ref.log").exists()  # no reference child


def test_a_reference_that_cannot_be_saved_costs_its_keeping_not_the_validation(tmp_path):
    """The child saves the reference for the cache where it can; a disk that refuses it (here a file where its
    folder would be) leaves the validation as it is, with the reason for the one warning."""
    from epbuild.contracts.jobs import ValidationJob
    from epbuild.steps.validate import _validate_in_child

    model = single_op_model(tmp_path / "m.onnx", "Relu")
    member = _reference_request(tmp_path, model, model, "the model as declared (m.onnx)")
    (tmp_path / "blocked").write_text("a file, not a folder")
    request = ValidationJob({"m": member}, False, False, None, None, reference_to=str(tmp_path / "blocked" / "ref"))
    report = _validate_in_child(request.to_json())
    assert report["status"] == "passed" and "reference_saved" not in report
    assert "blocked" in report["reference_unsaved"]
    saved = _validate_in_child(dataclasses.replace(request, reference_to=str(tmp_path / "ref")).to_json())
    assert saved["reference_saved"] and saved["outputs"] == report["outputs"]
    assert (tmp_path / "ref" / "reference.npz").is_file()


def test_a_passing_line_counts_a_cpu_targets_op_types_and_names_an_eps_first_few():
    """A passing CPU line listed all 25 op types of the model, which say nothing for a CPU target."""
    from epbuild.steps.validate import placed

    assert placed({"CPUExecutionProvider": [f"Op{i}" for i in range(25)]}) == \
        "25 op type(s), all on CPUExecutionProvider"
    assert placed({"QNNExecutionProvider": ["EPContext"], "CPUExecutionProvider": ["A", "B", "C", "D", "E", "F"]}) == \
        "EPContext on QNNExecutionProvider; A, B, C, D and 2 more on CPUExecutionProvider"
