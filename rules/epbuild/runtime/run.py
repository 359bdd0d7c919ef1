"""`epbuild run MODEL[@TARGET] [--inputs FILE.npz] [--runs N]`: an artifact run exactly as an application runs it
(`runtime.session.open_session`; through its model package when one holds it, as ONNX Runtime selects the
variant) on this host's EP: its outputs (name, shape, dtype, statistics), the session's
creation time and the latency over N runs."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ModelError, UserError, closest, printable
from ..manifest.builds import SIDECAR

MAX_RUNS = 10_000  # a latency needs no more; a mistyped count must not run for days


def declared_targets(manifest: Path) -> set[str] | None:
    """The targets the project's manifest declares; None where it cannot be read (then nothing is judged by it)."""
    import tomllib

    try:
        with open(manifest, "rb") as handle:
            targets = tomllib.load(handle).get("targets")
    except (OSError, ValueError):
        return None
    return set(targets) if isinstance(targets, dict) else None


def find_artifact(artifacts: Path, name: str, declared: set[str] | None = None) -> Path:
    """artifacts/<target>/<model>/ for MODEL@TARGET; for MODEL alone, its only built target of those the manifest
    declares (`declared`; None: every built one). A target not declared, or artifacts of targets no longer
    declared, are said as such, never offered as something to build or pick."""
    model, _, target = name.partition("@")
    if target:
        folder = artifacts / target / model
        if declared is not None and target not in declared:
            left = " (its artifacts there are left over from an earlier manifest: `epbuild prune` removes them)" \
                if (folder / SIDECAR).is_file() else ""
            raise UserError(name, None, f"target '{target}' is not declared in the manifest"
                            f"{closest(target, declared)}{left}; declared targets: {', '.join(sorted(declared))}")
        if not (folder / SIDECAR).is_file():
            raise UserError(name, None, f"no artifact at {folder}: build it first (epbuild compile:{model}@{target})")
        return folder
    found = sorted(p.parent for p in artifacts.glob(f"*/{model}/{SIDECAR}"))
    built = [p for p in found if declared is None or p.parent.name in declared]
    stale = sorted({p.parent.name for p in found} - {p.parent.name for p in built})
    leftover = (f"; left over from targets no longer declared: {', '.join(stale)} (`epbuild prune` removes them)"
                if stale else "")
    if len(built) == 1:
        return built[0]
    if not built:
        raise UserError(name, None, f"no artifact of model '{model}' under {artifacts}: build it first (epbuild)"
                        f"{leftover}")
    names = ", ".join(f"{model}@{p.parent.name}" for p in built)
    raise UserError(name, None, f"built for several targets: name one ({names}){leftover}")


def verdict_warning(folder: Path) -> str | None:
    """What to say before running an artifact its validation did not pass (failed, skipped, inconclusive,
    structural) or that no validation judged: its outputs are not vouched for; None for one that passed."""
    from ..contracts.validation import read_validation

    where = f"{folder.parent.name}/{folder.name}"
    try:
        record = read_validation(folder)
    except OSError:
        return f"warning: {where} has no verdict (validate = false, or its validation has not run): nothing vouches " \
               "for the outputs below"
    except (ValueError, RecursionError):
        return f"warning: {where}'s validation.json cannot be read: validate it again (epbuild); nothing vouches " \
               "for the outputs below"
    if record.passed:
        return None
    reason = (record.reason or "").strip().splitlines()
    return (f"warning: {where}'s validation {record.status.value}{': ' + reason[0][:300] if reason else ''}; the "
            "outputs below are not vouched for")


def _inputs(session: Any, given: Path | None, recorded: dict[str, list[int]]) -> dict[str, Any]:
    """The .npz's arrays, or fixed-seed ones of the graph's static shapes, or of the shapes artifact.json records
    for it (`recorded`: the manifest's `inputs` a symbolic dimension was built with)."""
    import numpy as np

    from ..steps.validation.validation_inputs import SEED, dtype_of, read_npz

    if given is not None:
        return read_npz(given, "--inputs")
    rng, feeds = np.random.default_rng(SEED), {}
    for value in session.get_inputs():
        shape = value.shape
        if not all(isinstance(d, int) and d > 0 for d in shape):
            shape = recorded.get(value.name)
            if shape is None:
                raise UserError(value.name, None, f"has symbolic shape {value.shape} and artifact.json records no "
                                "shape for it: give --inputs FILE.npz")
        dtype = dtype_of(value.type)
        feeds[value.name] = (rng.standard_normal(shape).astype(dtype) if dtype.kind == "f" else
                             np.ones(shape, dtype) if dtype.kind == "b" or "mask" in value.name.lower() else
                             rng.integers(0, 2, shape).astype(dtype))  # ids, flags: small, valid everywhere
    return feeds


# what EP libraries print on their own (QNN's native logging, ONNX Runtime's coloured warnings): not this command's
NOISE = re.compile(r"^(\s*# LIBNATIVE:|\x1b\[[0-9;]*m|\s*$|.*\[W:onnxruntime)")


