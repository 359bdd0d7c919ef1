"""Build the real-model corpus with epbuild (cpu, openvino-cpu and qnn-htp) and write the compatibility matrix.

    python bench/corpus/run.py [--no-torch] [--jobs N] [--out bench/results/corpus.md]

Generates the corpus into a temporary project, runs `doit --continue -n N` there with this repository's rules, and
writes per model x target: compile status, offload, compile time, peak memory, validation status, SNR, and the one
line that explains each failure. Prints the same matrix; exits non-zero only when doit itself crashed or a message
is a bare exception (a bug of ours), not when a model fails on an EP.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

from generate import generate  # noqa: E402

TARGETS = ("cpu", "openvino-cpu", "qnn-htp")
RAW = ("Traceback", "KeyError", "internal error in epbuild", "'ep_cache_context'")


def build(folder: Path, jobs: int) -> tuple[subprocess.CompletedProcess, float]:
    shutil.copy(REPO / "dodo.py", folder / "dodo.py")
    env = {**os.environ, "PYTHONPATH": str(REPO / "rules"), "EPBUILD_CACHE_DIR": str(folder / "cache")}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "doit", "--continue", "-n", str(jobs), "-P", "process"],
                          cwd=folder, env=env, capture_output=True, text=True)
    return done, time.monotonic() - started


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def matrix(folder: Path, names: list[str]) -> list[dict]:
    tasks = _read(folder / "artifacts" / "build-report.json").get("tasks", {})
    rows = []
    for name in names:
        for target in TARGETS:
            compiled = tasks.get(f"compile:{name}@{target}", {})
            validated = tasks.get(f"validate:{name}@{target}", {})
            sidecar = _read(folder / "artifacts" / target / name / "artifact.json")
            report = _read(folder / "artifacts" / target / name / "validation.json")
            nodes = sidecar.get("nodes", {})
            outputs = report.get("outputs", {})
            snr = min((o.get("snr_db", 0.0) for o in outputs.values()  # indices are judged as a selection
                       if not o.get("selection", {}).get("direct")), default=None)
            reason = compiled.get("reason") or validated.get("reason") or report.get("reason") or ""
            if not compiled:  # a stage before the compile failed
                stage = next(((n, e) for n, e in tasks.items() if n.split(":", 1)[-1].startswith(name)
                              and e.get("status") == "failed" and not n.startswith(("compile", "validate"))), None)
                reason = f"{stage[0]}: {stage[1].get('reason', '')}" if stage else "not run"
            rows.append({
                "model": name, "target": target, "compile": compiled.get("status", "failed"),
                "offload": nodes.get("offload"), "seconds": (compiled.get("child") or {}).get("seconds"),
                "peak_mb": (compiled.get("child") or {}).get("peak_mb"),
                "validation": report.get("status", "not run" if not compiled.get("status") else "failed"),
                "snr_db": snr, "reason": " ".join(reason.split())[:500],
            })
    return rows


def previous_verdicts(path: Path) -> dict[tuple[str, str], str]:
    """(model, target) -> validation status in an earlier matrix file, to count what changed."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 9 and cells[1] in TARGETS:
            found[(cells[0], cells[1])] = cells[6]
    return found


def counts(rows: list[dict], before: dict[tuple[str, str], str]) -> list[str]:
    """Per target: how many pass, are inconclusive, fail (with their reason), were not run; and how many that
    passed in the earlier matrix no longer do."""
    lines = ["| target | passed | inconclusive | failed | not run / skipped | were passed, now not |",
             "|---|---|---|---|---|---|"]
    for target in TARGETS:
        mine = [r for r in rows if r["target"] == target]
        status = [r["validation"] for r in mine]
        changed = [r["model"] for r in mine
                   if before.get((r["model"], target)) == "passed" and r["validation"] != "passed"]
        judged = {name: status.count(name) for name in ("passed", "inconclusive", "failed")}
        lines.append(f"| {target} | {judged['passed']} | {judged['inconclusive']} | {judged['failed']} | "
                     f"{len(status) - sum(judged.values())} | {len(changed)}"
                     f"{': ' + ', '.join(changed) if changed else ''} |")
    return lines


def markdown(rows: list[dict], origins: dict[str, str], seconds: float, jobs: int,
             before: dict[tuple[str, str], str] | None = None) -> str:
    def cell(value, pattern="{}"):
        return "" if value is None else pattern.format(value)

    lines = ["# Real-model corpus: compatibility matrix\n",
             f"`python bench/corpus/run.py` on this host; {len(origins)} models x {len(TARGETS)} targets, "
             f"`doit --continue -n {jobs}`, {seconds:.0f} s wall in all.\n",
             "| model | target | compile | offload | compile s | peak MB | validation | min SNR dB | why not passed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['model']} | {row['target']} | {row['compile']} | {cell(row['offload'], '{:.0%}')} | "
                     f"{cell(row['seconds'], '{:.2f}')} | {cell(row['peak_mb'], '{:.0f}')} | {row['validation']} | "
                     f"{cell(row['snr_db'], '{:.1f}')} | {row['reason'].replace('|', '/')} |")
    lines += ["", "## Verdicts per target", "",
              "Against the matrix this run replaced (`were passed, now not`: verdicts that said more than was "
              "checked, or regressions; models new to the corpus have no earlier verdict).", ""]
    lines += counts(rows, before or {})
    lines += ["", "## The models", ""] + [f"- `{name}`: {origin}" for name, origin in origins.items()]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "corpus.md")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="epbuild-corpus.") as temporary:
        folder = Path(temporary)
        entries = generate(folder, not arguments.no_torch)
        done, seconds = build(folder, arguments.jobs)
        rows = matrix(folder, [e.name for e in entries])
        text = markdown(rows, {e.name: e.origin for e in entries}, seconds, arguments.jobs,
                        previous_verdicts(arguments.out))
        (folder / "doit.log").write_text(done.stdout + done.stderr)
        raw = [line for line in (done.stdout + done.stderr).splitlines() if any(r in line for r in RAW)]
        arguments.out.parent.mkdir(parents=True, exist_ok=True)
        arguments.out.write_text(text)
        print(text)
        print(f"doit exited with status {done.returncode}")
        if raw:
            print("bare exception messages (bugs of epbuild):\n" + "\n".join(raw))
        crashed = done.returncode not in (0, 1, 2)  # 1: a task failed, 2: a task error; 3: doit could not run
        return 1 if raw or crashed else 0


if __name__ == "__main__":
    raise SystemExit(main())
