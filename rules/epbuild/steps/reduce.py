"""`epbuild reduce`: a failing compile reduced to the smallest subgraph that still fails the same way, then written
as a folder a vendor can act on (`steps.repro`).

Each probe is a real compile of one subgraph, by the same child job as the failing task (`epbuild.steps.compile`:
ModelCompiler, then the compiled model opened on its EP), within the target's limits and the reduction's time left.
"The same way" is the failure's stem (`reduce_graph.stem`: its first line without names, paths and numbers), so a
subgraph that fails otherwise (the EP compiles nothing of it, say) is not taken. The search: the shortest prefix of
the model's nodes (in order) that fails, then the latest start of a window ending there that fails, then each node
of the window dropped in turn where the rest still fails. Every probe's outcome is kept by the subgraph's content
in the repro folder (`probes.json`), so running the reduction again asks the EP nothing it was asked before; past
its time budget a reduction stops with the smallest failing subgraph found so far, and says so.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import BuildError, ModelError
from ..execute.child import run_child
from ..files.layout import write_json
from ..files.weights import resolved
from ..manifest.builds import Build
from ..store.cache import Workspace
from .compilers.ort import compile_request
from .expected_peak import build_limits
from .reduce_graph import Subgraphs, save_model, stem

PASSES = ""  # a probe's outcome when its subgraph compiled and opened


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


def reducible(build: Build) -> str | None:
    """Why `build`'s failure cannot be reduced here (None: it can): a probe is a compile through ONNX Runtime of
    one model for an EP."""
    target = build.target
    if build.shared:
        return f"a group's failure: reduce the compile of one of its members (reduce:{build.members[0].name}@...)"
    if target.is_cpu:
        return "a CPU target compiles nothing to reduce (its failures are the model's: see the compile log)"
    if target.compiler not in ("ort", "ort_session"):
        return f"compiler = \"{target.compiler}\" runs outside ONNX Runtime: only ONNX Runtime compiles are reduced"
    return None


def reduce_compile(build: Build, workspace: Workspace, folder: Path, budget_s: float,
                   say: Callable[[str], None] = print) -> Reduction:
    """Reduce the failing compile of `build`'s single model into `folder` (the repro folder: probes.json and a
    work folder for the probes, removed at the end). Raises BuildError when the full model compiles now."""
    started = time.monotonic()
    deadline = started + budget_s
    member = build.members[0]
    elsewhere = member.weights.get(str(member.model.path))
    graph = Subgraphs(member.model.path, resolved(member.model.path, elsewhere) if elsewhere else None)
    work = folder / "probes"
    known_path = folder / "probes.json"
    try:
        known: dict[str, str] = json.loads(known_path.read_text())
    except (OSError, ValueError):
        known = {}
    limits = build_limits(build, workspace, "compile")
    counted = [0]
    messages: dict[str, str] = {}

    def probe(indices: list[int]) -> str:
        key = graph.key(indices)
        if key in known:
            return known[key]
        try:
            path = save_model(graph.model_of(indices), work / key[:16] / member.model_file)
        except ModelError as exc:  # no types to cut there: not the failure looked for
            known[key] = f"cannot be cut: {exc}"
            return known[key]
        left = max(5.0, deadline - time.monotonic())
        request = compile_request(build, path.parent / "out")
        request["members"][0].update(model=str(path), inputs={}, weights=None, external_data=None)
        counted[0] += 1
        what = f"reduce {build.name}: probe {counted[0]} ({len(indices)} nodes)"
        try:
            run_child("epbuild.steps.compile", request, path.parent / "out",
                      dataclasses.replace(limits, timeout_s=min(limits.timeout_s, left)), what,
                      path.parent / "probe.log", ep=build.target.ep.fork_server, expect=workspace.provenance)
            outcome = PASSES
        except (BuildError, ModelError) as exc:
            message = str(exc).removeprefix(f"{what}: ")  # the EP's words, and the child's output below them
            outcome = stem(message) or "failed"
            if outcome not in messages:  # the first probe that failed so: its whole output, for failure.log
                log = path.parent / "probe.log"
                first = re.sub(r"\s*\(full output: [^)]*\)", "", message.splitlines()[0])
                output = log.read_text(errors="replace") if log.is_file() else "\n".join(message.splitlines()[1:])
                messages[outcome] = f"{first}\n\n{output}"
        finally:
            shutil.rmtree(path.parent, ignore_errors=True)
        known[key] = outcome
        write_json(known_path, known)
        return outcome

    whole = probe(list(range(len(graph))))
    if whole == PASSES:
        raise BuildError(f"{build.task} compiles now: nothing to reduce")
    said = (messages.get(whole) or whole).strip().splitlines()[0][:200]
    say(f"reducing {build.task}: {len(graph)} nodes fail with: {said}")
    kept, complete = search(len(graph), lambda indices: probe(indices) == whole, deadline)
    shutil.rmtree(work, ignore_errors=True)
    message = messages.get(whole)
    if message is None:  # the whole model's outcome was known from an earlier reduction: its log is in the folder
        log = folder / "failure.log"
        message = log.read_text() if log.is_file() else whole
    return Reduction(len(graph), kept, whole, message, counted[0], time.monotonic() - started, complete,
                     graph.model_of(kept))
