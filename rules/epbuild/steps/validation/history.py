"""Whether an artifact's outputs depend on what ran before on its EP. QNN's HTP backend leaves part of some outputs
unwritten (a ConvTranspose with `output_shape`): a fresh process reads 0 there, a process that ran another graph
reads that graph's leftovers, so a verdict would follow the order of the jobs in a warm worker and an application
that runs another model first gets silently wrong values. A second run of the same session repeats them, so only
a run after another graph sees it: `dirty` runs a different graph on the EP with the same options (a 256x256 MatMul
of large seeded values, compiled online: its cost in docs/performance.md; found by trying Add, Conv, ConvTranspose
and MatMul graphs, each of which leaves the same 16 positions of the repro's output different, where a graph of
the same shapes as the artifact's and the artifact itself with other data leave none), then the artifact runs in a
new session. Only EPs whose entry asks for it (`EpInfo.history_check`)."""

from __future__ import annotations

from typing import Any

DIRTY_SEED = 20261207  # the dirtying graph's values: fixed, so a failure reproduces, and unlike any input's


def dirtying_model() -> bytes:
    """A graph whose inputs and output fill more of the EP's buffers than a small artifact's with large values."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["Y"])], "epbuild_dirtying",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, 256, 256]),
         helper.make_tensor_value_info("B", TensorProto.FLOAT, [256, 256])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 256, 256])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def dirty(ort: Any, options: Any) -> str | None:
    """Run the dirtying graph on the EP `options` name (fallback to CPU disabled: on CPU it would dirty nothing);
    None, or why it could not run (the check is then not made, and said so)."""
    import numpy as np

    options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    try:
        session = ort.InferenceSession(dirtying_model(), options)
        rng = np.random.default_rng(DIRTY_SEED)
        session.run(None, {i.name: (rng.standard_normal(i.shape) * 100).astype(np.float32)
                           for i in session.get_inputs()})
    except Exception as exc:  # noqa: BLE001 - the check is skipped with the EP's own words
        return " ".join(str(exc).split())[:200]
    return None


def leftovers_line(output: str, differ: int, size: int, by: str, ep: str) -> str:
    """The failure: what happens, what it means for an application, where the vendor repro is."""
    return (f"output '{output}': {differ} of {size} values depend on what ran before on {ep} (unwritten by it): "
            f"they differ{by} after another graph ran on the EP, and a second run of that session repeats them, so "
            "an application that runs another model first gets other values (docs/targets/qnn.md has a repro for "
            "a vendor report)")
