"""The CPU reference kept across validations: a static MatMul chain with its weights in external data and every
shape known, built for `cpu` and `qnn-htp` (both compile the file as declared, with no stage, so their
validations compare with one reference), then
one target's validation threshold changed (the validation runs again on the same artifact). Time and peak memory
of each validation, side by side with other epbuild checkouts in one run (their `rules/` folders), alternating.

    python bench/bench_reference.py [--gib 0.75] [--repeats 2] [--against LABEL=RULES_DIR ...]

Writes bench/results/reference.json.
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE)]

from bench_large import QNN, write_chain  # noqa: E402
from record import save  # noqa: E402

MANIFEST = ('[models.chain]\npath = "models/chain.onnx"\nvalidation = { timeout_s = 1800 }\n'
            '[targets.cpu]\nep = "cpu"\n' + QNN)
CHANGED = MANIFEST.replace('ep = "qnn"\n', 'ep = "qnn"\nvalidation = { min_snr_db = 30 }\n')


def doit(folder: Path, rules: Path) -> tuple[dict, float]:
    env = {**os.environ, "PYTHONPATH": str(rules), "EPBUILD_CACHE_DIR": str(folder / "cache")}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "doit"], cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"doit failed in {folder}:\n{done.stdout}\n{done.stderr}")
    return json.loads((folder / "artifacts" / "build-report.json").read_text())["tasks"], seconds


def validations(report: dict) -> dict[str, dict]:
    return {name: {"seconds": entry.get("seconds"), "peak_mb": (entry.get("child") or {}).get("peak_mb"),
                   "cpu_reference": (entry.get("cpu_reference") or {}).get("from")}
            for name, entry in sorted(report.items()) if name.startswith("validate:") and entry.get("status")
            in ("validated", "skipped")}


def one_run(model: Path, rules: Path, scratch: Path) -> dict:
    """A clean build of both targets, then the threshold change; the project removed after."""
    folder = Path(tempfile.mkdtemp(prefix="reference.", dir=scratch))
    try:
        (folder / "models").mkdir()
        for path in model.parent.iterdir():
            shutil.copy(path, folder / "models" / path.name)
        (folder / "dodo.py").write_text("from epbuild.dodo import *  # noqa: F403\n")
        (folder / "models.toml").write_text(MANIFEST)
        report, clean = doit(folder, rules)
        first = validations(report)
        (folder / "models.toml").write_text(CHANGED)
        report, changed = doit(folder, rules)
        return {"clean_build_s": round(clean, 2), "clean_validations": first, "threshold_change_s": round(changed, 2),
                "threshold_change_validation": validations(report).get("validate:chain@qnn-htp")}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def rows(runs: dict[str, list[dict]], size: int) -> list[tuple[str, str]]:
    """Per checkout: the medians of both validations of the clean build and of the one after the change."""
    def figure(values: list[dict]) -> str:
        return (f"{statistics.median(v['seconds'] for v in values):.2f} s / "
                f"{statistics.median(v['peak_mb'] for v in values):.0f} MB")

    found = []
    for label, done in runs.items():
        clean = "; ".join(f"{name.split('@')[1]} {figure([r['clean_validations'][name] for r in done])}"
                          for name in sorted(done[0]["clean_validations"]))
        after = figure([r["threshold_change_validation"] for r in done])
        found.append((f"validations of one {size / 2**30:.2f} GiB model, cpu + qnn-htp ({label})",
                      f"clean build: {clean}; after a threshold change: {after}"))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=0.75)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--against", action="append", default=[], help="LABEL=RULES_DIR of another checkout")
    args = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    this = f"{head.stdout.strip() or 'this'}, this checkout"
    checkouts = {this: REPO / "rules", **{k: Path(v) for k, v in (a.split("=", 1) for a in args.against)}}
    scratch = Path(tempfile.mkdtemp(prefix="epbuild-bench-reference.", dir=os.environ.get("EPBUILD_BENCH_DIR")))
    try:
        (scratch / "model").mkdir()
        size = write_chain(scratch / "model" / "chain.onnx", args.gib, static=True)
        runs: dict[str, list[dict]] = {label: [] for label in checkouts}
        for _ in range(args.repeats):
            for label, rules in checkouts.items():  # alternating: the VM's speed drifts
                runs[label].append(one_run(scratch / "model" / "chain.onnx", rules, scratch))
                print(label, json.dumps(runs[label][-1]), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    save("reference", rows(runs, size), {"weights_bytes": size, "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
