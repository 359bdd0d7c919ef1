"""The settings record that replaces doit's config_changed: a task runs when its settings differ from those it
last succeeded with, and two builds at once keep each other's records."""

from __future__ import annotations

import json
import os
import time

from conftest import ran
from epbuild.state.folder import StateFolder
from epbuild.state.hash_memory import FileHashes
from epbuild.state.journaled import outgrown, read_journaled, write_journaled
from epbuild.store.task_configs import RECORD, ConfigRecord, digest, published


def _base(path) -> str:
    """The record's base as text (`state.journaled`)."""
    return read_journaled(path).base.decode()


def test_a_task_without_a_record_or_with_other_settings_runs(tmp_path):
    state = StateFolder(tmp_path)
    first = ConfigRecord(state)
    assert not first.unchanged("compile:a@cpu", {"ep": "cpu"})
    assert not first.unchanged("compile:b@cpu", {"ep": "cpu"})
    first.success("compile:a@cpu", {})
    first.save()  # b did not succeed: it stays unrecorded
    again = ConfigRecord(state)
    assert again.unchanged("compile:a@cpu", {"ep": "cpu"})
    assert not again.unchanged("compile:a@cpu", {"ep": "cpu", "level": 2})
    assert not again.unchanged("compile:b@cpu", {"ep": "cpu"})


def test_two_builds_at_once_merge_their_records(tmp_path):
    state = StateFolder(tmp_path)
    one, two = ConfigRecord(state), ConfigRecord(state)
    one.unchanged("compile:a@cpu", {"x": 1})
    two.unchanged("compile:b@cpu", {"x": 2})
    one.success("compile:a@cpu", {})
    two.success("compile:b@cpu", {})
    one.save()
    two.save()
    merged = ConfigRecord(state)
    assert merged.unchanged("compile:a@cpu", {"x": 1}) and merged.unchanged("compile:b@cpu", {"x": 2})


def test_a_run_appends_the_tasks_it_changed_and_a_torn_line_leaves_their_older_entries(tmp_path):
    """The record is 7 MB at 10,000 targets: a run that changed two tasks appends them to it as a line; a line a
    killed build tore is skipped (those tasks keep their older entries, so they run again); the record is rewritten
    whole, lines merged, once they outgrow it (an eighth of it here)."""
    state = StateFolder(tmp_path)
    path = state.path(RECORD)
    first = ConfigRecord(state)
    for index in range(40):
        first.unchanged(f"compile:m{index}@cpu", {"x": 1})
        first.success(f"compile:m{index}@cpu", {})
    first.save()
    base = path.read_bytes()
    second = ConfigRecord(state)
    second.unchanged("compile:m1@cpu", {"x": 2})
    second.success("compile:m1@cpu", {})
    second.save()
    assert path.read_bytes().startswith(base) and len(read_journaled(path).lines) == 1
    assert ConfigRecord(state).unchanged("compile:m1@cpu", {"x": 2})
    with open(path, "a") as handle:
        handle.write('{"compile:m2@cpu": ["torn')
    third = ConfigRecord(state)
    assert third.unchanged("compile:m1@cpu", {"x": 2}) and not third.unchanged("compile:m2@cpu", {"x": 3})
    third.success("compile:m2@cpu", {})
    third.save()
    assert read_journaled(path).lines[1] is None  # the torn line stays alone: the next one starts a line of its own
    assert ConfigRecord(state).unchanged("compile:m2@cpu", {"x": 3})
    for index in range(3, 40):  # the lines outgrow the record: rewritten whole, lines merged
        record = ConfigRecord(state)
        record.unchanged(f"compile:m{index}@cpu", {"x": 4})
        record.success(f"compile:m{index}@cpu", {})
        record.save()
    read = read_journaled(path)
    assert not outgrown(len(read.base), read.lines_size)
    merged = ConfigRecord(state)
    assert merged.unchanged("compile:m1@cpu", {"x": 2}) and merged.unchanged("compile:m2@cpu", {"x": 3})
    assert all(merged.unchanged(f"compile:m{index}@cpu", {"x": 4}) for index in range(3, 40))
    assert merged.unchanged("compile:m0@cpu", {"x": 1})


