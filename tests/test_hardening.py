"""Hardening: a catalogue of bad inputs and faults. Each bad input exits non-zero with one clear message naming
the file and key or model, no traceback, nothing written outside artifacts/ and the cache, and the earlier good
artifacts untouched. Faults (killed or crashing children, a killed doit, a full disk, concurrent doit processes)
never leave a partial artifact under a final name."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

from conftest import Project, ran
from epbuild.store.cache import ENTRIES, RECORD
from helpers import model_with_location, setup_failing_checker, tree_bytes

GOOD = '[models.tinycnn]\npath = "models/tinycnn.onnx"\ntargets = ["cpu"]\n\n[targets.cpu]\nep = "cpu"\n'
QNN = '\n[targets.qnn]\nep = "qnn"\noptions = { soc_model = 60 }\n'


def setup_symlink_escape(root: Path) -> None:
    (root / "models" / "outside.data").symlink_to("/etc/hostname")
    model_with_location(root, "linked.onnx", "outside.data")


def extra_model(name: str, path: str) -> str:
    return f'\n[models.{name}]\npath = "{path}"\ntargets = ["cpu"]\n'


# (id, manifest, setup(root) or None, expected message part); every case runs `doit` on a project whose earlier
# good build must stay untouched.
CASES = [
    ("toml-syntax", GOOD + "[targets.x\n", None, "models.toml: TOML syntax error: "),
    ("toml-duplicate-key", GOOD + '[targets.cpu]\nep = "cpu"\n', None, "models.toml: TOML syntax error: "),
    ("unknown-top-key", GOOD + "[target.x]\n", None, "models.toml: target: unknown key (did you mean 'targets'?)"),
    ("unknown-model-key", GOOD.replace('targets = ["cpu"]', 'target = ["cpu"]'), None,
     "models.toml: models.tinycnn.target: unknown key (did you mean 'targets'?)"),
    ("unknown-target-key", GOOD + "optimisation_level = \"basic\"\n", None,
     "models.toml: targets.cpu.optimisation_level: unknown key (did you mean 'optimization_level'?)"),
    ("wrong-type", GOOD + QNN + "embed = 1\n", None, "models.toml: targets.qnn.embed: must be a boolean"),
    ("wrong-type-models", "models = 3\n", None, "models.toml: models: must be a table"),
    ("unknown-ep", GOOD + '[targets.x]\nep = "tensorrt"\n', None, "models.toml: targets.x.ep: unknown EP 'tensorrt'"),
    ("unknown-source", GOOD + '[targets.x]\nep = "qnn@conda"\n', None, "targets.x.ep: unknown EP source 'conda'"),
    ("bad-device", GOOD + '[targets.x]\nep = "qnn"\ndevice = "tpu"\n', None, "targets.x.device: 'tpu' is not valid"),
    ("device-not-for-ep", GOOD + '[targets.x]\nep = "dml"\ndevice = "cpu"\n', None,
     "targets.x.device: DmlExecutionProvider does not build for 'cpu'"),
    ("unknown-compiler", GOOD + '[targets.x]\nep = "qnn"\ncompiler = "tvm"\n', None,
     "targets.x.compiler: 'tvm' is not valid"),
    ("unknown-qnn-option", GOOD + '[targets.x]\nep = "qnn"\noptions = { htp_performance = "burst" }\n', None,
     "targets.x.options.htp_performance: unknown QNNExecutionProvider option (did you mean"),
    ("ignored-openvino-option", GOOD + '[targets.x]\nep = "openvino"\noptions = { num_of_threads = 4 }\n', None,
     "targets.x.options.num_of_threads: the OpenVINO plugin EP ignores it"),
    ("option-table-value", GOOD + '[targets.x]\nep = "qnn"\noptions = { soc_model = { v = 60 } }\n', None,
     "targets.x.options.soc_model: must be a string, number or boolean"),
    ("option-file-key-absent", GOOD + '[targets.x]\nep = "openvino"\noption_files = ["load_config"]\n', None,
     "targets.x.option_files[0]: names option 'load_config', but options has no such key"),
    ("option-file-missing", GOOD + '[targets.x]\nep = "openvino"\noptions = { load_config = "configs/no.json" }\n'
     'option_files = ["load_config"]\n', None, "targets.x.options.load_config: option file not found"),
    ("load-config-without-option-files", GOOD + '[targets.x]\nep = "openvino"\n'
     'options = { load_config = "configs/openvino_f32.json" }\n', None,
     "targets.x.options.load_config: names a file ('configs/openvino_f32.json'), which OpenVINOExecutionProvider "
     "would parse as JSON text and reject at run time: add option_files = [\"load_config\"] so it is given the file"),
    ("option-file-folder", GOOD + '[targets.x]\nep = "openvino"\noptions = { load_config = "configs" }\n'
     'option_files = ["load_config"]\n', None, "targets.x.options.load_config: option file is a folder"),
    ("model-missing", GOOD + extra_model("gone", "models/gone.onnx"), None, "models.gone.path: model file not found"),
    ("model-path-absent", GOOD + '[models.nopath]\ntargets = ["cpu"]\n', None, "models.nopath.path: is required"),
    ("model-empty", GOOD + extra_model("empty", "models/empty.onnx"),
     lambda root: (root / "models" / "empty.onnx").write_bytes(b""),
     "models.empty.path: empty.onnx: the model file is empty"),
    ("model-truncated", GOOD + extra_model("cut", "models/cut.onnx"),
     lambda root: (root / "models" / "cut.onnx").write_bytes((root / "models" / "tinycnn.onnx").read_bytes()[:999]),
     "models.cut.path: cut.onnx: "),
    ("model-not-onnx", GOOD + extra_model("text", "models/text.onnx"),
     lambda root: (root / "models" / "text.onnx").write_text("this is not a model"), "models.text.path: text.onnx: "),
    ("model-fails-checker", GOOD + extra_model("broken", "models/broken.onnx"), setup_failing_checker,
     "models.broken.path: broken.onnx: fails onnx.checker:"),
    ("external-data-parent", GOOD + extra_model("escape", "models/escape.onnx"),
     lambda root: model_with_location(root, "escape.onnx", "../../etc/passwd"),
     "models.escape.path: escape.onnx: external data location '../../etc/passwd' escapes the model's folder"),
    ("external-data-absolute", GOOD + extra_model("absolute", "models/absolute.onnx"),
     lambda root: model_with_location(root, "absolute.onnx", "/etc/passwd"),
     "models.absolute.path: absolute.onnx: external data location '/etc/passwd' escapes the model's folder"),
    ("external-data-symlink", GOOD + extra_model("linked", "models/linked.onnx"), setup_symlink_escape,
     "models.linked.path: linked.onnx: external data location 'outside.data' resolves outside the model's folder"),
    ("external-data-missing", GOOD + extra_model("lost", "models/lost.onnx"),
     lambda root: model_with_location(root, "lost.onnx", "lost.data"),
     "models.lost.path: lost.onnx: external data file 'lost.data' not found"),
    ("target-name-escapes", GOOD + '[targets."../../etc"]\nep = "cpu"\n', None,
     "targets.../../etc: invalid name '../../etc'"),
    ("model-name-escapes", GOOD + '[models."/abs"]\npath = "models/tinycnn.onnx"\n', None,
     "models./abs: invalid name '/abs'"),
    ("model-name-reserved", GOOD + '[models.groups]\npath = "models/tinycnn.onnx"\n', None,
     "models.groups: 'groups' is reserved"),
    ("unknown-target-in-model", GOOD.replace('targets = ["cpu"]', 'targets = ["cpu", "gpu"]'), None,
     "models.tinycnn.targets[1]: unknown target 'gpu'"),
    ("extends-cycle", GOOD + '[targets.a]\nextends = "b"\n[targets.b]\nextends = "a"\n', None,
     "targets.a.extends: extends cycle: a -> b -> a"),
    ("inputs-not-positive", GOOD.replace('targets = ["cpu"]', 'inputs = { x = [0, 3] }\ntargets = ["cpu"]'), None,
     "models.tinycnn.inputs.x: must be a list of positive integers"),
    ("calibration-missing", GOOD.replace('targets = ["cpu"]', 'quantize = { calibration = "calib" }\n'
                                         'targets = ["cpu"]'), None,
     "models.tinycnn.quantize.calibration: calibration folder not found"),
    ("quantize-type", GOOD.replace('targets = ["cpu"]', 'quantize = { calibration = "random", '
                                   'weight_type = "fp8" }\ntargets = ["cpu"]'), None,
     "models.tinycnn.quantize.weight_type: 'fp8' is not valid"),
    ("validation-inputs-missing", GOOD.replace('targets = ["cpu"]', 'validation = { inputs = "data/x.npz" }\n'
                                               'targets = ["cpu"]'), None,
     "models.tinycnn.validation.inputs: file not found"),
    ("group-mixing-targets", GOOD + QNN + '[models.encoder]\npath = "models/encoder.onnx"\ntargets = []\n'
     '[groups.g]\ntarget = ["qnn", "cpu"]\nmodels = ["tinycnn", "encoder"]\n', None,
     "groups.g.target: must be a string, found an array"),
    ("group-cpu-target", GOOD + '[models.encoder]\npath = "models/encoder.onnx"\ntargets = []\n'
     '[groups.g]\ntarget = "cpu"\nmodels = ["tinycnn", "encoder"]\n', None,
     "groups.g.target: target 'cpu' uses CPUExecutionProvider, which cannot share an EP context"),
    ("cache-size", GOOD + "[cache]\nmax_size_mb = -1\n", None, "cache.max_size_mb: must be a positive number"),
    ("artifacts-symlink", GOOD, lambda root: _symlink_artifacts(root), "is a symbolic link"),
]


def _symlink_artifacts(root: Path) -> None:
    elsewhere = root.parent / "elsewhere"
    shutil.move(str(root / "artifacts"), str(elsewhere))
    (root / "artifacts").symlink_to(elsewhere)


@pytest.fixture(scope="module")
def built_template(tmp_path_factory, host_cache):
    root = tmp_path_factory.mktemp("template") / "proj"
    root.mkdir()
    project = Project(root, host_cache)
    project.manifest(GOOD)
    project.doit()
    return project


def outside_artifacts(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.relative_to(root).parts[0] != "artifacts"
            and not p.name.startswith(".doit.db")}


@pytest.mark.parametrize("manifest, setup, message", [case[1:] for case in CASES], ids=[c[0] for c in CASES])
def test_bad_input_fails_clearly_and_touches_nothing(built_template, tmp_path, manifest, setup, message):
    root = tmp_path / "proj"
    shutil.copytree(built_template.root, root, symlinks=True)
    project = Project.__new__(Project)
    project.root, project.cache = root, built_template.cache
    project.env = {**built_template.env}
    before_artifacts = tree_bytes(built_template.artifacts)
    project.manifest(manifest)
    if setup:
        setup(root)
    before = outside_artifacts(root)
    done = project.doit(check=False)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert message in output, output
    assert "Traceback" not in output
    error_lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1 and done.stderr.strip() == error_lines[0]
    assert outside_artifacts(root) == before
    artifacts = root / "artifacts"
    assert tree_bytes(artifacts.resolve()) == before_artifacts


def test_catalogue_has_at_least_thirty_cases():
    assert len(CASES) >= 30


def test_an_option_value_the_ep_rejects_fails_that_target_only(project):
    project.manifest(GOOD.replace('targets = ["cpu"]', 'targets = ["cpu", "qnn"]') +
                     '[targets.qnn]\nep = "qnn"\noptions = { enable_htp_fp16_precision = 1 }\n')  # no soc_model
    done = project.doit("--continue", check=False)
    assert done.returncode != 0 and "Traceback" not in done.stdout + done.stderr
    assert "compile tinycnn@qnn (QNNExecutionProvider): " in done.stdout + done.stderr
    assert "compile:tinycnn@cpu" in ran(done) and not (project.artifacts / "qnn" / "tinycnn").exists()


def test_ten_thousand_models_parse_and_list(tmp_path, host_cache):
    root = tmp_path / "big"
    root.mkdir()
    project = Project(root, host_cache)
    lines = ['[targets.cpu]\nep = "cpu"\n']
    lines += [f'[models.m{i}]\npath = "models/tinycnn.onnx"\n' for i in range(10_000)]
    project.manifest("\n".join(lines))
    listing = project.doit("list", "--quiet").stdout.split()
    assert len([name for name in listing if name.startswith("compile:m")]) == 10_000


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, ...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            parents.setdefault(int(fields[1]), []).append(int(entry))
    found, frontier = [], [pid]
    while frontier:
        children = parents.get(frontier.pop(), [])
        found += children
        frontier += children
    return found


def kill_child_when_running(run: subprocess.Popen, module: str, sig: int, deadline: float = 120) -> bool:
    """Send `sig` to the first descendant of `run` (the doit this test started) running `python -m module`;
    never to another process on the machine, where other builds may be running."""
    end = time.monotonic() + deadline
    while time.monotonic() < end and run.poll() is None:
        for pid in descendants(run.pid):
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"-m" in command and module.encode() in command:
                os.kill(pid, sig)
                return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("sig, name", [(signal.SIGKILL, "SIGKILL"), (signal.SIGSEGV, "SIGSEGV")])
def test_a_compile_child_killed_by_a_signal_fails_that_task_and_the_rest_builds(project, sig, name):
    project.env["EPBUILD_FORK_SERVER"] = "0"  # plain children, found by command line (forked: test_fork_server)
    project.manifest(GOOD.replace('targets = ["cpu"]', 'targets = ["cpu", "qnn"]') + QNN +
                     '[models.encoder]\npath = "models/encoder.onnx"\n')
    run = subprocess.Popen([sys.executable, "-m", "doit", "--continue"], cwd=project.root, env=project.env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert kill_child_when_running(run, "epbuild.steps.compile", sig)
    stdout, stderr = run.communicate(timeout=600)
    assert run.returncode != 0 and f"the child process was killed by {name}" in stdout + stderr
    assert "Traceback" not in stdout + stderr
    assert stdout.count("compiled compile:") == 3  # the other three of four compiles
    retry = project.doit()
    assert len(ran(retry, "compile:")) == 1


def test_a_validation_child_killed_fails_that_validation_and_the_next_run_retries(project):
    project.env["EPBUILD_FORK_SERVER"] = "0"  # plain children, found by command line (forked: test_fork_server)
    project.manifest(GOOD.replace('targets = ["cpu"]', 'targets = ["qnn"]') + QNN)
    project.doit("compile")
    run = subprocess.Popen([sys.executable, "-m", "doit", "--continue"], cwd=project.root, env=project.env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert kill_child_when_running(run, "epbuild.steps.validate", signal.SIGKILL)
    stdout, stderr = run.communicate(timeout=600)
    assert "the child process was killed by SIGKILL" in stdout + stderr
    report = json.loads((project.artifacts / "qnn" / "tinycnn" / "validation.json").read_text())
    assert report["status"] == "failed"
    assert "validate:tinycnn@qnn" in ran(project.doit())
    assert json.loads((project.artifacts / "qnn" / "tinycnn" / "validation.json").read_text())["status"] == "passed"


def assert_consistent(project: Project) -> None:
    """Every artifact folder under a final name is complete: its sidecar's files exist and its model loads."""
    for sidecar in project.artifacts.glob("*/*/artifact.json"):
        data = json.loads(sidecar.read_text())
        for name in data["files"]:
            assert (sidecar.parent / name).is_file(), (sidecar, name)
        onnx.load(str(sidecar.parent / data["model_file"]), load_external_data=False)
    for folder in project.artifacts.glob("*/*"):
        if folder.is_dir() and folder.parent.name not in (".state", ".logs", ".scratch", ".stages"):
            assert (folder / "artifact.json").is_file() or folder.name == "groups", folder
    with sqlite3.connect(project.root / ".doit.db.epbuild") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    for entry in (project.cache / ENTRIES).glob("*"):  # every entry in place is complete
        json.loads((entry / RECORD).read_text())


