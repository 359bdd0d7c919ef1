"""`epbuild reduce`: a failing compile, or an artifact that departs from CPU, reduced to the smallest subgraph that
still fails the same way, then written as a folder a vendor can act on (`steps.reduction.repro`).

A compile's probe is a real compile of one subgraph, by the same child job as the failing task
(`epbuild.steps.compile`: ModelCompiler, then the compiled model opened on its EP), within the target's limits and
the reduction's time left; "the same way" is the failure's stem (`reduce_graph.stem`: its first line without
names, paths and numbers), so a subgraph that fails otherwise (the EP compiles nothing of it, say) is not taken.
A divergence's probe (`steps.reduction.reduce_probe`) compiles one subgraph for the EP and runs it there and on
CPU, fed the values its inputs have in the whole model on CPU with the validation's inputs; it fails the same way
when an output misses the thresholds the failed validation used with a worst SNR within `SIGNATURE_DB` of the whole
model's, and keeps the node where the validation's `localise` found the first departure (magika's reduction kept an
ordinary 37.7 dB rounding in front of the -129 dB fp16 overflow that failed it, and handed that over). The search:
the shortest prefix of the model's nodes (in order) that fails, then the latest start of a window ending there that
fails, then each node of the window dropped in turn where the rest still fails. Every probe's outcome is kept by the
subgraph's content in the repro folder (`probes-KIND.json`), so running the reduction again asks the EP nothing it
was asked before; past its time budget a reduction stops with the smallest failing subgraph found so far, and says so.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...contracts.artifact import read_artifact
from ...contracts.jobs import CompileAnswer, DepartureProbe, ProbeAnswer, TensorsProbe
from ...contracts.statuses import Verdict
from ...contracts.validation import ValidationRecord, read_validation
from ...errors import BuildError, ModelError
from ...execute.child import run_child
from ...files.layout import write_json
from ...files.weights import resolved
from ...logs import say as say_line
from ...manifest.builds import Build
from ...store.cache import Workspace
from ..compilers.ort import compile_request
from ..expected_peak import build_limits
from .reduce_graph import Subgraphs, save_model, stem

PASSES = ""  # a probe's outcome when its subgraph compiled and opened (and, for a divergence, held)
DEPARTS = "departs from CPU beyond the validation's thresholds"
SIGNATURE_DB = 10.0  # a divergence's subgraph fails the same way within this many dB of the whole model's worst SNR


@dataclasses.dataclass
class Reduction:
    """What a reduction found: the nodes it kept (model order), the failure's stem and its first message."""

    nodes_before: int
    kept: list[int]
    stem: str
    message: str
    probes: int  # compiles run (outcomes found in probes.json are not counted)
    seconds: float
    complete: bool  # False: the time budget ran out first
    model: Any = None  # the reduced model (onnx.ModelProto), weights included
    kind: str = "compile"  # or "divergence": the artifact compiled and departs from CPU
    ep_sdk_version: str | None = None  # as a compile that passed (a probe's, or the artifact's) recorded it
    feeds: dict[str, Any] = dataclasses.field(default_factory=dict)  # a divergence's subgraph inputs, as in the model
    thresholds: dict[str, float] = dataclasses.field(default_factory=dict)  # a divergence's: the validation's


class _OutOfTime(Exception):
    pass


def search(count: int, fails: Callable[[list[int]], bool], deadline: float) -> tuple[list[int], bool]:
    """The smallest failing node set found (indices in order) and whether the search finished in time. The whole
    model, `range(count)`, is known to fail."""
    best = list(range(count))

    def check(candidate: list[int]) -> bool:
        nonlocal best
        if time.monotonic() > deadline:
            raise _OutOfTime
        if fails(candidate):
            if len(candidate) < len(best):
                best = candidate
            return True
        return False

    try:
        low, high = 1, count  # the shortest failing prefix ends at `high`
        while low < high:
            middle = (low + high) // 2
            if check(list(range(middle))):
                high = middle
            else:
                low = middle + 1
        end = high
        low, high = 0, end - 1  # the latest start of a failing window ending there
        while low < high:
            middle = (low + high + 1) // 2
            if check(list(range(middle, end))):
                low = middle
            else:
                high = middle - 1
        window = list(range(low, end))  # known to fail: checked, or the prefix found above
        if len(window) <= len(best):
            best = window
        for index in reversed(window[:-1]):  # the last node ends the failure: keep it
            candidate = [i for i in best if i != index]
            if candidate:
                check(candidate)
    except _OutOfTime:
        return best, False
    return best, True


