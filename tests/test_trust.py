""""Up to date" and "restored" mean what a clean build produces: inputs changed during a job, in-place edits that
keep size and mtime, published artifacts edited by hand, target names and timings in cached bytes, removed models
in the reports, and checks that re-run without rebuilding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from conftest import build_report, clone, ran
from epbuild.store.cache import ENTRIES
from helpers import slow_model, tree_bytes

CPU = """
[targets.cpu]
ep = "cpu"
"""
UNVALIDATED_CPU = CPU + "validate = false\n"


def external_data_model(path: Path, seed: int = 0) -> Path:
    """A MatMul whose 256 KB weight lives in `<name>.data`, as torch's exporter writes large models."""
    weight = np.random.default_rng(seed).standard_normal((256, 256)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "ext",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
                              [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path), save_as_external_data=True, location=f"{path.name}.data", size_threshold=0)
    return path


def rewrite_keeping_size_and_mtime(path: Path, offset: int = -64) -> None:
    """What `cp -p`, `rsync -t` or `unzip -o` leave: other bytes, the same size, the old mtime (`offset` < 0
    counts from the end: inside the last weights of a small model)."""
    stat = path.stat()
    offset = offset % stat.st_size
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns


def output(done: subprocess.CompletedProcess) -> str:
    return done.stdout + done.stderr


