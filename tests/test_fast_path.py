"""The no-op stamp and the cached listing (epbuild.fast_path): taken only when nothing task creation or doit's
checks read has changed, and every change that matters takes the full path again."""

from __future__ import annotations

import os

import pytest

from conftest import ran
from epbuild.invocation import Invocation
from helpers import TWO_MODELS_CPU_QNN, perturb_weights

FAST = "no input, output or setting changed since the last full check"
MANIFEST = TWO_MODELS_CPU_QNN + """
[targets.aic100]
compiler = "qaic"
device = "npu"
"""


@pytest.mark.parametrize(("argv", "default"), [
    ([], True), (["-n", "2"], True), (["-n2", "-P", "thread", "--continue"], True), (["--process=2"], True),
    (["list"], False), (["-a"], False), (["compile:tinycnn@cpu"], False), (["--db-file", "x.db"], False),
    (["-n", "2", "validate"], False), (["--reporter", "json"], False)])
def test_only_a_plain_default_run_may_take_the_no_op_stamp(argv, default):
    assert Invocation.of(argv).default_run is default


@pytest.fixture
def steady(project, tmp_path):
    """A built project whose full no-op has written the stamp; the qaic target is unavailable (no SDK here)."""
    for name in ("GITHUB_STEP_SUMMARY", "QAIC_ROOT", "EPBUILD_FAST_PATH"):
        project.env.pop(name, None)
    project.env["QAIC_ROOT"] = str(tmp_path / "no-sdk")
    project.manifest(MANIFEST)
    project.doit()
    full = project.doit()
    assert FAST not in full.stdout and "-- compile:tinycnn@cpu" in full.stdout
    project.up_to_date = sum(line.startswith("-- ") for line in full.stdout.splitlines())  # each task checked
    return project


def no_op(project) -> str:
    done = project.doit()
    assert ran(done) <= {"unavailable"}, done.stdout  # the full path runs it to say what is skipped
    return done.stdout


def test_a_second_no_op_takes_the_stamp_and_changes_nothing(steady):
    project = steady
    report, database = project.artifacts / "build-report.json", project.root / ".doit.db.epbuild"
    before = (report.read_bytes(), database.stat().st_mtime_ns)
    fast = no_op(project)
    assert f"summary: 4 skipped, {project.up_to_date} up-to-date ({FAST} of " in fast
    assert "skipped compile:tinycnn@aic100: qaic-compile not found" in fast  # as the full no-op says it
    assert "-- " not in fast
    assert (report.read_bytes(), database.stat().st_mtime_ns) == before
    assert FAST in no_op(project)


def test_every_change_that_matters_takes_the_full_path(steady, tmp_path):
    project = steady
    perturb_weights(project.root / "models" / "encoder.onnx", seed=3)
    assert ran(project.doit(), "compile:") == {"compile:encoder@cpu", "compile:encoder@qnn-htp"}
    assert FAST not in no_op(project) and FAST in no_op(project)

    (project.artifacts / "qnn-htp" / "tinycnn" / "tinycnn_qnn.bin").unlink()  # an output
    assert ran(project.doit(), "compile:") == {"compile:tinycnn@qnn-htp"}
    no_op(project)

    project.manifest(MANIFEST.replace("soc_model = 60", "soc_model = 69"))  # a setting
    assert ran(project.doit(), "compile:") == {"compile:tinycnn@qnn-htp", "compile:encoder@qnn-htp"}
    no_op(project)

    project.doit("forget", "compile:tinycnn@cpu")  # doit's own state
    assert ran(project.doit(), "compile:") == {"compile:tinycnn@cpu"}
    no_op(project)

    (project.artifacts / ".state" / "configs.journaled").unlink()  # the settings record: every task runs again
    assert "compile:encoder@cpu" in ran(project.doit())
    no_op(project)

    project.env["EPBUILD_SHARD"] = "1/1"  # a variable task creation reads
    assert FAST not in no_op(project) and FAST in no_op(project)

    model = project.root / "models" / "tinycnn.onnx"  # touched, same bytes: checked by hash once
    os.utime(model, ns=(model.stat().st_atime_ns, model.stat().st_mtime_ns + 10**9))
    assert FAST not in no_op(project) and FAST in no_op(project)

    sdk = tmp_path / "no-sdk" / "exec"  # the SDK appears where discovery looks: the qaic target becomes buildable
    sdk.mkdir(parents=True)
    for tool in ("qaic-compile", "qaic-qpc"):
        (sdk / tool).write_text("#!/bin/sh\nexit 1\n")
        (sdk / tool).chmod(0o755)
    done = project.doit("--continue", check=False)
    assert "compile:tinycnn@aic100" in ran(done) or "ops:tinycnn@aic100" in ran(done)


def test_a_failed_or_working_run_writes_no_stamp_and_removes_the_last(steady):
    project = steady
    stamp = project.artifacts / ".state" / "noop.record"
    assert stamp.exists()
    perturb_weights(project.root / "models" / "tinycnn.onnx", seed=4)
    project.doit()
    assert not stamp.exists()  # it ran tasks: the next run checks everything, without reading a stale stamp
    project.manifest(MANIFEST.replace("soc_model = 60", 'soc_model = 60, qnn_context_priority = "bogus"'))
    assert project.doit(check=False).returncode != 0
    assert not stamp.exists()


def test_doit_list_from_the_cache_equals_the_full_listing(steady):
    project = steady
    project.env["EPBUILD_FAST_PATH"] = "0"
    full = project.doit("list").stdout
    project.env.pop("EPBUILD_FAST_PATH")
    project.doit("list")  # writes the listing
    assert (project.artifacts / ".state" / "listing.json").exists()
    assert project.doit("list").stdout == full
    assert "[unavailable here: qaic-compile not found" in full
    project.manifest(MANIFEST + '\n[models.dynbatch]\npath = "models/dynbatch.onnx"\ninputs = { x = [1, 3, 32, 32] }\n')
    assert "compile:dynbatch@cpu" in project.doit("list").stdout


def test_the_cached_listing_follows_a_model_re_exported_with_other_shapes(project):
    """The listing's key is the manifest's and epbuild's; which stages exist also depends on the model's shapes:
    a model re-exported with a static batch needs no `shape` stage, and the cached listing must not show one."""
    import onnx
    from onnx import TensorProto, helper

    def relu(batch: int | str) -> onnx.ModelProto:
        x, y = (helper.make_tensor_value_info(name, TensorProto.FLOAT, [batch, 4]) for name in ("x", "y"))
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        return model

    path = project.root / "models" / "m.onnx"
    onnx.save(relu("batch"), path)
    project.manifest('[models.m]\npath = "models/m.onnx"\ninputs = { x = [1, 4] }\n\n[targets.qnn-htp]\nep = "qnn"\n')
    project.doit("list")
    assert "shape:m " in project.doit("list").stdout  # the cached listing
    onnx.save(relu(1), path)
    listing = project.doit("list").stdout
    assert "shape:m " not in listing and "compile:m@qnn-htp" in listing
    project.env["EPBUILD_FAST_PATH"] = "0"
    assert project.doit("list").stdout == listing
