"""Small real models and artifact readers for the tests."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper

if TYPE_CHECKING:
    from epbuild.store.cache import Workspace

# two shipped models for cpu and qnn-htp: the project most tests start from
TWO_MODELS_CPU_QNN = """
[models.tinycnn]
path = "models/tinycnn.onnx"

[models.encoder]
path = "models/encoder.onnx"

[targets.cpu]
ep = "cpu"

[targets.qnn-htp]
ep = "qnn"
options = { soc_model = 60 }
"""
# tinycnn alone for cpu and qnn-htp (an install, the runtime helpers)
TINYCNN_CPU_QNN = """
[models.tinycnn]
path = "models/tinycnn.onnx"

[targets.cpu]
ep = "cpu"

[targets.qnn-htp]
ep = "qnn"
options = { backend_type = "htp", soc_model = 60 }
"""
# the same with the model's targets listed, the qnn-htp table last (a test may append its options)
TINYCNN_LISTED = """
[models.tinycnn]
path = "models/tinycnn.onnx"
targets = ["cpu", "qnn-htp"]

[targets.cpu]
ep = "cpu"

[targets.qnn-htp]
ep = "qnn"
"""
OPENVINO_CPU_TARGET = """
[targets.openvino-cpu]
ep = "openvino@pypi"
device = "cpu"
options = { load_config = "configs/openvino_f32.json" }   # f32: without it many CPUs run bf16
option_files = ["load_config"]
"""


def single_op_model(path: Path, op: str, shape=(2, 3, 3)) -> Path:
    """A one-node float model; with op='Det' QNN HTP compiles nothing (a real EP failure)."""
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"])], op.lower(),
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(onnx.shape_inference.infer_shapes(model), str(path))
    return path


def ep_context_nodes(path: Path) -> list[dict]:
    model = onnx.load(str(path), load_external_data=False)
    return [{a.name: helper.get_attribute_value(a) for a in node.attribute}
            for node in model.graph.node if node.op_type == "EPContext"]


def tree_bytes(folder: Path) -> dict[str, bytes]:
    """Every artifact file under folder by relative path, skipping the build's state, logs and the reports
    (validation, build, HTML, JUnit, graph: they hold timings)."""
    reports = ("validation.json", "build-report.json", "report.html", "junit.xml", "graph.dot", "graph.svg")
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in reports
            and not {".state", ".logs", ".scratch"} & set(p.relative_to(folder).parts)}


def perturb_weights(path: Path, seed: int) -> None:
    """Change a model's bytes (first initializer) without changing its graph."""
    model = onnx.load(str(path))
    first = model.graph.initializer[0]
    array = onnx.numpy_helper.to_array(first).copy()
    array += np.random.default_rng(seed).standard_normal(array.shape).astype(array.dtype) * 0.01
    first.CopyFrom(onnx.numpy_helper.from_array(array, first.name))
    onnx.save(model, str(path))


def slow_model(path: Path, nodes: int = 60000) -> Path:
    """A valid model whose CPU compile (ORT graph optimization) takes seconds: a chain of `nodes` Adds."""
    one = onnx.numpy_helper.from_array(np.full((1, 4), 1e-6, np.float32), "one")
    chain = [helper.make_node("Add", ["x" if i == 0 else f"h{i - 1}", "one"], ["y" if i == nodes - 1 else f"h{i}"])
             for i in range(nodes)]
    graph = helper.make_graph(chain, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def model_with_location(root: Path, name: str, location: str) -> None:
    """models/NAME: tinycnn with its first weight said to be in external file `location`."""
    model = onnx.load(str(root / "models" / "tinycnn.onnx"))
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    (root / "models" / name).write_bytes(model.SerializeToString())


def setup_failing_checker(root: Path) -> None:
    """models/broken.onnx: tinycnn with a node input that names no tensor, which onnx.checker refuses."""
    model = onnx.load(str(root / "models" / "tinycnn.onnx"))
    model.graph.node[0].input[1] = "no_such_tensor"
    (root / "models" / "broken.onnx").write_bytes(model.SerializeToString())


WAIT_S = 300  # bounds far above the normal seconds: a build beside others on 2 cores must not fail the suite


def wait_for(what: str, condition, seconds: float = WAIT_S):
    """Wait for `condition()` to hold (polling), or fail saying what was awaited."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"waited {seconds:.0f} s for {what}")


def job_processes(root: Path) -> list[int]:
    """Processes running a job of `root`'s build: working inside its artifacts (a job starts in its scratch folder
    there) or writing their output there (a compile works from its model's folder, its output stays its log)."""
    import os

    inside = str(root / "artifacts")
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            for link in ("cwd", "fd/1"):
                try:
                    if os.readlink(entry / link).startswith(inside):
                        found.append(int(entry.name))
                        break
                except OSError:
                    continue
    return found


def validation_member(**fields):
    """A validation job's member (`contracts.jobs.ValidationMember`) for a test that calls the child's functions
    itself: a CPU run of `artifact` against `reference`, every other field as a plain target leaves it."""
    from epbuild.contracts.jobs import ValidationMember

    artifact = fields.get("artifact", "artifact.onnx")
    base = {"artifact": artifact, "files": [], "ep_sdk_version": None, "cpu_nodes": 1, "foldable_on_cpu": {},
            "source": artifact, "weights": {}, "reference": artifact, "declared": artifact,
            "reference_is": "the model as declared", "float_reference": None, "float_reference_is": "", "ep": "cpu",
            "device": "cpu", "embed": False, "mode": "run", "options": {}, "inputs": {}, "inputs_file": None,
            "precision": "fp32", "thresholds": {}, "frozen": {}, "entry": "models.m", "manifest": "models.toml",
            "target": "cpu", "localise": False, "compile_options": {}, "localise_budget_s": 60.0}
    return ValidationMember(**{**base, **fields})


def workspace(artifacts: Path, cache: Path) -> Workspace:
    """A build's workspace outside a build: no remote, no executor, the provenance a build here reads."""
    from epbuild.execute.provenance import Provenance
    from epbuild.steps.job_modules import CODE_ROOTS
    from epbuild.store.cache import Workspace

    return Workspace(artifacts, cache, None, provenance=Provenance.read(CODE_ROOTS))
