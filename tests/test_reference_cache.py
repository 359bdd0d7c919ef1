"""The CPU reference of a validation, computed once per (model, inputs) and kept in the cache: targets that
validate the same model share it, a validation after a settings change restores it, and every file it reads is
part of its key (a `validation.reference`'s external data too)."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import onnx
from test_trust import external_data_model

from conftest import build_report, ran
from epbuild.steps.validation.reference import NO_TIME, REFERENCE_FILE, load_reference, save_reference
from helpers import TINYCNN_CPU_QNN, perturb_weights

TWO_TARGETS = TINYCNN_CPU_QNN


def _references(project) -> dict[str, str]:
    return {name: entry["cpu_reference"]["from"] for name, entry in build_report(project).items()
            if "cpu_reference" in entry}


def _outputs(project, target: str) -> dict:
    return json.loads((project.artifacts / target / "tinycnn" / "validation.json").read_text())["outputs"]


def test_targets_validating_one_model_share_its_cpu_reference(project):
    """tinycnn is static and has no constant nodes: the cpu and qnn-htp compiles both read it as declared, so
    their validations compare with one reference. The second restores it; a threshold change re-runs the
    validation on the same artifact with the reference restored; an edited model gets a new one."""
    project.manifest(TWO_TARGETS)
    done = project.doit("-v", "2")
    assert ran(done, "validate:") == {"validate:tinycnn@cpu", "validate:tinycnn@qnn-htp"}
    assert sorted(_references(project).values()) == ["cache", "computed"], _references(project)
    assert "(CPU reference from the cache)" in done.stdout
    entries = build_report(project).values()
    assert len({entry["cpu_reference"]["fingerprint"] for entry in entries if "cpu_reference" in entry}) == 1
    first = _outputs(project, "qnn-htp")

    project.manifest(TWO_TARGETS + "validation = { min_snr_db = 30 }\n")  # the qnn-htp table is the last
    done = project.doit("-v", "2")
    assert ran(done) == {"validate:tinycnn@qnn-htp"}
    assert _references(project)["validate:tinycnn@qnn-htp"] == "cache"
    assert _outputs(project, "qnn-htp") == first  # the restored reference: the same comparison, number for number

    perturb_weights(project.root / "models" / "tinycnn.onnx", seed=3)
    done = project.doit("-v", "2")
    assert ran(done, "validate:") == {"validate:tinycnn@cpu", "validate:tinycnn@qnn-htp"}
    assert sorted(_references(project).values()) == ["cache", "computed"]
    assert _outputs(project, "qnn-htp") != first


def test_a_validation_reference_with_external_data_is_tracked_to_its_weights(project):
    """The reference's weights file is an input of the validation and of its reference's key: new weights there
    re-run the validation against a reference computed again (it fails: the artifact has the old weights). A
    reference onnx cannot read is refused when the manifest is loaded, naming its key."""
    models = project.root / "models"
    reference = external_data_model(models / "ref.onnx", seed=0)
    onnx.save(onnx.load(str(reference)), str(models / "mm.onnx"))  # the same weights, inside the model
    project.manifest('[models.mm]\npath = "models/mm.onnx"\nvalidation = { reference = "models/ref.onnx" }\n'
                     '[targets.cpu]\nep = "cpu"\n')
    project.doit()
    assert _references(project) == {"validate:mm@cpu": "computed"}
    assert project.doit("-v", "2").stdout.count(".  ") == 0

    external_data_model(models / "ref.onnx", seed=1)  # the same graph file, new weights beside it
    done = project.doit("-v", "2", check=False)
    assert done.returncode != 0 and ran(done) == {"validate:mm@cpu"}
    assert "failed validate:mm@cpu: " in done.stdout + done.stderr

    (models / "ref.onnx").write_bytes(b"not onnx")
    done = project.doit("list", check=False)
    assert done.returncode != 0 and "models.mm.validation.reference: ref.onnx: not a readable ONNX model" in (
        done.stderr), done.stderr
    assert "Traceback" not in done.stderr


def test_a_saved_reference_holds_the_arrays_and_no_timestamp(tmp_path):
    run = {"feeds": {"x": np.arange(6, dtype=np.float32).reshape(2, 3)},
           "expected": {"/model/out": np.ones(3, np.float16)}, "floats": {}, "generated": {"ids": "uniform"},
           "notes": ["a note"]}
    save_reference(run, tmp_path / "a")
    with zipfile.ZipFile(tmp_path / "a" / REFERENCE_FILE) as archive:
        assert {info.date_time for info in archive.infolist()} == {NO_TIME}
    loaded = load_reference(tmp_path / "a")
    assert loaded["generated"] == run["generated"] and loaded["notes"] == run["notes"]
    assert np.array_equal(loaded["feeds"]["x"], run["feeds"]["x"])
    assert loaded["expected"]["/model/out"].dtype == np.float16
