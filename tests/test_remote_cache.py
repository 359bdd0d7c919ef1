"""The remote cache on a real S3-API server (moto on loopback): clones share artifacts through it, and nothing it
holds is trusted: tampered blobs and manifests are refused and rebuilt, read-only mode writes nothing, a dead
server costs one warning, and no credential ever reaches an output."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_cache import MANIFEST as CACHE_MANIFEST

from conftest import Project, build_report, ran
from conftest import clone as clone_project
from epbuild.state.hash_memory import FileHashes
from epbuild.store import remote_cache
from epbuild.store.cache import RECORD, ArtifactCache
from helpers import perturb_weights, tree_bytes
from s3_server import ACCESS_KEY, SECRET_KEY, S3Server

SIGNING_KEY = "epbuild-signing-key-never-print-93ac"
MANIFEST = CACHE_MANIFEST + """
[cache]
remote = "s3://BUCKET/team/epbuild"
"""
MODELS = ("tinycnn", "encoder", "dynbatch")
COMPILES = {f"compile:{m}@{t}" for m in MODELS for t in ("cpu", "qnn-htp")}
VALIDATES = {name.replace("compile:", "validate:") for name in COMPILES}
# the NPU target's stages: dynbatch's (tinycnn and encoder are static with nothing to fold: compiled as they are)
STAGES = {"shape:dynbatch", "fold:dynbatch"}
TASKS = COMPILES | VALIDATES | STAGES


@pytest.fixture
def s3():
    server = S3Server()
    server.start()
    yield server
    server.stop()


def clone(tmp_path: Path, host_cache: Path, name: str, s3: S3Server, bucket: str, **env: str) -> Project:
    """A fresh clone with its own, empty local cache, pointed at the shared remote."""
    return clone_project(tmp_path, host_cache, name, MANIFEST.replace("BUCKET", bucket), **{**s3.env(), **env})


def origins(project: Project) -> dict[str, str]:
    """Task -> "remote", "local" (restored from there), or its status."""
    return {name: entry.get("from", entry["status"]) for name, entry in build_report(project).items()}


def refusals(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("warning: remote cache entry")]


def assert_no_secret(*texts: str, folders: tuple[Path, ...] = ()) -> None:
    """No credential or signing key in any output, log, report, cache file or doit database."""
    secrets = (SECRET_KEY, ACCESS_KEY, SIGNING_KEY)
    for text in texts:
        assert not any(secret in text for secret in secrets), text
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                assert not any(secret.encode() in data for secret in secrets), path


def manifest_key(bucket_prefix: str, fingerprint: str) -> str:
    return f"{bucket_prefix}ac/{fingerprint}.json"


def test_a_fresh_clone_restores_everything_from_the_remote_and_a_changed_model_rebuilds_only_its_targets(
        tmp_path, host_cache, s3):
    bucket = s3.new_bucket()
    first = clone(tmp_path, host_cache, "a", s3, bucket)
    built = first.doit()
    assert {origins(first)[name] for name in TASKS} == {"compiled", "validated"}
    stored = s3.objects(bucket)
    fingerprints = {entry["fingerprint"] for name, entry in build_report(first).items() if name in COMPILES | VALIDATES}
    assert {manifest_key("team/epbuild/", fp) for fp in fingerprints} <= set(stored)
    assert any(key.startswith("team/epbuild/cas/sha256/") for key in stored)
    assert "remote cache: 0 hits" in built.stdout and "MB up" in built.stdout

    second = clone(tmp_path, host_cache, "b", s3, bucket)
    before = s3.requests
    done = second.doit()
    assert {origins(second)[name] for name in TASKS} == {"remote"}, origins(second)
    assert tree_bytes(first.artifacts) == tree_bytes(second.artifacts)
    assert f"remote cache: {len(TASKS)} hits" in done.stdout and "(from the remote cache" in done.stdout
    files = sum(len(entry["files"]) for name, entry in build_report(first).items() if name in COMPILES | STAGES) + len(
        VALIDATES)
    assert s3.requests - before <= len(TASKS) + files + 2  # one manifest and one GET per file, no uploads
    assert s3.requests - before >= len(TASKS) + files
    before = s3.requests
    assert ran(second.doit()) == set()  # a no-op run asks the remote nothing
    assert s3.requests == before

    third = clone(tmp_path, host_cache, "c", s3, bucket)
    perturb_weights(third.root / "models" / "encoder.onnx", seed=3)
    third.doit()
    rebuilt = {name for name, origin in origins(third).items() if origin in ("compiled", "validated")}
    assert rebuilt == {"compile:encoder@cpu", "compile:encoder@qnn-htp",
                       "validate:encoder@cpu", "validate:encoder@qnn-htp"}
    assert {origins(third)[name] for name in TASKS - rebuilt} == {"remote"}
    assert_no_secret(built.stdout, built.stderr, done.stdout, done.stderr,
                     folders=(first.root, second.root, tmp_path / "a-cache", tmp_path / "b-cache"))


def tamper(s3: S3Server, bucket: str, key: str, change) -> None:
    client = s3.client()
    body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    client.put_object(Bucket=bucket, Key=key, Body=change(body))


def test_tampered_blobs_and_manifests_are_refused_rebuilt_and_replaced(tmp_path, host_cache, s3):
    bucket = s3.new_bucket()
    signed = {"EPBUILD_CACHE_SIGNING_KEY": SIGNING_KEY}
    first = clone(tmp_path, host_cache, "a", s3, bucket, **signed)
    first.doit()
    entries = build_report(first)
    prefix = "team/epbuild/"
    # a blob: the tinycnn cpu model's bytes changed in place
    blob = next(f["sha256"] for f in entries["compile:tinycnn@cpu"]["files"] if f["name"] == "tinycnn.onnx")
    tamper(s3, bucket, f"{prefix}cas/sha256/{blob}", lambda data: data[:-1] + bytes([data[-1] ^ 1]))
    # a signed manifest edited (its signature no longer matches)
    encoder = manifest_key(prefix, entries["compile:encoder@cpu"]["fingerprint"])
    tamper(s3, bucket, encoder, lambda data: data.replace(b'"task": "compile:encoder@cpu"', b'"task": "x"'))
    # a manifest with its signature removed
    dynbatch = manifest_key(prefix, entries["compile:dynbatch@qnn-htp"]["fingerprint"])
    tamper(s3, bucket, dynbatch, lambda data: json.dumps(
        {k: v for k, v in json.loads(data).items() if k != "signature"}).encode())

    second = clone(tmp_path, host_cache, "b", s3, bucket, **signed)
    done = second.doit()
    lines = refusals(done)
    assert len(lines) == 3, done.stderr
    assert any("compile:tinycnn@cpu" in line and "does not match its sha256" in line for line in lines)
    assert any("compile:encoder@cpu" in line and "signature does not match" in line for line in lines)
    assert any("compile:dynbatch@qnn-htp" in line and "unsigned" in line for line in lines)
    status = origins(second)
    assert {status["compile:tinycnn@cpu"], status["compile:encoder@cpu"],
            status["compile:dynbatch@qnn-htp"]} == {"compiled"}
    assert {status[name] for name in TASKS - {"compile:tinycnn@cpu", "compile:encoder@cpu",
                                               "compile:dynbatch@qnn-htp"}} == {"remote"}
    assert tree_bytes(first.artifacts) == tree_bytes(second.artifacts)

    third = clone(tmp_path, host_cache, "c", s3, bucket, **signed)  # the rebuilds replaced the bad objects
    again = third.doit()
    assert not refusals(again) and {origins(third)[name] for name in TASKS} == {"remote"}

    unsigned_reader = clone(tmp_path, host_cache, "d", s3, bucket)  # no key: signatures unchecked, blobs still
    unsigned_reader.doit()
    assert {origins(unsigned_reader)[name] for name in TASKS} == {"remote"}
    other_key = clone(tmp_path, host_cache, "e", s3, bucket, EPBUILD_CACHE_SIGNING_KEY="another-team-key",
                      EPBUILD_CACHE_READONLY="1")
    refused = other_key.doit()
    tasks = [line for line in refusals(refused) if "for the CPU reference of " not in line]
    assert len(tasks) == len(TASKS) and {origins(other_key)[n] for n in COMPILES} == {"compiled"}
    # and one per CPU reference: tinycnn's and encoder's serve both their targets, dynbatch's two chains have two
    assert len(refusals(refused)) - len(tasks) == 4
    assert_no_secret(done.stdout, done.stderr, again.stdout, again.stderr,
                     folders=(second.root, tmp_path / "b-cache"))


def test_a_remote_with_every_blob_corrupted_is_repaired_by_one_build(tmp_path, host_cache, s3):
    """A writer replacing a refused entry re-uploads every blob it has not verified, not only the first bad one it
    found (successive builds used to refuse fewer and fewer entries: 32, 14, 9, 2, 0)."""
    bucket = s3.new_bucket()
    clone(tmp_path, host_cache, "a", s3, bucket).doit()
    blobs = [key for key in s3.objects(bucket) if "/cas/sha256/" in key]
    assert len(blobs) > len(TASKS)  # models, external data, binaries, artifact.json and validation reports
    for key in blobs:
        tamper(s3, bucket, key, lambda data: data + b"corrupted")
    repairing = clone(tmp_path, host_cache, "b", s3, bucket).doit()
    assert refusals(repairing) and all("does not match its sha256" in line for line in refusals(repairing))
    third = clone(tmp_path, host_cache, "c", s3, bucket)
    after = third.doit()
    assert not refusals(after), after.stderr
    assert {origins(third)[name] for name in TASKS} == {"remote"}


def test_a_download_cut_off_is_reported_as_cut_off(tmp_path, s3, monkeypatch):
    bucket = s3.new_bucket()
    monkeypatch.setenv("EPBUILD_CACHE_READONLY", "")
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    remote = remote_cache.RemoteCache(f"s3://{bucket}/p")
    data = b"x" * 1000
    digest = hashlib.sha256(data).hexdigest()
    s3.client().put_object(Bucket=bucket, Key=f"p/cas/sha256/{digest}", Body=data[:400])  # a writer that died
    why = remote._download(digest, len(data), tmp_path / "blob")
    assert why == f"blob {digest[:16]} was cut off after 400 of 1000 bytes"


def test_read_only_mode_restores_and_never_writes(tmp_path, host_cache, s3):
    bucket = s3.new_bucket()
    first = clone(tmp_path, host_cache, "a", s3, bucket)
    first.doit()
    stored, writes = s3.objects(bucket), s3.writes
    reader = clone(tmp_path, host_cache, "b", s3, bucket, EPBUILD_CACHE_READONLY="1")
    perturb_weights(reader.root / "models" / "tinycnn.onnx", seed=5)
    reader.doit()
    assert origins(reader)["compile:tinycnn@qnn-htp"] == "compiled" and origins(reader)["compile:encoder@cpu"] == \
        "remote"
    assert s3.writes == writes and s3.objects(bucket) == stored
    shown = reader.doit("cache")
    assert "read-only (EPBUILD_CACHE_READONLY)" in shown.stdout and "reachable" in shown.stdout


def test_a_server_stopped_mid_build_costs_one_warning_and_the_build_completes(tmp_path, host_cache, s3):
    bucket = s3.new_bucket()
    project = clone(tmp_path, host_cache, "a", s3, bucket, PYTHONUNBUFFERED="1")
    process = subprocess.Popen([sys.executable, "-m", "doit"], cwd=project.root, env=project.env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(process.stderr), daemon=True)
    reader.start()
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("compiled compile:"):
            s3.stop()  # after the first upload: every later request meets a closed port
            break
    lines.extend(process.stdout)
    assert process.wait(timeout=600) == 0, "".join(lines) + "".join(stderr)
    reader.join(timeout=10)
    warnings = [line for line in stderr if "remote cache" in line]
    assert len(warnings) == 1 and "unavailable" in warnings[0] and "building locally" in warnings[0], stderr
    assert {origins(project)[name] for name in TASKS} == {"compiled", "validated"}
    assert_no_secret("".join(lines), "".join(stderr))


def test_an_unreachable_throttling_or_denying_remote_costs_one_warning(tmp_path, host_cache, s3):
    bucket = s3.new_bucket()
    dead = clone(tmp_path, host_cache, "a", s3, bucket, AWS_ENDPOINT_URL="http://127.0.0.1:9")  # discard port
    done = dead.doit()
    warnings = [line for line in done.stderr.splitlines() if "remote cache" in line]
    assert len(warnings) == 1 and "unavailable while" in warnings[0], done.stderr
    assert {origins(dead)[name] for name in TASKS} == {"compiled", "validated"}

    s3.throttle = True
    slow = clone(tmp_path, host_cache, "b", s3, bucket)
    throttled = slow.doit()
    assert [line for line in throttled.stderr.splitlines() if "remote cache" in line and "SlowDown" in line], \
        throttled.stderr
    assert len([line for line in throttled.stderr.splitlines() if "remote cache" in line]) == 1
    s3.throttle = False

    s3.deny_writes = True
    denied = clone(tmp_path, host_cache, "c", s3, bucket)
    refused = denied.doit()
    assert len([line for line in refused.stderr.splitlines() if "writes denied" in line]) == 1, refused.stderr
    assert s3.objects(bucket) == {} and {origins(denied)[name] for name in TASKS} == {"compiled", "validated"}
    assert_no_secret(done.stdout, done.stderr, throttled.stdout, throttled.stderr, refused.stdout, refused.stderr)


def test_with_two_jobs_a_dead_remote_is_still_one_warning_and_skipped_by_both(tmp_path, host_cache, s3):
    """`-n 2`: the worker that gives up first says it and marks it; the other says nothing and stops asking."""
    dead = clone(tmp_path, host_cache, "a", s3, s3.new_bucket(), AWS_ENDPOINT_URL="http://127.0.0.1:9")
    done = dead.doit("-n", "2", "-P", "process")
    warnings = [line for line in done.stderr.splitlines() if "remote cache" in line]
    assert len(warnings) == 1 and warnings[0].endswith("building locally without it for the rest of this build"), \
        done.stderr
    assert {origins(dead)[name] for name in TASKS} == {"compiled", "validated"}
    from epbuild.files.owners import owner_gone

    (marks,) = (dead.artifacts / ".scratch").glob("said.*")  # the build's mark: swept by the next build
    assert owner_gone(marks.name)


def test_two_builders_filling_the_remote_at_once_leave_one_valid_entry_per_fingerprint(tmp_path, host_cache, s3):
    bucket = s3.new_bucket()
    builders = [clone(tmp_path, host_cache, name, s3, bucket, EPBUILD_CACHE_SIGNING_KEY=SIGNING_KEY)
                for name in ("a", "b")]
    processes = [subprocess.Popen([sys.executable, "-m", "doit"], cwd=p.root, env=p.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for p in builders]
    outputs = [process.communicate(timeout=600) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    assert not any("warning" in err for _, err in outputs)
    assert tree_bytes(builders[0].artifacts) == tree_bytes(builders[1].artifacts)
    entries = build_report(builders[0]).values()
    fingerprints = {entry["fingerprint"] for entry in entries if "fingerprint" in entry}
    # a validation one builder restored from the other's upload names no reference: both reports together do
    references = {entry["cpu_reference"]["fingerprint"] for builder in builders
                  for entry in build_report(builder).values() if "cpu_reference" in entry}
    assert len(references) == 4  # tinycnn's and encoder's serve both their targets, dynbatch's two chains have two
    assert len([key for key in s3.objects(bucket) if "/ac/" in key]) == len(fingerprints) + len(references) + len(
        STAGES)
    reader = clone(tmp_path, host_cache, "c", s3, bucket, EPBUILD_CACHE_SIGNING_KEY=SIGNING_KEY)
    done = reader.doit()
    assert not refusals(done) and {origins(reader)[name] for name in TASKS} == {"remote"}


def test_doit_cache_shows_the_settings_and_a_bad_remote_url_is_one_error(tmp_path, host_cache, s3):
    bucket = s3.new_bucket()
    project = clone(tmp_path, host_cache, "a", s3, bucket, EPBUILD_CACHE_SIGNING_KEY=SIGNING_KEY)
    project.doit("compile:tinycnn@cpu")
    shown = project.doit("cache").stdout
    assert "local cache: " in shown and "1 entry," in shown
    assert f"s3://{bucket}/team/epbuild at {s3.endpoint}: reachable; read-write; entries signed" in shown
    assert_no_secret(shown)
    project.manifest(MANIFEST.replace("s3://BUCKET/team/epbuild", "https://example.com/cache"))
    bad = project.doit("list", check=False)
    assert bad.returncode != 0 and "models.toml: cache.remote: must be an S3 URL" in bad.stderr
    project.manifest(MANIFEST.replace("BUCKET", bucket))
    project.env["EPBUILD_CACHE_REMOTE"] = "s3:/missing-slash"
    bad = project.doit("list", check=False)
    assert bad.returncode != 0 and "EPBUILD_CACHE_REMOTE: must be an S3 URL" in bad.stderr
    project.env["EPBUILD_CACHE_REMOTE"] = ""  # empty: no remote for this run
    assert "remote cache: none" in project.doit("cache").stdout


def test_a_bucket_that_does_not_exist_says_how_to_create_it(tmp_path, host_cache, s3):
    project = clone(tmp_path, host_cache, "a", s3, "no-such-bucket-here")
    shown = project.doit("cache").stdout
    assert ("the bucket no-such-bucket-here does not exist: create it (aws s3 mb s3://no-such-bucket-here) or fix "
            "the URL") in shown
    done = project.doit("compile:tinycnn@cpu")
    (warning,) = [line for line in done.stderr.splitlines() if "remote cache" in line]
    assert "NoSuchBucket" in warning and "aws s3 mb s3://no-such-bucket-here" in warning


# ---- the remote module on its own ----

def unsigned_remote(tmp_path: Path, s3: S3Server, monkeypatch) -> tuple[str, remote_cache.RemoteCache, ArtifactCache]:
    """A new bucket, this process's AWS settings pointed at it without a signing key, a remote on its `p/` prefix
    and an empty local cache."""
    bucket = s3.new_bucket()
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("EPBUILD_CACHE_SIGNING_KEY", raising=False)
    return bucket, remote_cache.RemoteCache(f"s3://{bucket}/p"), ArtifactCache(tmp_path / "cache",
                                                                              FileHashes(tmp_path / "state"))


def test_a_manifest_naming_a_file_outside_its_entry_is_refused(tmp_path, s3, monkeypatch, capsys):
    bucket, remote, cache = unsigned_remote(tmp_path, s3, monkeypatch)
    fingerprint = "ab" * 32
    source = tmp_path / "out"
    source.mkdir()
    (source / "model.onnx").write_bytes(b"x" * 100)
    digests = {"model.onnx": remote_cache.hashlib.sha256(b"x" * 100).hexdigest()}
    assert remote.upload(fingerprint, source, digests, {}, "compile:m@t") > 100
    tamper(s3, bucket, f"p/ac/{fingerprint}.json", lambda data: data.replace(b'"model.onnx"', b'"../../escape"'))
    assert remote.fetch(fingerprint, cache, "compile:m@t") is None
    assert "outside its entry" in capsys.readouterr().err
    assert not (tmp_path / "escape").exists() and not list((tmp_path / "cache").rglob("escape"))
    other = "cd" * 32  # a file named as the local cache's own record would pass for it
    assert remote.upload(other, source, digests, {}, "compile:m@t") > 100
    tamper(s3, bucket, f"p/ac/{other}.json", lambda data: data.replace(b'"model.onnx"', b'"' + RECORD.encode() + b'"'))
    assert remote.fetch(other, cache, "compile:m@t") is None
    assert f"names a file {RECORD}, which the local cache reserves" in capsys.readouterr().err
    assert cache.restore(other, tmp_path / "restored") is None


def test_large_blobs_go_up_in_parts_create_only_and_come_back_verified(tmp_path, s3, monkeypatch):
    bucket = s3.new_bucket()
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(remote_cache, "SINGLE_PUT_LIMIT", 6 * 1024 * 1024)
    monkeypatch.setattr(remote_cache, "PART_SIZE", 5 * 1024 * 1024)
    data = bytes(range(256)) * (12 * 4096)  # 12 MiB: three parts
    source = tmp_path / "out"
    source.mkdir()
    (source / "weights.bin").write_bytes(data)
    digest = remote_cache.hashlib.sha256(data).hexdigest()
    writer = remote_cache.RemoteCache(f"s3://{bucket}")
    assert writer.upload("cd" * 32, source, {"weights.bin": digest}, {}, "compile:big@t") >= len(data)
    assert writer.upload("ef" * 32, source, {"weights.bin": digest}, {}, "compile:big2@t") < 10_000  # blob reused
    cache = ArtifactCache(tmp_path / "cache", FileHashes(tmp_path / "state"))
    assert remote_cache.RemoteCache(f"s3://{bucket}").fetch("cd" * 32, cache, "compile:big@t") >= len(data)
    restored = tmp_path / "restored"
    assert cache.restore("cd" * 32, restored) == ["weights.bin"]
    assert (restored / "weights.bin").read_bytes() == data


def test_credentials_are_redacted_from_every_message(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("EPBUILD_CACHE_SIGNING_KEY", SIGNING_KEY)
    text = remote_cache.redact(f"failed: {SECRET_KEY} and {SIGNING_KEY} at https://user:{SECRET_KEY}@host/x")
    assert SECRET_KEY not in text and SIGNING_KEY not in text and "user" not in text