@contextlib.contextmanager
def _native_output_filtered() -> Iterator[Any]:
    """The EP libraries' own prints (to either descriptor) held back, and after the block only what is not their
    noise written to stderr: the command's output stays its own lines. Yields a function that writes a progress
    line to the real stderr meanwhile."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)

    def progress(text: str) -> None:
        os.write(saved[1], f"{text}\n".encode())

    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 1)
        os.dup2(held.fileno(), 2)
        try:
            yield progress
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for descriptor in saved:
                os.close(descriptor)
            held.seek(0)
            for line in held.read().decode(errors="replace").splitlines():
                if not NOISE.match(line):
                    print(printable(line), file=sys.stderr)


def _statistics(array: Any) -> str:
    import numpy as np

    if array.dtype.kind not in "fiub" or array.size == 0:
        return ""
    values = array.astype(np.float64)
    return f"min {values.min():.6g}, max {values.max():.6g}, mean {values.mean():.6g}, std {values.std():.6g}"


def main(argv: list[str], root: Path, manifest: Path | None = None) -> int:
    """`epbuild run`; `manifest`: the project's (default `root`/models.toml), whose targets an artifact is one of."""
    parser = argparse.ArgumentParser(prog="epbuild run", description=__doc__)
    parser.add_argument("artifact", help="MODEL or MODEL@TARGET (a built artifact under artifacts/)")
    parser.add_argument("--inputs", type=Path, help="an .npz of inputs, keys = input names (default: fixed-seed)")
    parser.add_argument("--runs", type=int, default=None, help=f"timed runs after a first one (default 10, 1 on a "
                        f"simulator; at most {MAX_RUNS})")
    arguments = parser.parse_args(argv)
    if arguments.runs is not None and not 0 <= arguments.runs <= MAX_RUNS:
        print(f"error: --runs {arguments.runs}: give 0 to {MAX_RUNS} timed runs", file=sys.stderr)
        return 2
    import numpy as np

    from ..manifest.eps import lookup
    from .session import artifact_record, open_session, package_differences, package_session, packaged_in

    try:
        folder = find_artifact(root / "artifacts", arguments.artifact,
                               declared_targets(manifest or root / "models.toml"))
        folder, record = artifact_record(folder)
        warning = verdict_warning(folder)
        if warning:  # said before anything runs: the outputs that follow are those of an artifact that did not pass
            print(printable(warning), file=sys.stderr, flush=True)
        package = packaged_in(root / "artifacts", folder.name, folder.parent.name)
        differ = package_differences(package, folder.name, folder.parent.name) if package is not None else []
        if differ and package is not None:  # never run "through the package" what it does not hold as published
            print(printable(f"error: {package.name}'s {folder.name}@{folder.parent.name} variant is not what its "
                            f"manifest records ({', '.join(differ[:5])} differ): rebuild the package (epbuild) "
                            "before running it"), file=sys.stderr)
            return 1
        import onnxruntime as ort

        quiet = ort.SessionOptions()
        quiet.log_severity_level = 3  # the EP's own warnings are not this command's output
        simulated = record.ep == "QNNExecutionProvider" and platform.machine().lower() in ("x86_64", "amd64")
        runs = arguments.runs if arguments.runs is not None else 1 if simulated else 10
        recorded = record.inputs if record.has("inputs") else {}
        with _native_output_filtered() as progress:  # the EP libraries' prints: not this command's output
            started = time.perf_counter()
            try:
                if package is None:
                    session = open_session(folder, session_options=quiet)
                else:  # as an application loads it: the variant ONNX Runtime selects for this EP
                    session, selected = package_session(package, folder.name, lookup(record.ep), record.device,
                                                        quiet)
                    if selected != folder.parent.name:
                        progress(f"error: ONNX Runtime selected variant '{selected}' of {folder.name} from "
                                 f"{package.name}, not {folder.parent.name}")
                        return 1
            except (RuntimeError, OSError, ImportError) as exc:
                progress(printable(f"error: this host cannot run {record.ep} ({record.device}): {exc}"))
                return 1
            created = time.perf_counter() - started
            feeds = _inputs(session, arguments.inputs, recorded)
            try:
                begun = time.perf_counter()
                outputs = session.run(None, feeds)
                first = time.perf_counter() - begun
            except Exception as exc:  # noqa: BLE001 - the runtime's own words, in one line
                given = "these --inputs" if arguments.inputs else "fixed-seed inputs (give --inputs FILE.npz)"
                progress(printable(f"error: {record.ep} could not run {folder.name} with {given}: "
                                   f"{' '.join(str(exc).split())}"))
                return 1
            times = []
            for run in range(runs):
                if simulated or first > 1:  # a run of seconds: say where it is
                    progress(f"  timed run {run + 1} of {runs} (a run took {first:.1f} s)")
                begun = time.perf_counter()
                session.run(None, feeds)
                times.append(time.perf_counter() - begun)
    except (UserError, ModelError) as exc:  # the user's file or name: one line (an --inputs file that is no .npz)
        print(printable(f"error: {exc}"), file=sys.stderr)
        return 2
    through = f" through package {package.name}" if package is not None else ""
    print(printable(f"{folder.parent.name}/{folder.name}{through}: {record.ep} on "
                    f"{', '.join(session.get_providers())}; session created in {created * 1000:.1f} ms"))
    for output, value in zip(session.get_outputs(), outputs, strict=True):
        value = np.asarray(value)
        print(printable(f"  {output.name}: {list(value.shape)} {value.dtype}  {_statistics(value)}"))
    if times:
        p50, p90 = np.percentile(np.array(times) * 1000, [50, 90])
        where = " (QNN's HTP simulator on this host, not the device's latency)" if simulated else ""
        print(f"  latency over {len(times)} run{'s' * (len(times) != 1)}: p50 {p50:.3f} ms, p90 {p90:.3f} ms{where}")
    return 0
