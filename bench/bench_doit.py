"""Task-creation and no-op cost: `doit list` and a no-op `doit` for N targets, against a bare dodo.py with N
trivial tasks (2 file_deps, 1 target each), run side by side. Prints medians and ratios (goal: <= 1.5x).
Each target is two tasks (compile and validate), so a bare dodo.py with 2N tasks is timed too: the per-task ratio.

    python bench/bench_doit.py [N] [REPEATS] [KEEP_DIR]

The project side declares N/2 models (copies of tinycnn) x 2 targets (cpu, qnn-htp) and builds them for real
first (`doit -n 2`, about 10 minutes for N=1000 on 2 cores); the timed runs then find everything up to date.
With KEEP_DIR the three projects and the cache stay there, and a later run reuses the build. Writes
bench/results/doit.json.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import save

REPO = Path(__file__).resolve().parent.parent

BARE_DODO = '''
from pathlib import Path
DOIT_CONFIG = {{"backend": "sqlite3", "dep_file": ".doit.db", "verbosity": 0}}

def touch(path):
    Path(path).write_text("x")

def task_trivial():
    for i in range({n}):
        yield {{"name": str(i), "actions": [(touch, [f"out/{{i}}.txt"])],
               "file_dep": [f"in/{{i}}.a", f"in/{{i}}.b"], "targets": [f"out/{{i}}.txt"]}}
'''


def environment() -> dict[str, str]:
    """As a user's shell: bytecode caching on (this sandbox sets PYTHONDONTWRITEBYTECODE, which would make every
    run recompile the rules package), the repository importable."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(REPO / "rules")}


def timed(args: list[str], cwd: Path, repeats: int, env: dict[str, str] | None = None) -> float:
    env = env or environment()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(args, cwd=cwd, env=env, check=True, capture_output=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def make_bare(folder: Path, n: int) -> None:
    (folder / "in").mkdir(parents=True)
    (folder / "out").mkdir()
    for i in range(n):
        (folder / "in" / f"{i}.a").write_text("a")
        (folder / "in" / f"{i}.b").write_text("b")
    (folder / "dodo.py").write_text(BARE_DODO.format(n=n))


def make_project(folder: Path, n: int) -> None:
    (folder / "models").mkdir(parents=True)
    shutil.copy(REPO / "dodo.py", folder / "dodo.py")
    lines = ['[targets.cpu]\nep = "cpu"\n', '[targets.qnn-htp]\nep = "qnn"\noptions = { soc_model = 60 }\n']
    for i in range(n // 2):
        shutil.copy(REPO / "models" / "tinycnn.onnx", folder / "models" / f"m{i}.onnx")
        lines.append(f'[models.m{i}]\npath = "models/m{i}.onnx"\n')
    (folder / "models.toml").write_text("\n".join(lines))


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    keep = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    doit = [sys.executable, "-m", "doit"]
    with tempfile.TemporaryDirectory() as tmp:
        top = keep / str(n) if keep else Path(tmp)
        bare, double, project = top / "bare", top / "bare2n", top / "project"
        if not (project / "models.toml").exists():
            shutil.rmtree(top, ignore_errors=True)
            make_bare(bare, n)
            make_bare(double, 2 * n)
            make_project(project, n)
        shutil.copy(REPO / "dodo.py", project / "dodo.py")  # a kept project gets the current one
        for folder in (bare, double):
            subprocess.run([*doit], cwd=folder, check=True, capture_output=True, env=environment())
        env = {**environment(), "EPBUILD_CACHE_DIR": str(top / "cache"), "EPBUILD_PROGRESS": "plain"}
        start = time.perf_counter()
        subprocess.run([*doit, "-n", "2", "-P", "process"], cwd=project, env=env, check=True, capture_output=True)
        build_s = time.perf_counter() - start
        noop = subprocess.run(doit, cwd=project, env=env, check=True, capture_output=True, text=True).stdout
        assert ".  " not in noop, f"the project's no-op run executed a task:\n{noop}"
        rows = {}
        full = {**env, "EPBUILD_FAST_PATH": "0"}  # every task created and checked, as after a change
        for label, args in (("doit list", [*doit, "list"]), ("no-op doit", doit)):
            rows[label] = {"bare_s": timed(args, bare, repeats), "bare_double_s": timed(args, double, repeats),
                           "project_s": timed(args, project, repeats, env),
                           "project_full_s": timed(args, project, repeats, full)}
    print(f"{n} targets ({2 * n} tasks), median of {repeats} runs; the build before took {build_s:.0f} s, -n 2")
    print(f"{'command':<12} {f'bare {n} s':>11} {f'bare {2 * n} s':>11} {'project s':>10} {'ratio':>6} "
          f"{'per task':>9}")
    table = []
    for label, row in rows.items():
        ratio, per_task = row["project_s"] / row["bare_s"], row["project_s"] / row["bare_double_s"]
        full_ratio = row["project_full_s"] / row["bare_s"]
        print(f"{label:<12} {row['bare_s']:>11.3f} {row['bare_double_s']:>11.3f} {row['project_s']:>10.3f} "
              f"{ratio:>6.2f} {per_task:>9.2f}   full path {row['project_full_s']:.3f} s ({full_ratio:.2f}x)")
        shortcut = "the cached listing" if label == "doit list" else "the no-op stamp"
        table.append((f"`{label}`, {n} targets ({n // 2} models x cpu, qnn-htp), everything up to date",
                      f"{row['project_s']:.3f} s with {shortcut}; a bare dodo.py with {n} trivial tasks "
                      f"{row['bare_s']:.3f} s (**{ratio:.2f}x**, goal 1.5x), with {2 * n} tasks "
                      f"{row['bare_double_s']:.3f} s; without the shortcut (the first run after a change) "
                      f"{row['project_full_s']:.3f} s ({full_ratio:.2f}x)"))
    save("doit", table, {"targets": n, "repeats": repeats, "build_before_s": round(build_s, 1),
                         **{label: {k: round(v, 4) for k, v in row.items()} for label, row in rows.items()}})

if __name__ == "__main__":
    main()
