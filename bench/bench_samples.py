"""A dataset's validation on the HTP simulator against sixteen runs of the artifact in one process: its samples in
one process (EPBUILD_SAMPLE_PROCESSES=1) and shared by processes (the default: one per core).

    python bench/bench_samples.py [--repeats 3] [--samples 16] [--baseline DIR --baseline-name NAME]

The model: four 3x3 convolutions of 144 channels on a 48x48 image (3 MB of weights, about a second a run on the
simulator, single-threaded); the target qnn-htp (soc_model 60), `metric = "agreement"` on SAMPLES samples. The
compile is built once; each validation runs with a fresh cache (nothing restored) and `doit forget`, modes
interleaved repeat by repeat, medians of the task's own seconds (build-report.json). The floor: one process that
opens the artifact's session and runs it SAMPLES times. `--baseline DIR` (a `git archive COMMIT rules` folder) also
runs that epbuild's validation in turn. Writes bench/results/samples.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_history import conv_stack
from record import save

REPO = Path(__file__).resolve().parents[1]
MANIFEST = """[models.conv]
path = "models/conv.onnx"
validation = {{ dataset = "data/samples.npz", metric = "agreement", output = "{output}" }}

[targets.qnn-htp]
ep = "qnn"
options = {{ backend_type = "htp", soc_model = 60 }}
"""
FLOOR = """
import sys, time, numpy as np, onnxruntime as ort, onnxruntime_qnn
ort.set_default_logger_severity(3)
ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
device = next(d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider")
options = ort.SessionOptions()
options.add_provider_for_devices([device], {"backend_type": "htp", "soc_model": "60"})
session = ort.InferenceSession(sys.argv[1], options)
samples = np.load(sys.argv[2])["x"]
began = time.perf_counter()
for sample in samples:
    session.run(None, {"x": sample[None]})
print(time.perf_counter() - began)
"""


def _validate(root: Path, rules: Path, processes: str | None, cache: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(rules), "EPBUILD_CACHE_DIR": str(cache)}
    env.pop("EPBUILD_SAMPLE_PROCESSES", None)
    if processes:
        env["EPBUILD_SAMPLE_PROCESSES"] = processes
    shutil.rmtree(cache, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "doit", "forget", "validate:conv@qnn-htp"], cwd=root, env=env, check=True,
                   capture_output=True)
    done = subprocess.run([sys.executable, "-m", "doit", "validate:conv@qnn-htp"], cwd=root, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stdout + done.stderr)
    entry = json.loads((root / "artifacts" / "build-report.json").read_text())["tasks"]["validate:conv@qnn-htp"]
    return float(entry["seconds"])


def rows_from(times: dict[str, list[float]], samples: int) -> list[tuple[str, str]]:
    """Each side against the floor measured in the same repeat (this host's speed drifts between repeats): the
    median of the paired ratios, and the medians of the seconds."""
    floor = statistics.median(times["floor"])
    rows = []
    for name, values in times.items():
        if name == "floor":
            continue
        ratio = statistics.median(value / base for value, base in zip(values, times["floor"], strict=True))
        rows.append((f"a {samples}-sample validation on the HTP simulator (3 MB conv, ~{floor / samples:.1f} s a "
                     f"run), {name}", f"{ratio:.2f}x {samples} runs in one process, paired by repeat (medians "
                                      f"{statistics.median(values):.1f} s vs {floor:.1f} s)"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--baseline", default=None)
    parser.add_argument("--baseline-name", default="before")
    args = parser.parse_args()
    import numpy as np

    root = Path(tempfile.mkdtemp(prefix="bench-samples-"))
    shutil.copy(REPO / "dodo.py", root / "dodo.py")
    (root / "models").mkdir()
    (root / "data").mkdir()
    output = conv_stack(root / "models" / "conv.onnx", 48, pooled=True)
    np.savez(root / "data" / "samples.npz",
             x=np.random.default_rng(1).standard_normal((args.samples, 3, 48, 48)).astype(np.float32))
    (root / "models.toml").write_text(MANIFEST.format(output=output))
    env = {**os.environ, "PYTHONPATH": str(REPO / "rules"), "EPBUILD_CACHE_DIR": str(root / "cache-build")}
    subprocess.run([sys.executable, "-m", "doit", "compile:conv@qnn-htp"], cwd=root, env=env, check=True,
                   capture_output=True)
    artifact = root / "artifacts" / "qnn-htp" / "conv" / "conv.onnx"
    sides = {"one process": ("1", REPO / "rules"), "shared (default)": (None, REPO / "rules")}
    if args.baseline:
        sides[args.baseline_name] = (None, Path(args.baseline))
    times: dict[str, list[float]] = {name: [] for name in [*sides, "floor"]}
    for _ in range(args.repeats):
        for name, (processes, rules) in sides.items():
            times[name].append(_validate(root, rules, processes, root / "cache-validate"))
        floor = subprocess.run([sys.executable, "-c", FLOOR, str(artifact), str(root / "data" / "samples.npz")],
                               capture_output=True, text=True, check=True)
        times["floor"].append(float(floor.stdout.strip().splitlines()[-1]))
        print({name: round(values[-1], 2) for name, values in times.items()}, flush=True)
    rows = rows_from(times, args.samples)
    for row in rows:
        print(row)
    save("samples", rows, {"seconds": times, "cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%d %H:%M")})
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
