"""epbuild against the floor: one Python process that calls ONNX Runtime directly for the same work.

    python bench/bench_floor.py [--repeats 5] [--tiny 100] [--jobs 2] [--path-first DIR] [--name floor]
                                [--kinds qnn,cpu,tiny]

Projects: `qnn` (the shipped example's tinycnn and encoder for qnn-htp, soc_model 60), `cpu` (the same two for the
cpu target) and `tiny` (the 100-target project of bench_fork: TINY/2 copies of tinycnn x cpu and qnn-htp, `-n JOBS`).
For each, interleaved repeat by repeat (this VM's speed drifts), the two epbuild versions in turns, medians:

- floor, compile: one fresh process that imports onnxruntime, registers the QNN plugin where needed and compiles each
  model (ModelCompiler; the cpu target: an offline-optimized model); floor, compile and run: the same, then each
  artifact run once on its EP (QNN: the HTP simulator) and its source once on CPU;
- epbuild cold (fresh TMPDIR, so no fork server is running, as in CI or a new shell; empty cache and artifacts):
  clean without validation (`validate = false`), clean with validations; a restore (artifacts/ deleted, the cache
  warm, cold TMPDIR); a no-op after it.

`--path-first DIR` puts DIR in front of both sides' import path (another version of a package, for a before/after
in one environment); `--baseline DIR` (or `NAME=DIR`, repeatable) also runs the epbuild imported from DIR
(`git archive COMMIT rules | tar -x -C X`: DIR = X/rules) interleaved with this one, repeat by repeat, and names
its medians in the rows (`--baseline-name` for a bare DIR); `--name` names the results file. Writes
bench/results/NAME.json (rows of the performance table).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import save

REPO = Path(__file__).resolve().parents[1]
QNN = '[targets.qnn-htp]\nep = "qnn"\noptions = { backend_type = "htp", soc_model = 60 }\n'
CPU = '[targets.cpu]\nep = "cpu"\n'

FLOOR = r'''
import sys, os
import numpy as np, onnxruntime as ort
jobs, out, run = sys.argv[1], sys.argv[2], sys.argv[3] == "run"
pairs = [line.split() for line in open(jobs).read().splitlines()]
if any(t == "qnn" for _, t in pairs):
    import onnxruntime_qnn
    ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"][:1]
for index, (model, target) in enumerate(pairs):
    artifact = os.path.join(out, f"{index}.onnx")
    options = ort.SessionOptions(); options.log_severity_level = 3
    if target == "qnn":
        options.add_provider_for_devices(devices, {"backend_type": "htp", "soc_model": "60"})
        ort.ModelCompiler(options, model, flags=int(ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED)).compile_to_file(
            artifact)
    else:
        options.optimized_model_filepath = artifact
        ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    if run:
        source = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        feeds = {i.name: np.random.default_rng(0).standard_normal([d if isinstance(d, int) else 1 for d in i.shape])
                 .astype(np.float32) for i in source.get_inputs()}
        want = source.run(None, feeds)
        options = ort.SessionOptions(); options.log_severity_level = 3
        if target == "qnn":
            options.add_provider_for_devices(devices, {"backend_type": "htp"})
            got = ort.InferenceSession(artifact, options).run(None, feeds)
        else:
            got = ort.InferenceSession(artifact, options, providers=["CPUExecutionProvider"]).run(None, feeds)
        assert all(np.isfinite(g).all() for g in got)
'''


def project(folder: Path, kind: str, tiny: int) -> list[tuple[str, str]]:
    """Write the project; the (model file, target kind) pairs the floor compiles."""
    (folder / "models").mkdir(parents=True)
    shutil.copy(REPO / "dodo.py", folder / "dodo.py")
    if kind == "tiny":
        pairs, lines = [], [CPU, QNN]
        for index in range(tiny // 2):
            shutil.copy(REPO / "models" / "tinycnn.onnx", folder / "models" / f"m{index}.onnx")
            lines.append(f'[models.m{index}]\npath = "models/m{index}.onnx"\n')
            pairs += [(f"models/m{index}.onnx", "cpu"), (f"models/m{index}.onnx", "qnn")]
    else:
        target = QNN if kind == "qnn" else CPU
        lines, pairs = [target], []
        for name in ("tinycnn", "encoder"):
            shutil.copy(REPO / "models" / f"{name}.onnx", folder / "models" / f"{name}.onnx")
            lines.append(f'[models.{name}]\npath = "models/{name}.onnx"\n')
            pairs.append((f"models/{name}.onnx", kind))
    (folder / "models.toml").write_text("\n".join(lines))
    (folder / "floor_jobs.txt").write_text("\n".join(f"{m} {t}" for m, t in pairs))
    (folder / "floor.py").write_text(FLOOR)
    return pairs


FIRST: list[str] = []  # --path-first


def timed(command: list[str], folder: Path, env: dict[str, str]) -> float:
    if FIRST:
        env = {**env, "PYTHONPATH": os.pathsep.join([*FIRST, *filter(None, [env.get("PYTHONPATH")])])}
    subprocess.run(["sync"], check=False)
    started = time.monotonic()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode:
        sys.exit(f"{' '.join(command)} failed in {folder}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return seconds


def floor(folder: Path, run: bool) -> float:
    out = folder / "floor_out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    return timed([sys.executable, "floor.py", "floor_jobs.txt", str(out), "run" if run else "compile"], folder,
                 dict(os.environ))


def epbuild(folder: Path, validate: bool, jobs: int, rules: Path = REPO / "rules") -> dict[str, float]:
    """Cold clean build, a restore of it, a no-op: seconds of each, with epbuild imported from `rules`."""
    text = (folder / "models.toml").read_text()
    lines = [line for line in text.splitlines() if not line.startswith("validate = ")]
    manifest = "\n".join(line + ("\nvalidate = false" if line.startswith("ep = ") and not validate else "")
                         for line in lines) + "\n"
    (folder / "models.toml").write_text(manifest)
    found = {}
    with tempfile.TemporaryDirectory() as cache:
        with tempfile.TemporaryDirectory() as servers:
            env = {**os.environ, "PYTHONPATH": str(rules), "EPBUILD_CACHE_DIR": cache, "TMPDIR": servers}
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            shutil.rmtree(folder / "artifacts", ignore_errors=True)
            for name in (".doit.db", ".doit.db.dat", ".doit.db.dir", ".doit.db.bak"):
                (folder / name).unlink(missing_ok=True)
            command = [sys.executable, "-m", "doit", "-n", str(jobs)]
            found["clean"] = timed(command, folder, env)
            found["no-op"] = timed(command, folder, env)
        with tempfile.TemporaryDirectory() as servers:  # a new shell: no fork server running
            env["TMPDIR"] = servers
            shutil.rmtree(folder / "artifacts")
            found["restore"] = timed(command, folder, env)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tiny", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--path-first", default=None)
    parser.add_argument("--name", default="floor")
    parser.add_argument("--kinds", default="qnn,cpu,tiny", help="the projects to measure, comma-separated")
    parser.add_argument("--baseline", action="append", default=[],
                        help="another epbuild's import folder (`git archive COMMIT rules`), run interleaved too: "
                             "DIR, or NAME=DIR (repeatable)")
    parser.add_argument("--baseline-name", default="before")
    arguments = parser.parse_args()
    baselines = [(given.split("=", 1)[0], Path(given.split("=", 1)[1]).resolve()) if "=" in given
                 else (arguments.baseline_name, Path(given).resolve()) for given in arguments.baseline]
    FIRST.extend([arguments.path_first] if arguments.path_first else [])
    data: dict[str, dict[str, float]] = {}
    rows = []
    for kind in arguments.kinds.split(","):
        with tempfile.TemporaryDirectory(prefix=f"bench-floor-{kind}-") as tmp:
            folder = Path(tmp)
            project(folder, kind, arguments.tiny)
            samples: dict[str, list[float]] = {}
            jobs = arguments.jobs if kind == "tiny" else 1
            for repeat in range(arguments.repeats):
                # this version and the baseline take turns going first: the one right after the floor ran in a
                # warmer machine (a fixed order read as a 2.7% difference of the 100-target build, which pairs
                # in alternating order did not show)
                versions = [("epbuild", REPO / "rules"), *((f"baseline {name}", path) for name, path in baselines)]
                versions = versions if repeat % 2 == 0 else versions[::-1]
                for validated in (False, True):
                    samples.setdefault("floor compile and run" if validated else "floor compile",
                                       []).append(floor(folder, validated))
                    for label, rules in versions:
                        for key, value in epbuild(folder, validated, jobs, rules).items():
                            samples.setdefault(f"{label} {key}{', validated' if validated else ''}", []).append(value)
        medians = {key: round(statistics.median(values), 3) for key, values in samples.items()}
        data[kind] = medians
        compile_ratio = medians["epbuild clean"] / medians["floor compile"]
        run_ratio = medians["epbuild clean, validated"] / medians["floor compile and run"]

        def before(key: str, medians: dict[str, float] = medians) -> str:
            return "".join(f"; {name}: {medians[f'baseline {name} {key}']:.2f} s" for name, _ in baselines)

        rows += [(f"{kind}: clean build, cold, vs the floor (one process calling ONNX Runtime)",
                  f"{medians['epbuild clean']:.2f} s vs {medians['floor compile']:.2f} s ({compile_ratio:.2f}x)"
                  f"{before('clean')}"),
                 (f"{kind}: with validations vs the floor's compile and run",
                  f"{medians['epbuild clean, validated']:.2f} s vs {medians['floor compile and run']:.2f} s "
                  f"({run_ratio:.2f}x){before('clean, validated')}"),
                 (f"{kind}: restore (artifacts/ deleted, warm cache, cold TMPDIR); no-op",
                  f"{medians['epbuild restore, validated']:.2f} s; "
                  f"{medians['epbuild no-op, validated']:.2f} s{before('restore, validated')}")]
        print(kind, medians, flush=True)
    save(arguments.name, rows, {"path_first": arguments.path_first, "repeats": arguments.repeats,
                                "baselines": [name for name, _ in baselines],
                                "tiny": arguments.tiny, "jobs": arguments.jobs, "medians": data})


if __name__ == "__main__":
    main()