class _Probes:
    """Probe outcomes by subgraph content, kept in the repro folder (`probes-KIND.json`) across reductions, and the
    first whole message of each failure seen."""

    def __init__(self, folder: Path, kind: str):
        self.path = folder / f"probes-{kind}.json"
        try:
            self.known: dict[str, str] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.known = {}
        self.messages: dict[str, str] = {}
        self.counted = 0
        self.sdk: str | None = None  # the EP's SDK version, as a compile that passed recorded it

    def failed(self, message: str, log: Path) -> str:
        """The outcome of a probe that failed with `message`; the first of each kind keeps its whole output."""
        outcome = stem(message) or "failed"
        if outcome not in self.messages:
            first = re.sub(r"\s*\(full output: [^)]*\)", "", message.splitlines()[0])
            output = log.read_text(errors="replace") if log.is_file() else "\n".join(message.splitlines()[1:])
            self.messages[outcome] = f"{first}\n\n{output}"
        return outcome

    def keep(self, key: str, outcome: str) -> str:
        self.known[key] = outcome
        write_json(self.path, self.known)
        return outcome


def reduce_failure(build: Build, workspace: Workspace, folder: Path, budget_s: float,
                   say: Callable[[str], None] = say_line) -> Reduction:
    """Reduce what fails of `build`'s single model into `folder` (the repro folder; the probes' work folder is
    removed at the end): its compile when that fails now, else a validation that failed by departing from CPU.
    Raises BuildError when neither fails."""
    started = time.monotonic()
    deadline = started + budget_s
    member = build.members[0]
    elsewhere = member.weights.get(str(member.model.path))
    weights = resolved(member.model.path, elsewhere) if elsewhere else None
    graph = Subgraphs(member.model.path, weights)
    work = folder / "probes"
    everything = list(range(len(graph)))
    probes = _Probes(folder, "compile")
    probe = _compile_probe(build, workspace, graph, probes, work, deadline)
    whole = probe(everything)
    kind, thresholds, feeds = "compile", {}, {}
    same: Callable[[list[int]], bool] = lambda indices: probe(indices) == whole  # noqa: E731
    required = None
    if whole == PASSES:
        recorded = _failed_validation(build, workspace)
        thresholds = dict(recorded.thresholds)
        tensors = _tensors(build, workspace, graph, weights, folder, deadline)
        probes = _Probes(folder, "divergence-v2")  # v2: outcomes carry the worst SNR
        probe = _divergence_probe(build, workspace, graph, probes, work, tensors, thresholds, deadline)
        whole, kind = probe(everything), "divergence"
        if not whole.startswith(DEPARTS):
            raise BuildError(f"{build.task} compiles and its whole model holds the thresholds of the failed "
                             f"{build.validate_task} on these values ({whole or 'passes'}): nothing to reduce")
        worst = _snr(whole)
        required = _localised_node(recorded, graph, worst)
        same = lambda indices: ((required is None or required in indices)  # noqa: E731
                                and _same_departure(probe(indices), worst))
    said = (probes.messages.get(whole) or whole).strip().splitlines()[0][:200]
    keeps = f"; keeping node '{graph.nodes[required].name}', where localise found the first departure" \
        if required is not None else ""
    say(f"reducing {build.task if kind == 'compile' else build.validate_task}: {len(graph)} nodes "
        f"{'fail with' if kind == 'compile' else 'give'}: {said}{keeps}")
    kept, complete = search(len(graph), same, deadline)
    shutil.rmtree(work, ignore_errors=True)
    message = probes.messages.get(whole)
    if kind == "divergence":  # the repro's own figure, beside the whole model's
        message = (f"{DEPARTS}: worst SNR {_snr(probe(kept))} dB (the whole model's: {_snr(whole)} dB), "
                   f"thresholds {thresholds}{keeps}")
    if message is None:  # the whole model's outcome was known from an earlier reduction: its log is in the folder
        log = folder / "failure.log"
        message = log.read_text() if log.is_file() else whole
    model = graph.model_of(kept)
    if kind == "divergence":
        import numpy as np

        with np.load(folder / "tensors.npz") as saved:
            feeds = {value.name: saved[value.name] for value in model.graph.input}
        (folder / "tensors.npz").unlink()
    sdk = probes.sdk
    if sdk is None and kind == "divergence":
        record = read_artifact(build.out_dir(workspace.layout))
        sdk = record.ep_sdk_version if record.has("ep_sdk_version") else None
    return Reduction(len(graph), kept, whole if kind == "compile" else DEPARTS, message, probes.counted,
                     time.monotonic() - started, complete, model, kind, sdk, feeds, thresholds)


