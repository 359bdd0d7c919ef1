"""Reading the models at task creation (external-data files, onnx.checker): in a fork server's warm worker or
forked child the answers and errors are those of reading them in this process; a reading job that fails names
each model; a first build's doit process never imports onnx."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from conftest import REPO
from epbuild.execute.fork_server import SWITCH
from epbuild.plan.external_data import INDEX, ExternalDataIndex, read_models
from epbuild.state.journaled import read_journaled, write_journaled
from helpers import TWO_MODELS_CPU_QNN, model_with_location, perturb_weights, setup_failing_checker

EXPECTED = {
    "tinycnn.onnx": {"locations": []},
    "weights.onnx": {"locations": ["weights.data"]},
    "empty.onnx": {"error": "the model file is empty"},
    "text.onnx": {"error": "not a readable ONNX model: "},
    "broken.onnx": {"error": "fails onnx.checker: "},
    "escape.onnx": {"error": "external data location '../../etc/passwd' escapes the model's folder; refused"},
    "lost.onnx": {"error": "external data file 'lost.data' not found next to the model"},
}


def models(root: Path) -> list[str]:
    """A good model, one with its weights in an external file, and one of each kind of unreadable model."""
    (root / "models").mkdir()
    shutil.copy(REPO / "models" / "tinycnn.onnx", root / "models")
    model = onnx.load(str(root / "models" / "tinycnn.onnx"))
    onnx.save_model(model, str(root / "models" / "weights.onnx"), save_as_external_data=True,
                    location="weights.data", size_threshold=0)
    (root / "models" / "empty.onnx").write_bytes(b"")
    (root / "models" / "text.onnx").write_text("this is not a model")
    setup_failing_checker(root)
    model_with_location(root, "escape.onnx", "../../etc/passwd")
    model_with_location(root, "lost.onnx", "lost.data")
    return [str(root / "models" / name) for name in EXPECTED]


def matches(answers: dict[str, dict], expected: dict[str, dict]) -> bool:
    for path, answer in answers.items():
        want = expected[Path(path).name]
        if "error" in want and not answer.get("error", "").startswith(want["error"]):
            return False
        if "locations" in want and answer.get("locations") != want["locations"]:
            return False
    return len(answers) == len(expected)


@pytest.mark.parametrize("mode", ["1", "fork"])
def test_models_read_by_a_fork_server_give_the_answers_and_errors_of_reading_them_here(tmp_path, monkeypatch,
                                                                                        mode):
    monkeypatch.setenv(SWITCH, mode)
    paths = models(tmp_path)
    here = read_models(paths, None, tmp_path / "work")
    assert matches(here, EXPECTED), here
    assert read_models(paths, "", tmp_path / "work") == here
    assert not (tmp_path / "work").exists()


def test_a_reading_job_that_fails_names_the_model_that_failed(tmp_path, monkeypatch):
    """The models are read again one job each when their one job fails: the readable one is answered, the one whose
    job fails (here its job times out: injected, so no wall-clock race with a loaded machine decides the test; real
    timeouts are the children's own tests) fails alone, named."""
    from epbuild.errors import BuildError
    from epbuild.execute import child

    paths = models(tmp_path)[:1]
    big = str(tmp_path / "models" / "big.onnx")
    shutil.copy(paths[0], big)
    real = child.run_child

    def times_out_on_big(module, request, *args, **kwargs):
        if big in request["models"]:
            raise BuildError("reading the models: timed out after 600 s")
        return real(module, request, *args, **kwargs)

    monkeypatch.setattr(child, "run_child", times_out_on_big)
    answers = read_models([*paths, big], "", tmp_path / "work")
    assert answers[paths[0]] == {"locations": [], "needs": {}, "inputs": {"x": [1, 3, 64, 64]}, "weights_as_inputs": [],
                                 "dim_names": {"x": [None, None, None, None]},
                                 "graph": {"static": True, "foldable": False, "opset": 17}}
    assert answers[big] == {"error": "reading it failed: reading the models: timed out after 600 s"}, answers


def test_a_first_build_never_imports_onnx_in_the_doit_process(project):
    """Its fork servers, started while it loads, read the models (and external-data files are still found)."""
    project.manifest(TWO_MODELS_CPU_QNN)
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "doit"],
                          cwd=project.root, env=project.env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    assert "epbuild.tasks" in imported and not {"onnx", "numpy", "onnxruntime"} & imported
    assert (project.artifacts / ".state" / INDEX).is_file()


def _base(folder: Path) -> str:
    """The index's entries as its record holds them (`state.journaled`)."""
    return read_journaled(folder / "state" / INDEX).base.decode()


