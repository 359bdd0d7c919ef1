"""Per-job start-up: clean builds with fresh children (`EPBUILD_FORK_SERVER=0`, as before the fork server), with a
forked child per job (`EPBUILD_FORK_SERVER=fork`) and with warm workers (the default), side by side in one run,
against the one-process floor.

    python bench/bench_fork.py [COPIES] [TINY] [REPEATS]

1. COPIES (40) copies of the shipped tiny CNN for the `cpu` target, with the project on the disk and again on
   tmpfs (/dev/shm: this VM's disk, ext4 with online discard, takes 0.1-0.8 ms per file created, which a build
   does ~10 times per model and the one-process floor 2-3 times; each build and each floor starts after a
   `sync`, so that the cleanup before it and the dirty pages of the build before it are not written back in the
   middle of the measurement): a clean serial `doit` (COPIES compiles and
   COPIES validations, empty cache, no fork server running: each build gets its own TMPDIR, so it pays the
   server's start) in each mode, the median of REPEATS (3; fresh children once), and with warm workers once more
   with the fork server already running. The floor is the issue's: one Python process started for the same
   compiles and validations (imports included, as a build pays them); the same work after a warm-up inside that
   process is printed too. The ratio is the median of each repeat's warm-worker build over the floor measured just
   before it, with the host's CPU pressure then: this VM's speed drifts by up to 50% within minutes.
2. TINY (100) tiny targets: TINY/2 copies x (cpu, qnn-htp), clean `doit -n 2`, in each mode.
3. Starting a fork server (imports, EP registration) once, and a job that does nothing (start-up alone; it imports
   only epbuild's child helper, so a fresh child's figure here is below a real job's 0.24-0.36 s).

Writes bench/results/fork.json.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "rules"))
sys.path.insert(0, str(REPO / "bench"))

from bench_doit import environment  # noqa: E402
from record import save  # noqa: E402

TARGETS = {"cpu": '[targets.cpu]\nep = "cpu"\n',
           "qnn-htp": '[targets.qnn-htp]\nep = "qnn"\noptions = { soc_model = 60 }\n'}


def make_project(folder: Path, copies: int, targets: list[str]) -> None:
    (folder / "models").mkdir(parents=True)
    shutil.copy(REPO / "dodo.py", folder / "dodo.py")
    lines = [TARGETS[t] for t in targets]
    for i in range(copies):
        shutil.copy(REPO / "models" / "tinycnn.onnx", folder / "models" / f"m{i}.onnx")
        lines.append(f'[models.m{i}]\npath = "models/m{i}.onnx"\n')
    (folder / "models.toml").write_text("\n".join(lines))


def clean_build(folder: Path, mode: str, args: list[str], builds: int = 1) -> float:
    """Seconds of the last of `builds` clean builds (no artifacts, no doit state, an empty cache) sharing one
    private TMPDIR, removed afterwards (so their fork servers leave too): the first starts the servers, a later one
    finds them running."""
    with tempfile.TemporaryDirectory() as servers:
        for _ in range(builds):
            shutil.rmtree(folder / "artifacts", ignore_errors=True)
            (folder / ".doit.db.epbuild").unlink(missing_ok=True)
            cache = folder.with_name(f"{folder.name}-cache")
            shutil.rmtree(cache, ignore_errors=True)
            os.sync()  # the removal's writes and the previous build's dirty pages land before timing, not in it
            env = {**environment(), "EPBUILD_CACHE_DIR": str(cache), "EPBUILD_FORK_SERVER": mode,
                   "EPBUILD_PROGRESS": "plain", "TMPDIR": servers}
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "doit", *args], cwd=folder, env=env, capture_output=True,
                                  text=True)
            seconds = time.perf_counter() - start
            if done.returncode != 0 or "failed" in done.stdout:
                raise SystemExit(f"build failed:\n{done.stdout}\n{done.stderr}")
    return seconds


def floor_work(folder: Path) -> float:
    """In this process: the compiles and validations, then the same again, timed (the work once warm)."""
    from epbuild.files.layout import Layout
    from epbuild.manifest.parse import load
    from epbuild.plan.targets import plan
    from epbuild.steps.compile import _compile_in_child
    from epbuild.steps.compilers.ort import compile_request
    from epbuild.steps.validate import _validate_in_child, validation_request

    layout = Layout(folder / "artifacts")
    builds = plan(load(folder / "models.toml"))
    scratch = Path(tempfile.mkdtemp(dir=folder))

    def both(build, index: int) -> None:
        (scratch / str(index)).mkdir()
        _compile_in_child(compile_request(build, scratch / str(index)).to_json())
        _validate_in_child(validation_request(build, build.out_dir(layout)).to_json())

    for index, build in enumerate(builds):
        both(build, index)  # imports and first sessions: part of the process's figure
    started = time.perf_counter()
    for index, build in enumerate(builds):
        both(build, len(builds) + index)
    seconds = time.perf_counter() - started
    shutil.rmtree(scratch)
    return seconds


def floor(folder: Path) -> tuple[float, float]:
    """(seconds of one Python process started for the work, imports included; the work alone once warm)."""
    os.sync()  # as before each build
    start = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--floor", str(folder)], env=environment(), check=True,
                          capture_output=True, text=True)
    warm = float(done.stdout.strip().splitlines()[-1])
    return time.perf_counter() - start - warm, warm  # the process without its second (warm) round


def server_start() -> float:
    """Seconds from starting a fork server for QNN until it serves."""
    with tempfile.TemporaryDirectory() as tmp:
        socket_path = Path(tmp) / "s.sock"
        start = time.perf_counter()
        server = subprocess.Popen([sys.executable, "-m", "epbuild.execute.server_process", str(socket_path), "qnn"],
                                  env=environment(), stdout=subprocess.PIPE, text=True)
        line = server.stdout.readline()
        seconds = time.perf_counter() - start
        if not line.startswith("serving"):
            raise SystemExit(f"the fork server did not start: {line}{server.stdout.read()}")
        socket_path.unlink()
        server.wait(timeout=30)
    return seconds


def empty_job(mode: str, repeats: int = 20) -> float:
    """Median seconds of a job that does nothing (tests/crash_child sleeping 0 s): the start-up alone."""
    import statistics

    from epbuild.execute.child import run_child
    from epbuild.manifest.builds import Limits

    os.environ["EPBUILD_FORK_SERVER"] = mode
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO / "rules")])
    sys.path.insert(0, str(REPO / "tests"))
    try:  # a build's links keep its warm worker from job to job (epbuild before them: the process did)
        from epbuild.execute.links import Links

        build: dict = {"links": Links()}
    except ImportError:
        build = {}
    samples = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats + 1):  # the first one may start the server
            start = time.perf_counter()
            run_child("crash_child", {"action": "sleep", "seconds": 0}, Path(tmp), Limits(60), "empty job",
                      reuse=True, **build)
            samples.append(time.perf_counter() - start)
    return statistics.median(samples[1:])


MODES = {"fresh": "0", "forked": "fork", "warm": "1"}


def serial_case(serial: Path, copies: int, repeats: int) -> dict:
    """The 40-target case in `serial`: each mode's clean build against the floor, REPEATS times interleaved."""
    import statistics

    make_project(serial, copies, ["cpu"])
    clean_build(serial, MODES["warm"], [])  # the artifacts the floor validates; not measured
    samples: dict[str, list[float]] = {"forked_s": [], "warm_s": [], "warm_server_up_s": [], "floor_s": [],
                                       "floor_warm_s": [], "ratio": [], "psi_avg10": []}
    for _ in range(repeats):  # interleaved, so a slow spell of this VM touches every figure alike
        process, warm = floor(serial)
        samples["floor_s"].append(process)
        samples["floor_warm_s"].append(warm)
        samples["warm_s"].append(clean_build(serial, MODES["warm"], []))
        samples["ratio"].append(samples["warm_s"][-1] / process)  # back to back: the drift of this VM cancels
        samples["psi_avg10"].append((cpu_pressure() or [0.0])[0])
        samples["warm_server_up_s"].append(clean_build(serial, MODES["warm"], [], builds=2))
        samples["forked_s"].append(clean_build(serial, MODES["forked"], []))
    return {**{key: statistics.median(values) for key, values in samples.items()}, "samples": samples}


