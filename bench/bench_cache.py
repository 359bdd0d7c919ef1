"""Cache figures: restore versus cold compile, hashing throughput, files hashed by a no-op run.

    python bench/bench_cache.py [COPIES]

1. The shipped example, and COPIES (default 100) copies of tinycnn for qnn-htp: `doit compile group` in a clone
   with an empty cache, then in a fresh clone sharing that cache. Both the wall time and the sum of the compile
   tasks' own seconds (from build-report.json, without doit's start-up) are compared.
2. sha256 of a 1 GB file: epbuild.files.hashing.sha256_file against `sha256sum`.
3. Lines appended to the hash memory by a no-op `doit` (each line is one file read and hashed).

Writes bench/results/cache.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "rules"))

from epbuild.files.hashing import sha256_file  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
from record import save  # noqa: E402


def make_clone(folder: Path, manifest: str, copies: int) -> None:
    folder.mkdir(parents=True)
    shutil.copy(REPO / "dodo.py", folder / "dodo.py")
    shutil.copytree(REPO / "models", folder / "models", ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    shutil.copytree(REPO / "configs", folder / "configs")
    for i in range(copies):
        shutil.copy(REPO / "models" / "tinycnn.onnx", folder / "models" / f"copy{i}.onnx")
    (folder / "models.toml").write_text(manifest)


def build(folder: Path, cache: Path) -> tuple[float, float, dict[str, int]]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "rules"), "EPBUILD_CACHE_DIR": str(cache)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "doit", "compile", "group"], cwd=folder, env=env, check=True,
                   capture_output=True)
    wall = time.perf_counter() - start
    report = json.loads((folder / "artifacts" / "build-report.json").read_text())["tasks"]
    tasks = {n: e for n, e in report.items() if n.startswith(("compile:", "group:")) and "seconds" in e}
    counts: dict[str, int] = {}
    for entry in tasks.values():
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
    return wall, sum(e["seconds"] for e in tasks.values()), counts


def compare(label: str, manifest: str, copies: int, tmp: Path) -> dict[str, float]:
    cache = tmp / f"{label}-cache"
    make_clone(tmp / f"{label}-a", manifest, copies)
    make_clone(tmp / f"{label}-b", manifest, copies)
    cold_wall, cold_tasks, cold_counts = build(tmp / f"{label}-a", cache)
    warm_wall, warm_tasks, warm_counts = build(tmp / f"{label}-b", cache)
    print(f"{label}: cold {cold_wall:.2f} s wall / {cold_tasks:.2f} s in tasks {cold_counts}; "
          f"restore {warm_wall:.2f} s wall / {warm_tasks:.2f} s in tasks {warm_counts}; "
          f"ratio {cold_wall / warm_wall:.1f}x wall, {cold_tasks / warm_tasks:.1f}x in tasks")
    return {"cold_wall_s": round(cold_wall, 2), "restore_wall_s": round(warm_wall, 2),
            "cold_tasks_s": round(cold_tasks, 3), "restore_tasks_s": round(warm_tasks, 3)}


def row(what: str, result: dict[str, float]) -> tuple[str, str]:
    return (what, f"{result['restore_wall_s']:.2f} s vs {result['cold_wall_s']:.2f} s wall "
                  f"({result['cold_wall_s'] / result['restore_wall_s']:.1f}x); {result['restore_tasks_s']:.2f} s vs "
                  f"{result['cold_tasks_s']:.2f} s inside the tasks "
                  f"({result['cold_tasks_s'] / max(result['restore_tasks_s'], 0.001):.0f}x)")


def main() -> None:
    copies = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        shipped = compare("shipped", (REPO / "models.toml").read_text(), 0, tmp)
        many = '[targets.qnn-htp]\nep = "qnn"\noptions = { soc_model = 60 }\n' + "".join(
            f'[models.copy{i}]\npath = "models/copy{i}.onnx"\n' for i in range(copies))
        many_result = compare(f"{copies}-copies", many, copies, tmp)

        big = tmp / "big.bin"
        with open(big, "wb") as handle:
            for _ in range(1024):
                handle.write(os.urandom(1 << 20))
        subprocess.run(["sha256sum", str(big)], check=True, capture_output=True)  # page cache warm for both
        start = time.perf_counter()
        subprocess.run(["sha256sum", str(big)], check=True, capture_output=True)
        tool = time.perf_counter() - start
        start = time.perf_counter()
        sha256_file(big)
        ours = time.perf_counter() - start
        print(f"sha256 of 1 GiB: sha256sum {tool:.2f} s, epbuild.files.hashing {ours:.2f} s, "
              f"relative speed {tool / ours:.2f}x")

        folder = tmp / "shipped-b"
        shards = folder / "artifacts" / ".state" / "hashes"  # the hash memory's lines (`state.hash_memory`)

        def lines() -> int:
            return sum(len(shard.read_text().splitlines()) for shard in shards.glob("*.tsv"))

        env = {**os.environ, "PYTHONPATH": str(REPO / "rules"), "EPBUILD_CACHE_DIR": str(tmp / "shipped-cache")}
        subprocess.run([sys.executable, "-m", "doit"], cwd=folder, env=env, check=True, capture_output=True)
        before = lines()
        subprocess.run([sys.executable, "-m", "doit"], cwd=folder, env=env, check=True, capture_output=True)
        hashed = lines() - before
        print(f"files hashed by a no-op doit: {hashed}")
    save("cache", [
        row("restore vs cold compile, shipped example (`doit compile group`, empty cache vs a clone sharing it)",
            shipped),
        row(f"restore vs cold compile, {copies} copies of tinycnn for qnn-htp", many_result),
        ("sha256 of 1 GiB, `epbuild.files.hashing` vs `sha256sum`",
         f"{ours:.2f} s vs {tool:.2f} s ({tool / ours:.1f}x the speed)"),
        ("files hashed by a no-op `doit`", str(hashed))],
        {"shipped": shipped, f"{copies}_copies": many_result, "sha256_1gib_s": {"ours": round(ours, 3),
         "sha256sum": round(tool, 3)}, "hashed_by_noop": hashed})


if __name__ == "__main__":
    main()
