"""The last run's record as base and journal (`epbuild.tasks.run_record`): what is loaded is exactly what the last
run recorded, whether it appended a line or rewrote the whole; a torn or foreign line, or a change to what the
record watches, leaves no record (the full path). `test_selection.py` and the incrementality contract test take it
through real builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epbuild.store.layout import Layout
from epbuild.tasks.run_record import RunRecord
from epbuild.tasks.selection import Recorded


@pytest.fixture
def layout(tmp_path, monkeypatch) -> Layout:
    monkeypatch.chdir(tmp_path)
    found = Layout(tmp_path / "artifacts")
    found.state.mkdir(parents=True)
    for path in (found.configs, found.build_report, Path(".doit.db")):
        path.write_text("{}")
    return found


def _record(count: int, changed: int = -1) -> Recorded:
    tasks = {f"compile:m{i}@cpu": [f"models/m{i}.onnx", f"artifacts/cpu/m{i}/m{i}.onnx"] for i in range(count)}
    files = {path: [i, 2, 3, 4] for i, listed in enumerate(tasks.values()) for path in listed}
    if changed >= 0:
        files[f"models/m{changed}.onnx"] = [99, 9, 9, 9]
    return Recorded(tasks, files, {"group:g": ["compile:m0@cpu"]} if count else {}, {"configs/x.json": [1, 2, 3, 4]})


def _same(loaded: Recorded | None, written: Recorded) -> None:
    assert loaded is not None
    assert (loaded.tasks, loaded.files, loaded.task_deps, loaded.looked_at) == \
        (written.tasks, written.files, written.task_deps, written.looked_at)


def test_a_run_that_read_the_record_appends_what_changed_and_the_next_loads_exactly_that(layout):
    records = RunRecord(layout)
    first = _record(200)
    records.write("key", first, None)
    assert not records.journal.exists()
    base = records.path.read_bytes()
    loaded = records.load("key")
    _same(loaded, first)
    second = _record(199, changed=5)  # one task gone, one file's identity changed
    second.task_deps.clear()
    second.looked_at["configs/y.json"] = None
    records.write("key", second, loaded)
    assert records.path.read_bytes() == base and len(records.journal.read_text().splitlines()) == 1
    again = records.load("key")
    _same(again, second)
    third = _record(201)
    records.write("key", third, again)
    assert len(records.journal.read_text().splitlines()) == 2
    _same(records.load("key"), third)
    assert records.load("other key") is None


def test_a_torn_or_foreign_line_leaves_no_record(layout):
    records = RunRecord(layout)
    records.write("key", _record(200), None)
    records.write("key", _record(200, changed=1), records.load("key"))
    line = records.journal.read_text()
    records.journal.write_text(line[:-20])  # a killed writer
    assert records.load("key") is None
    records.journal.write_text(line.replace(json.loads(line)["base"], "0" * 16))  # a line of another base
    assert records.load("key") is None
    records.journal.unlink()  # the base alone: the watched files are those after the journal's line was written
    assert records.load("key") is not None


def test_a_record_another_run_wrote_meanwhile_is_rewritten_whole(layout):
    records = RunRecord(layout)
    records.write("key", _record(200), None)
    ours, theirs = records.load("key"), records.load("key")
    records.write("key", _record(200, changed=1), theirs)  # the other run appended first
    mine = _record(200, changed=2)
    records.write("key", mine, ours)
    assert not records.journal.exists()
    _same(records.load("key"), mine)


def test_a_journal_outgrowing_half_the_record_is_merged_into_it(layout):
    records = RunRecord(layout)
    records.write("key", _record(20), None)
    rewritten = 0
    for count in range(21, 60):
        records.write("key", _record(count), records.load("key"))
        if not records.journal.exists():
            rewritten += 1
        else:
            assert records.journal.stat().st_size <= records.path.stat().st_size // 2
        _same(records.load("key"), _record(count))
    assert 1 <= rewritten < 39


@pytest.mark.parametrize("written", ["build report", "settings journal"])
def test_a_watched_file_written_since_leaves_no_record(layout, written):
    records = RunRecord(layout)
    records.write("key", _record(20), None)
    records.write("key", _record(20, changed=3), records.load("key"))
    assert records.load("key") is not None
    if written == "build report":
        layout.build_report.write_text('{"tasks": {}}')
    else:  # present or not, it counts
        (layout.state / "configs.journal").write_text("{}\n")
    assert records.load("key") is None
