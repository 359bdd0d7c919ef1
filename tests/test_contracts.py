"""The contracts that cross a process or a run (`epbuild.contracts`): artifact.json read and written through one
record, byte for byte; a record of another format refused with one line; statuses written as their words."""

from __future__ import annotations

import dataclasses
import json

import pytest

from epbuild.contracts.artifact import OMIT, ArtifactFormatError, ArtifactRecord, read_artifact
from epbuild.contracts.statuses import TaskStatus, Verdict
from epbuild.errors import UserError
from epbuild.files.layout import write_json
from epbuild.version import RULES_FORMAT

SINGLE = {"format": RULES_FORMAT, "ep": "QNNExecutionProvider", "ep_source": "pypi", "device": "npu",
          "compiler": "ort", "files": ["artifact.json", "m.onnx", "m_qnn.bin"], "runtime_options": {},
          "versions": {"onnxruntime": "1.32.0"}, "model": "m", "embed": False, "model_file": "m.onnx",
          "inputs": {}, "ep_sdk_version": None, "nodes": {"source": 3, "ep_context": 1, "cpu": 0, "in_ep": 3},
          "target": "qnn-htp"}
GROUP = {"format": RULES_FORMAT, "ep": "QNNExecutionProvider", "ep_source": "pypi", "device": "npu",
         "compiler": "ort", "files": ["a.onnx", "artifact.json", "b.onnx", "a_qnn.bin"], "runtime_options": {},
         "versions": {}, "group": "g", "embed": False, "order": ["a", "b"],
         "members": {"a": {"model_file": "a.onnx", "binaries": ["a_qnn.bin"], "nodes": {"source": 1},
                           "ep_sdk_version": "2.40", "graphs": ["a"], "inputs": {}, "compatibility": "x"},
                     "b": {"model_file": "b.onnx", "binaries": ["a_qnn.bin"], "nodes": {"source": 1},
                           "ep_sdk_version": "2.40", "graphs": [], "inputs": {}}},
         "loading": {"order": ["a", "b"], "session_options": {"ep.share_ep_contexts": "1"}}}
QPC = {"format": RULES_FORMAT, "model": "m", "compiler": "qaic", "device": "npu", "files": ["artifact.json"],
       "toolchain": {"name": "qaic", "version": "1.20"}, "nodes": {"source": 3}, "inputs": {"x": [1, 3]}}


@pytest.mark.parametrize("data", [SINGLE, GROUP, QPC], ids=["single", "group", "qpc"])
def test_an_artifact_record_reads_and_writes_the_same_bytes(tmp_path, data):
    write_json(tmp_path / "artifact.json", data)
    before = (tmp_path / "artifact.json").read_bytes()
    record = read_artifact(tmp_path)
    write_json(tmp_path / "artifact.json", record.to_json())
    assert (tmp_path / "artifact.json").read_bytes() == before
    assert record.has("ep") == (data is not QPC) and record.graphs is OMIT
    if data is SINGLE:
        assert record.ep_sdk_version is None  # a null is kept, not dropped


def test_a_record_of_another_format_or_with_unknown_keys_is_refused(tmp_path):
    with pytest.raises(ArtifactFormatError, match="rebuild the artifact"):
        ArtifactRecord.from_json({**SINGLE, "format": RULES_FORMAT + 1})
    with pytest.raises(ArtifactFormatError, match=r"unknown key.*shiny"):
        ArtifactRecord.from_json({**SINGLE, "shiny": 1})
    from epbuild.runtime.session import artifact_record

    write_json(tmp_path / "artifact.json", {**SINGLE, "format": 0})
    with pytest.raises(UserError, match="not an artifact record this epbuild reads: format 0"):
        artifact_record(tmp_path)
    write_json(tmp_path / "artifact.json", QPC)
    with pytest.raises(UserError, match="a qaic artifact is not loaded by ONNX Runtime"):
        artifact_record(tmp_path)


def test_statuses_are_written_as_their_words():
    assert json.dumps({"status": Verdict.INCONCLUSIVE, "task": TaskStatus.NOT_BUILT}) == \
        '{"status": "inconclusive", "task": "not built"}'
    assert Verdict.PASSED == "passed" and f"{TaskStatus.UP_TO_DATE}" == "up-to-date"


