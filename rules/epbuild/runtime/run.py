"""`epbuild run MODEL[@TARGET] [--inputs FILE.npz] [--runs N]`: an artifact run exactly as an application runs it
(`runtime.session.open_session`; through its model package when one holds it, as ONNX Runtime selects the
variant) on this host's EP: its outputs (name, shape, dtype, statistics), the session's
creation time and the latency over N runs."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ModelError, UserError, printable
from ..manifest.builds import SIDECAR

MAX_RUNS = 10_000  # a latency needs no more; a mistyped count must not run for days


def find_artifact(artifacts: Path, name: str) -> Path:
    """artifacts/<target>/<model>/ for MODEL@TARGET; for MODEL alone, its only built target."""
    model, _, target = name.partition("@")
    if target:
        folder = artifacts / target / model
        if not (folder / SIDECAR).is_file():
            raise UserError(name, None, f"no artifact at {folder}: build it first (epbuild compile:{model}@{target})")
        return folder
    built = sorted(p.parent for p in artifacts.glob(f"*/{model}/{SIDECAR}"))
    if len(built) == 1:
        return built[0]
    if not built:
        raise UserError(name, None, f"no artifact of model '{model}' under {artifacts}: build it first (epbuild)")
    names = ", ".join(f"{model}@{p.parent.name}" for p in built)
    raise UserError(name, None, f"built for several targets: name one ({names})")


def _inputs(session: Any, given: Path | None) -> dict[str, Any]:
    """The .npz's arrays, or fixed-seed ones for a graph of static shapes."""
    import numpy as np

    from ..steps.validation_inputs import SEED, dtype_of, read_npz

    if given is not None:
        return read_npz(given, "--inputs")
    rng, feeds = np.random.default_rng(SEED), {}
    for value in session.get_inputs():
        if not all(isinstance(d, int) and d > 0 for d in value.shape):
            raise UserError(value.name, None, f"has symbolic shape {value.shape}: give --inputs FILE.npz")
        dtype = dtype_of(value.type)
        feeds[value.name] = (rng.standard_normal(value.shape).astype(dtype) if dtype.kind == "f" else
                             np.ones(value.shape, dtype) if dtype.kind == "b" or "mask" in value.name.lower() else
                             rng.integers(0, 2, value.shape).astype(dtype))  # ids, flags: small, valid everywhere
    return feeds


@contextlib.contextmanager
def _native_output_to_stderr() -> Iterator[None]:
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _statistics(array: Any) -> str:
    import numpy as np

    if array.dtype.kind not in "fiub" or array.size == 0:
        return ""
    values = array.astype(np.float64)
    return f"min {values.min():.6g}, max {values.max():.6g}, mean {values.mean():.6g}, std {values.std():.6g}"


def main(argv: list[str], root: Path) -> int:
    parser = argparse.ArgumentParser(prog="epbuild run", description=__doc__)
    parser.add_argument("artifact", help="MODEL or MODEL@TARGET (a built artifact under artifacts/)")
    parser.add_argument("--inputs", type=Path, help="an .npz of inputs, keys = input names (default: fixed-seed)")
    parser.add_argument("--runs", type=int, default=10, help=f"timed runs after a first one (default 10, at most "
                        f"{MAX_RUNS})")
    arguments = parser.parse_args(argv)
    if not 0 <= arguments.runs <= MAX_RUNS:
        print(f"error: --runs {arguments.runs}: give 0 to {MAX_RUNS} timed runs", file=sys.stderr)
        return 2
    import numpy as np

    from ..manifest.eps import lookup
    from .session import artifact_record, open_session, package_session, packaged_in

    try:
        folder = find_artifact(root / "artifacts", arguments.artifact)
        folder, record = artifact_record(folder)
        package = packaged_in(root / "artifacts", folder.name, folder.parent.name)
        import onnxruntime as ort

        quiet = ort.SessionOptions()
        quiet.log_severity_level = 3  # the EP's own warnings are not this command's output
        started = time.perf_counter()
        try:
            with _native_output_to_stderr():  # QNN's libraries print to fd 1: not this command's output
                if package is None:
                    session = open_session(folder, session_options=quiet)
                else:  # as an application loads it: the variant ONNX Runtime selects for this EP
                    session, selected = package_session(package, folder.name, lookup(record.ep), record.device,
                                                        quiet)
                    if selected != folder.parent.name:
                        print(f"error: ONNX Runtime selected variant '{selected}' of {folder.name} from "
                              f"{package.name}, not {folder.parent.name}", file=sys.stderr)
                        return 1
        except (RuntimeError, OSError, ImportError) as exc:
            print(printable(f"error: this host cannot run {record.ep} ({record.device}): {exc}"), file=sys.stderr)
            return 1
        created = time.perf_counter() - started
        feeds = _inputs(session, arguments.inputs)
        try:
            outputs = session.run(None, feeds)
        except Exception as exc:  # noqa: BLE001 - the runtime's own words, in one line
            given = "these --inputs" if arguments.inputs else "fixed-seed inputs (give --inputs FILE.npz)"
            print(printable(f"error: {record.ep} could not run {folder.name} with {given}: "
                            f"{' '.join(str(exc).split())}"), file=sys.stderr)
            return 1
        times = []
        for _ in range(max(arguments.runs, 0)):
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
        print(f"  latency over {len(times)} runs: p50 {p50:.3f} ms, p90 {p90:.3f} ms")
    return 0