def test_a_model_saved_while_it_compiles_is_refused_and_nothing_is_stored(project):
    model = slow_model(project.root / "models" / "slow.onnx")
    project.manifest('[models.slow]\npath = "models/slow.onnx"\ntargets = ["cpu"]\n' + UNVALIDATED_CPU)
    child = subprocess.Popen([sys.executable, "-m", "doit", "compile:slow@cpu"], cwd=project.root, env=project.env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not list((project.artifacts / ".scratch").glob("compile.slow.cpu.*")) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # inside the compile
    slow_model(model, nodes=60001)  # saved again: other bytes
    text = child.communicate(timeout=300)[0]
    assert child.returncode != 0, text
    assert "compile:slow@cpu: slow.onnx changed while compile:slow@cpu ran; run again" in text
    assert not (project.artifacts / "cpu" / "slow").exists()
    assert not list((project.cache / ENTRIES).glob("*"))  # the old bytes' fingerprint holds nothing
    again = project.doit("compile:slow@cpu")
    assert "compiled compile:slow@cpu" in again.stdout


def test_an_in_place_edit_that_keeps_size_and_mtime_rebuilds_on_both_paths(project):
    project.env.pop("EPBUILD_FAST_PATH", None)
    external_data_model(project.root / "models" / "ext.onnx")
    project.manifest('[models.ext]\npath = "models/ext.onnx"\ntargets = ["cpu"]\n' + CPU)
    project.doit()
    project.doit()  # a full no-op: the fast path's stamp
    for fast in ("1", "0"):
        project.env["EPBUILD_FAST_PATH"] = fast
        rewrite_keeping_size_and_mtime(project.root / "models" / "ext.onnx.data", offset=1000 + int(fast))
        done = project.doit()
        assert "compiled compile:ext@cpu" in done.stdout, (fast, done.stdout)
        assert "validated validate:ext@cpu" in done.stdout or "passed validate:ext@cpu" in done.stdout


def test_a_cache_entry_tampered_in_place_is_evicted_not_restored(tmp_path, host_cache):
    manifest = '[models.tinycnn]\npath = "models/tinycnn.onnx"\ntargets = ["cpu"]\n' + UNVALIDATED_CPU
    first = clone(tmp_path, host_cache, "a", manifest)
    first.doit()
    first.doit("forget", "compile:tinycnn@cpu")
    first.doit()  # a restore: the entry's identity is now remembered
    entry = next((tmp_path / "a-cache" / ENTRIES).glob("*"))
    rewrite_keeping_size_and_mtime(entry / "tinycnn.onnx", offset=200)
    first.doit("forget", "compile:tinycnn@cpu")
    done = first.doit()
    assert "evicted: tinycnn.onnx does not match its recorded sha256" in output(done)
    assert "compiled compile:tinycnn@cpu" in done.stdout


def test_published_artifacts_are_copies_that_onnx_loads_with_their_external_data(project):
    external_data_model(project.root / "models" / "ext.onnx")
    project.manifest('[models.ext]\npath = "models/ext.onnx"\ntargets = ["cpu", "qnn-htp"]\ninputs = { x = [1, 256] }\n'
                     + CPU + '\n[targets.qnn-htp]\nep = "qnn"\noptions = { soc_model = 60 }\n')
    project.doit()
    project.doit("forget")
    project.doit()  # every output restored from the cache this time
    published = [p for p in project.artifacts.rglob("*") if p.is_file() and ".state" not in p.parts]
    assert published and all(p.stat().st_nlink == 1 for p in published)  # not one is a link into the cache
    for model in [*project.artifacts.glob("*/ext/*.onnx"), *project.artifacts.glob(".stages/ext/*/*.onnx")]:
        onnx.load(str(model))  # onnx 1.23 refuses external data with several hard links


def test_a_hand_edited_artifact_is_restored_with_one_line(project):
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\ntargets = ["cpu"]\n' + CPU)
    project.doit()
    artifact = project.artifacts / "cpu" / "tinycnn" / "tinycnn.onnx"
    clean = artifact.read_bytes()
    for fast in ("1", "0"):
        project.env["EPBUILD_FAST_PATH"] = fast
        model = onnx.load(str(artifact))
        model.doc_string = "edited by hand"
        onnx.save(model, str(artifact))  # in place
        done = project.doit()
        assert "warning: artifacts/cpu/tinycnn/tinycnn.onnx changed since it was published; restoring or " \
               "rebuilding it" in done.stdout, done.stdout
        assert "restored compile:tinycnn@cpu" in done.stdout
        assert artifact.read_bytes() == clean
    project.env["EPBUILD_FAST_PATH"] = "0"
    os.utime(artifact, ns=(10**9, 10**9))  # touched, not changed: nothing runs
    assert ran(project.doit()) <= {"unavailable"}


def test_a_restored_folder_equals_a_fresh_one_file_for_file_and_names_the_current_target(tmp_path, host_cache):
    manifest = ('[models.tinycnn]\npath = "models/tinycnn.onnx"\ntargets = ["qnn-htp"]\n'
                '[targets.qnn-htp]\nep = "qnn"\noptions = { soc_model = 60 }\n')
    first = clone(tmp_path, host_cache, "a", manifest)
    first.doit()
    renamed = manifest.replace("qnn-htp", "npu")
    first.manifest(renamed)
    done = first.doit()
    assert "restored compile:tinycnn@npu" in done.stdout
    restored = {n: b for n, b in _files(first.artifacts / "npu" / "tinycnn").items()}
    fresh_project = clone(tmp_path, host_cache, "b", renamed)
    assert "compiled compile:tinycnn@npu" in fresh_project.doit().stdout
    fresh = _files(fresh_project.artifacts / "npu" / "tinycnn")
    assert json.loads(restored["artifact.json"])["target"] == "npu"
    assert set(restored) == set(fresh) and "validation.json" in restored
    assert {n: b for n, b in restored.items()} == fresh  # reports included: no timing or origin inside


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_reports_describe_the_current_manifest_and_prune_removes_what_removed_models_left(project):
    two = ('[models.tinycnn]\npath = "models/tinycnn.onnx"\ntargets = ["cpu"]\n'
           '[models.encoder]\npath = "models/encoder.onnx"\ntargets = ["cpu"]\n' + CPU)
    project.manifest(two)
    project.doit()
    project.manifest(two.split("[models.encoder]")[0] + CPU)
    project.doit()
    assert not any("encoder" in name for name in build_report(project))
    assert "encoder" not in (project.artifacts / "junit.xml").read_text()
    assert "encoder" not in (project.artifacts / "report.html").read_text()
    listed = project.doit("prune", "--dry-run").stdout
    assert "would remove artifacts/cpu/encoder/" in listed and "tinycnn" not in listed
    assert (project.artifacts / "cpu" / "encoder").is_dir()
    removed = project.doit("prune").stdout
    assert "removed artifacts/cpu/encoder/" in removed and "freed" in removed
    assert not (project.artifacts / "cpu" / "encoder").exists() and (project.artifacts / "cpu" / "tinycnn").is_dir()
    assert "nothing under artifacts/ is left over" in project.doit("prune").stdout
    assert tree_bytes(project.artifacts)  # the current model's artifact is untouched


def test_a_validation_time_limit_change_does_not_rerun_a_passed_validation(project):
    manifest = '[models.tinycnn]\npath = "models/tinycnn.onnx"\ntargets = ["cpu"]\nvalidation = { timeout_s = 60 }\n'
    project.manifest(manifest + CPU)
    project.doit()
    project.manifest(manifest.replace("60", "90") + CPU)
    assert ran(project.doit()) <= {"unavailable"}