def test_every_validation_json_a_build_writes_reads_back_to_the_same_object(project):
    """validation.json goes out through `ValidationRecord.to_json` and in through `read_validation`: for every verdict
    a real build writes (a model's, a fleet's per-SoC one, a group's), the record reads back exactly what was
    written, and its status is a Verdict."""
    from epbuild.contracts.validation import read_validation
    from helpers import TWO_MODELS_CPU_QNN

    project.manifest(TWO_MODELS_CPU_QNN + '\n[groups.pair]\ntarget = "qnn-htp"\nmodels = ["tinycnn", "encoder"]\n')
    project.doit("-n", "2", check=False)
    found = list(project.artifacts.glob("**/validation.json"))
    assert len(found) >= 5
    for path in found:
        record = read_validation(path.parent)
        assert isinstance(record.status, Verdict)
        assert record.to_json() == json.loads(path.read_text()), path


@pytest.mark.parametrize("data, why", [
    ({"status": "ok"}, "status 'ok' is none of passed, failed"),
    ({"status": "reference"}, "status 'reference'"),  # a reference phase's answer is never a verdict
    ({}, "status None"),
    ({"status": "passed", "format": RULES_FORMAT + 1}, f"format {RULES_FORMAT + 1}"),
    ({"status": "skipped", "structural": "fine"}, "structural 'fine'"),
    ([1, 2], "not a JSON object"),
])
def test_a_validation_json_without_a_verdict_it_knows_is_refused_never_passed(tmp_path, data, why):
    from epbuild.contracts.validation import ValidationFormatError, read_validation

    (tmp_path / "validation.json").write_text(json.dumps(data))
    with pytest.raises(ValidationFormatError, match=why):
        read_validation(tmp_path)


def test_only_a_run_that_met_its_thresholds_is_passed():
    from epbuild.contracts.validation import ValidationRecord

    assert ValidationRecord(Verdict.PASSED).passed
    assert not any(ValidationRecord(v).passed for v in Verdict if v is not Verdict.PASSED)
    made = ValidationRecord(Verdict.FAILED, reason="snr", thresholds={"min_snr_db": 30.0}, figures={"outputs": {}})
    assert made.to_json() == {"status": "failed", "format": RULES_FORMAT, "reason": "snr",
                              "thresholds": {"min_snr_db": 30.0}, "outputs": {}}
    assert made.replace(target="t").to_json()["target"] == "t"


def test_a_compile_job_and_its_answer_travel_as_versioned_records_and_nothing_else_is_read():
    """The compile job and answer are frozen records (`contracts.jobs`): written as JSON with their format, read
    back equal; what `execute.child` adds on the way is not theirs; another format, an unknown key or a missing one
    is refused (a worker of another epbuild answers an internal error, never a half-understood compile)."""
    import dataclasses

    from epbuild.contracts.jobs import (
        JOB_FORMAT,
        CompileAnswer,
        CompiledMember,
        CompileJob,
        CompileMember,
        JobFormatError,
    )

    job = CompileJob((CompileMember("/p/m.onnx", "/s/m.onnx", None, {"x": [1, 3]}, "models.m", None),), "models.toml",
                     False, "qnn", "npu", "ort", False, {"soc_model": "60"}, None)
    sent = json.loads(json.dumps({**job.to_json(), "provenance": {"code": "c"}}))
    assert sent["format"] == JOB_FORMAT and CompileJob.from_json(sent) == job
    assert job.to_json() == {k: v for k, v in sent.items() if k != "provenance"}  # JSON's types, in this process too
    assert CompileJob.from_json(job.to_json()) == job
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.ep = "cpu"  # type: ignore[misc]
    answer = CompileAnswer((CompiledMember({"offload": 1.0}, "2.40", ["m_qnn.bin"]),))
    back = CompileAnswer.from_json(json.loads(json.dumps({**answer.to_json(), "usage": {"seconds": 1.0}})))
    assert back == answer and back.members[0].graphs == [] and back.members[0].pruned is None
    for bad in ({**sent, "format": JOB_FORMAT + 1}, {k: v for k, v in sent.items() if k != "format"},
                {**sent, "extra": 1}, {k: v for k, v in sent.items() if k != "ep"},
                {**sent, "members": [{**sent["members"][0], "shape": [1]}]}, {**sent, "members": {}}, [sent]):
        with pytest.raises(JobFormatError):
            CompileJob.from_json(bad)


