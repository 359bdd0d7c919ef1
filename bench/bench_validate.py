"""Validation wall time per shipped artifact, and the cost of the fresh child process against running the same
validation in-process (imports and EP registration already paid).

    python bench/bench_validate.py [REPEATS]

Builds the shipped example in a temporary copy first (validation included), then times each validation again:
as a build runs it (a child, forked by the fork server where it serves) and in this process. Writes
bench/results/validate.json.
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "rules"))

from epbuild.execute.host import capabilities  # noqa: E402
from epbuild.files.layout import Layout  # noqa: E402
from epbuild.manifest.parse import load  # noqa: E402
from epbuild.plan.targets import plan  # noqa: E402
from epbuild.steps.compilers import compiler  # noqa: E402
from epbuild.steps.validate import _validate_in_child, validate, validation_request  # noqa: E402
from epbuild.store.cache import Workspace  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
from record import save  # noqa: E402


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        for name in ("dodo.py", "models.toml"):
            shutil.copy(REPO / name, project / name)
        shutil.copytree(REPO / "models", project / "models")
        shutil.copytree(REPO / "configs", project / "configs")
        env = {**os.environ, "PYTHONPATH": str(REPO / "rules")}
        subprocess.run([sys.executable, "-m", "doit"], cwd=project, env=env, check=True, capture_output=True)
        layout = Layout(project / "artifacts")
        caps = capabilities(layout.state)
        print(f"{'artifact':<28} {'child s':>8} {'in-process s':>13} {'overhead s':>11}")
        times = {}
        workdir = layout.scratch("bench")
        workspace = Workspace(layout.root, project / "cache", None)  # the CPU references kept there after the first
        for build in plan(load(project / "models.toml")):
            target = build.target
            if compiler(target).unavailable(target, caps) or not build.validates:
                continue
            child = statistics.median(_timed(lambda b=build: validate(b, workspace, workdir)) for _ in range(repeats))
            request = validation_request(build, build.out_dir(layout)).to_json()
            _validate_in_child(request)  # warm: imports, EP registration
            inside = statistics.median(_timed(lambda r=request: _validate_in_child(r)) for _ in range(repeats))
            print(f"{build.name:<28} {child:>8.3f} {inside:>13.3f} {child - inside:>11.3f}")
            times[build.name] = {"child_s": round(child, 4), "in_process_s": round(inside, 4)}
    children = sorted(t["child_s"] for t in times.values())
    inside_all = sorted(t["in_process_s"] for t in times.values())
    save("validate", [("validation per shipped artifact, as a build runs it (a warm worker for cpu targets, a "
                       "forked child for the others)",
                       f"{children[0]:.3f}-{children[-1]:.3f} s; the same validation in one warm process "
                       f"{inside_all[0]:.3f}-{inside_all[-1]:.3f} s")], times)


def _timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
