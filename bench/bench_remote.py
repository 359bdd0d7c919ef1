"""Remote cache figures: a fresh clone with an empty local cache restoring from an S3-API remote, against a cold
build and against a restore from a warm local cache.

    python bench/bench_remote.py [COPIES]

The remote is moto's S3-API server on 127.0.0.1 (no network latency or bandwidth limit: on a real object store
add about one round trip per file and the transfer time). Two cases, each a full `doit` (stages, compiles,
validations): the shipped example, and COPIES (default 100) copies of the tiny CNN for the cpu target. Writes
bench/results/remote.json and prints the ratios.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import boto3
from bench_cache import make_clone  # the same clone: dodo.py, models/, configs/, COPIES of tinycnn
from moto.server import ThreadedMotoServer

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from record import save  # noqa: E402

logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise


def build(folder: Path, env: dict[str, str], cache: Path) -> dict[str, object]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "doit"], cwd=folder, env={**env, "EPBUILD_CACHE_DIR": str(cache)},
                          check=True, capture_output=True, text=True)
    wall = time.perf_counter() - started
    report = json.loads((folder / "artifacts" / "build-report.json").read_text())["tasks"]
    origins: dict[str, int] = {}
    for entry in report.values():
        origin = entry.get("from", entry["status"])
        origins[origin] = origins.get(origin, 0) + 1
    summary = next((line for line in done.stdout.splitlines() if line.startswith("summary: ")), "")
    return {"wall_s": round(wall, 2), "tasks": origins, "summary": summary}


def case(label: str, manifest: str, copies: int, tmp: Path, env: dict[str, str]) -> dict[str, object]:
    for name in ("cold", "remote", "local"):
        make_clone(tmp / f"{label}-{name}", manifest, copies)
    cold = build(tmp / f"{label}-cold", env, tmp / f"{label}-cache-cold")
    remote = build(tmp / f"{label}-remote", env, tmp / f"{label}-cache-remote")  # empty local cache
    local = build(tmp / f"{label}-local", env, tmp / f"{label}-cache-cold")  # the cold build's local cache
    result = {"cold": cold, "remote_restore": remote, "local_restore": local,
              "cold_over_remote": round(cold["wall_s"] / remote["wall_s"], 1),
              "remote_over_local": round(remote["wall_s"] / local["wall_s"], 2)}
    print(f"{label}: cold {cold['wall_s']} s, restore from the remote {remote['wall_s']} s "
          f"({result['cold_over_remote']}x faster than cold), from the local cache {local['wall_s']} s "
          f"(remote/local {result['remote_over_local']}x)\n  {remote['summary']}")
    return result


def main() -> None:
    copies = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        env = {**os.environ, "PYTHONPATH": str(REPO / "rules"), "AWS_ENDPOINT_URL": endpoint,
               "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
               "NO_PROXY": "127.0.0.1"}
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                              aws_secret_access_key="bench")
        client.create_bucket(Bucket="bench")
        remote = '\n[cache]\nremote = "s3://bench/{label}"\n'
        results = {}
        with tempfile.TemporaryDirectory() as name:
            tmp = Path(name)
            shipped = (REPO / "models.toml").read_text() + remote.format(label="shipped")
            results["shipped"] = case("shipped", shipped, 0, tmp, env)
            many = ('[targets.cpu]\nep = "cpu"\n' + "".join(
                f'[models.copy{i}]\npath = "models/copy{i}.onnx"\n' for i in range(copies))
                + remote.format(label="copies"))
            results[f"{copies}_tiny_cpu_targets"] = case(f"{copies}-tiny", many, copies, tmp, env)
    finally:
        server.stop()
    rows = []
    for label, what in (("shipped", "shipped example"), (f"{copies}_tiny_cpu_targets", f"{copies} tiny cpu targets")):
        result = results[label]
        rows.append((f"fresh clone, empty local cache, restoring from the remote cache (moto S3 on loopback), full "
                     f"`doit`, {what}", f"{result['remote_restore']['wall_s']} s vs {result['cold']['wall_s']} s cold "
                     f"({result['cold_over_remote']}x); from a warm local cache {result['local_restore']['wall_s']} s"))
    save("remote", rows, {"copies": copies, **results})


if __name__ == "__main__":
    main()