def test_every_other_job_kind_travels_as_a_record_with_its_tuples_and_paths_read_back():
    """The stage, model-reading and reduce-probe jobs and answers (`contracts.jobs`) are records as the compile's
    are: JSON across the pipe, read back equal (a tuple a tuple, a path a path again), refused when of another
    format or with keys they do not declare."""
    from pathlib import Path

    from epbuild.contracts.jobs import (
        DepartureProbe,
        JobFormatError,
        ModelReadJob,
        ModelsRead,
        ProbeAnswer,
        StageAnswer,
        StageJob,
        TensorsProbe,
    )

    stage = StageJob(kind="quantize", task="quantize:m", source=Path("/p/m.onnx"), output=Path("/s/m.onnx"),
                     settings={"per_channel": True}, data_file=None, graph_only=False, weights_folder=None,
                     flavour="qnn", calibration=("/p/a.npz", "/p/b.npz"), manifest="models.toml", entry="models.m")
    made = [stage, dataclasses.replace(stage, weights_folder=Path("/w"), graph_only=True),
            StageAnswer(("x",), {"from_opset": 11}), StageAnswer(), ModelReadJob(("/p/m.onnx",)),
            ModelsRead({"/p/m.onnx": {"locations": []}, "/p/n.onnx": {"error": "cut short"}}),
            TensorsProbe(model="/p/m.onnx", weights=None, names=("a", "b"), inputs={"x": [1, 3]}, inputs_file=None,
                         frozen={}, out="/r/tensors.npz"),
            DepartureProbe(model="/r/0/m.onnx", tensors="/r/tensors.npz", ep="qnn", device="npu", options={},
                           thresholds={"min_snr_db": 30.0}),
            ProbeAnswer(saved=3), ProbeAnswer(departs=True, snr_db=12.5)]
    for record in made:
        sent = json.loads(json.dumps({**record.to_json(), "usage": {"seconds": 0.1}}))
        back = type(record).from_json(sent)
        assert back == record, type(record).__name__
        assert all(type(getattr(back, f.name)) is type(getattr(record, f.name)) for f in dataclasses.fields(record))
        with pytest.raises(JobFormatError):
            type(record).from_json({**sent, "format": 1})
        with pytest.raises(JobFormatError):
            type(record).from_json({**sent, "unknown": 1})
    assert StageJob.from_json(stage.to_json()).weights and not made[1].weights


def test_a_validation_job_reads_back_equal_members_and_pipeline_included(project):
    """A built artifact's validation job (`steps.validate.validation_request`) travels as JSON and reads back the
    same record, its members and a pipeline's members alone as `ValidationMember`s; an unknown key in a member, or a
    pipeline without its members alone, is refused."""
    import dataclasses

    from epbuild.contracts.jobs import JobFormatError, ValidationJob, ValidationMember
    from epbuild.steps.validate import validation_request
    from epbuild.tasks.loading import load_project

    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\ntargets = ["cpu"]\n\n[targets.cpu]\nep = "cpu"\n')
    assert project.doit("compile:tinycnn@cpu").returncode == 0
    loaded = load_project(project.root / "models.toml", ["list"])
    (build,) = loaded.builds
    job = validation_request(build, build.out_dir(loaded.layout))
    sent = json.loads(json.dumps(job.to_json()))
    back = ValidationJob.from_json(sent)
    assert back == job and type(back.members["tinycnn"]) is ValidationMember
    alone = dataclasses.replace(job, pipeline={"tokens": 2, "alone": {"tinycnn": job.members["tinycnn"], "x": None}})
    again = ValidationJob.from_json(json.loads(json.dumps(alone.to_json())))
    assert again == alone and type(again.pipeline["alone"]["tinycnn"]) is ValidationMember
    member = sent["members"]["tinycnn"]
    for bad in ({**sent, "members": {"tinycnn": {**member, "status": "passed"}}}, {**sent, "pipeline": {"tokens": 2}},
                {**sent, "members": [member]}):
        with pytest.raises(JobFormatError):
            ValidationJob.from_json(bad)