def test_the_index_reads_a_model_again_only_when_it_has_changed(tmp_path):
    model = Path(models(tmp_path)[0])
    index = ExternalDataIndex(tmp_path / "state")
    assert index.unread([model]) == [model]
    index.read([model], "", tmp_path / "work")
    index.save()
    unchanged = ExternalDataIndex(tmp_path / "state")
    assert unchanged.unread([model]) == [] and unchanged.files(model) == []
    shutil.copy(tmp_path / "models" / "weights.onnx", model)  # now its weights are in weights.data
    changed = ExternalDataIndex(tmp_path / "state")
    assert changed.unread([model]) == [model]
    assert changed.files(model) == [tmp_path / "models" / "weights.data"]


def test_the_index_forgets_models_the_manifest_no_longer_names(tmp_path):
    """A model removed or renamed, or the folder of another checkout (a copied project), leaves no entry that every
    run would read and every change would write again."""
    (tmp_path / "models").mkdir()
    kept, gone = tmp_path / "models" / "kept.onnx", tmp_path / "models" / "gone.onnx"
    for path in (kept, gone):
        shutil.copy(REPO / "models" / "tinycnn.onnx", path)
    index = ExternalDataIndex(tmp_path / "state")
    index.read(index.unread([kept, gone]))
    index.save()
    again = ExternalDataIndex(tmp_path / "state")
    assert set(again.entries) == {str(kept), str(gone)} and again.unread([kept]) == []
    again.save()  # only the manifest's models were looked up: the other's entry goes
    assert set(json.loads(_base(tmp_path))) == {str(kept)}
    written = (tmp_path / "state" / INDEX).stat().st_mtime_ns
    third = ExternalDataIndex(tmp_path / "state")
    assert third.unread([kept]) == [] and third.save() is None
    assert (tmp_path / "state" / INDEX).stat().st_mtime_ns == written  # nothing new: not written


def test_the_index_is_one_line_per_model_and_a_run_that_read_one_model_rewrites_only_its_line(tmp_path):
    """At 1,000 targets decoding and encoding the whole index took ~3 ms of the run after one model changed: the
    other models' lines are written back as they were read; an index its digest does not vouch for (one line) is
    decoded whole."""
    (tmp_path / "models").mkdir()
    paths = [tmp_path / "models" / f"m{i}.onnx" for i in range(3)]
    for path in paths:
        shutil.copy(REPO / "models" / "tinycnn.onnx", path)
    index = ExternalDataIndex(tmp_path / "state")
    index.read(index.unread(paths))
    index.save()
    written = _base(tmp_path)
    assert written.count("\n") == len(paths) + 2 and set(json.loads(written)) == {str(p) for p in paths}
    perturb_weights(paths[1], 3)
    again = ExternalDataIndex(tmp_path / "state")
    assert all(isinstance(line, str) for line in again.entries._items.values())  # not decoded until looked up
    assert again.unread(paths) == [paths[1]]
    again.read([paths[1]])
    again.save()
    now = _base(tmp_path).splitlines()
    assert [line for line in now if str(paths[1]) not in line] == [line for line in written.splitlines()
                                                                    if str(paths[1]) not in line]
    write_journaled(tmp_path / "state" / INDEX, json.dumps(json.loads(written), sort_keys=True).encode())
    older = ExternalDataIndex(tmp_path / "state")  # no digest names this text: decoded whole
    assert older.unread([paths[0]]) == [] and older.files(paths[0]) == []


def test_a_run_after_a_model_changed_starts_its_targets_servers_while_it_reads(project, monkeypatch):
    """On a CI runner after a commit no fork server is running: those the changed model's builds use are started
    while the models are read, not when its first job asks; nothing is started when no model changed, nor for
    targets of models that did not."""
    from epbuild.tasks import loading, run_start

    project.manifest(TWO_MODELS_CPU_QNN.replace('path = "models/tinycnn.onnx"',
                                                'path = "models/tinycnn.onnx"\ntargets = ["cpu"]'))
    project.doit()
    started: list[set[str]] = []
    monkeypatch.setattr(run_start, "prestart", lambda links, aliases, expect=None: started.append(set(aliases)))
    monkeypatch.chdir(project.root)
    for name, value in project.env.items():
        monkeypatch.setenv(name, value)
    loading.load_project(project.root / "models.toml", [])
    assert started == []  # nothing to read
    perturb_weights(project.root / "models" / "tinycnn.onnx", seed=3)
    loading.load_project(project.root / "models.toml", ["list"])
    assert started == []  # not a build
    perturb_weights(project.root / "models" / "tinycnn.onnx", seed=4)  # the listing read the last change
    loading.load_project(project.root / "models.toml", ["-n", "2"])
    assert started == [{""}]  # tinycnn's one target, cpu: the server shared with CPU-only work, not QNN's
