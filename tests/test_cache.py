"""The shared artifact cache, the hash memory and the build report, across clones, processes and kills."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import Project, ran
from epbuild.errors import BuildError
from epbuild.files.hashing import sha256_file
from epbuild.state.hash_memory import FileHashes
from epbuild.store.cache import ENTRIES, RECORD, ArtifactCache
from helpers import TWO_MODELS_CPU_QNN, perturb_weights, tree_bytes

MANIFEST = """
[models.tinycnn]
path = "models/tinycnn.onnx"

[models.encoder]
path = "models/encoder.onnx"

[models.dynbatch]
path = "models/dynbatch.onnx"
inputs = { x = [1, 3, 32, 32] }

[targets.cpu]
ep = "cpu"

[targets.qnn-htp]
ep = "qnn"
options = { soc_model = 60 }
"""
COMPILES = {f"compile:{m}@{t}" for m in ("tinycnn", "encoder", "dynbatch") for t in ("cpu", "qnn-htp")}


def clone(tmp_path, host_cache, name: str, cache) -> Project:
    (tmp_path / name).mkdir()
    project = Project(tmp_path / name, host_cache)
    project.env["EPBUILD_CACHE_DIR"] = str(cache)
    project.manifest(MANIFEST)
    return project


def statuses(project: Project) -> dict[str, str]:
    report = json.loads((project.artifacts / "build-report.json").read_text())["tasks"]
    return {name: entry["status"] for name, entry in report.items()}


def test_fresh_clone_compiles_only_the_changed_model_and_restores_the_rest(tmp_path, host_cache):
    cache = tmp_path / "shared-cache"
    first = clone(tmp_path, host_cache, "a", cache)
    first.doit()
    assert {statuses(first)[name] for name in COMPILES} == {"compiled"}
    second = clone(tmp_path, host_cache, "b", cache)
    perturb_weights(second.root / "models" / "encoder.onnx", seed=9)
    done = second.doit()
    status = statuses(second)
    assert {name for name in COMPILES if status[name] == "compiled"} == {"compile:encoder@cpu",
                                                                        "compile:encoder@qnn-htp"}
    assert {name for name in COMPILES if status[name] == "restored"} == COMPILES - {"compile:encoder@cpu",
                                                                                   "compile:encoder@qnn-htp"}
    assert status["validate:tinycnn@qnn-htp"] == "restored" and status["validate:encoder@qnn-htp"] == "validated"
    assert "restored compile:tinycnn@qnn-htp" in done.stdout
    a, b = tree_bytes(first.artifacts), tree_bytes(second.artifacts)
    for name in a:
        if not name.startswith(("cpu/encoder", "qnn-htp/encoder", ".stages/encoder")):
            assert a[name] == b[name], name
    report = json.loads((second.artifacts / "build-report.json").read_text())["tasks"]
    entry = report["compile:tinycnn@qnn-htp"]
    assert len(entry["fingerprint"]) == 64 and {f["name"] for f in entry["files"]} == {
        "artifact.json", "tinycnn.onnx", "tinycnn_qnn.bin"}
    assert "summary: " in done.stdout and "compiled" in done.stdout.split("summary: ")[1]


def test_a_corrupted_cache_entry_is_evicted_with_a_warning_and_rebuilt(tmp_path, host_cache):
    cache = tmp_path / "shared-cache"
    first = clone(tmp_path, host_cache, "a", cache)
    first.doit()
    fingerprint = json.loads((first.artifacts / "build-report.json").read_text())["tasks"][
        "compile:tinycnn@qnn-htp"]["fingerprint"]
    entry = cache / ENTRIES / fingerprint / "tinycnn_qnn.bin"
    data = bytearray(entry.read_bytes())
    data[100] ^= 0xFF
    entry.write_bytes(bytes(data))  # the artifact of clone a is a hard link to it and changes too
    second = clone(tmp_path, host_cache, "b", cache)
    done = second.doit()
    assert f"warning: cache entry {fingerprint[:16]} evicted: tinycnn_qnn.bin does not match its recorded sha256" \
        in done.stderr
    assert statuses(second)["compile:tinycnn@qnn-htp"] == "compiled"
    assert statuses(second)["validate:tinycnn@qnn-htp"] != "failed"
    third = clone(tmp_path, host_cache, "c", cache)
    third.doit()
    assert statuses(third)["compile:tinycnn@qnn-htp"] == "restored"


def test_a_toolchain_version_change_misses_the_cache(tmp_path, host_cache):
    cache = tmp_path / "shared-cache"
    clone(tmp_path, host_cache, "a", cache).doit()
    second = clone(tmp_path, host_cache, "b", cache)
    shadow = tmp_path / "shadow" / "onnxruntime_qnn-2.7.1.dist-info"
    shadow.mkdir(parents=True)
    (shadow / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-qnn\nVersion: 2.7.1\n")
    second.env["PYTHONPATH"] = os.pathsep.join([str(shadow.parent), second.env["PYTHONPATH"]])
    second.doit()
    status = statuses(second)
    assert {status[f"compile:{m}@qnn-htp"] for m in ("tinycnn", "encoder", "dynbatch")} == {"compiled"}
    assert {status[f"compile:{m}@cpu"] for m in ("tinycnn", "encoder", "dynbatch")} == {"restored"}


def test_two_doit_processes_at_once_compile_each_fingerprint_at_most_once(tmp_path, host_cache):
    project = clone(tmp_path, host_cache, "a", tmp_path / "shared-cache")
    command = [sys.executable, "-m", "doit", "-n", "2", "-P", "process"]
    runs = [subprocess.Popen(command, cwd=project.root, env=project.env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [run.communicate(timeout=600) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    for name in COMPILES:
        compiled = sum(out.count(f"compiled {name}:") for out, _ in outputs)
        restored = sum(out.count(f"restored {name}:") for out, _ in outputs)
        assert compiled == 1 and compiled + restored <= 2, (name, outputs)
    for name in COMPILES:
        model, target = name[len("compile:"):].split("@")
        assert json.loads((project.artifacts / target / model / "validation.json").read_text())["status"] == "passed"
    assert ran(project.doit()) <= {"unavailable"}


def test_a_killed_doit_run_restores_finished_work_on_rerun(tmp_path, host_cache):
    project = clone(tmp_path, host_cache, "a", tmp_path / "shared-cache")
    run = subprocess.Popen([sys.executable, "-m", "doit"], cwd=project.root, env=project.env,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    finished = []
    for line in run.stdout:
        if line.startswith("compiled "):
            finished.append(line.split()[1].rstrip(":"))
            if len(finished) == 2:
                break
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    time.sleep(0.2)
    done = project.doit()
    assert len(finished) == 2
    for task in finished:
        assert f"restored {task}:" in done.stdout and f"compiled {task}:" not in done.stdout


def _memory_lines(state: Path) -> int:
    return sum(len(shard.read_text().splitlines()) for shard in (state / "hashes").glob("*.tsv"))


def test_no_op_run_hashes_nothing_and_a_touched_tree_is_hashed_once(tmp_path, host_cache):
    project = clone(tmp_path, host_cache, "a", tmp_path / "shared-cache")
    project.doit()
    state = project.artifacts / ".state"
    lines = _memory_lines(state)
    assert lines and ran(project.doit()) <= {"unavailable"}
    assert _memory_lines(state) == lines
    for path in [*(project.root / "models").glob("*.onnx"), *project.artifacts.rglob("*.onnx")]:
        os.utime(path, (time.time() + 5, time.time() + 5))  # as after a fresh clone: new mtimes, same bytes
    assert ran(project.doit()) <= {"unavailable"}
    touched = _memory_lines(state)
    assert touched > lines
    assert ran(project.doit()) <= {"unavailable"}
    assert _memory_lines(state) == touched


def _same_shard(folder: Path, count: int) -> list[Path]:
    """`count` file names in one folder whose paths fall in one shard of the memory."""
    from epbuild.state.hash_memory import shard_of

    by_shard: dict[str, list[Path]] = {}
    for at in range(10_000):
        path = folder / f"file{at}.bin"
        found = by_shard.setdefault(shard_of(str(path)), [])
        found.append(path)
        if len(found) == count:
            return found
    raise AssertionError("no shard took enough names")


def test_the_hash_memory_is_compacted_when_superseded_lines_pile_up(tmp_path, monkeypatch):
    from epbuild.state import hash_memory as hashing

    monkeypatch.setattr(hashing, "COMPACT_SLACK", 5)
    kept, gone = _same_shard(tmp_path, 2)
    memory = hashing.FileHashes(tmp_path / "state")
    memory.state.mkdir()
    for round_ in range(10):  # each rewrite of the file appends one line
        kept.write_bytes(f"version {round_}".encode())
        os.utime(kept, ns=(round_ * 10**9, round_ * 10**9))
        time.sleep(0.01)  # past the clock tick of the write: a file changed within it is not remembered
        memory.sha256(kept)
    gone.write_bytes(b"x")
    time.sleep(0.01)
    memory.sha256(gone)
    gone.unlink()
    shard = tmp_path / "state" / "hashes" / hashing.shard_of(str(kept))
    assert len(shard.read_text().splitlines()) == 11
    fresh = hashing.FileHashes(tmp_path / "state")
    assert fresh.sha256(kept) == sha256_file(kept)  # loads, compacts
    lines = shard.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{kept}\t") and lines[0].endswith(sha256_file(kept))


def test_a_lookup_reads_its_own_shard_of_the_memory_and_passes_over_a_torn_line(tmp_path, monkeypatch):
    """One model changed among 10,000: its lookup reads the shard its path falls in, not the whole memory; its
    latest whole line counts, a line cut short by a killed process is passed over."""
    from epbuild.state import hash_memory as hashing

    model, other = tmp_path / "model.onnx", tmp_path / "model.onnx.data"
    memory = hashing.FileHashes(tmp_path / "state")
    for round_ in range(3):
        model.write_bytes(f"weights {round_}".encode())
        other.write_bytes(f"data {round_}".encode())
        time.sleep(0.01)
        memory.sha256(model), memory.sha256(other)
    shard = tmp_path / "state" / "hashes" / hashing.shard_of(str(model))
    with open(shard, "a") as handle:
        handle.write(f"{model}\t1\t2\t3")  # killed mid-line
    monkeypatch.setattr(hashing, "sha256_file", lambda path: pytest.fail(f"{path} read again"))
    fresh = hashing.FileHashes(tmp_path / "state")
    assert fresh.sha256(model) == hashlib.sha256(b"weights 2").hexdigest()
    assert set(fresh._shards) == {hashing.shard_of(str(model))}
    assert fresh.sha256(other) == hashlib.sha256(b"data 2").hexdigest()
    assert set(fresh._shards) == {hashing.shard_of(str(model)), hashing.shard_of(str(other))}


def test_two_appends_run_together_cost_one_hash_and_never_a_wrong_one(tmp_path, monkeypatch):
    """A process killed mid-line, then another's append: one line holds both. The first path's earlier whole line
    still counts (found line by line); the second path's is lost, so that file is hashed again, once."""
    from epbuild.state import hash_memory as hashing

    model, other = _same_shard(tmp_path, 2)
    memory = hashing.FileHashes(tmp_path / "state")
    model.write_bytes(b"weights")
    time.sleep(0.01)
    memory.sha256(model)
    shard = tmp_path / "state" / "hashes" / hashing.shard_of(str(model))
    with open(shard, "a") as handle:
        handle.write(f"{model}\t1\t2\t3")  # killed mid-line
    other.write_bytes(b"other")
    time.sleep(0.01)
    hashing.FileHashes(tmp_path / "state").sha256(other)  # appends its line to the torn one
    assert len(shard.read_text().splitlines()) == 2
    reads = []
    real = hashing.sha256_file
    monkeypatch.setattr(hashing, "sha256_file", lambda path: reads.append(path) or real(path))
    fresh = hashing.FileHashes(tmp_path / "state")
    assert fresh.sha256(model) == hashlib.sha256(b"weights").hexdigest() and reads == []
    assert fresh.sha256(other) == hashlib.sha256(b"other").hexdigest() and reads == [str(other)]
    assert hashing.FileHashes(tmp_path / "state").sha256(other) == hashlib.sha256(b"other").hexdigest()
    assert reads == [str(other)]


