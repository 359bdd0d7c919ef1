"""Per-job start-up: clean builds with fresh children (`EPBUILD_FORK_SERVER=0`, as before the fork server) against
children forked by the fork server, side by side in one run, and the one-process floor.

    python bench/bench_fork.py [COPIES] [TINY]

1. COPIES (40) copies of the shipped tiny CNN for the `cpu` target: a clean serial `doit` (COPIES compiles and
   COPIES validations, empty cache) with fresh children and with forked ones; the floor is the same compiles and
   validations called in this one Python process, imports and EP registration paid before the clock starts.
2. TINY (100) tiny targets: TINY/2 copies x (cpu, qnn-htp), clean `doit -n 2`, fresh vs forked children.
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
sys.path.insert(0, str(REPO))
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


def clean_build(folder: Path, fork: bool, args: list[str]) -> float:
    """A clean build: no artifacts, no doit state, an empty cache."""
    shutil.rmtree(folder / "artifacts", ignore_errors=True)
    (folder / ".doit.db").unlink(missing_ok=True)
    cache = folder.with_name(f"{folder.name}-cache")
    shutil.rmtree(cache, ignore_errors=True)
    env = {**environment(), "EPBUILD_CACHE_DIR": str(cache), "EPBUILD_FORK_SERVER": "1" if fork else "0",
           "EPBUILD_PROGRESS": "plain"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "doit", *args], cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0 or "failed" in done.stdout:
        raise SystemExit(f"build failed:\n{done.stdout}\n{done.stderr}")
    return seconds


def floor(folder: Path) -> float:
    """The same compiles and validations in this process (after one warm-up of each)."""
    from rules.build.compile import _compile_in_child
    from rules.build.compilers import compile_request
    from rules.build.validate import _validate_in_child, validation_request
    from rules.manifest.parse import load
    from rules.manifest.targets import plan
    from rules.store.layout import Layout

    layout = Layout(folder / "artifacts")
    builds = plan(load(folder / "models.toml"))
    scratch = Path(tempfile.mkdtemp(dir=folder))

    def both(build, index: int) -> None:
        (scratch / str(index)).mkdir()
        _compile_in_child(compile_request(build, scratch / str(index)))
        _validate_in_child(validation_request(build, build.out_dir(layout)))

    both(builds[0], -1)  # warm: imports, first session
    start = time.perf_counter()
    for index, build in enumerate(builds):
        both(build, index)
    return time.perf_counter() - start


def server_start() -> float:
    """Seconds from starting a fork server for QNN until it serves."""
    with tempfile.TemporaryDirectory() as tmp:
        socket_path = Path(tmp) / "s.sock"
        start = time.perf_counter()
        server = subprocess.Popen([sys.executable, "-m", "rules.execute.fork_server", str(socket_path), "qnn"],
                                  env=environment(), stdout=subprocess.PIPE, text=True)
        line = server.stdout.readline()
        seconds = time.perf_counter() - start
        if not line.startswith("serving"):
            raise SystemExit(f"the fork server did not start: {line}{server.stdout.read()}")
        socket_path.unlink()
        server.wait(timeout=30)
    return seconds


def empty_job(fork: bool, repeats: int = 20) -> float:
    """Median seconds of a job that does nothing (tests/crash_child sleeping 0 s): the start-up alone."""
    import statistics

    from rules.execute.child import Limits, run_child

    os.environ["EPBUILD_FORK_SERVER"] = "1" if fork else "0"
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO)])
    sys.path.insert(0, str(REPO / "tests"))
    samples = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats + 1):  # the first one may start the server
            start = time.perf_counter()
            run_child("crash_child", {"action": "sleep", "seconds": 0}, Path(tmp), Limits(60), "empty job")
            samples.append(time.perf_counter() - start)
    return statistics.median(samples[1:])


def main() -> None:
    copies = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    tiny = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    results: dict[str, dict[str, float]] = {
        "fork server start (qnn)": {"seconds": server_start()},
        "empty job (start-up only)": {"fresh_s": empty_job(False), "forked_s": empty_job(True)}}
    with tempfile.TemporaryDirectory() as tmp:
        serial = Path(tmp) / "serial"
        make_project(serial, copies, ["cpu"])
        fresh = clean_build(serial, False, [])
        forked = clean_build(serial, True, [])
        one_process = floor(serial)
        results[f"{copies} cpu targets, serial"] = {"fresh_s": fresh, "forked_s": forked, "floor_s": one_process}
        mixed = Path(tmp) / "mixed"
        make_project(mixed, tiny // 2, ["cpu", "qnn-htp"])
        results[f"{tiny} targets (cpu + qnn-htp), -n 2"] = {"fresh_s": clean_build(mixed, False, ["-n", "2"]),
                                                            "forked_s": clean_build(mixed, True, ["-n", "2"])}
    for label, row in results.items():
        if "seconds" in row:
            print(f"{label}: {row['seconds']:.2f} s")
            continue
        line = f"{label}: fresh children {row['fresh_s']:.2f} s, forked {row['forked_s']:.2f} s " \
               f"({row['fresh_s'] / row['forked_s']:.1f}x faster)"
        if "floor_s" in row:
            line += (f"; one process {row['floor_s']:.2f} s: fresh {row['fresh_s'] / row['floor_s']:.1f}x the floor, "
                     f"forked {row['forked_s'] / row['floor_s']:.1f}x")
        print(line)
    start, empty = results["fork server start (qnn)"], results["empty job (start-up only)"]
    serial, mixed = results[f"{copies} cpu targets, serial"], results[f"{tiny} targets (cpu + qnn-htp), -n 2"]
    save("fork", [
        ("a job's start-up, fresh child vs forked by the fork server (a job that does nothing, median of 20)",
         f"{empty['fresh_s'] * 1000:.0f} ms vs {empty['forked_s'] * 1000:.1f} ms (goal <= 50 ms)"),
        (f"{copies} copies of tinycnn for cpu, clean serial build ({copies} compiles + {copies} validations)",
         f"fresh children {serial['fresh_s']:.2f} s, forked {serial['forked_s']:.2f} s; the same work in one warm "
         f"process {serial['floor_s']:.2f} s: forked **{serial['forked_s'] / serial['floor_s']:.1f}x** that floor "
         f"(goal 2.5x), fresh {serial['fresh_s'] / serial['floor_s']:.0f}x"),
        (f"{tiny} tiny targets ({tiny // 2} models x cpu, qnn-htp), clean `doit -n 2`",
         f"fresh children {mixed['fresh_s']:.1f} s, forked {mixed['forked_s']:.1f} s "
         f"({mixed['fresh_s'] / mixed['forked_s']:.1f}x)"),
        ("starting a fork server for QNN (imports, EP registration)", f"{start['seconds']:.2f} s, once per 30 s of "
         "activity")], results)


if __name__ == "__main__":
    main()