def test_a_run_that_read_the_record_before_another_wrote_it_merges_instead_of_appending(tmp_path):
    """Two builds at once: the second to save finds the record changed since it read it, so it merges into what is
    there now (under the records lock) rather than append a line that would lie over another base."""
    state = StateFolder(tmp_path)
    _recorded(state, {f"compile:m{i}@cpu": {} for i in range(20)})
    one, two = ConfigRecord(state), ConfigRecord(state)
    one.unchanged("compile:a@cpu", {"x": 1})
    one.success("compile:a@cpu", {})
    two.unchanged("compile:b@cpu", {"x": 2})
    two.success("compile:b@cpu", {})
    one.save()
    assert len(read_journaled(state.path(RECORD)).lines) == 1
    two.save()
    assert read_journaled(state.path(RECORD)).lines == []  # rewritten whole, both in its base
    merged = ConfigRecord(state)
    assert merged.unchanged("compile:a@cpu", {"x": 1}) and merged.unchanged("compile:b@cpu", {"x": 2})


def _recorded(state, tasks: dict[str, dict]) -> None:
    record = ConfigRecord(state)
    for task, files in tasks.items():
        record.unchanged(task, {"task": task})
        record.success(task, files)
    record.save()


def test_the_record_is_one_line_per_task_and_a_run_decodes_only_the_tasks_it_asks_about(tmp_path):
    """2,000 entries took ~3.5 ms to decode at 1,000 targets, where a run after one change creates a few tasks: the
    record this module wrote (its digest in its header) is split into lines, each decoded when asked for."""
    state = StateFolder(tmp_path)
    path = state.path(RECORD)
    tasks = {f"compile:m{i}@cpu": {f"artifacts/cpu/m{i}/m{i}.onnx": [1, 2, 3, i, "ab"]} for i in range(30)}
    _recorded(state, tasks)
    lines = _base(path).splitlines()
    assert lines[0] == "{" and lines[-1] == "}" and len(lines) == 32
    assert json.loads(_base(path)) == {task: [digest({"task": task}), files] for task, files in tasks.items()}
    record = ConfigRecord(state)
    assert record.unchanged("compile:m3@cpu", {"task": "compile:m3@cpu"})
    assert record.published_files(["compile:m4@cpu", "compile:gone@cpu"]) == tasks["compile:m4@cpu"]
    assert record.published_files() == {p: i for files in tasks.values() for p, i in files.items()}
    fresh = ConfigRecord(state)
    fresh.unchanged("compile:m3@cpu", {"task": "compile:m3@cpu"})
    assert [name for name, item in fresh.recorded._items.items() if not isinstance(item, str)] == ["compile:m3@cpu"]


def test_a_record_not_vouched_for_is_decoded_whole(tmp_path):
    """A record edited by hand in the same layout (its digest no longer matches), one written whole on one line, and
    one with a name JSON escapes are read as their JSON says; one no longer JSON, or no record at all, is empty: every
    task runs."""
    state = StateFolder(tmp_path)
    path = state.path(RECORD)
    tasks = {"compile:a@cpu": {"a.onnx": [1, 2, 3, 4, "aa"]}, 'compile:b"@cpu': {"b.onnx": [1, 2, 3, 5, "bb"]}}
    _recorded(state, tasks)
    assert ConfigRecord(state).published_files(['compile:b"@cpu']) == tasks['compile:b"@cpu']  # escaped: whole
    _recorded(state, {"compile:a@cpu": tasks["compile:a@cpu"]})
    path.write_bytes(path.read_bytes().replace(b'"aa"', b'"ed"'))  # same layout and size, another digest
    assert ConfigRecord(state).published_files(["compile:a@cpu"]) == {"a.onnx": [1, 2, 3, 4, "ed"]}
    assert isinstance(ConfigRecord(state).recorded._items["compile:a@cpu"], list)  # decoded whole, not by line
    write_journaled(path, json.dumps({"compile:a@cpu": [digest({"task": "compile:a@cpu"}), {}]}).encode())
    whole = ConfigRecord(state)
    assert whole.unchanged("compile:a@cpu", {"task": "compile:a@cpu"}) and whole.published_files() == {}
    whole.unchanged("compile:c@cpu", {"task": "compile:c@cpu"})
    whole.success("compile:c@cpu", {})
    whole.save()  # a record not vouched for is rewritten one line per task at once, no line appended over it
    read = read_journaled(path, vouch=True)
    assert read.lines == [] and read.vouched and len(read.base.decode().splitlines()) == 4
    write_journaled(path, b'{\n  "compile:a@cpu": ["x", {}],\n  "compile:b@cpu": [\n}\n')  # not JSON
    assert len(ConfigRecord(state).recorded) == 0
    path.write_text("{not a record")
    record = ConfigRecord(state)
    assert not record.unchanged("compile:a@cpu", {})
    record.success("compile:a@cpu", {})
    record.save()
    assert json.loads(_base(path)) == {"compile:a@cpu": [record.current["compile:a@cpu"], {}]}


