"""Faults that used to end in a traceback, a wrong blame or a malformed report, each now one line that names the
file and the fix: a corrupt doit database, a model deleted or unreadable mid-build, a model renamed over while
its compile runs, calibration and validation arrays numpy cannot read or of the wrong kind, and junit.xml with an
output name XML forbids."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from xml.etree import ElementTree

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import build_report
from helpers import slow_model

CPU = '[targets.cpu]\nep = "cpu"\n'
QUANTIZED = """
[models.tinycnn]
path = "models/tinycnn.onnx"
quantize = { calibration = "models/calib/tinycnn/" }
targets = ["cpu-int8"]

[targets.cpu-int8]
ep = "cpu"
quantized = true
"""


def test_a_corrupt_doit_database_is_set_aside_with_one_warning(project):
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\ntargets = ["cpu"]\n' + CPU)
    project.doit()
    (project.root / ".doit.db.epbuild").write_bytes(b"this is no database" * 100)
    done = project.doit()
    assert "Traceback" not in done.stderr
    warnings = [line for line in done.stderr.splitlines() if "doit's database" in line]
    assert len(warnings) == 1 and "set aside as .doit.db.epbuild.corrupt" in warnings[0], done.stderr
    assert (project.root / ".doit.db.epbuild.corrupt").read_bytes().startswith(b"this is no database")
    assert {entry["status"] for entry in build_report(project).values()} <= {"up to date", "restored"}
    again = project.doit()
    assert "doit's database" not in again.stderr


def test_a_file_the_checker_cannot_read_makes_its_task_run(tmp_path, monkeypatch):
    """As a user without root: a model made unreadable. doit's file checker says "changed" (its task then runs
    and fails with one line naming the file) instead of raising PermissionError inside doit."""
    from epbuild.state.hash_memory import FileHashes
    from epbuild.tasks.checker import HashChecker

    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    checker = HashChecker(FileHashes(tmp_path / "state"), {str(model): [0, 0, 0, 0, "0" * 64]})

    def unreadable(*_args, **_kwargs):
        raise PermissionError(13, "Permission denied", str(model))

    monkeypatch.setattr(checker.hashes, "sha256", unreadable)
    assert checker.check_modified(str(model), os.stat(model), [1, 2, 3, 4, "0" * 64]) is True
    assert checker.exists(str(model)) is False and str(model) in checker.edited


def _compiled_for_validation(project, monkeypatch):
    """tinycnn compiled for cpu, and the project loaded in this process as `doit validate:tinycnn@cpu` loads it."""
    from epbuild.tasks.loading import load_project

    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\ntargets = ["cpu"]\n' + CPU)
    project.doit("compile:tinycnn@cpu")
    monkeypatch.chdir(project.root)
    monkeypatch.setenv("EPBUILD_CACHE_DIR", str(project.cache))
    loaded = load_project(project.root / "models.toml", ["validate:tinycnn@cpu"])
    return loaded, next(b for b in loaded.builds if b.name == "tinycnn@cpu")


def test_a_model_deleted_before_its_validation_is_a_line_of_that_task(project, monkeypatch):
    from doit.exceptions import TaskFailed

    from epbuild.steps.fingerprint import validate_config
    from epbuild.tasks.actions import run_validate

    loaded, build = _compiled_for_validation(project, monkeypatch)
    (project.root / "models" / "tinycnn.onnx").unlink()  # mid-build: after the tasks were made
    failed = run_validate(build, loaded.workspace, validate_config(build, loaded.root, loaded.workspace.provenance))
    assert isinstance(failed, TaskFailed)
    assert "validate:tinycnn@cpu: No such file or directory" in failed.message and "tinycnn.onnx" in failed.message


def test_a_verdict_removed_by_a_concurrent_builder_is_not_a_traceback(project, monkeypatch):
    """Two builds of one project validating the same task: the second removes the verdict before it waits for the
    fingerprint's lock, so the first may find its validation.json gone right after writing it. It used to crash
    (FileNotFoundError in its published-files record, found by `test_concurrent_doit_processes_...`); now its task
    passes and records no identity, so the next run checks the file afresh."""
    import epbuild.steps.validate as validating
    from epbuild.contracts.task_result import PUBLISHED
    from epbuild.steps.fingerprint import validate_config
    from epbuild.tasks.actions import run_validate

    loaded, build = _compiled_for_validation(project, monkeypatch)
    write_json = validating.write_json

    def written_then_removed(path, data, *args):
        write_json(path, data, *args)
        if path.name == validating.REPORT and path.parent == build.out_dir(loaded.layout):
            path.unlink()  # what the other builder does

    monkeypatch.setattr(validating, "write_json", written_then_removed)
    done = run_validate(build, loaded.workspace, validate_config(build, loaded.root, loaded.workspace.provenance))
    assert isinstance(done, dict) and done["status"] == "validated" and done[PUBLISHED] == {}


def test_a_model_renamed_over_while_its_compile_runs_fails_that_compile(project):
    """The compile reads its stages' output, not the model: the model's new bytes would have been compared with
    an artifact of the old ones (cosine -0.01, blamed on the EP). The compile says the model changed instead."""
    slow_model(project.root / "models" / "slow.onnx", nodes=8000)
    replacement = onnx.load(str(project.root / "models" / "slow.onnx"))
    replacement.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(np.full((1, 4), -0.5, np.float32),
                                                                           "one"))
    onnx.save(replacement, str(project.root / "new.onnx"))
    project.manifest('[models.slow]\npath = "models/slow.onnx"\ntargets = ["qnn-htp"]\n'
                     '[targets.qnn-htp]\nep = "qnn"\noptions = { soc_model = 60 }\n')
    build = subprocess.Popen([sys.executable, "-m", "doit"], cwd=project.root, env=project.env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in build.stdout:
        lines.append(line)
        if line.startswith(".  compile:slow@qnn-htp"):
            time.sleep(0.5)  # its inputs' identities taken, its child compiling
            os.replace(project.root / "new.onnx", project.root / "models" / "slow.onnx")
            break
    lines.extend(build.stdout)
    assert build.wait(timeout=600) != 0
    output = "".join(lines)
    assert "compile:slow@qnn-htp: slow.onnx changed while compile:slow@qnn-htp ran; run again" in output, output
    assert "validate:slow@qnn-htp" not in output.replace("not built validate:slow@qnn-htp", "")


def _calibration(project, array: np.ndarray | bytes) -> subprocess.CompletedProcess:
    project.manifest(QUANTIZED)
    sample = project.root / "models" / "calib" / "tinycnn" / "0.npz"
    if isinstance(array, bytes):
        sample.write_bytes(array)
    else:
        np.savez(sample, x=array)
    return project.doit(check=False)


@pytest.mark.parametrize("case, message", [
    ("corrupt", "calibration file 0.npz cannot be read as .npz (BadZipFile"),
    ("nan", "calibration file 0.npz: 'x' holds NaN or infinite values"),
    ("int64", "calibration file 0.npz: 'x' is int64, the model's input is float32: save it as float32"),
])
def test_calibration_data_numpy_cannot_read_or_that_cannot_calibrate_is_named(project, case, message):
    array = {"corrupt": b"PK\x03\x04 torn", "nan": np.full((1, 3, 64, 64), np.nan, np.float32),
             "int64": np.ones((1, 3, 64, 64), np.int64)}[case]
    done = _calibration(project, array)
    assert done.returncode != 0 and message in done.stdout, done.stdout
    assert "internal error" not in done.stdout and "Traceback" not in done.stdout + done.stderr


def test_validation_inputs_of_another_dtype_are_the_files_fault_not_the_references(project):
    np.savez(project.root / "models" / "in64.npz", x=np.zeros((1, 3, 64, 64), np.float64))
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\ntargets = ["cpu"]\n'
                     'validation = { inputs = "models/in64.npz" }\n' + CPU)
    done = project.doit(check=False)
    assert ("validation.inputs in64.npz: 'x' is float64, the model's input is tensor(float): save it as float32"
            in done.stdout), done.stdout


def test_junit_xml_stays_well_formed_with_an_output_name_xml_forbids(project):
    """An output named with a vertical tab, its validation failing: the CI's parser reads every result."""
    name = "out\x0bput"
    graph = helper.make_graph([helper.make_node("Sin", ["x"], [name])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 64])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(project.root / "models" / "ctl.onnx"))
    project.manifest('[models.ctl]\npath = "models/ctl.onnx"\ntargets = ["qnn-htp"]\n'
                     'validation = { min_snr_db = 500 }\n'
                     '[targets.qnn-htp]\nep = "qnn"\noptions = { soc_model = 60 }\n')
    done = project.doit(check=False)
    assert "failed validate:ctl@qnn-htp" in done.stdout, done.stdout
    suite = ElementTree.parse(project.artifacts / "junit.xml").getroot()
    failure = suite.find("testcase/failure")
    assert suite.get("failures") == "1" and failure is not None and "out\\x0bput" in (failure.text or "")


