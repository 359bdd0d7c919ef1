"""Parallel by default, within memory: clean builds with plain `doit` (one job per core, epbuild's default) against
`doit -n 1`, side by side in one run, with the wall time and the peak memory of the whole build.

    python bench/bench_parallel.py [--tiny 100] [--no-torch] [--stress-gib 0.5] [--stress-models 3]
                                   [--stress-budget-gb 2.5] [--skip-corpus] [--skip-stress]

1. The real-model corpus (`bench/corpus/generate.py`; its torch part with torch installed) for cpu, openvino-cpu
   and qnn-htp, `doit --continue` against `doit --continue -n 1`.
2. TINY tiny targets: TINY/2 copies of the shipped tiny CNN x (cpu, qnn-htp), `doit` against `doit -n 1`.
3. Stress: a few large models (MatMul chains with generated weights, STRESS_GIB each) for qnn-htp under a memory
   budget set low (`EPBUILD_MEMORY_GB`), so that their compiles do not fit together on this machine: no job is
   killed for memory, admission makes jobs wait (the lines are counted), and the wall time is set against serial.

The peak memory of a build is the host's used memory (MemTotal - MemAvailable) sampled every 20 ms while it runs,
above what it was just before: it counts the fork servers and their jobs, which are not doit's children. Every build
starts clean (no artifacts, no doit state, an empty cache) with its own TMPDIR, so each pays its fork servers'
start. Writes bench/results/parallel.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(HERE / "corpus")]

from bench_fork import make_project  # noqa: E402
from bench_large import write_chain  # noqa: E402
from record import save  # noqa: E402


def used_mb() -> float:
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return (int(fields["MemTotal"].split()[0]) - int(fields["MemAvailable"].split()[0])) / 1024


class PeakMemory:
    """The host's used memory above its level at the start, sampled until stopped."""

    def __init__(self) -> None:
        self.base = used_mb()
        self.peak = 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.done.wait(0.02):
            self.peak = max(self.peak, used_mb() - self.base)

    def stop(self) -> float:
        self.done.set()
        self.thread.join()
        return self.peak


def clean_build(folder: Path, args: list[str], env: dict[str, str] | None = None) -> dict:
    """One clean build of the project in `folder`: its wall time, peak memory, exit status and output."""
    for name in ("artifacts", "cache"):
        shutil.rmtree(folder / name, ignore_errors=True)
    for path in folder.glob(".doit.db*"):
        path.unlink()
    subprocess.run(["sync"], check=False)
    with tempfile.TemporaryDirectory() as servers:  # its own fork servers, gone with the folder
        # as users run it: bytecode cached, no job count or budget from this shell
        environment = {key: value for key, value in os.environ.items()
                       if key not in ("PYTHONDONTWRITEBYTECODE", "EPBUILD_JOBS", "EPBUILD_MEMORY_GB")}
        environment.update({"PYTHONPATH": str(REPO / "rules"), "EPBUILD_CACHE_DIR": str(folder / "cache"),
                            "TMPDIR": servers, "XDG_RUNTIME_DIR": servers, "EPBUILD_PROGRESS": "plain", **(env or {})})
        memory = PeakMemory()
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "doit", *args], cwd=folder, env=environment,
                              capture_output=True, text=True)
        seconds = time.monotonic() - started
        peak = memory.stop()
    output = done.stdout + done.stderr
    return {"args": args, "seconds": round(seconds, 2), "peak_mb": round(peak), "status": done.returncode,
            "waits": output.count("waiting for memory:"), "killed": output.count("killed by SIGKILL"),
            "tail": output.splitlines()[-3:]}


def side_by_side(folder: Path, base: list[str], env: dict[str, str] | None = None) -> dict:
    """The default (one job per core) and `-n 1`, alternating, one build each."""
    return {"default": clean_build(folder, base, env), "serial": clean_build(folder, [*base, "-n", "1"], env)}


def corpus(with_torch: bool) -> dict:
    from generate import generate

    with tempfile.TemporaryDirectory(prefix="epbuild-bench-parallel.") as temporary:
        folder = Path(temporary)
        entries = generate(folder, with_torch)
        shutil.copy(REPO / "dodo.py", folder / "dodo.py")
        return {"models": len(entries), **side_by_side(folder, ["--continue"])}


def tiny(count: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="epbuild-bench-parallel.") as temporary:
        folder = Path(temporary) / "project"
        make_project(folder, count // 2, ["cpu", "qnn-htp"])
        return {"targets": count // 2 * 2, **side_by_side(folder, [])}


def stress(models: int, gib: float, budget_gb: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="epbuild-bench-parallel.") as temporary:
        folder = Path(temporary)
        (folder / "models").mkdir()
        shutil.copy(REPO / "dodo.py", folder / "dodo.py")
        lines = ['[targets.qnn-htp]\nep = "qnn"\noptions = { soc_model = 60 }\n']
        for index in range(models):
            write_chain(folder / "models" / f"chain{index}.onnx", gib, static=True)
            lines.append(f'[models.chain{index}]\npath = "models/chain{index}.onnx"\n')
        (folder / "models.toml").write_text("\n".join(lines))
        return {"models": models, "gib": gib, "budget_gb": budget_gb,
                **side_by_side(folder, [], {"EPBUILD_MEMORY_GB": str(budget_gb)})}


def rows_of(name: str, result: dict) -> list[tuple[str, str]]:
    default, serial = result["default"], result["serial"]
    ratio = serial["seconds"] / default["seconds"] if default["seconds"] else 0.0
    figure = (f"default ({os.cpu_count()} jobs) {default['seconds']:.1f} s, peak {default['peak_mb']} MB; "
              f"`-n 1` {serial['seconds']:.1f} s, peak {serial['peak_mb']} MB ({ratio:.2f}x faster)")
    if "budget_gb" in result:
        figure += (f"; {default['waits']} waiting line(s), {default['killed'] + serial['killed']} job(s) killed; "
                   f"exit {default['status']} / {serial['status']}")
    return [(name, figure)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", type=int, default=100)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--skip-corpus", action="store_true")
    parser.add_argument("--skip-stress", action="store_true")
    parser.add_argument("--stress-models", type=int, default=3)
    parser.add_argument("--stress-gib", type=float, default=0.5)
    parser.add_argument("--stress-budget-gb", type=float, default=2.5)
    arguments = parser.parse_args()
    data: dict = {}
    rows: list[tuple[str, str]] = []
    if not arguments.skip_corpus:
        data["corpus"] = corpus(not arguments.no_torch)
        rows += rows_of(f"clean build of the corpus ({data['corpus']['models']} models x cpu, openvino-cpu, "
                        "qnn-htp, `--continue`)", data["corpus"])
    data["tiny"] = tiny(arguments.tiny)
    rows += rows_of(f"clean build of {data['tiny']['targets']} tiny targets (cpu, qnn-htp)", data["tiny"])
    if not arguments.skip_stress:
        data["stress"] = stress(arguments.stress_models, arguments.stress_gib, arguments.stress_budget_gb)
        rows += rows_of(f"stress: {arguments.stress_models} MatMul chains of {arguments.stress_gib:g} GiB for "
                        f"qnn-htp under a {arguments.stress_budget_gb:g} GB memory budget", data["stress"])
    for what, figure in rows:
        print(f"{what}: {figure}")
    save("parallel", rows, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