def _snr(outcome: str) -> float:
    """The worst SNR a divergence probe's outcome carries (NaN where it carries none)."""
    found = re.search(r"worst SNR (\S+) dB", outcome)
    try:
        return float(found.group(1)) if found else float("nan")
    except ValueError:
        return float("nan")


def _same_departure(outcome: str, worst: float) -> bool:
    """A subgraph departs as the whole model does: beyond the thresholds, and as far (within SIGNATURE_DB), not by
    a milder miss on the way (where the whole model's figure is not a number, departing is enough)."""
    if not outcome.startswith(DEPARTS):
        return False
    snr = _snr(outcome)
    return worst != worst or snr <= worst + SIGNATURE_DB  # NaN: no figure to hold it to


def _localised_node(recorded: ValidationRecord, graph: Subgraphs, worst: float) -> int | None:
    """The index of the node where the failed validation's `localise` found the first departure, where it ran, found
    one in this graph, and that departure is the failure's (within SIGNATURE_DB of the whole model's worst SNR, as
    magika's overflow was; a milder miss on the way, ordinary rounding, is not kept for its own sake)."""
    divergence = recorded.figures.get("divergence") or {}
    if not isinstance(divergence, dict) or not divergence.get("found"):
        return None
    snr = divergence.get("snr_db")
    if isinstance(snr, (int, float)) and worst == worst and snr > worst + SIGNATURE_DB:
        return None
    name = divergence.get("node")
    return next((index for index, node in enumerate(graph.nodes) if name and node.name == name), None)


def _cut(graph: Subgraphs, indices: list[int], work: Path, name: str, probes: _Probes) -> tuple[str, Path | None]:
    key = graph.key(indices)
    if key in probes.known:
        return key, None
    try:
        return key, save_model(graph.model_of(indices), work / key[:16] / name)
    except ModelError as exc:  # no types to cut there: not the failure looked for
        probes.keep(key, f"cannot be cut: {exc}")
        return key, None


def _probe_with(build: Build, workspace: Workspace, graph: Subgraphs, probes: _Probes, work: Path, deadline: float,
                kind: str, module: str, request_for: Callable[[Path], Mapping[str, Any]],
                judged: Callable[[dict[str, Any]], str]) -> Callable[[list[int]], str]:
    """A probe: the subgraph cut and saved, `module`'s child job run on it in the EP's fork server within the `kind`
    child's limits and the time left, its answer `judged` (a failure of the job is judged by its stem), the
    outcome kept by the subgraph's content."""
    limits = build_limits(build, workspace, kind)

    def probe(indices: list[int]) -> str:
        key, path = _cut(graph, indices, work, build.members[0].model_file, probes)
        if path is None:
            return probes.known[key]
        probes.counted += 1
        what = f"reduce {build.name}: probe {probes.counted} ({len(indices)} nodes)"
        left = max(5.0, deadline - time.monotonic())
        try:
            outcome = judged(run_child(module, request_for(path), path.parent / "out",
                                       dataclasses.replace(limits, timeout_s=min(limits.timeout_s, left)), what,
                                       path.parent / "probe.log", ep=build.target.fork_server,
                                       expect=workspace.provenance, links=workspace.links))
        except (BuildError, ModelError) as exc:
            outcome = probes.failed(str(exc).removeprefix(f"{what}: "), path.parent / "probe.log")
        finally:
            shutil.rmtree(path.parent, ignore_errors=True)
        return probes.keep(key, outcome)

    return probe