def cpu_pressure() -> list[float]:
    """The share of time runnable tasks waited for a CPU (Linux PSI): on a shared VM, other tenants' load shows
    here, and every figure of a run under pressure is slower."""
    try:
        fields = Path("/proc/pressure/cpu").read_text().split("\n")[0].split()
        return [float(field.split("=")[1]) for field in fields[1:3]]
    except (OSError, IndexError, ValueError):
        return []


def serial_row(copies: int, repeats: int, where: str, row: dict) -> tuple[str, str]:
    ratios, pressure = row["samples"]["ratio"], row["samples"]["psi_avg10"]
    fresh = (f", fresh children {row['fresh_s']:.2f} s ({row['fresh_s'] / row['floor_s']:.0f}x)"
             if "fresh_s" in row else "")
    return (f"{copies} copies of tinycnn for cpu, clean serial build ({copies} compiles + {copies} validations, "
            f"fork server start included), project on {where}, median of {repeats}",
            f"warm workers {row['warm_s']:.2f} s; one process doing the same work {row['floor_s']:.2f} s: "
            f"**{row['ratio']:.1f}x** that floor (goal 2.5x; each repeat's back-to-back ratio "
            f"{', '.join(f'{r:.1f}' for r in ratios)} at host CPU pressure "
            f"{', '.join(f'{p:.0f}' for p in pressure)}%); forked children {row['forked_s']:.2f} s "
            f"({row['forked_s'] / row['floor_s']:.1f}x){fresh}; with the fork server already running "
            f"{row['warm_server_up_s']:.2f} s ({row['warm_server_up_s'] / row['floor_s']:.1f}x); the work alone, "
            f"once warm in one process, {row['floor_warm_s']:.2f} s")