def test_a_file_under_several_names_is_read_once_until_it_changes(tmp_path, monkeypatch):
    """With `[cache] hard_links` the cache stores, publishes and restores by hard links: one read per file, not one
    per name."""
    from epbuild.state import hash_memory as hashing

    reads: list[str] = []
    real = hashing.sha256_file
    monkeypatch.setattr(hashing, "sha256_file", lambda path: reads.append(str(path)) or real(path))
    first, second = tmp_path / "scratch.onnx", tmp_path / "artifact.onnx"
    first.write_bytes(b"model bytes")
    os.link(first, second)
    time.sleep(0.01)  # past the clock tick of the link (it moved ctime)
    memory = hashing.FileHashes(tmp_path / "state")
    assert memory.sha256(second) == memory.sha256(first) == real(first)
    assert reads == [str(second)]
    with open(first, "r+b") as handle:  # changed in place: both names see it
        handle.write(b"MODEL")
    os.utime(first, ns=(5 * 10**9, 5 * 10**9))
    time.sleep(0.01)
    assert memory.sha256(second) == real(first)  # new content, read again
    assert len(reads) == 2


def test_cache_size_cap_evicts_least_recently_used_entries(tmp_path, host_cache):
    project = clone(tmp_path, host_cache, "a", tmp_path / "shared-cache")
    project.manifest(MANIFEST + "\n[cache]\nmax_size_mb = 0.2\n")
    project.doit()
    entries = list((tmp_path / "shared-cache" / ENTRIES).glob("*"))
    size = sum(p.stat().st_size for e in entries for p in e.rglob("*") if p.is_file())
    assert size <= 0.2 * 1024 * 1024 and entries


