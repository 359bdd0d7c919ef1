"""A dataset's samples run (`run_dataset`), spread over processes where one run is slow (QNN's HTP simulator:
seconds a sample, and single-threaded): the validating child runs the first share on its own session (the tensor
comparison's run of the first samples counted in it, not repeated) and
starts a fresh Python for each other share (`python -m epbuild.steps.validation.sample_worker`), each opening the
artifact's session as the validation does and running its samples in order. The shares are contiguous and put back
in sample order, so the verdict and its figures do not depend on how they were split (each sample is one run of its
own). Shares travel as .npz files in the job's folder, read without pickles; a worker is tied to the child (it dies
with it), checks that it runs the code and packages the build names, and says how far it got in a file the child
reads for its progress line (`progress: 12/36 samples`, which the build's `still running` line repeats)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...execute.child import PROGRESS
from ...execute.memory_ledger import available_memory_mb, usable_cores

if TYPE_CHECKING:
    from ...contracts.jobs import ValidationMember
    from .task_metrics import Dataset

WORKER = "epbuild.steps.validation.sample_worker"  # a share's process (named in the code digest's roots)
PROCESSES = "EPBUILD_SAMPLE_PROCESSES"  # how many processes a validation's samples use, where set (1: one)
SPREAD_FROM_S = 6.0  # sequential runs shorter than this stay in one process (a worker's start costs ~1-2 s)
START_S = 2.0  # what the timeout's estimate allows for starting the workers
MEMORY_SHARE = 0.5  # of the memory available now, what the workers' sessions may take


def processes_for(runs: int, seconds: float, resident_bytes: int) -> int:
    """How many processes share `runs` runs of `seconds` each (EPBUILD_SAMPLE_PROCESSES, where set): one where they
    are quick; else one per core this process may use, no more than the runs, and as many as the memory available
    now holds beside this one (each a session like this process's, `resident_bytes`)."""
    chosen = os.environ.get(PROCESSES, "").strip()
    if chosen:
        if not (chosen.isascii() and chosen.isdigit()) or int(chosen) < 1:
            from ...errors import ModelError

            raise ModelError(f"{PROCESSES}={chosen!r}: give how many processes a validation's samples use (1 or "
                             "more; unset: as many as pay, within the cores and memory)")
        return max(1, min(int(chosen), runs))
    if runs < 2 or runs * seconds < SPREAD_FROM_S:
        return 1
    cores = usable_cores()
    available = _available_bytes()
    by_memory = 1 + int(available * MEMORY_SHARE / resident_bytes) if available and resident_bytes else cores
    return max(1, min(cores, runs, by_memory))


def estimate_s(runs: int, seconds: float, processes: int) -> float:
    """The samples' wall time: the longest share, and the workers' start."""
    return math.ceil(runs / processes) * seconds + (START_S if processes > 1 else 0.0)


def _available_bytes() -> int:
    available = available_memory_mb()
    return int(available * 2**20) if available else 0


def shares(runs: int, processes: int, lead: int = 0) -> list[range]:
    """Contiguous runs for each process: the first (this process's, whose session is open) `lead` runs more than
    an even share (a run it has already), the rest split evenly."""
    first = min(runs, math.ceil((runs + lead * (processes - 1)) / processes))
    rest = runs - first
    size = math.ceil(rest / (processes - 1)) if processes > 1 and rest else 1
    return [range(0, first), *(range(start, min(runs, start + size)) for start in range(first, runs, size))]


class Spread:
    """The other shares' worker processes, started as soon as a run's time is known (their start then overlaps this
    process's other work: the repeat, the comparison), collected with this process's own share (`results`), and
    ended and their folder removed by `stop` (every path: a warm worker must not leave them running)."""

    def __init__(self, member: dict[str, Any], batches: list[tuple[dict[str, Any], int]], wanted: list[str],
                 processes: int, total: int, seconds: float, first: dict[str, Any] | None):
        import numpy as np

        from ...execute.job_environment import job_environment
        from ...execute.lifelines import DIE_WITH
        from ...execute.provenance import code_digest, loaded_versions
        from ..job_modules import CODE_ROOTS

        self.batches, self.wanted, self.total, self.first = batches, wanted, total, first
        # the workers start while this process repeats its first run and compares it: what they spend starting,
        # it spends there, so its share leads only by the run it has already (the tensor comparison's)
        lead = 1 if first is not None else 0
        self.parts = [part for part in shares(len(batches), processes, lead) if len(part)]
        self.folder = Path(tempfile.mkdtemp(prefix="samples.", dir=os.getcwd()))
        self.workers: list[tuple[subprocess.Popen, Path, Path, range]] = []
        expected = {"versions": loaded_versions(), "code": code_digest(CODE_ROOTS), "roots": list(CODE_ROOTS)}
        environment = {**job_environment(), DIE_WITH: str(os.getpid())}
        try:
            for index, part in enumerate(self.parts[1:], 1):
                share = self.folder / f"share-{index}.npz"
                np.savez(share, **{f"{run}/{name}": value for run in part for name, value in batches[run][0].items()})
                request = {"member": member, "share": str(share), "runs": [part.start, part.stop], "wanted": wanted,
                           "samples": [batches[run][1] for run in part], "inputs": list(batches[0][0]),
                           "out": str(self.folder / f"out-{index}.npz"),
                           "progress": str(self.folder / f"progress-{index}"), "provenance": expected}
                (self.folder / f"request-{index}.json").write_text(json.dumps(request))
                with open(self.folder / f"log-{index}.txt", "w", encoding="utf-8") as log:
                    process = subprocess.Popen(
                        [sys.executable, "-m", WORKER, str(self.folder / f"request-{index}.json"),
                         str(self.folder / f"result-{index}.json")], stdout=log, stderr=subprocess.STDOUT,
                        env=environment, cwd=self.folder)
                self.workers.append((process, self.folder / f"out-{index}.npz", self.folder / f"progress-{index}",
                                     part))
        except BaseException:
            self.stop()
            raise

    def results(self, session: Any) -> list[dict[str, Any]]:
        """Each batch's outputs (`wanted`, in batch order): this process's share run on `session` now (its first
        batch's outputs taken where known), the others' read from their workers."""
        import numpy as np

        results: list[dict[str, Any]] = []
        done, said = 0, -1
        for run in self.parts[0]:
            feeds, real = self.batches[run]
            known = self.first if run == 0 else None
            results.append(known if known is not None else dict(zip(self.wanted, session.run(self.wanted, feeds),
                                                                    strict=True)))
            done += real
            said = _say_progress(done, self.workers, self.total, said)
        while any(process.poll() is None for process, *_ in self.workers):
            said = _say_progress(done, self.workers, self.total, said)
            time.sleep(0.2)
        for process, out, _, part in self.workers:
            if process.returncode != 0:
                said_by = out.with_name(out.name.replace("out-", "log-").replace(".npz", ".txt"))
                tail = said_by.read_text(errors="replace").strip().splitlines()[-3:] if said_by.is_file() else []
                raise RuntimeError(f"a process running samples {part.start}-{part.stop - 1} ended with status "
                                   f"{process.returncode}: {' | '.join(tail)}")
            with np.load(out, allow_pickle=False) as saved:
                results += [{name: saved[f"{run}/{name}"] for name in self.wanted} for run in part]
        _say_progress(self.total, [], self.total, said)
        return results

    def stop(self) -> None:
        for process, *_ in self.workers:
            if process.poll() is None:
                process.kill()
                process.wait()
        self.workers = []
        if self.folder.is_dir():
            for path in self.folder.iterdir():
                path.unlink()
            self.folder.rmdir()


def _say_progress(done_here: int, workers: list[Any], total: int, said: int) -> int:
    """`progress: N/TOTAL samples` on this child's output (its log, which the build's progress line reads), when it
    changed."""
    done = done_here
    for _, _, progress, _ in workers:
        with contextlib.suppress(OSError, ValueError):
            done += int(progress.read_text() or 0)
    if done != said:
        print(f"{PROGRESS}{min(done, total)}/{total} samples", flush=True)
    return done


@dataclasses.dataclass
class DatasetRun:
    """A dataset's runs made ready: the batches fed, the first batch's outputs where known, the workers started
    (`Spread`, None: one process). `outputs` runs what is left; `stop` ends the workers (after, or instead)."""

    batches: list[tuple[dict[str, Any], int]]
    wanted: list[str]
    size: int
    count: int
    first: dict[str, Any] | None
    spread: Spread | None
    said: bool = False  # says how far it got (`progress: ...`): the artifact's runs, not the reference's

    def outputs(self, session: Any) -> dict[str, Any]:
        """Every wanted output over the samples, stacked on the sample axis."""
        import numpy as np

        if self.spread is not None:
            results = self.spread.results(session)
        else:
            results, done = [], 0
            for index, (feeds, real) in enumerate(self.batches):
                known = self.first if index == 0 else None
                results.append(known if known is not None else dict(zip(self.wanted, session.run(self.wanted, feeds),
                                                                        strict=True)))
                done += real
                if self.said and len(self.batches) > 1:
                    print(f"{PROGRESS}{done}/{self.count} samples", flush=True)
        runs: dict[str, list[Any]] = {name: [] for name in self.wanted}
        for outputs, (_, real) in zip(results, self.batches, strict=True):
            for name in self.wanted:
                value = np.asarray(outputs[name])
                runs[name].append(value[:real] if value.ndim and len(value) == self.size else value)
        return {name: np.concatenate(parts) if parts[0].ndim else np.stack(parts) for name, parts in runs.items()}

    def stop(self) -> None:
        if self.spread is not None:
            self.spread.stop()


def prepare_runs(session: Any, dataset: Dataset, size: int, keep: list[str] | None, frozen: dict[str, Any],
                 what: str, processes: int = 1, member: ValidationMember | None = None, seconds: float = 0.0,
                 ran: tuple[dict[str, Any], list[Any]] | None = None) -> DatasetRun:
    """The runs of every output in `keep` (None: all) over the samples (frozen inputs fed their values, as the
    tensor comparison feeds them): with `processes` > 1 the other shares' workers started now (`Spread`, for the
    artifact `member` names). `ran`: feeds this session already ran and its outputs (the tensor comparison's, on the
    dataset's first samples): where they are the first run's, it is not run again."""
    from .validation_inputs import feeds_for

    names = [output.name for output in session.get_outputs()]
    wanted = [name for name in names if keep is None or name in keep]
    batches = [(feeds_for(session, batch, frozen, what), real) for batch, real in dataset.batches(size)]
    first = _known_first(batches, ran, names, wanted)
    spread = Spread(member.to_json(), batches, wanted, processes, dataset.count, seconds, first) \
        if processes > 1 and member is not None else None
    return DatasetRun(batches, wanted, size, dataset.count, first, spread, member is not None)


def run_dataset(session: Any, dataset: Dataset, size: int, keep: list[str] | None, frozen: dict[str, Any],
                what: str) -> dict[str, Any]:
    """Every output in `keep` (None: all) over the samples, one run after another here (the reference's)."""
    runs = prepare_runs(session, dataset, size, keep, frozen, what)
    return runs.outputs(session)


def _known_first(batches: list[tuple[dict[str, Any], int]], ran: tuple[dict[str, Any], list[Any]] | None,
                 names: list[str], wanted: list[str]) -> dict[str, Any] | None:
    """The first batch's outputs, where `ran` fed exactly its feeds (same names, types and values)."""
    import numpy as np

    if ran is None or not batches:
        return None
    feeds, outputs = ran
    batch = batches[0][0]
    if feeds.keys() != batch.keys() or any(
            np.asarray(feeds[name]).dtype != np.asarray(batch[name]).dtype
            or not np.array_equal(np.asarray(feeds[name]), np.asarray(batch[name])) for name in batch):
        return None
    by_name = dict(zip(names, outputs, strict=True))
    return {name: by_name[name] for name in wanted}