def test_xml_text_escapes_exactly_what_xml_forbids():
    from epbuild.report.views import xml_text

    assert xml_text("a\x0bb\x00c\td\ne\rf\ud800") == "a\\x0bb\\x00c\td\ne\rf\\ud800"
    ElementTree.fromstring(f"<a>{xml_text(''.join(map(chr, range(32))))}</a>")


def test_external_data_cut_short_is_named_before_any_task(project):
    """A copy cut short: refused with the file and the bytes missing, as well on the run after a good one (the
    model's own bytes unchanged, its index entry remembered)."""
    from test_trust import external_data_model

    external_data_model(project.root / "models" / "ext.onnx")
    project.manifest('[models.ext]\npath = "models/ext.onnx"\ntargets = ["cpu"]\n' + CPU)
    project.doit("list")
    data = project.root / "models" / "ext.onnx.data"
    data.write_bytes(data.read_bytes()[:100_000])
    done = project.doit(check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert ("external data file 'ext.onnx.data' is cut short: its tensors reach byte 262,144, the file has 100,000"
            in done.stderr)


def test_an_option_file_that_is_a_fifo_is_named_as_such(project):
    os.mkfifo(project.root / "configs" / "pipe.json")
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\ntargets = ["ov"]\n[targets.ov]\n'
                     'ep = "openvino@pypi"\ndevice = "cpu"\noptions = { load_config = "configs/pipe.json" }\n'
                     'option_files = ["load_config"]\n')
    done = project.doit("list", check=False)
    assert done.returncode == 2 and "targets.ov.options.load_config: option file is not a regular file (a FIFO, " \
        "socket or device)" in done.stderr, done.stderr