def test_a_restore_of_bytes_already_published_leaves_the_folder_in_place(project):
    """Another builder's compile may be reading a stage output from it; its validation report stays beside it."""
    project.manifest(TWO_MODELS_CPU_QNN + '[models.dynbatch]\npath = "models/dynbatch.onnx"\n'
                     'inputs = { x = [1, 3, 32, 32] }\n')
    project.doit()
    stage, artifact = project.artifacts / ".stages" / "dynbatch" / "shape", project.artifacts / "cpu" / "tinycnn"
    before = (stage.stat().st_ino, artifact.stat().st_ino)
    project.doit("forget", "shape:dynbatch", "compile:tinycnn@cpu")
    done = project.doit()
    assert "restored shape:dynbatch" in done.stdout and "restored compile:tinycnn@cpu" in done.stdout
    assert (stage.stat().st_ino, artifact.stat().st_ino) == before
    assert (artifact / "validation.json").is_file()


def test_an_output_named_like_the_cache_record_is_refused(tmp_path):
    cache = ArtifactCache(tmp_path / "cache", FileHashes(tmp_path / "state"))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / RECORD).write_text("{}")
    with pytest.raises(BuildError, match=f"an output is named {RECORD}, a name the artifact cache reserves"):
        cache.store("ab" * 32, tmp_path / "out", [RECORD])
    assert not (tmp_path / "cache" / ENTRIES).exists()


