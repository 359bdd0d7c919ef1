"""`epbuild reduce` on the real-model corpus's failing qnn-htp builds: nodes before and after, compiles, time.

    python bench/bench_reduce.py [--budget-s 300]

Generates the torch-free corpus (`bench/corpus/generate.py`), builds it for qnn-htp with `doit --continue`, then
reduces each failed compile and each validation that failed by departing from CPU, one `epbuild reduce` each, and
runs every repro folder's `repro.py` in a fresh Python (without epbuild). Writes bench/results/reduce.json.
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
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(HERE / "corpus")]

from record import save  # noqa: E402

TARGET = ('[targets.qnn-htp]\nep = "qnn"\noptions = { backend_type = "htp", soc_model = 60 }\ntimeout_s = 900\n'
          'max_memory_gb = 8\n')  # as the corpus declares it


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=300.0)
    arguments = parser.parse_args()
    from generate import generate

    rows, data = [], []
    with tempfile.TemporaryDirectory(prefix="epbuild-bench-reduce.") as temporary:
        folder = Path(temporary)
        entries = generate(folder, False)
        text = (folder / "models.toml").read_text()
        text = text[:text.index("[targets.")] if "[targets." in text else text
        (folder / "models.toml").write_text(f"{text}\n[build]\nreduce_budget_s = {arguments.budget_s}\n{TARGET}")
        shutil.copy(REPO / "dodo.py", folder / "dodo.py")
        env = {**os.environ, "PYTHONPATH": str(REPO / "rules"), "EPBUILD_CACHE_DIR": str(folder / "cache")}
        subprocess.run([sys.executable, "-m", "doit", "--continue"], cwd=folder, env=env, capture_output=True)
        report = json.loads((folder / "artifacts" / "build-report.json").read_text())
        report = report.get("tasks", report)
        failing = []
        for entry in entries:
            compile_entry = report.get(f"compile:{entry.name}@qnn-htp") or {}
            validate_entry = report.get(f"validate:{entry.name}@qnn-htp") or {}
            if compile_entry.get("status") == "failed":
                failing.append((entry.name, f"compile:{entry.name}@qnn-htp"))
            elif validate_entry.get("status") == "failed":
                failing.append((entry.name, f"validate:{entry.name}@qnn-htp"))
        for name, task in failing:
            started = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "epbuild", "reduce", task], cwd=folder, env=env,
                                  capture_output=True, text=True)
            seconds = time.monotonic() - started
            repro = folder / "artifacts" / "repro" / f"{name}@qnn-htp"
            if done.returncode != 0 or not (repro / "reduction.json").is_file():
                last = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()][-1:]
                data.append({"model": name, "task": task, "reduced": False, "why": last})
                rows.append((f"reduce {task}", f"not reduced: {last[0][:160] if last else 'no output'}"))
                continue
            reduction = json.loads((repro / "reduction.json").read_text())
            clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("EPBUILD_")}
            replay = subprocess.run([sys.executable, "-I", "repro.py"], cwd=repro, env=clean, capture_output=True,
                                    text=True)
            data.append({"model": name, "task": task, "reduced": True, **reduction, "wall_s": round(seconds, 1),
                         "repro_exit": replay.returncode})
            rows.append((f"reduce {task}", f"{reduction['nodes_before']} -> {reduction['nodes_after']} nodes "
                         f"({', '.join(reduction['ops'])}), {reduction['probes']} compiles, {seconds:.0f} s; "
                         f"repro.py exit {replay.returncode}{'' if reduction['complete'] else ', budget ran out'}"))
    for what, figure in rows:
        print(f"{what}: {figure}")
    save("reduce", rows, {"reductions": data})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