def _compile_probe(build: Build, workspace: Workspace, graph: Subgraphs, probes: _Probes, work: Path,
                   deadline: float) -> Callable[[list[int]], str]:
    def request_for(path: Path) -> dict[str, Any]:
        job = compile_request(build, path.parent / "out")
        member = dataclasses.replace(job.members[0], model=str(path), inputs={}, weights=None, external_data=None)
        return dataclasses.replace(job, members=(member,)).to_json()

    def judged(answer: dict[str, Any]) -> str:
        probes.sdk = probes.sdk or CompileAnswer.from_json(answer).members[0].ep_sdk_version
        return PASSES

    return _probe_with(build, workspace, graph, probes, work, deadline, "compile", "epbuild.steps.compile",
                       request_for, judged)


def _failed_validation(build: Build, workspace: Workspace) -> ValidationRecord:
    """The build's failed validation (its validation.json): the thresholds a divergence must still miss, and where
    `localise` found the first departure."""
    try:
        recorded = read_validation(build.out_dir(workspace.layout))
    except (OSError, ValueError):
        recorded = None
    if recorded is None or recorded.status is not Verdict.FAILED or not recorded.thresholds:
        raise BuildError(f"{build.task} compiles now and {build.validate_task} has not failed (run it first): "
                         "nothing to reduce")
    return recorded


def _tensors(build: Build, workspace: Workspace, graph: Subgraphs, weights: Path | None, folder: Path,
             deadline: float) -> Path:
    """Every tensor a node of the model computes, on CPU with the validation's inputs (`tensors.npz`)."""
    out = folder / "tensors.npz"
    names = list(dict.fromkeys(o for node in graph.nodes for o in node.output if o))
    limits = build_limits(build, workspace, "validate")
    member = build.members[0]
    job = TensorsProbe(model=str(member.model.path), weights=str(weights) if weights else None, names=tuple(names),
                       inputs={name: list(shape) for name, shape in member.model.inputs.items()},
                       inputs_file=str(member.validation.inputs) if member.validation.inputs else None,
                       frozen={name: list(values) for name, values in (member.frozen or {}).items()}, out=str(out))
    left = max(5.0, deadline - time.monotonic())
    run_child("epbuild.steps.reduction.reduce_probe", job.to_json(), folder / "probes" / "tensors",
              dataclasses.replace(limits, timeout_s=left), f"reduce {build.name}: the model's tensors on CPU",
              folder / "probes" / "tensors.log",
              expect=workspace.provenance, links=workspace.links)
    return out


def _divergence_probe(build: Build, workspace: Workspace, graph: Subgraphs, probes: _Probes, work: Path,
                      tensors: Path, thresholds: dict[str, float], deadline: float) -> Callable[[list[int]], str]:
    target = build.target

    def request_for(path: Path) -> dict[str, Any]:
        return DepartureProbe(model=str(path), tensors=str(tensors), ep=target.ep.alias, device=target.device,
                              options=target.session_options(), thresholds=thresholds).to_json()

    def judged(answer: dict[str, Any]) -> str:
        probed = ProbeAnswer.from_json(answer)
        return f"{DEPARTS}; worst SNR {probed.snr_db} dB" if probed.departs else PASSES

    return _probe_with(build, workspace, graph, probes, work, deadline, "validate",
                       "epbuild.steps.reduction.reduce_probe", request_for, judged)
