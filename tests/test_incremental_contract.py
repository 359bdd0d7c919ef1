"""The incrementality contract: for each kind of change, exactly these tasks execute, on the no-op fast path and
on the full path (`EPBUILD_FAST_PATH=0`), and what a change rebuilds equals a clean build's bytes.

One project is built once; each row applies its change, runs `doit`, compares the executed tasks with the row's,
then undoes the change and runs again so the next row starts from the steady state. Package versions are covered
by switching onnx to another version for the same interpreter (`--target` folder in front of the path) and by
`test_provenance.py` (the fork server's key, each job's own check of what its process loaded).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from test_trust import external_data_model, rewrite_keeping_size_and_mtime

from conftest import SOURCE, Project, clone, ran
from helpers import perturb_weights, tree_bytes
from real_models import sample_rate_branches

MANIFEST = """
[models.tinycnn]
path = "models/tinycnn.onnx"
quantize = { calibration = "models/calib/tinycnn/" }
targets = ["cpu", "cpu-int8", "qnn-htp"]
validation = { min_snr_db = 40, inputs = "models/tinycnn_inputs.npz" }

[models.ext]
path = "models/ext.onnx"
targets = ["cpu"]

[models.dyn]
path = "models/dynbatch.onnx"
inputs = { x = [1, 3, 32, 32] }
targets = ["cpu", "ov"]
validation = { dataset = "models/dyn_samples.npz", metric = "task_metrics:agreement", min_relative = 0.9 }

[models.vad]
path = "models/vad.onnx"
freeze = { sr = 16000 }
targets = ["cpu"]

[targets.cpu]
ep = "cpu"

[targets.cpu-int8]
ep = "cpu"
quantized = true

[targets.qnn-htp]
ep = "qnn"
config = "configs/qnn.json"   # a WinMLBuildConfig: its compile.provider_options

[targets.ov]
ep = "openvino"
options = { load_config = "configs/openvino_f32.json" }
option_files = ["load_config"]
"""
QNN_TARGET = 'config = "configs/qnn.json"'  # the qnn-htp line that manifest edits put keys in front of
QNN_CONFIG = '{"compile": {"provider_options": {"backend_type": "htp", "soc_model": "60"}}}'
TINYCNN_VALIDATIONS = {"validate:tinycnn@cpu", "validate:tinycnn@cpu-int8", "validate:tinycnn@qnn-htp"}
QNN_COMPILE = {"compile:tinycnn@qnn-htp", "validate:tinycnn@qnn-htp"}
TINYCNN_CPU = {"compile:tinycnn@cpu", "validate:tinycnn@cpu"}
TINYCNN_INT8 = {"quantize:tinycnn[generic]", "compile:tinycnn@cpu-int8", "validate:tinycnn@cpu-int8"}
TINYCNN_QNN = {"compile:tinycnn@qnn-htp", "validate:tinycnn@qnn-htp"}  # static, nothing to fold: no stage
EXT = {"compile:ext@cpu", "validate:ext@cpu"}
DYN_OV = {"compile:dyn@ov", "validate:dyn@ov"}
DYN = {"compile:dyn@cpu", "validate:dyn@cpu", "shape:dyn"} | DYN_OV
VAD = {"freeze:vad", "compile:vad@cpu", "validate:vad@cpu"}
TINYCNN = TINYCNN_CPU | TINYCNN_INT8 | TINYCNN_QNN


def _manifest_edit(old: str, new: str) -> Callable[[Project], Callable[[], None]]:
    def change(project: Project) -> Callable[[], None]:
        project.manifest(MANIFEST.replace(old, new))
        return lambda: project.manifest(MANIFEST)
    return change


def _new_stage(old: str, new: str) -> Callable[[Project], Callable[[], None]]:
    """A stage added to a model; the undo prunes its output, else the next application finds it up to date."""
    def change(project: Project) -> Callable[[], None]:
        undo = _manifest_edit(old, new)(project)
        return lambda: (undo(), project.doit("prune"))
    return change


def _file_edit(relative: str, edit: Callable[[Path], None]) -> Callable[[Project], Callable[[], None]]:
    def change(project: Project) -> Callable[[], None]:
        path = project.root / relative
        saved = path.read_bytes()
        edit(path)
        return lambda: path.write_bytes(saved)
    return change


def _perturb_keeping_size_and_mtime(path: Path) -> None:
    """Retrained weights of the same shape, the file's mtime restored (`cp -p`, `rsync -t`)."""
    stat = path.stat()
    perturb_weights(path, 2)
    assert path.stat().st_size == stat.st_size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _inputs(path: Path, seed: int = 0) -> None:
    np.savez(path, x=np.random.default_rng(seed).standard_normal((1, 3, 64, 64)).astype(np.float32))


