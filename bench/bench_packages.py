"""Model packages at scale: what `[packages.NAME]` costs a project of N targets, and what it leaves of the scale
figures.

    python bench/bench_packages.py [N] [--repeats R] [--keep DIR] [--against LABEL=RULES_DIR ...]   (default: 1000)

bench_scale's project (N/2 tinycnn copies x {cpu, qnn-htp}, DIR/N/project, built there when missing) and a copy of
it with one package per model (`[packages.mK]`: its cpu and qnn-htp variants), its own cache. Measured: the clean
packaging of the copy (every package task, the builds up to date: made, each variant checked through ONNX
Runtime's `ModelPackageContext`, nothing restored), then, interleaved, the no-op and `doit list` with and without
the packages and bare doit's of N tasks, and the first run after one model changed (its two compiles and
validations and, with packages, its package task, whose seconds are given apart). With --against, bench_scale's
copy for another checkout (the commit before packages) runs the same no-op, list and change beside them. Medians
of R runs; writes bench/results/packages.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from bench_doit import environment  # noqa: E402
from bench_scale import DOIT, _built, change_run, once  # noqa: E402
from record import save  # noqa: E402


def with_packages(project: Path, copy: Path) -> int:
    """A copy of the built project whose every model is a package; the number of packages."""
    if not copy.exists():
        shutil.copytree(project, copy, symlinks=True)
    shutil.rmtree(copy / "artifacts" / "packages", ignore_errors=True)  # made again (its cache is emptied too)
    text = (project / "models.toml").read_text()
    models = [line[len("[models."):-1] for line in text.splitlines() if line.startswith("[models.")]
    (copy / "models.toml").write_text(text + "".join(f'\n[packages.{m}]\nmodels = ["{m}"]\n' for m in models))
    return len(models)


def report(project: Path) -> dict[str, dict]:
    return json.loads((project / "artifacts" / "build-report.json").read_text())["tasks"]


def measure(n: int, repeats: int, top: Path, versions: dict[str, Path]) -> dict[str, dict[str, float]]:
    _, copies, envs = _built(n, top, versions, None)
    packaged = top / "project-packages"
    count = with_packages(copies["this"], packaged)
    copies = {"packages": packaged, **copies}
    envs = {"packages": {**envs["this"], "EPBUILD_CACHE_DIR": str(top / "cache-packages")}, **envs}
    shutil.rmtree(top / "cache-packages", ignore_errors=True)
    start = time.perf_counter()
    subprocess.run([*DOIT, "-n", "2", "-P", "process"], cwd=packaged, env=envs["packages"], check=True,
                   capture_output=True)
    clean = time.perf_counter() - start
    made = [e for name, e in report(packaged).items() if name.startswith("package:")]
    assert len(made) == count and all(e["status"] == "packaged" for e in made), "every package made, none restored"
    samples: dict[str, dict[str, list[float]]] = {label: {} for label in copies}
    for label in copies:  # the full no-op for the record, then the stamp
        for _ in range(2):
            subprocess.run(DOIT, cwd=copies[label], env=envs[label], check=True, capture_output=True)
    bare = samples.setdefault("bare", {})
    for kind, args in (("noop_s", DOIT), ("list_s", [*DOIT, "list"])):
        for _ in range(repeats):
            bare.setdefault(kind, []).append(once(args, top / "bare", environment()))  # drifts with the load as theirs
            for label in copies:
                samples[label].setdefault(kind, []).append(once(args, copies[label], envs[label]))
    labels = list(copies)
    for seed in range(repeats):
        for label in labels[::1 if seed % 2 else -1]:
            wall, work = change_run(copies[label], envs[label], 100 + seed + 1000 * labels.index(label))
            package = (report(copies[label]).get("package:m0") or {}).get("seconds") or 0.0
            for kind, value in (("change_s", wall), ("change_work_s", work), ("change_package_s", package),
                                ("change_overhead_s", wall - work - package)):
                samples[label].setdefault(kind, []).append(value)
    found = {label: {k: round(statistics.median(v), 4) for k, v in kinds.items()} for label, kinds in samples.items()}
    found["packages"].update({"packages": count, "clean_packaging_s": round(clean, 2),
                              "package_task_s_median": round(statistics.median(e["seconds"] for e in made), 3)})
    return found


def rows_for(n: int, found: dict[str, dict[str, float]]) -> list[tuple[str, str]]:
    packaged, plain = found["packages"], found["this"]
    others = "; ".join(f"{label} {f['noop_s']:.3f} / {f['list_s']:.3f} / {f['change_overhead_s']:.2f} s"
                       for label, f in found.items() if label not in ("packages", "this", "bare"))
    bare = found["bare"]
    return [
        (f"{n} targets, a package per model ({packaged['packages']}): clean packaging (builds up to date)",
         f"{packaged['clean_packaging_s']:.1f} s on 2 jobs; one package task {packaged['package_task_s_median']:.2f} s"
         " (2 variants checked through ModelPackageContext)"),
        (f"{n} targets: no-op / `doit list` / overhead of the first run after one model changed, with packages; "
         f"without{'; ' + ', '.join(k for k in found if k not in ('packages', 'this', 'bare')) if others else ''}"
         f"; bare doit's no-op / list",
         f"{packaged['noop_s']:.3f} / {packaged['list_s']:.3f} / {packaged['change_overhead_s']:.2f} s; "
         f"{plain['noop_s']:.3f} / {plain['list_s']:.3f} / {plain['change_overhead_s']:.2f} s"
         f"{'; ' + others if others else ''}; {bare['noop_s']:.3f} / {bare['list_s']:.3f} s "
         f"(overhead with packages {packaged['change_overhead_s'] / bare['noop_s']:.2f}x bare's no-op)"),
        (f"{n} targets: the changed model's package task in that run",
         f"{packaged['change_package_s']:.2f} s (its tasks {packaged['change_work_s']:.2f} s)"),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("size", nargs="?", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="keep the projects in this folder, reuse those found there")
    parser.add_argument("--against", action="append", default=[], help="LABEL=RULES_DIR of another checkout")
    arguments = parser.parse_args()
    versions = {"this": HERE.parent / "rules", **{k: Path(v) for k, v in (a.split("=", 1) for a in arguments.against)}}
    with tempfile.TemporaryDirectory(prefix="epbuild-packages.") as temporary:
        top = (arguments.keep or Path(temporary)) / str(arguments.size)
        found = measure(arguments.size, arguments.repeats, top, versions)
    for label, figures in found.items():
        print(f"N={arguments.size} {label}: {json.dumps(figures)}", flush=True)
    save("packages", rows_for(arguments.size, found), {str(arguments.size): found})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
