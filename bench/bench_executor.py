"""Dask executor overhead: COPIES tiny cpu targets (compile + validate), empty caches, on this machine.

    python bench/bench_executor.py [COPIES]

Three runs side by side: local `doit -n 2`, and `doit -n 2` with EPBUILD_EXECUTOR and one, then two
`python -m epbuild.worker` processes (one thread each) on 127.0.0.1. All run on the same 2 cores, so the
ratios show the per-job overhead (sending inputs and outputs by content, scheduling), not a speed-up; a second real
machine adds its cores. Writes bench/results/executor.json.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import save

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def clone(folder: Path, copies: int) -> None:
    folder.mkdir(parents=True)
    shutil.copy(REPO / "dodo.py", folder / "dodo.py")
    (folder / "models").mkdir()
    for i in range(copies):
        shutil.copy(REPO / "models" / "tinycnn.onnx", folder / "models" / f"copy{i}.onnx")
    (folder / "models.toml").write_text('[targets.cpu]\nep = "cpu"\n' + "".join(
        f'[models.copy{i}]\npath = "models/copy{i}.onnx"\n' for i in range(copies)))


def build(folder: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "doit", "-n", "2"], cwd=folder, env=env, check=True, capture_output=True)
    return round(time.perf_counter() - started, 2)


def main() -> None:
    copies = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    base = {**os.environ, "PYTHONPATH": str(REPO / "rules")}
    results: dict[str, float] = {}
    processes: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        try:
            clone(tmp / "local", copies)
            results["local_n2_s"] = build(tmp / "local", {**base, "EPBUILD_CACHE_DIR": str(tmp / "cache-local")})
            address = f"tcp://127.0.0.1:{free_port()}"
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                 address.rsplit(":", 1)[1], "--no-dashboard"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True))
            for workers in (1, 2):
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "epbuild.worker", address, "--workdir", str(tmp / f"w{workers}"),
                     "--name", f"w{workers}", "--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1"], env=base,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
                time.sleep(8)  # the worker probes its host, then registers
                clone(tmp / f"dask{workers}", copies)
                results[f"dask_{workers}_worker_s"] = build(tmp / f"dask{workers}", {
                    **base, "EPBUILD_CACHE_DIR": str(tmp / f"cache-{workers}"), "EPBUILD_EXECUTOR": address})
        finally:
            for process in processes:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    jobs = 2 * copies
    results["per_job_overhead_1_worker_ms"] = round(
        (results["dask_1_worker_s"] - results["local_n2_s"]) / jobs * 1000, 1)
    print(f"{copies} targets ({jobs} jobs): local -n 2 {results['local_n2_s']} s; Dask, 1 worker "
          f"{results['dask_1_worker_s']} s ({results['dask_1_worker_s'] / results['local_n2_s']:.2f}x); 2 workers "
          f"{results['dask_2_worker_s']} s ({results['dask_2_worker_s'] / results['local_n2_s']:.2f}x)")
    local, one, two = results["local_n2_s"], results["dask_1_worker_s"], results["dask_2_worker_s"]
    save("executor", [(f"{copies} tiny cpu targets ({jobs} jobs), empty caches, `doit -n 2`: local vs Dask with 1 / 2 "
                       "workers (one thread each) on the same cores",
                       f"{local} s vs {one} s (1 worker: jobs run one at a time) / {two} s (2 workers: "
                       f"{two / local:.2f}x local)")], {"copies": copies, **results})


if __name__ == "__main__":
    main()