def test_a_published_file_changed_since_counts_as_missing_and_a_touched_one_does_not(tmp_path, monkeypatch):
    from epbuild.tasks.checker import HashChecker

    monkeypatch.chdir(tmp_path)
    state, artifact = StateFolder(tmp_path / "state"), tmp_path / "model.onnx"
    artifact.write_bytes(b"compiled bytes")
    time.sleep(0.01)
    record = ConfigRecord(state)
    record.unchanged("compile:a@cpu", {})
    record.success("compile:a@cpu", published([artifact], FileHashes(tmp_path), tmp_path))
    record.save()

    def checker() -> HashChecker:
        return HashChecker(FileHashes(tmp_path), ConfigRecord(state).published_files())

    os.utime(artifact, ns=(10**9, 10**9))  # touched: another identity, the same bytes
    assert checker().exists("model.onnx")
    stat = artifact.stat()
    artifact.write_bytes(b"COMPILED bytes")  # the same size, the mtime restored: ctime still moves
    os.utime(artifact, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    edited = checker()
    assert not edited.exists("model.onnx") and edited.edited == {"model.onnx"}


MANIFEST = """
[models.tinycnn]
path = "models/tinycnn.onnx"

[targets.qnn]
ep = "qnn"
options = { soc_model = 60, qnn_context_priority = "LEVEL" }
"""


def test_a_setting_changed_and_changed_back_runs_each_time_and_a_failure_is_not_recorded(project):
    project.manifest(MANIFEST.replace("LEVEL", "normal"))
    project.doit()
    record = StateFolder(project.artifacts / ".state")
    assert set(ConfigRecord(record).recorded) == {"compile:tinycnn@qnn", "validate:tinycnn@qnn"}
    assert ran(project.doit()) == set()
    project.manifest(MANIFEST.replace("LEVEL", "high"))
    assert ran(project.doit(), "compile:") == {"compile:tinycnn@qnn"}
    project.manifest(MANIFEST.replace("LEVEL", "normal"))
    assert ran(project.doit(), "compile:") == {"compile:tinycnn@qnn"}
    before = ConfigRecord(record).recorded
    # settings the EP refuses at compile time (fp16 precision without a SoC model)
    project.manifest(MANIFEST.replace('soc_model = 60, qnn_context_priority = "LEVEL"',
                                      'enable_htp_fp16_precision = 1, qnn_context_priority = "normal"'))
    failed = project.doit(check=False)
    assert failed.returncode != 0 and ran(failed, "compile:") == {"compile:tinycnn@qnn"}
    assert ConfigRecord(record).recorded == before  # the failed settings are not recorded
    assert ran(project.doit(check=False), "compile:") == {"compile:tinycnn@qnn"}  # so it runs again


def test_a_record_that_cannot_be_written_is_a_warning_and_the_next_run_checks_again(project):
    project.manifest(MANIFEST.replace("LEVEL", "normal"))
    # a folder where the records' lock belongs: the lock cannot be taken, so the record cannot be written (a folder
    # where the record itself belongs is replaced: tests/test_untrusted_checkout.py)
    (project.artifacts / ".state" / "records.lock").mkdir(parents=True)
    done = project.doit()
    assert "warning: build state not saved" in done.stdout and "compile:tinycnn@qnn" in ran(done)
    again = project.doit()
    assert "compile:tinycnn@qnn" in ran(again)  # no record: it runs (restored from the cache)
    assert "restored compile:tinycnn@qnn" in again.stdout
