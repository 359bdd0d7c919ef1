"""What folding (the `fold` stage NPU targets get by default, `steps.folding`) does to the CPU reference: every
corpus model run on ONNX Runtime's CPU EP (every optimization off) as declared and folded, with the same generated
inputs.

    python bench/bench_folding.py [--no-torch]

Per model: nodes before and after, and per output the largest difference against the output's scale (max abs
difference / max abs value). Goal: fp32 rounding only (below 1e-5 relative). Writes bench/results/folding.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE / "corpus"), str(HERE.parent / "rules")]

from generate import CORPUS  # noqa: E402
from record import save  # noqa: E402

DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
          "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8}


def _inputs(session, rng: np.random.Generator, fixed: dict[str, list[int]]) -> dict[str, np.ndarray]:
    feeds = {}
    for value in session.get_inputs():
        shape = fixed.get(value.name) or [d if isinstance(d, int) and d > 0 else 1 for d in value.shape]
        dtype = DTYPES[value.type]
        if dtype in (np.int64, np.int32, np.uint8, np.int8):
            feeds[value.name] = rng.integers(0, 2, shape).astype(dtype)  # token ids, masks, flags, rates
        elif dtype is np.bool_:
            feeds[value.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _fixed(inputs: str) -> dict[str, list[int]]:
    """The corpus entry's `inputs = { name = [dims] }`, parsed as the manifest would."""
    import tomllib

    table = tomllib.loads(inputs) if inputs.startswith("inputs") else {}
    return table.get("inputs", {})


def compare(path: Path, fixed: dict[str, list[int]], folded: Path) -> dict[str, object]:
    import onnx
    import onnxruntime as ort

    from epbuild.steps.folding import fold_constants

    model = onnx.load(str(path))
    fold_constants(model)
    onnx.save(model, str(folded))
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    before = ort.InferenceSession(str(path), plain, providers=["CPUExecutionProvider"])
    after = ort.InferenceSession(str(folded), plain, providers=["CPUExecutionProvider"])
    feeds = _inputs(before, np.random.default_rng(0), fixed)
    names = [o.name for o in before.get_outputs()]
    worst = 0.0
    for expected, got in zip(before.run(names, feeds), after.run(names, feeds), strict=True):
        expected, got = np.asarray(expected, np.float64), np.asarray(got, np.float64)
        scale = float(np.max(np.abs(expected))) or 1.0
        worst = max(worst, float(np.max(np.abs(expected - got))) / scale if expected.size else 0.0)
    nodes = (len(onnx.load(str(path), load_external_data=False).graph.node),
             len(onnx.load(str(folded), load_external_data=False).graph.node))
    return {"nodes_before": nodes[0], "nodes_after": nodes[1], "worst_relative_difference": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-torch", action="store_true")
    arguments = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for entry in CORPUS:
            if entry.torch and arguments.no_torch:
                continue
            folder = Path(tmp) / entry.name
            folder.mkdir()
            path = entry.make(folder / f"{entry.name}.onnx")
            try:
                results[entry.name] = compare(path, _fixed(entry.inputs), folder / "folded.onnx")
            except Exception as exc:  # noqa: BLE001 - a model ORT cannot optimize is a finding, not a crash
                results[entry.name] = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"}
            row = results[entry.name]
            print(f"{entry.name:<18} " + (row["error"] if "error" in row else
                  f"{row['nodes_before']:>5} -> {row['nodes_after']:<5} nodes, worst relative difference "
                  f"{row['worst_relative_difference']:.2e}"))
    measured = [r for r in results.values() if "error" not in r]
    worst = max(r["worst_relative_difference"] for r in measured)
    print(f"{len(measured)} of {len(results)} models; worst relative difference {worst:.2e}")
    save("folding", [(f"folding (the `fold` stage, the NPU default) on the {len(measured)} corpus models, "
                      "CPU reference before and after", f"worst relative output difference {worst:.1e} (fp32 "
                      f"rounding); {sum(r['nodes_before'] - r['nodes_after'] for r in measured)} nodes folded "
                      "away in all")], results)


if __name__ == "__main__":
    main()