TASK_METRIC = """import numpy as np


def agreement(outputs, labels, reference):
    name = next(iter(outputs))
    return float(np.mean(outputs[name].reshape(len(outputs[name]), -1).argmax(1)
                         == reference[name].reshape(len(reference[name]), -1).argmax(1)))
"""


def _samples(path: Path, seed: int = 0) -> None:
    np.savez(path, x=np.random.default_rng(seed).standard_normal((6, 3, 32, 32)).astype(np.float32))


def _new_sample(project: Project) -> Callable[[], None]:
    folder = project.root / "models" / "calib" / "tinycnn"
    with np.load(folder / "0.npz") as sample:  # a wider range than the others: other quantization scales
        np.savez(folder / "9.npz", **{k: v * 4 + 1 for k, v in sample.items()})
    return lambda: (folder / "9.npz").unlink()


def _environment(project: Project) -> Callable[[], None]:
    project.env["EPBUILD_UNRELATED_SETTING"] = "1"
    return lambda: project.env.pop("EPBUILD_UNRELATED_SETTING")


def _touch(project: Project) -> Callable[[], None]:
    model = project.root / "models" / "tinycnn.onnx"
    model.write_bytes(model.read_bytes())  # a new mtime and ctime, the same bytes
    return lambda: None


def _epbuild_code(module: str) -> Callable[[Project], Callable[[], None]]:
    """An upgrade of epbuild: the package from another folder, one of its modules changed."""
    def change(project: Project) -> Callable[[], None]:
        copy = project.root.parent / "upgraded"
        if not copy.exists():
            shutil.copytree(SOURCE / "epbuild", copy / "epbuild", ignore=shutil.ignore_patterns("__pycache__"))
        path = copy / "epbuild" / module
        saved = path.read_bytes()
        path.write_bytes(saved + b"\n# a new release\n")
        previous = project.env["PYTHONPATH"]
        project.env["PYTHONPATH"] = str(copy)

        def undo() -> None:
            path.write_bytes(saved)
            project.env["PYTHONPATH"] = previous
        return undo
    return change


def _other_onnx(project: Project) -> Callable[[], None]:
    """onnx 1.23.1 in front of the installed one, for the same interpreter: every job's toolchain changes."""
    folder = project.root.parent / "onnx-1.23.1"
    if not folder.exists():
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(folder),
                               "onnx==1.23.1"], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            shutil.rmtree(folder, ignore_errors=True)
            pytest.skip(f"onnx 1.23.1 cannot be installed here: {done.stderr.strip()[-300:]}")
    previous = project.env["PYTHONPATH"]
    project.env["PYTHONPATH"] = f"{folder}{os.pathsep}{previous}"
    return lambda: project.env.update(PYTHONPATH=previous)


def _foreign_state(project: Project) -> Callable[[], None]:
    """`.state/` as an older epbuild's layout left it (another format; its no-op stamp keyed by other code, so never
    this code's shortcut): emptied before use (state.registry), every task checked in full, restored from the cache."""
    (project.artifacts / ".state" / "format").write_text("0\n")
    (project.artifacts / ".state" / "noop.record").unlink()
    return lambda: None


def _other_owner(project: Project) -> Callable[[], None]:
    """`.state/` stamped under another user's key (a checkout that committed it: state.owner): its records and doit's
    database vouch for nothing, so it is emptied with doit's database, and every task is checked in full, restored
    from the cache."""
    (project.artifacts / ".state" / "owner").write_text("0" * 64 + "\n")
    return lambda: None


def _edit_cache_entry(project: Project) -> Callable[[], None]:
    entry = next(path for path in (project.cache / "entries-v2").glob("*/ext.onnx"))
    saved = entry.read_bytes()
    rewrite_keeping_size_and_mtime(entry, offset=20)
    return lambda: entry.write_bytes(saved)


def _edit_artifact(project: Project) -> Callable[[], None]:
    artifact = project.artifacts / "cpu" / "ext" / "ext.onnx"
    rewrite_keeping_size_and_mtime(artifact, offset=20)
    return lambda: None  # the build itself restores it


