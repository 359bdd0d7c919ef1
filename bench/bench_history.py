"""What the QNN history check adds to a validation: the repeat made in a new session after another graph ran on the
EP (`steps.validation.history`) against the repeat on the same session it replaces.

    python bench/bench_history.py [--repeats 7]

Artifacts: the shipped example's tinycnn and encoder and a generated 3 MB convolutional model, each compiled for
qnn-htp (soc_model 60) with ModelCompiler in this process. For each, interleaved repeat by repeat, medians: the old
repeat (one run on the open session) and the new one (the dirtying graph compiled online and run, the artifact's new
session, one run), on the HTP simulator. Writes bench/results/history.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from record import save

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "rules"))

from epbuild.steps.validation.history import dirty  # noqa: E402

OPTIONS = {"backend_type": "htp", "soc_model": "60"}


def conv_stack(path: Path, size: int, pooled: bool = False) -> str:
    """Four 3x3 convolutions of 144 channels on a SIZExSIZE image (0.75 M weights, 3 MB of fp32), seeded; with
    `pooled`, averaged to 144 logits. Returns the output's name. (bench_samples.py uses it too.)"""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, previous = [], [], "x"
    for i in range(4):
        weights.append(numpy_helper.from_array((rng.standard_normal((144, 3 if i == 0 else 144, 3, 3)) * 0.05)
                                               .astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("Conv", [previous, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        previous = f"r{i}"
    shape = [1, 144, size, size]
    if pooled:
        nodes += [helper.make_node("GlobalAveragePool", [previous], ["pooled"]),
                  helper.make_node("Flatten", ["pooled"], ["logits"])]
        previous, shape = "logits", [1, 144]
    image = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])
    result = helper.make_tensor_value_info(previous, TensorProto.FLOAT, shape)
    graph = helper.make_graph(nodes, "conv", [image], [result], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return previous


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    import numpy as np
    import onnxruntime as ort
    import onnxruntime_qnn

    ort.set_default_logger_severity(3)
    ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
    device = next(d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider")

    def options():
        so = ort.SessionOptions()
        so.add_provider_for_devices([device], OPTIONS)
        return so

    work = Path(tempfile.mkdtemp(prefix="bench-history-"))
    conv_stack(work / "three_mb.onnx", 32)
    sources = {"tinycnn": REPO / "models" / "tinycnn.onnx", "encoder": REPO / "models" / "encoder.onnx",
               "3 MB conv": work / "three_mb.onnx"}
    rows, data = [], {}
    for name, source in sources.items():
        artifact = work / f"{source.stem}_ctx.onnx"
        ort.ModelCompiler(options(), str(source), embed_compiled_data_into_model=False).compile_to_file(str(artifact))
        session = ort.InferenceSession(str(artifact), options())
        rng = np.random.default_rng(1)
        feeds = {i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
                 for i in session.get_inputs()}
        session.run(None, feeds)
        same, fresh = [], []
        for _ in range(args.repeats):
            began = time.perf_counter()
            session.run(None, feeds)
            same.append(time.perf_counter() - began)
            began = time.perf_counter()
            assert dirty(ort, options()) is None
            ort.InferenceSession(str(artifact), options()).run(None, feeds)
            fresh.append(time.perf_counter() - began)
        before, after = statistics.median(same), statistics.median(fresh)
        data[name] = {"same_session_s": same, "after_other_graph_s": fresh}
        rows.append((f"QNN history check, {name}: the repeat after another graph in a new session (was: on the same "
                     "session)", f"{after:.2f} s (was {before:.2f} s): {after - before:+.2f} s a validation"))
        print(rows[-1])
    save("history", rows, data)


if __name__ == "__main__":
    main()