def test_an_adopted_staging_folder_becomes_the_entry_without_what_a_child_left_beside_the_outputs(tmp_path):
    """A validation's child works in the folder that becomes its cache entry: files an EP wrote into its working
    folder are not stored."""
    cache = ArtifactCache(tmp_path / "cache", FileHashes(tmp_path / "state"))
    staging = cache.staging("ab" * 32)
    (staging / "validation.json").write_text('{"status": "passed"}\n')
    (staging / "ep-profile.log").write_text("left by the EP")
    (staging / "ep-cache").mkdir()
    (staging / "ep-cache" / "blob").write_bytes(b"x")
    digests = cache.store("ab" * 32, staging, ["validation.json"], adopt=True)
    entry = tmp_path / "cache" / ENTRIES / ("ab" * 32)
    assert not staging.exists() and sorted(p.name for p in entry.iterdir()) == [RECORD, "validation.json"]
    assert digests == json.loads((entry / RECORD).read_text())["files"]
    assert cache.restore("ab" * 32, tmp_path / "restored") == ["validation.json"]
    assert (tmp_path / "restored" / "validation.json").read_text() == '{"status": "passed"}\n'


def test_the_cap_never_evicts_an_entry_another_builder_holds(tmp_path):
    """`doit -n`: a builder restoring (or uploading) entry A holds A's lock; another storing B under a cap below one
    entry evicts what no one holds, never A (it was pulled from under the restore: a missing validation.json)."""
    import threading

    cache = ArtifactCache(tmp_path / "cache", FileHashes(tmp_path / "state"))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "validation.json").write_text('{"status": "passed"}\n')
    held, free, other = "aa" * 32, "bb" * 32, "cc" * 32
    for fingerprint in (held, free):
        cache.store(fingerprint, tmp_path / "out", ["validation.json"])
        time.sleep(0.01)  # older than what follows
    entries = tmp_path / "cache" / ENTRIES
    cache.max_bytes = 1  # a cap below one entry from here on
    taken, release = threading.Event(), threading.Event()

    def restoring() -> None:
        with cache.lock(held):
            taken.set()
            release.wait(30)

    builder = threading.Thread(target=restoring)
    builder.start()
    try:
        assert taken.wait(30)
        cache.store(other, tmp_path / "out", ["validation.json"])
        assert sorted(p.name for p in entries.iterdir()) == [held, other]  # the held one stays, the free one went
    finally:
        release.set()
        builder.join(30)
    cache.store("dd" * 32, tmp_path / "out", ["validation.json"])
    assert sorted(p.name for p in entries.iterdir()) == ["dd" * 32]  # no longer held: evicted as usual


