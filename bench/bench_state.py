"""What each shortcut under `artifacts/.state/` saves: the run it shortens, timed with the file and without it
(deleted just before that run, which writes it again), at N targets (N/2 tinycnn copies x {cpu, qnn-htp}, as
bench_scale.py builds them).

    python bench/bench_state.py [N] [--repeats R] [--keep DIR]

Medians of R, with and without interleaved; before each run with the file, one untimed run settles the project (a
run without a file leaves the next one a full check). The change rows time the first run after one model's bytes
changed, less its own tasks' seconds (from the build report). Writes bench/results/state.json; docs/state.md's
"earns its place" column names its rows. Files that are records rather than shortcuts (the settings record, the
layout marker, the lock, the settings and operator-check files) have no row: `tests/test_state.py` says what losing
each costs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from bench_doit import environment, make_project  # noqa: E402
from bench_scale import change_run  # noqa: E402
from record import save  # noqa: E402

DOIT = [sys.executable, "-m", "doit"]
# file (a glob under .state/), what the run is, its arguments, its environment, files deleted in both conditions
STAMP = ["noop.record"]  # without it a no-op is the full check: what the records below shorten
ROWS = [
    ("noop.record", "a no-op `doit`", [], {}, []),
    ("listing.json", "`doit list`", ["list"], {}, []),
    ("plan.record", "a no-op `doit` without the no-op stamp (the full check)", [], {}, STAMP),
    ("last-run.journaled", "a no-op `doit` without the no-op stamp (the full check)", [], {}, STAMP),
    ("external-data.journaled", "a no-op `doit` without the no-op stamp and the saved plan", [], {},
     [*STAMP, "plan.record"]),
    ("host.json", "a no-op `doit` without the no-op stamp (without it: the probe, a child process, and a new plan, "
     "as the key names the probe)", [], {}, STAMP),
    ("hashes/*.tsv", "a no-op `doit` without the no-op stamp, every model touched since doit's record (same bytes, "
     "new identities)", [], {}, STAMP),
]
CHANGED = [("report-parts.journaled", "the first run after one model changed, beyond its own tasks"),
           ("build-report.sha256", "the first run after one model changed, beyond its own tasks")]


def _drop(state: Path, patterns: list[str]) -> None:
    for pattern in patterns:
        for path in state.glob(pattern):
            path.unlink()


def _run(project: Path, args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([*DOIT, *args], cwd=project, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def _touch_models(project: Path) -> None:
    for model in (project / "models").glob("*.onnx"):
        os.utime(model)


def measure(project: Path, base: dict[str, str], repeats: int) -> dict[str, dict[str, float]]:
    state = project / "artifacts" / ".state"
    found: dict[str, dict[str, float]] = {}
    for pattern, _, args, extra, both in ROWS:
        env = {**base, **extra}
        if pattern.startswith("hashes"):
            _touch_models(project)
        samples: dict[str, list[float]] = {"with": [], "without": []}
        for _ in range(repeats):
            _drop(state, both)
            _run(project, args, env)  # settled: the file written, the next run's state steady
            _drop(state, both)
            samples["with"].append(_run(project, args, env))
            _drop(state, [pattern, *both])
            samples["without"].append(_run(project, args, env))
        found[pattern] = {k: statistics.median(v) for k, v in samples.items()}
        print(pattern, {k: round(v, 3) for k, v in found[pattern].items()}, flush=True)
    seed = 100
    for pattern, _ in CHANGED:
        samples = {"with": [], "without": []}
        for _ in range(repeats):
            _run(project, [], base)
            for condition in ("with", "without"):
                if condition == "without":
                    _drop(state, [pattern])
                seed += 1
                wall, work = change_run(project, base, seed)
                samples[condition].append(wall - work)
        found[pattern] = {k: statistics.median(v) for k, v in samples.items()}
        print(pattern, {k: round(v, 3) for k, v in found[pattern].items()}, flush=True)
    return found


def report_reading(project: Path, scale: int, repeats: int) -> dict[str, float]:
    """In this process: the build report as `scale` times this project's (its entries copied under other names),
    read as a run reads it: its sha256 checked against the digest file and its lines split, else decoded whole."""
    import hashlib
    import json

    from epbuild.files.entry_lines import plain_texts

    tasks = json.loads((project / "artifacts" / "build-report.json").read_text())["tasks"]
    text = "{\n" + ",\n".join(f'  "{name}#{copy}": {json.dumps(entry)}' for copy in range(scale)
                               for name, entry in sorted(tasks.items())) + "\n}\n"

    def best(read) -> float:
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            read()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples)

    return {"with": best(lambda: plain_texts(text) if hashlib.sha256(text.encode()).hexdigest() else None),
            "without": best(lambda: json.loads(text)), "entries": len(tasks) * scale}


def hash_memory(folder: Path, mib: int, repeats: int) -> dict[str, float]:
    """In this process: the sha256 of an unchanged `mib` MiB file asked for by a new reader (another process: a job,
    the next run) with the hash memory and without it."""
    from epbuild.state.hash_memory import FileHashes

    folder.mkdir(parents=True, exist_ok=True)
    big = folder / "big.bin"
    with open(big, "wb") as handle:
        for _ in range(mib):
            handle.write(os.urandom(1 << 20))
    time.sleep(0.1)  # past the clock tick it was written in: its identity may be remembered
    FileHashes(folder / "state").sha256(big)
    samples: dict[str, list[float]] = {"with": [], "without": []}
    for _ in range(repeats):
        for condition in ("with", "without"):
            if condition == "without":
                shutil.rmtree(folder / "state" / "hashes")
            start = time.perf_counter()
            FileHashes(folder / "state").sha256(big)
            samples[condition].append(time.perf_counter() - start)
    shutil.rmtree(folder)
    return {k: statistics.median(v) for k, v in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("size", nargs="?", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="keep the project in this folder, reuse one found there")
    arguments = parser.parse_args()
    top = (arguments.keep or Path(os.environ.get("TMPDIR", "/tmp")) / "epbuild-bench-state") / str(arguments.size)
    project = top / "project"
    if not (project / "models.toml").exists():
        shutil.rmtree(top, ignore_errors=True)
        make_project(project, arguments.size)
    base = {**environment(), "EPBUILD_CACHE_DIR": str(top / "cache"), "EPBUILD_PROGRESS": "plain"}
    subprocess.run([*DOIT, "-n", "2", "-P", "process"], cwd=project, env=base, check=True, capture_output=True)
    found = measure(project, base, arguments.repeats)
    described = {pattern: what for pattern, what, *_ in ROWS} | dict(CHANGED)
    rows = [(f"`.state/{pattern}` at {arguments.size} targets: {described[pattern]}",
             f"{times['with']:.3f} s with it, {times['without']:.3f} s without "
             f"({times['without'] / times['with']:.2f}x)") for pattern, times in found.items()]
    sys.path.insert(0, str(HERE.parent / "rules"))
    reading = report_reading(project, 10, arguments.repeats)
    rows.append((f"`.state/build-report.sha256`: reading a build report of {reading['entries']:,} entries "
                 f"({10 * arguments.size:,} targets' report), in one process",
                 f"{reading['with'] * 1000:.1f} ms with it (its sha256, then its lines split), "
                 f"{reading['without'] * 1000:.1f} ms without (decoded whole)"))
    hashed = hash_memory(top / "hash-memory", 256, arguments.repeats)
    rows.append(("`.state/hashes/*.tsv`: the sha256 of an unchanged 256 MiB model asked for again by another "
                 "process, in one process", f"{hashed['with'] * 1000:.1f} ms with it, {hashed['without'] * 1000:.0f} "
                 "ms without (read whole)"))
    save("state", rows, {"size": arguments.size, "repeats": arguments.repeats, "seconds": found,
                         "report_reading": reading, "hash_memory": hashed})
    if arguments.keep is None:
        shutil.rmtree(top, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
