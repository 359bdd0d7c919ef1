"""The cache never fails a build: a size cap below one entry, a remote manifest that names a file and a folder
alike or lists only some of its entry's files, a remote that answers late or not at all. Each costs a warning
and local work, never a failed task; bad entries are refused one by one and repaired by the build that finds
them, and everything else keeps being cached. The remote is moto's S3 server on loopback (`s3_server`), told to
answer late or not at all as a slow proxy or a dead link would."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from test_remote_cache import MANIFEST, TASKS, origins, refusals, tamper, unsigned_remote

from conftest import build_report
from conftest import clone as clone_project
from epbuild.execute.memory_ledger import default_jobs
from epbuild.store import remote_cache
from epbuild.store.cache import ENTRIES
from s3_server import S3Server

PREFIX = "team/epbuild/"


@pytest.fixture
def s3():
    server = S3Server(max_requests=3000)
    server.start()
    yield server
    server.delay_s = server.hang_s = 0.0
    server.stop()


def clone(tmp_path: Path, host_cache: Path, name: str, s3: S3Server, bucket: str, extra: str = "", **env: str):
    return clone_project(tmp_path, host_cache, name, MANIFEST.replace("BUCKET", bucket) + extra, **{**s3.env(), **env})


def test_a_cap_below_one_entry_keeps_every_task_passing_and_every_download_restored(tmp_path, host_cache, s3):
    """`max_size_mb = 0.001`: the entry just stored (or downloaded) is never the one evicted, so it is uploaded,
    and restored, from the local cache as usual (it used to be evicted first: every validation failed on a
    missing validation.json and every download was compiled again)."""
    bucket = s3.new_bucket()
    first = clone(tmp_path, host_cache, "a", s3, bucket, "max_size_mb = 0.001\n")
    done = first.doit()  # exit 0: no task failed
    assert {origins(first)[name] for name in TASKS} == {"compiled", "validated"}, done.stderr
    again = first.doit("--always-execute")  # every task again, from a cache that holds one entry
    assert "failed" not in again.stdout.lower().replace("0 failed", "")
    second = clone(tmp_path, host_cache, "b", s3, bucket, "max_size_mb = 0.001\n")
    second.doit()
    assert {origins(second)[name] for name in TASKS} == {"remote"}  # downloads above the cap restored
    assert len(list((tmp_path / "b-cache" / ENTRIES).iterdir())) == 1


def _manifest(s3: S3Server, bucket: str, fingerprint: str) -> dict:
    return json.loads(s3.client().get_object(Bucket=bucket, Key=f"{PREFIX}ac/{fingerprint}.json")["Body"].read())


def test_malformed_remote_entries_are_refused_one_by_one_and_repaired_by_one_build(tmp_path, host_cache, s3):
    """One manifest names `tinycnn.onnx` both as a file and as a folder; another lists only its artifact.json: each
    is refused alone, the local cache keeps storing every other entry, and the build replaces both."""
    bucket = s3.new_bucket()
    first = clone(tmp_path, host_cache, "a", s3, bucket)
    first.doit()
    entries = build_report(first)
    clash, partial = entries["compile:tinycnn@cpu"]["fingerprint"], entries["compile:encoder@cpu"]["fingerprint"]

    def clashing(data: bytes) -> bytes:
        body = json.loads(data)
        some = next(iter(body["files"].values()))
        body["files"]["tinycnn.onnx/inner"] = dict(some)
        return json.dumps(body).encode()

    def only_artifact_json(data: bytes) -> bytes:
        body = json.loads(data)
        body["files"] = {"artifact.json": body["files"]["artifact.json"]}
        return json.dumps(body).encode()

    tamper(s3, bucket, f"{PREFIX}ac/{clash}.json", clashing)
    tamper(s3, bucket, f"{PREFIX}ac/{partial}.json", only_artifact_json)

    second = clone(tmp_path, host_cache, "b", s3, bucket)
    done = second.doit()
    lines = refusals(done)
    assert len(lines) == 2, done.stderr
    assert any("compile:tinycnn@cpu" in line and "both as a file and as the folder" in line for line in lines)
    assert any("compile:encoder@cpu" in line and "it holds ['artifact.json']" in line for line in lines)
    assert "unusable" not in done.stderr  # the local cache was never given up
    status = origins(second)
    assert status["compile:tinycnn@cpu"] == status["compile:encoder@cpu"] == "compiled"
    assert {status[name] for name in TASKS - {"compile:tinycnn@cpu", "compile:encoder@cpu"}} == {"remote"}
    assert len(list((tmp_path / "b-cache" / ENTRIES).iterdir())) >= len(TASKS)  # everything stored locally
    assert set(_manifest(s3, bucket, partial)["files"]) == {f["name"] for f in entries["compile:encoder@cpu"]
                                                             ["files"]}
    third = clone(tmp_path, host_cache, "c", s3, bucket)
    after = third.doit()
    assert not refusals(after) and {origins(third)[name] for name in TASKS} == {"remote"}, after.stderr


def test_a_remote_answering_late_is_skipped_once_the_builds_budget_is_spent(tmp_path, host_cache, s3):
    """Every answer 0.5 s late, a budget of 2 s: the build skips the remote with one warning after a few requests
    and builds the rest locally; the requests it made are bounded."""
    bucket = s3.new_bucket()
    s3.delay_s = 0.5
    slow = clone(tmp_path, host_cache, "a", s3, bucket, "remote_budget_s = 2\n")
    done = slow.doit()
    warnings = [line for line in done.stderr.splitlines() if "remote cache" in line]
    assert len(warnings) == 1 and "skipped: it kept this build waiting" in warnings[0], done.stderr
    assert "remote_budget_s" in warnings[0]
    assert {origins(slow)[name] for name in TASKS} == {"compiled", "validated"}
    assert s3.requests < 20


def test_a_remote_that_never_answers_costs_two_request_timeouts(tmp_path, host_cache, s3):
    bucket = s3.new_bucket()
    s3.hang_s = 20.0
    dead = clone(tmp_path, host_cache, "a", s3, bucket, "remote_timeout_s = 1\n")
    started = time.monotonic()
    done = dead.doit()
    warnings = [line for line in done.stderr.splitlines() if "remote cache" in line]
    assert len(warnings) == 1 and "unavailable while" in warnings[0] and "timeout" in warnings[0].lower(), \
        done.stderr
    assert {origins(dead)[name] for name in TASKS} == {"compiled", "validated"}
    # one request, tried twice, in each of doit's worker processes that had one in flight before the first to give
    # up marked the build (the others then skip the remote without asking)
    assert s3.requests <= 3 * max(1, default_jobs({}))
    assert time.monotonic() - started < 600  # bounded; the figure itself is in the note, not asserted


def test_a_clashing_manifest_is_refused_before_anything_is_written(tmp_path, s3, monkeypatch, capsys):
    bucket, remote, cache = unsigned_remote(tmp_path, s3, monkeypatch)
    source = tmp_path / "out"
    (source / "a").mkdir(parents=True)
    (source / "a" / "b").write_bytes(b"y")
    digest = remote_cache.hashlib.sha256(b"y").hexdigest()
    assert remote.upload("ab" * 32, source, {"a/b": digest}, {}, "compile:m@t") > 0
    tamper(s3, bucket, f"p/ac/{'ab' * 32}.json",
           lambda data: json.dumps({**json.loads(data), "files": {**json.loads(data)["files"],
                                                                  "a": json.loads(data)["files"]["a/b"]}}).encode())
    assert remote.fetch("ab" * 32, cache, "compile:m@t") is None
    assert "names 'a' both as a file and as the folder of 'a/b'" in capsys.readouterr().err
    assert cache.unusable is None and remote.down is None


def test_the_remote_budget_is_one_per_build_not_one_per_process(tmp_path):
    """doit's `-n` workers each had a budget of their own, so a build waited up to one budget per process (a remote
    4 s late made a 3 s build take 79 s under 60 s): their waits now count against one account of the build."""
    said = tmp_path / "said.build" / "remote-cache"
    first, second = (remote_cache.RemoteCache("s3://bucket-name/p", budget_s=2.0) for _ in range(2))
    for cache in (first, second):  # two processes of one build: the same marker
        cache.said = said
    first._charge(time.monotonic() - 1.5, 0)
    assert not first.down
    second._charge(time.monotonic() - 1.5, 0)  # 1.5 s alone, 3 s for the build: past its budget
    assert second.down and "kept this build waiting 3 s" in second.down
    assert first.skipped()  # the warning's marker (said once, by the second) tells the first
    lone = remote_cache.RemoteCache("s3://bucket-name/p", budget_s=2.0)
    lone._charge(time.monotonic() - 1.5, 0)
    assert not lone.down  # another build: an account of its own
