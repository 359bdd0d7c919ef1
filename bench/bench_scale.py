"""Scale: what a build costs around the work itself, at N targets, against bare doit and ninja of the same size.

    python bench/bench_scale.py [N ...] [--repeats R] [--keep DIR] [--against LABEL=RULES_DIR ...]
                                [--snakemake PATH] [--change-only]  (default: 100 1000)

Per N: N/2 tinycnn copies x {cpu, qnn-htp}, built for real first; then, everything up to date, the no-op run and
`doit list` on the fast path (the no-op stamp, the cached listing) and the full path (EPBUILD_FAST_PATH=0); bare
doit with N and 2N trivial tasks (one file_dep... as bench_doit.py); ninja and Snakemake with N trivial jobs of the
same shape (Snakemake where `--snakemake` or PATH has it: `pip install snakemake` in a virtual environment of its
own, its dependencies are not epbuild's); and the run users have on every CI run after a commit: one model's bytes
changed, everything else up to date (its two compiles and validations are the work; the rest is overhead, from the
build report's task seconds). Medians of R runs. Growth factors between successive N are printed. Writes
bench/results/scale.json; with --change-only, only the run after one model changed, each version's interleaved with
bare doit's no-op, to bench/results/scale-change.json. With --keep, the projects stay in DIR/N and a later run
reuses them (10,000 targets take ~30 min to build on 2 cores). With --against, each other checkout's rules run on a
copy of the built project (the project key holds epbuild's sources, so one copy per version keeps each one's
records), every measure interleaved with this checkout's; each version's change runs write weights of their own, so
every one of them compiles (a restore from the other's upload would skip the model read and the fork servers that a
compile warms).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from bench_doit import environment, make_bare, make_project, timed  # noqa: E402
from record import save  # noqa: E402

from helpers import perturb_weights  # noqa: E402

DOIT = [sys.executable, "-m", "doit"]


def make_ninja(folder: Path, n: int) -> None:
    (folder / "in").mkdir(parents=True)
    lines = ["rule touch\n  command = touch $out\n"]
    for i in range(n):
        (folder / "in" / f"{i}.a").write_text("a")
        lines.append(f"build out/{i}.txt: touch in/{i}.a\n")
    (folder / "build.ninja").write_text("".join(lines))


def make_snakemake(folder: Path, n: int) -> None:
    """N jobs, each one input to one output, as the bare dodo.py and build.ninja; the outputs are written here,
    after their inputs (Snakemake 9 took ~1.7 s per job to build 10,000 of them: hours), so that its first run is
    already the no-op measured."""
    (folder / "in").mkdir(parents=True)
    (folder / "out").mkdir()
    for i in range(n):
        (folder / "in" / f"{i}.a").write_text("a")
    later = time.time() + 1
    for i in range(n):
        (folder / "out" / f"{i}.txt").write_text("")
        os.utime(folder / "out" / f"{i}.txt", (later, later))
    (folder / "Snakefile").write_text(f"""rule all:
    input: expand("out/{{i}}.txt", i=range({n}))

rule touch:
    input: "in/{{i}}.a"
    output: "out/{{i}}.txt"
    shell: "touch {{output}}"