def main() -> None:
    if sys.argv[1:2] == ["--floor"]:
        print(floor_work(Path(sys.argv[2])))
        return

    copies, tiny, repeats = (int(sys.argv[i]) if len(sys.argv) > i else default
                             for i, default in ((1, 40), (2, 100), (3, 3)))
    results: dict[str, dict[str, float]] = {
        "host CPU pressure before (PSI some avg10, avg60, %)": {"psi": cpu_pressure()},
        "fork server start (qnn)": {"seconds": server_start()},
        "empty job (start-up only)": {f"{name}_s": empty_job(mode) for name, mode in MODES.items()}}
    with tempfile.TemporaryDirectory() as tmp:
        on_disk = Path(tmp) / "serial"
        results[f"{copies} cpu targets, serial"] = serial_case(on_disk, copies, repeats)
        shm = Path("/dev/shm")
        if shm.is_dir() and os.access(shm, os.W_OK):
            with tempfile.TemporaryDirectory(dir=shm) as memory:
                results[f"{copies} cpu targets, serial, tmpfs"] = serial_case(Path(memory) / "serial", copies,
                                                                             repeats)
        # fresh children last: their 19 s of steady load make this VM slower for minutes after
        results[f"{copies} cpu targets, serial"]["fresh_s"] = clean_build(on_disk, MODES["fresh"], [])
        mixed = Path(tmp) / "mixed"
        make_project(mixed, tiny // 2, ["cpu", "qnn-htp"])
        results[f"{tiny} targets (cpu + qnn-htp), -n 2"] = {
            f"{name}_s": clean_build(mixed, mode, ["-n", "2"]) for name, mode in MODES.items()}
    results["host CPU pressure after (PSI some avg10, avg60, %)"] = {"psi": cpu_pressure()}
    start, empty = results["fork server start (qnn)"], results["empty job (start-up only)"]
    serial, mixed = results[f"{copies} cpu targets, serial"], results[f"{tiny} targets (cpu + qnn-htp), -n 2"]
    for label, row in results.items():
        print(label, {k: v for k, v in row.items() if k != "samples"})
    save("fork", [
        ("a job's start-up: fresh child, forked child, warm worker (a job that does nothing, median of 20)",
         f"{empty['fresh_s'] * 1000:.0f} ms, {empty['forked_s'] * 1000:.1f} ms, {empty['warm_s'] * 1000:.1f} ms "
         "(goal <= 50 ms)"),
        *(serial_row(copies, repeats, where, row) for where, row in (
            ("this VM's disk", serial), ("tmpfs", results.get(f"{copies} cpu targets, serial, tmpfs"))) if row),
        (f"{tiny} tiny targets ({tiny // 2} models x cpu, qnn-htp), clean `doit -n 2`",
         f"fresh children {mixed['fresh_s']:.1f} s, forked {mixed['forked_s']:.1f} s, with warm workers for cpu "
         f"{mixed['warm_s']:.1f} s"),
        ("starting a fork server for QNN (imports, EP registration)", f"{start['seconds']:.2f} s, once per 30 s of "
         "activity")], results)


if __name__ == "__main__":
    main()