CHANGES = {  # change -> the tasks that must execute
    "model bytes": (_file_edit("models/tinycnn.onnx", lambda p: perturb_weights(p, 1)), TINYCNN),
    "model bytes, size and mtime kept": (_file_edit("models/tinycnn.onnx", _perturb_keeping_size_and_mtime), TINYCNN),
    "external data, size and mtime kept": (_file_edit("models/ext.onnx.data",
                                                      lambda p: rewrite_keeping_size_and_mtime(p, 4000)), EXT),
    "a calibration sample added": (_new_sample, {"quantize:tinycnn[generic]", "compile:tinycnn@cpu-int8",
                                                 "validate:tinycnn@cpu-int8"}),
    "a provider option in the manifest": (_manifest_edit(QNN_TARGET, 'options = { soc_model = 69 }\n' + QNN_TARGET),
                                          QNN_COMPILE),
    "a WinMLBuildConfig file": (_file_edit("configs/qnn.json", lambda p: p.write_text(QNN_CONFIG.replace("60", "69"))),
                                QNN_COMPILE),
    "a validation threshold": (_manifest_edit("min_snr_db = 40", "min_snr_db = 30"), TINYCNN_VALIDATIONS),
    "the validation inputs file": (_file_edit("models/tinycnn_inputs.npz", lambda p: _inputs(p, seed=1)),
                                   TINYCNN_VALIDATIONS),
    "a validation time limit": (_manifest_edit("min_snr_db = 40", "min_snr_db = 40, timeout_s = 100"), set()),
    "localise on a passing validation": (_manifest_edit("min_snr_db = 40", "min_snr_db = 40, localise = true"), set()),
    "min_offload (a check of the recorded placement)": (
        _manifest_edit(QNN_TARGET, 'min_offload = 0.5\n' + QNN_TARGET), {"compile:tinycnn@qnn-htp"}),
    "an unrelated environment variable": (_environment, set()),
    "a model touched, bytes unchanged": (_touch, set()),
    "epbuild code the jobs run": (_epbuild_code("steps/graph.py"), TINYCNN | EXT | DYN | VAD),
    "another onnx version": (_other_onnx, TINYCNN | EXT | DYN | VAD),
    "epbuild code of the reports": (_epbuild_code("report/views.py"), set()),
    # the compile restores the folder; its validation report, replaced with it, is restored from the cache
    "a published artifact edited by hand": (_edit_artifact, EXT),
    "a cache entry edited by hand": (_edit_cache_entry, set()),  # read only on a restore, which verifies it
    # the settings record is gone with the folder: every task runs again, each restored from the cache
    "the state folder of another layout format": (_foreign_state, TINYCNN | EXT | DYN | VAD),
    "the state folder stamped by another user (a committed checkout's)": (_other_owner, TINYCNN | EXT | DYN | VAD),
    "embed on the NPU target": (_manifest_edit(QNN_TARGET, 'embed = true\n' + QNN_TARGET), QNN_COMPILE),
    "a quantization setting": (_manifest_edit('calibration = "models/calib/tinycnn/"',
                                              'calibration = "models/calib/tinycnn/", activation_type = "uint16"'),
                               TINYCNN_INT8),
    "the [build] table (jobs at once, memory budget: how, not what)": (
        _manifest_edit('[targets.cpu]\nep = "cpu"\n', '[build]\njobs = 2\nmemory_gb = 8\n[targets.cpu]\nep = "cpu"\n'),
        set()),
    "the cpu target's optimization level": (_manifest_edit('[targets.cpu]\nep = "cpu"\n',
                                                           '[targets.cpu]\nep = "cpu"\noptimization_level = "basic"\n'),
                                            TINYCNN_CPU | EXT | VAD - {"freeze:vad"}
                                            | {"compile:dyn@cpu", "validate:dyn@cpu"}),
    "an option file's bytes (OpenVINO's load_config)": (
        _file_edit("configs/openvino_f32.json",
                   lambda p: p.write_text('{"CPU": {"INFERENCE_PRECISION_HINT": "f32", "NUM_STREAMS": "1"}}')),
        DYN_OV),
    "a model's input shapes": (_manifest_edit("x = [1, 3, 32, 32]", "x = [2, 3, 32, 32]"), DYN),
    "the compiler of a target": (_manifest_edit(QNN_TARGET, 'compiler = "ort_session"\n' + QNN_TARGET), QNN_COMPILE),
    "a key set to its default value": (_manifest_edit(QNN_TARGET, 'device = "npu"\n' + QNN_TARGET), set()),
    "a compile time and memory limit": (_manifest_edit(QNN_TARGET, 'timeout_s = 900\nmax_memory_gb = 8\n' + QNN_TARGET),
                                        set()),
    "an optimize stage": (_new_stage('path = "models/ext.onnx"', 'path = "models/ext.onnx"\noptimize = "basic"'),
                          EXT | {"optimize:ext"}),
    # tinycnn is static with nothing to fold: it gets no fold stage, so turning folding off changes nothing
    "no folding where nothing folds": (_new_stage('path = "models/tinycnn.onnx"',
                                                  'path = "models/tinycnn.onnx"\noptimize = "none"'), set()),
    "a squash stage": (_new_stage('path = "models/ext.onnx"', 'path = "models/ext.onnx"\nsquash = true'),
                       EXT | {"squash:ext"}),
    "structural validation on one target": (
        _manifest_edit('quantized = true\n', 'quantized = true\nvalidate = "structural"\n'),
        {"validate:tinycnn@cpu-int8"}),
    "a frozen input's value": (_manifest_edit("sr = 16000", "sr = 8000"), VAD),
    "a model's target list reordered": (_manifest_edit('targets = ["cpu", "cpu-int8", "qnn-htp"]',
                                                       'targets = ["qnn-htp", "cpu", "cpu-int8"]'), set()),
    "a task metric's dataset file": (_file_edit("models/dyn_samples.npz", lambda p: _samples(p, seed=1)),
                                     {"validate:dyn@cpu", "validate:dyn@ov"}),
    "a task metric's gate": (_manifest_edit("min_relative = 0.9", "min_relative = 0.95"),
                             {"validate:dyn@cpu", "validate:dyn@ov"}),
    "a task metric's module:function file edited": (
        _file_edit("task_metrics.py", lambda p: p.write_text(TASK_METRIC + "# tuned\n")),
        {"validate:dyn@cpu", "validate:dyn@ov"}),
}