@pytest.mark.slow
def test_doit_killed_at_random_points_never_leaves_partial_artifacts(project):
    models = "".join(f'[models.m{i}]\npath = "models/m{i}.onnx"\n' for i in range(6))
    for i in range(6):
        shutil.copy(project.root / "models" / "tinycnn.onnx", project.root / "models" / f"m{i}.onnx")
    project.manifest(models + '[targets.cpu]\nep = "cpu"\n' + QNN)
    rng = random.Random(20261129)
    for _ in range(20):
        run = subprocess.Popen([sys.executable, "-m", "doit", "-n", "2", "-P", "process"], cwd=project.root,
                               env=project.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
        time.sleep(rng.uniform(0.2, 3.0))
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        assert_consistent(project)
        shutil.rmtree(project.cache / ENTRIES, ignore_errors=True) if rng.random() < 0.2 else None
    project.doit()
    assert_consistent(project)
    assert ran(project.doit()) <= {"unavailable"}


def test_a_full_disk_fails_clearly_without_partial_files(project):
    artifacts = project.artifacts
    shutil.rmtree(artifacts)
    artifacts.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(artifacts)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        project.manifest(GOOD.replace('targets = ["cpu"]', 'targets = ["qnn"]') + QNN)
        done = project.doit(check=False)
        output = done.stdout + done.stderr
        assert done.returncode != 0 and "Traceback" not in output
        assert "No space left on device" in output or "no space" in output.lower()
        assert not (artifacts / "qnn" / "tinycnn").exists()
    finally:
        subprocess.run(["umount", str(artifacts)], check=True)


@pytest.mark.parametrize("processes", [2, 3])
def test_concurrent_doit_processes_end_complete_with_an_intact_dep_file(project, processes):
    project.manifest(GOOD.replace('targets = ["cpu"]', 'targets = ["cpu", "qnn"]') + QNN +
                     '[models.encoder]\npath = "models/encoder.onnx"\n')
    runs = [subprocess.Popen([sys.executable, "-m", "doit", "-n", "2", "-P", "process"], cwd=project.root,
                             env=project.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(processes)]
    outputs = [run.communicate(timeout=600) for run in runs]
    failed = [f"exit {run.returncode}:\n" + "\n".join((out + err).splitlines()[-40:])
              for run, (out, err) in zip(runs, outputs, strict=True) if run.returncode != 0]
    assert not failed, "\n---\n".join(failed)
    assert_consistent(project)
    for target, model in (("cpu", "tinycnn"), ("qnn", "tinycnn"), ("cpu", "encoder"), ("qnn", "encoder")):
        assert json.loads((project.artifacts / target / model / "validation.json").read_text())["status"] == "passed"
    assert ran(project.doit()) <= {"unavailable"}


@pytest.mark.slow
def test_a_record_nested_too_deep_is_a_miss_never_a_traceback(project):
    """Every file a build left (its state records, build-report.json, artifact.json, validation.json, the settings
    records, the hash memory) holding JSON nested 60,000 deep: Python's decoder raises RecursionError, which ended
    every later run (rc 3, or `'BuildReporter' object has no attribute 'live'`) and `epbuild check`/`run` in a
    traceback. Now it is malformed JSON like any other: a miss, rebuilt or restored, or one line."""
    project.manifest(GOOD)
    project.doit()
    files = [p for p in project.artifacts.rglob("*") if p.is_file() and p.suffix != ".onnx"
             and p.name not in ("format", "records.lock")]
    assert any(p.name == "build-report.json" for p in files) and any(".state" in p.parts for p in files)
    saved = {p: p.read_bytes() for p in files}
    deep = "[" * 60000 + "]" * 60000
    for victim in files:
        for path, data in saved.items():
            path.write_bytes(data)
        victim.write_text(deep if victim.suffix != ".tsv" else f"/x\t{deep}\n")
        for command in (["-m", "doit"], ["-m", "doit"], ["-m", "epbuild", "check"],
                        ["-m", "epbuild", "run", "tinycnn@cpu", "--runs", "0"]):
            done = subprocess.run([sys.executable, *command], cwd=project.root, env=project.env, capture_output=True,
                                  text=True, timeout=300)
            said = done.stdout + done.stderr
            assert done.returncode in (0, 1) and "Traceback" not in said, (victim, command, said[-2000:])
