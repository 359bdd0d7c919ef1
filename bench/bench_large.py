"""Large models end to end: a > 2 GiB model for `cpu` and `qnn-htp` (written, built, validated, deleted), and a
prompt/token pair of a ~50 M parameter decoder as one weight-shared QNN context, with time and peak memory per task.

    python bench/bench_large.py [--gib 3] [--skip-large] [--skip-decoder]

The large model is a chain of square fp32 MatMuls (8192 wide) with its weights in external data and a symbolic
batch, so the NPU chain runs the shape and fold stages (graph only: their memory is the graph's) before QNN compiles
it. The decoder is `tests/real_models.kv_decoder` at hidden 1024, 4 layers, vocabulary 8192 (~50 M parameters),
prompt 64 / token 1 in a 256 context. Writes bench/results/large.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(HERE), str(REPO / "tests")]

from record import RESULTS, save  # noqa: E402

WIDTH = 8192


def write_chain(path: Path, gib: float, static: bool = False) -> int:
    """A MatMul chain of about `gib` GiB, written layer by layer (never the whole model in memory); a symbolic
    batch unless `static`."""
    import onnx
    from onnx import TensorProto, helper

    layers = max(1, round(gib * 2**30 / (WIDTH * WIDTH * 4)))
    data = path.with_name(f"{path.name}.data")
    rng = np.random.default_rng(0)
    weights, nodes, current, offset = [], [], "x", 0
    with open(data, "wb") as out:
        for index in range(layers):
            array = (rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) / WIDTH**0.5).astype(np.float32)
            out.write(array.tobytes())
            weight = TensorProto(name=f"layers.{index}.weight", data_type=TensorProto.FLOAT, dims=[WIDTH, WIDTH],
                                 data_location=TensorProto.EXTERNAL)
            for key, value in (("location", data.name), ("offset", str(offset)), ("length", str(array.nbytes))):
                weight.external_data.add(key=key, value=value)
            offset += array.nbytes
            weights.append(weight)
            nodes.append(helper.make_node("MatMul", [current, weight.name], [f"layers.{index}.out"]))
            current = f"layers.{index}.out"
    nodes.append(helper.make_node("Tanh", [current], ["y"]))
    batch = 1 if static else "batch"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, WIDTH])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    if static:  # every shape known: an NPU target compiles it as declared, with no shape stage
        model = onnx.shape_inference.infer_shapes(model)
    onnx.save(model, str(path))
    return offset


def build(folder: Path, manifest: str, jobs: int = 1) -> tuple[dict, float, str]:
    (folder / "models.toml").write_text(manifest)
    (folder / "dodo.py").write_text("from epbuild.dodo import *  # noqa: F403\n")
    env = {**os.environ, "PYTHONPATH": str(REPO / "rules"), "EPBUILD_CACHE_DIR": str(folder / "cache")}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "doit", "--continue", "-n", str(jobs)], cwd=folder, env=env,
                          capture_output=True, text=True)
    seconds = time.monotonic() - started
    report = json.loads((folder / "artifacts" / "build-report.json").read_text())["tasks"]
    return report, seconds, done.stdout + done.stderr


def disk_bytes(folder: Path) -> int:
    """Bytes the files under `folder` take on disk (a reflink or sparse file counts what it allocates)."""
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def per_task(report: dict) -> dict[str, dict]:
    return {name: {"status": entry.get("status"), "seconds": entry.get("seconds"),
                   "peak_mb": (entry.get("child") or {}).get("peak_mb")} for name, entry in sorted(report.items())}


QNN = '[targets.qnn-htp]\nep = "qnn"\noptions = { soc_model = 60 }\ntimeout_s = 1800\n'


def large(gib: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="epbuild-large.", dir=os.environ.get("EPBUILD_BENCH_DIR")) as temporary:
        folder = Path(temporary)
        (folder / "models").mkdir()
        started = time.monotonic()
        size = write_chain(folder / "models" / "chain.onnx", gib)
        written = time.monotonic() - started
        report, seconds, output = build(folder, '[models.chain]\npath = "models/chain.onnx"\n'
                                                'inputs = { x = [1, 8192] }\nvalidation = { timeout_s = 1800 }\n'
                                                '[targets.cpu]\nep = "cpu"\n' + QNN)
        validations = {t: json.loads((folder / "artifacts" / t / "chain" / "validation.json").read_text())
                       for t in ("cpu", "qnn-htp") if (folder / "artifacts" / t / "chain" / "validation.json").exists()}
        return {"weights_bytes": size, "write_seconds": round(written, 1), "build_seconds": round(seconds, 1),
                "tasks": per_task(report), "stages_disk_bytes": disk_bytes(folder / "artifacts" / ".stages"),
                "cache_disk_bytes": disk_bytes(folder / "cache"),
                "snr_db": {t: min(o["snr_db"] for o in v.get("outputs", {}).values()) if v.get("outputs") else None
                           for t, v in validations.items()},
                "status": {t: v["status"] for t, v in validations.items()},
                "failures": [line for line in output.splitlines() if line.startswith(("failed", "compile ", "error"))]}


def decoder() -> dict:
    from real_models import kv_decoder

    with tempfile.TemporaryDirectory(prefix="epbuild-decoder.") as temporary:
        folder = Path(temporary)
        (folder / "models").mkdir()
        kv_decoder(folder / "models" / "decoder.onnx", layers=4, hidden=1024, heads=16, vocab=8192)
        parameters = (folder / "models" / "decoder.onnx.data").stat().st_size // 4
        manifest = ('[models.decoder]\npath = "models/decoder.onnx"\ndims = { batch_size = 1 }\n'
                    '[models.decoder.variants.prompt]\ndims = { sequence_length = 64, past_sequence_length = 192, '
                    'total_sequence_length = 256 }\n[models.decoder.variants.token]\ndims = { sequence_length = 1, '
                    'past_sequence_length = 255, total_sequence_length = 256 }\n' + QNN +
                    '[groups.llm]\ntarget = "qnn-htp"\nmodels = ["decoder.prompt", "decoder.token"]\n'
                    'pipeline = { tokens = 4 }\n')
        report, seconds, _ = build(folder, manifest, jobs=2)
        group = folder / "artifacts" / "qnn-htp" / "groups" / "llm"
        loading = json.loads((group / "artifact.json").read_text())["loading"]
        validation = json.loads((group / "validation.json").read_text())
        return {"parameters": parameters, "build_seconds": round(seconds, 1), "tasks": per_task(report),
                "weights_bytes": (folder / "models" / "decoder.onnx.data").stat().st_size,
                "stages_disk_bytes": disk_bytes(folder / "artifacts" / ".stages"),
                "cache_disk_bytes": disk_bytes(folder / "cache"),
                "sharing": loading["sharing"], "validation": validation["status"],
                "reason": validation.get("reason", "")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=3.0)
    parser.add_argument("--skip-large", action="store_true")
    parser.add_argument("--skip-decoder", action="store_true")
    arguments = parser.parse_args()
    previous = RESULTS / "large.json"  # a part skipped keeps its last figures
    kept = json.loads(previous.read_text()) if previous.exists() else {"data": {}, "rows": []}
    data, rows = {}, []
    if arguments.skip_large and "large" in kept["data"]:
        data["large"] = kept["data"]["large"]
        rows += [tuple(row) for row in kept["rows"] if row[0].startswith(("3", "2", "1", "4")) and "GiB" in row[0]]
    if not arguments.skip_large:
        data["large"] = found = large(arguments.gib)
        tasks = found["tasks"]
        for name in ("shape:chain", "fold:chain", "compile:chain@cpu", "compile:chain@qnn-htp",
                     "validate:chain@cpu", "validate:chain@qnn-htp"):
            entry = tasks.get(name, {})
            rows.append((f"{found['weights_bytes'] / 2**30:.1f} GiB model: {name}",
                         f"{entry.get('status')}, {entry.get('seconds') or 0:.1f} s, peak "
                         f"{entry.get('peak_mb') or 0:.0f} MB"))
        rows.append((f"{found['weights_bytes'] / 2**30:.1f} GiB model: stage outputs and cache on disk",
                     f"{found['stages_disk_bytes'] / 2**20:.0f} MiB / {found['cache_disk_bytes'] / 2**20:.0f} MiB"))
    if arguments.skip_decoder and "decoder" in kept["data"]:
        data["decoder"] = kept["data"]["decoder"]
        rows += [tuple(row) for row in kept["rows"] if row[0].startswith("decoder")]
    if not arguments.skip_decoder:
        data["decoder"] = found = decoder()
        sharing = found["sharing"]
        alone = sum((sharing.get("alone_bytes") or {}).values())
        rows.append((f"decoder {found['parameters'] / 1e6:.0f} M parameters, prompt + token in one QNN context",
                     f"{sharing['shared_bytes'] / 1e6:.1f} MB shared vs {alone / 1e6:.1f} MB alone "
                     f"(ratio {sharing.get('ratio')}); pipeline: {found['validation']}"))
        rows.append((f"decoder: stage outputs and cache on disk ({found['weights_bytes'] / 2**20:.0f} MiB of weights)",
                     f"{found['stages_disk_bytes'] / 2**20:.0f} MiB / {found['cache_disk_bytes'] / 2**20:.0f} MiB"))
    print(json.dumps(data, indent=1))
    save("large", rows, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