@pytest.fixture(scope="module")
def steady(tmp_path_factory, host_cache) -> Project:
    root = tmp_path_factory.mktemp("contract") / "proj"
    root.mkdir()
    project = Project(root, host_cache)
    project.env.pop("EPBUILD_FAST_PATH", None)
    external_data_model(root / "models" / "ext.onnx")
    sample_rate_branches(root / "models" / "vad.onnx")
    _inputs(root / "models" / "tinycnn_inputs.npz")
    _samples(root / "models" / "dyn_samples.npz")
    (root / "task_metrics.py").write_text(TASK_METRIC)
    (root / "configs" / "qnn.json").write_text(QNN_CONFIG)
    project.manifest(MANIFEST)
    project.doit()
    return project


# file edits only: the project key holds, so on the fast path the last run's record decides which tasks doit is
# handed (tasks.selection), and what executes must still be exactly the row's set
RECORD_ROWS = {"model bytes", "model bytes, size and mtime kept", "external data, size and mtime kept",
               "a calibration sample added", "a WinMLBuildConfig file", "the validation inputs file",
               "a model touched, bytes unchanged", "a published artifact edited by hand",
               "an option file's bytes (OpenVINO's load_config)", "a task metric's dataset file",
               "a task metric's module:function file edited"}
HANDED = "unchanged since the last run's record"


def _run(project: Project, fast: str) -> tuple[set[str], str]:
    project.env["EPBUILD_FAST_PATH"] = fast
    done = project.doit()
    return ran(done) - {"unavailable"}, done.stdout


def _executed(project: Project, fast: str) -> set[str]:
    return _run(project, fast)[0]


@pytest.mark.parametrize("fast", ["1", "0"])
@pytest.mark.parametrize("change", list(CHANGES))
def test_each_change_executes_exactly_its_tasks(steady, change, fast):
    project = steady
    _executed(project, "1")
    assert _executed(project, "1") == set()  # steady: the full no-op above wrote the stamp; this run took it
    apply, expected = CHANGES[change]
    undo = apply(project)
    try:
        executed, output = _run(project, fast)
        assert executed == expected, output[-4000:]
        assert (HANDED in output) == (fast == "1" and change in RECORD_ROWS), output[-600:]
        assert _executed(project, fast) == set()  # and only once
    finally:
        undo()
        _executed(project, "0")


def _same_inputs(project: Project, other: Project) -> None:
    for folder in ("models", "configs"):
        shutil.rmtree(other.root / folder)
        shutil.copytree(project.root / folder, other.root / folder)
    shutil.copy(project.root / "task_metrics.py", other.root / "task_metrics.py")


@pytest.mark.parametrize("change", ["model bytes", "a calibration sample added", "a WinMLBuildConfig file"])
def test_what_a_change_rebuilds_equals_a_clean_build(steady, tmp_path, host_cache, change):
    project = steady
    apply, _ = CHANGES[change]
    undo = apply(project)
    try:
        project.doit()
        fresh = clone(tmp_path, host_cache, "clean", (project.root / "models.toml").read_text())
        _same_inputs(project, fresh)
        fresh.doit()
        assert tree_bytes(fresh.artifacts) == tree_bytes(project.artifacts)
    finally:
        undo()
        project.doit()


def test_a_second_clone_sharing_the_cache_restores_everything_and_equals_the_first(steady, tmp_path, host_cache):
    project = steady
    second = clone(tmp_path, host_cache, "second", MANIFEST,
                   EPBUILD_CACHE_DIR=str(project.cache))
    _same_inputs(project, second)
    done = second.doit()
    assert "compiled " not in done.stdout and "restored compile:tinycnn@qnn-htp" in done.stdout
    assert tree_bytes(second.artifacts) == tree_bytes(project.artifacts)