@pytest.mark.parametrize(("name", "value", "said"), [
    ("EPBUILD_JOBS", "0", "error: EPBUILD_JOBS: '0': give how many jobs a build runs at once"),
    ("EPBUILD_JOBS", "-1", "error: EPBUILD_JOBS: '-1': give how many jobs a build runs at once"),
    ("EPBUILD_JOBS", "1e3", "error: EPBUILD_JOBS: '1e3': give how many jobs a build runs at once"),
    ("EPBUILD_JOBS", "²", "error: EPBUILD_JOBS: '²': give how many jobs a build runs at once"),  # a digit to isdigit
    ("EPBUILD_SHARD", "²/³", "error: EPBUILD_SHARD: must be I/N with 1 <= I <= N, such as 2/4, found '²/³'"),
])
@pytest.mark.parametrize("command", [["list"], [], ["-n", "2"]])
def test_a_bad_variable_is_one_line_naming_it(project, name, value, said, command):
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\n' + CPU)
    project.env[name] = value
    done = project.doit(*command, check=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(said), done.stderr


def test_a_fifo_where_a_file_is_read_is_one_line_never_a_wait(project, monkeypatch, tmp_path):
    """A FIFO named like a sample in a dataset or calibration folder, a FIFO as a WinML config, the memory ledger
    as a FIFO: a reader that opened it would wait forever (or fail seeking it). Each is one line naming the key
    or the variable, before anything opens it."""
    from epbuild.errors import UserError
    from epbuild.execute import memory_ledger
    from epbuild.manifest.parse import load
    from epbuild.manifest.task_metric import dataset_files

    data = project.root / "data"
    data.mkdir()
    np.savez(data / "a.npz", x=np.zeros((1, 3, 64, 64), np.float32))
    os.mkfifo(data / "b.npz")
    with pytest.raises(UserError, match=r"validation\.dataset: .*b\.npz is not a regular file \(a FIFO, socket or "
                                        r"device\): every \.npz of the folder must be a file"):
        dataset_files(project.root / "models.toml", "models.m.validation.dataset", data)
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\nquantize = { calibration = "data" }\n' + CPU)
    with pytest.raises(UserError, match=r"models\.tinycnn\.quantize\.calibration: calibration sample .*b\.npz is "
                                        r"not a regular file"):
        load(project.root / "models.toml")
    os.mkfifo(project.root / "build.json")
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\n[targets.ov]\nep = "openvino"\n'
                     'config = "build.json"\n')
    listing = project.doit("list", check=False)  # it waited for a writer forever
    assert listing.returncode == 2 and "targets.ov.config: WinMLBuildConfig file is not a regular file" in \
        listing.stderr and "Traceback" not in listing.stderr, listing.stderr
    os.mkfifo(tmp_path / "memory.json")
    with pytest.raises(UserError, match=r"the memory ledger .*memory\.json is not a regular file \(a FIFO"):
        memory_ledger._open(tmp_path / "memory.json")