def test_an_entry_evicted_while_it_is_copied_is_a_miss(tmp_path, monkeypatch):
    """A restore that holds no lock (small CPU references: two targets may compute one at once) met another
    builder's store under a cap below one entry: the entry vanished between its check and its copy, and the
    validation failed on `No such file or directory`. It is a miss: nothing is restored, the caller computes it."""
    from epbuild.store import cache as cache_module

    cache = ArtifactCache(tmp_path / "cache", FileHashes(tmp_path / "state"))
    (tmp_path / "out").mkdir()
    for name in ("a.json", "reference.json"):
        (tmp_path / "out" / name).write_text("{}")
    cache.store("ab" * 32, tmp_path / "out", ["a.json", "reference.json"])
    entry = tmp_path / "cache" / ENTRIES / ("ab" * 32)
    copy = cache_module.copy_file

    def evicting(source, target, hard_links):
        copy(source, target, hard_links)
        shutil.rmtree(entry)  # another builder's store evicts it after the first file
    monkeypatch.setattr(cache_module, "copy_file", evicting)
    assert cache.restore("ab" * 32, tmp_path / "restored") is None
    assert list((tmp_path / "restored").iterdir()) == []


def test_doit_cache_says_when_the_cache_is_the_per_user_default_every_project_shares(project, tmp_path):
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\n\n[targets.cpu]\nep = "cpu"\n')
    own = project.doit("cache").stdout
    assert "local cache: " in own and "shared by every project" not in own  # EPBUILD_CACHE_DIR: its own
    project.env.pop("EPBUILD_CACHE_DIR")
    project.env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    shared = project.doit("cache").stdout
    assert f"local cache: {tmp_path / 'xdg' / 'epbuild'}: " in shared
    assert "the per-user default, shared by every project of this user" in shared