""")


def change_run(project: Path, env: dict[str, str], seed: int) -> tuple[float, float]:
    """(wall, of which the changed model's own tasks) of a run after one model's bytes changed."""
    perturb_weights(project / "models" / "m0.onnx", seed)
    start = time.perf_counter()
    subprocess.run(DOIT, cwd=project, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    tasks = json.loads((project / "artifacts" / "build-report.json").read_text())["tasks"]
    work = sum(entry.get("seconds") or 0 for name, entry in tasks.items()
               if name.endswith(("m0@cpu", "m0@qnn-htp")) and entry.get("status") not in ("up-to-date",))
    return wall, work


def once(args: list[str], cwd: Path, env: dict[str, str]) -> float:
    return timed(args, cwd, 1, env)


def _built(n: int, top: Path, versions: dict[str, Path],
           snakemake: str | None) -> tuple[float, dict[str, Path], dict[str, dict[str, str]]]:
    """The projects of size `n` built (the first version's; a copy per other version, each with its own records),
    bare doit's, ninja's and Snakemake's up to date: (seconds of the build, project by version, env by version)."""
    bare, double, ninja, project = top / "bare", top / "bare2n", top / "ninja", top / "project"
    if not (project / "models.toml").exists():
        shutil.rmtree(top, ignore_errors=True)
        make_project(project, n)
    for folder, make in ((bare, lambda: make_bare(bare, n)), (double, lambda: make_bare(double, 2 * n)),
                         (ninja, lambda: make_ninja(ninja, n))):
        if not folder.exists():
            make()
    for folder in (bare, double):
        subprocess.run(DOIT, cwd=folder, check=True, capture_output=True, env=environment())
    subprocess.run(["ninja", "-C", str(ninja)], check=True, capture_output=True)
    snake = top / "snakemake"
    if snakemake and not (snake / "Snakefile").exists():
        make_snakemake(snake, n)
    if snakemake:
        subprocess.run([snakemake, "-c1", "--quiet"], cwd=snake, check=True, capture_output=True)
    base = {**environment(), "EPBUILD_CACHE_DIR": str(top / "cache"), "EPBUILD_PROGRESS": "plain"}
    start = time.perf_counter()
    subprocess.run([*DOIT, "-n", "2", "-P", "process"], cwd=project, env=base, check=True, capture_output=True)
    built = time.perf_counter() - start
    copies, envs = {}, {}
    for at, (label, rules) in enumerate(versions.items()):
        copies[label] = project if at == 0 else top / f"project-{label}"
        if at and not copies[label].exists():
            shutil.copytree(project, copies[label], symlinks=True)
        envs[label] = {**base, "PYTHONPATH": str(rules)}
        for _ in range(2):  # the full no-op for the record, then the stamp
            subprocess.run(DOIT, cwd=copies[label], env=envs[label], check=True, capture_output=True)
    return built, copies, envs


def _change_runs(repeats: int, copies: dict[str, Path], envs: dict[str, dict[str, str]],
                 samples: dict[str, dict[str, list[float]]], bare: Path | None = None) -> None:
    """`repeats` change runs per version, who goes first alternating; with `bare`, a bare no-op before each round
    (its figure drifts with the machine's load as theirs do)."""
    versions = list(copies)
    for seed in range(repeats):
        if bare is not None:
            samples.setdefault("bare", {}).setdefault("bare_noop_s", []).append(once(DOIT, bare, environment()))
        for label in versions[::1 if seed % 2 else -1]:
            wall, work = change_run(copies[label], envs[label], 100 + seed + 1000 * versions.index(label))
            for kind, value in (("change_s", wall), ("change_work_s", work), ("change_overhead_s", wall - work)):
                samples[label].setdefault(kind, []).append(value)


def measure(n: int, repeats: int, top: Path, versions: dict[str, Path],
            snakemake: str | None) -> dict[str, dict[str, float]]:
    """Every version's figures (the first is this checkout, which builds the project)."""
    built, copies, envs = _built(n, top, versions, snakemake)
    bare, double, ninja, snake = top / "bare", top / "bare2n", top / "ninja", top / "snakemake"
    samples: dict[str, dict[str, list[float]]] = {label: {} for label in versions}
    kinds = {"noop_fast_s": (DOIT, False), "noop_full_s": (DOIT, True), "list_fast_s": ([*DOIT, "list"], False),
             "list_full_s": ([*DOIT, "list"], True)}
    for kind, (args, full) in kinds.items():
        for _ in range(repeats):
            for label in versions:
                env = {**envs[label], "EPBUILD_FAST_PATH": "0"} if full else envs[label]
                samples[label].setdefault(kind, []).append(once(args, copies[label], env))
    for label in versions:  # after the full-path runs, a no-op for the record of this run's kind
        subprocess.run(DOIT, cwd=copies[label], env=envs[label], check=True, capture_output=True)
    _change_runs(repeats, copies, envs, samples)
    shared = {"build_s": built, "bare_noop_s": timed(DOIT, bare, repeats),
              "bare2n_noop_s": timed(DOIT, double, repeats), "bare_list_s": timed([*DOIT, "list"], bare, repeats),
              "ninja_noop_s": timed(["ninja", "-C", str(ninja)], ninja, repeats),
              **({"snakemake_noop_s": timed([snakemake, "-c1", "--quiet"], snake, repeats)} if snakemake else {})}
    return {label: {**{k: round(v, 4) for k, v in shared.items()},
                    **{k: round(statistics.median(v), 4) for k, v in found.items()}}
            for label, found in samples.items()}


def measure_change(n: int, repeats: int, top: Path, versions: dict[str, Path]) -> dict[str, dict[str, float]]:
    """`--change-only`: the first run after one model changed, each version's, interleaved with bare doit's no-op."""
    _, copies, envs = _built(n, top, versions, None)
    samples: dict[str, dict[str, list[float]]] = {label: {} for label in versions}
    _change_runs(repeats, copies, envs, samples, top / "bare")
    bare = round(statistics.median(samples.pop("bare")["bare_noop_s"]), 4)
    return {label: {"bare_noop_s": bare, **{k: round(statistics.median(v), 4) for k, v in found.items()}}
            for label, found in samples.items()}


def change_rows(n: int, every: dict[str, dict[str, float]]) -> list[tuple[str, str]]:
    """`--change-only`'s rows: each version's change run beside the others'."""
    figures = "; ".join(f"{label} {found['change_overhead_s']:.3f} s "
                        f"({found['change_overhead_s'] / found['bare_noop_s']:.2f}x)" for label, found in every.items())
    return [(f"{n} targets: first run after one model changed, overhead beyond its own tasks (x bare doit's no-op, "
             f"{every['this']['bare_noop_s']:.3f} s, interleaved)", figures)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sizes", nargs="*", type=int, default=[100, 1000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="keep the projects in this folder, reuse those found there")
    parser.add_argument("--against", action="append", default=[], help="LABEL=RULES_DIR of another checkout")
    parser.add_argument("--snakemake", default=shutil.which("snakemake"), help="the snakemake command (PATH's)")
    parser.add_argument("--name", default=None, help="the results file's name (default: scale, scale-change)")
    parser.add_argument("--change-only", action="store_true",
                        help="only the run after one model changed, beside bare doit's no-op (scale-change.json)")
    arguments = parser.parse_args()
    if arguments.change_only:
        return change_only(arguments)
    if not arguments.snakemake:
        print("snakemake: not found (--snakemake PATH); its column is left out", flush=True)
    versions = {"this": HERE.parent / "rules", **{k: Path(v) for k, v in (a.split("=", 1) for a in arguments.against)}}
    results, others, rows = {}, {}, []
    with tempfile.TemporaryDirectory(prefix="epbuild-scale.") as temporary:
        for n in arguments.sizes:
            top = (arguments.keep or Path(temporary)) / str(n)
            every = measure(n, arguments.repeats, top, versions, arguments.snakemake)
            results[n], others[n] = found, _ = every["this"], {k: v for k, v in every.items() if k != "this"}
            if not arguments.keep:
                shutil.rmtree(top, ignore_errors=True)
            for label, figures in every.items():
                print(f"N={n} {label}: {json.dumps(figures)}", flush=True)
            rows.extend(version_rows(n, found, ""))
            rows.extend(row for label, figures in others[n].items() for row in version_rows(n, figures, label))
    sizes = sorted(results)
    for small, large in itertools.pairwise(sizes):
        growth = {k: round(results[large][k] / results[small][k], 2) for k in results[small] if results[small][k]}
        print(f"growth {small} -> {large}: {json.dumps(growth)}")
        rows.append((f"growth {small} -> {large} targets (no-op full path, list full path, change overhead)",
                     f"{growth['noop_full_s']}x, {growth['list_full_s']}x, {growth['change_overhead_s']}x"))
    save(arguments.name or "scale", rows, {**{str(n): r for n, r in results.items()},
                                           **({"against": {str(n): o for n, o in others.items()}}
                                              if arguments.against else {})})
    return 0


def version_rows(n: int, found: dict[str, float], label: str) -> list[tuple[str, str]]:
    """The performance table's rows of one version's figures at N targets (`label`: another checkout's, else this
    one's)."""
    of = f" ({label})" if label else ""
    snake = f"; Snakemake {found['snakemake_noop_s']:.3f} s" if "snakemake_noop_s" in found else ""
    times_bare = found["change_overhead_s"] / found["bare_noop_s"]
    return [(f"{n} targets{of}: no-op fast / full path; bare doit {n} / {2 * n} tasks; ninja"
             f"{'; Snakemake' if snake else ''}",
             f"{found['noop_fast_s']:.3f} / {found['noop_full_s']:.3f} s; {found['bare_noop_s']:.3f} / "
             f"{found['bare2n_noop_s']:.3f} s; {found['ninja_noop_s']:.3f} s{snake}"),
            (f"{n} targets{of}: `doit list` fast / full path; bare doit",
             f"{found['list_fast_s']:.3f} / {found['list_full_s']:.3f} s; {found['bare_list_s']:.3f} s"),
            (f"{n} targets{of}: first run after one model changed (its 2 compiles + 2 validations)",
             f"{found['change_s']:.2f} s, of which the model's own tasks {found['change_work_s']:.2f} s: "
             f"overhead {found['change_overhead_s']:.2f} s ({times_bare:.1f}x a bare no-op)")]


def change_only(arguments: argparse.Namespace) -> int:
    versions = {"this": HERE.parent / "rules", **{k: Path(v) for k, v in (a.split("=", 1) for a in arguments.against)}}
    rows, results = [], {}
    with tempfile.TemporaryDirectory(prefix="epbuild-scale.") as temporary:
        for n in arguments.sizes:
            top = (arguments.keep or Path(temporary)) / str(n)
            results[str(n)] = every = measure_change(n, arguments.repeats, top, versions)
            if not arguments.keep:
                shutil.rmtree(top, ignore_errors=True)
            print(f"N={n}: {json.dumps(every)}", flush=True)
            rows.extend(change_rows(n, every))
    save(arguments.name or "scale-change", rows, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
