"""The folder `epbuild reduce` leaves for a bug report: the reduced model with its weights, inputs for it (for a
divergence, the values they have in the whole model), the target's options, the versions, the failure's log, a
standalone `repro.py` (ONNX Runtime and the EP's plugin only, no epbuild) and a README with the line to paste into
a report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...files.layout import write_json
from ...manifest.builds import Build
from .reduce import Reduction
from .reduce_graph import save_model

MODEL = "model.onnx"

REPRO_HEAD = '''"""Reproduces {what}: {stem}
Found by `epbuild reduce {task}` ({before} -> {after} nodes). Needs only onnxruntime and the EP's plugin:
    pip install {packages}
    python repro.py        # exit status 1: reproduced; 0: {passes}
"""

import json
import sys
from pathlib import Path

import onnxruntime as ort

HERE = Path(__file__).resolve().parent
SETTINGS = json.loads((HERE / "options.json").read_text())


def device():
    """The EP's device, registering its plugin library first (a PyPI plugin EP)."""
    ep = SETTINGS["ep"]
    if SETTINGS["plugin_module"] and not any(d.ep_name == ep for d in ort.get_ep_devices()):
        ort.register_execution_provider_library(ep, __import__(SETTINGS["plugin_module"]).get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == ep]
    key, wanted = SETTINGS["device_metadata"], SETTINGS["device"]
    if key:
        devices = [d for d in devices if d.ep_metadata.get(key, "").upper().startswith(wanted.upper())]
    else:
        devices = [d for d in devices if d.device.type.name.lower() == wanted] or devices
    if not devices:
        sys.exit(f"{{ep}} offers no {{wanted}} device on this host: cannot try")
    return devices[0]


def session_options(ep_device):
    options = ort.SessionOptions()
    options.add_provider_for_devices([ep_device], SETTINGS["provider_options"])
    return options


'''

COMPILE_MAIN = '''def main():
    ep_device = device()
    compiled = HERE / "compiled" / "model_ctx.onnx"
    compiled.parent.mkdir(exist_ok=True)
    try:
        flags = int(ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED)
        ort.ModelCompiler(session_options(ep_device), str(HERE / "{model}"), embed_compiled_data_into_model=False,
                          flags=flags).compile_to_file(str(compiled))
        ort.InferenceSession(str(compiled), session_options(ep_device))
    except Exception as exc:  # the failure this folder reproduces
        print(f"reproduced: {{type(exc).__name__}}: {{exc}}")
        return 1
    print("not reproduced: the model compiled and opened")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''

DIVERGENCE_MAIN = '''def snr_db(got, want):
    import numpy as np

    got, want = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    noise = float(np.sum((got - want) ** 2))
    return 200.0 if noise == 0 else 10 * np.log10(max(float(np.sum(want ** 2)), 1e-300) / noise)


def main():
    import numpy as np

    ep_device = device()
    compiled = HERE / "compiled" / "model_ctx.onnx"
    compiled.parent.mkdir(exist_ok=True)
    flags = int(ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED)
    ort.ModelCompiler(session_options(ep_device), str(HERE / "{model}"), embed_compiled_data_into_model=False,
                      flags=flags).compile_to_file(str(compiled))
    on_ep = ort.InferenceSession(str(compiled), session_options(ep_device))
    on_cpu = ort.InferenceSession(str(HERE / "{model}"), providers=["CPUExecutionProvider"])
    with np.load(HERE / "inputs.npz") as saved:
        feeds = {{i.name: saved[i.name] for i in on_cpu.get_inputs()}}
    wanted = SETTINGS["thresholds"].get("min_snr_db", 0.0)
    worst = min((snr_db(g, w), o.name) for o, g, w in zip(on_cpu.get_outputs(), on_ep.run(None, feeds),
                                                         on_cpu.run(None, feeds)))
    if worst[0] < wanted:
        name, ep = worst[1], SETTINGS["ep"]
        print(f"reproduced: output {{name!r}} on {{ep}} is {{worst[0]:.1f}} dB from CPU (< {{wanted:g}})")
        return 1
    print(f"not reproduced: every output within {{wanted:g}} dB of CPU (worst {{worst[0]:.1f}} dB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


def _inputs(model: Any) -> dict[str, Any]:
    """Fixed-seed inputs for the reduced model's inputs, by their declared types and shapes."""
    import numpy as np
    from onnx import helper

    rng, feeds = np.random.default_rng(0), {}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in tensor.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        feeds[value.name] = (rng.standard_normal(shape).astype(dtype) if np.issubdtype(dtype, np.floating)
                             else np.zeros(shape, dtype))
    return feeds


def write_repro(folder: Path, build: Build, reduction: Reduction, versions: dict[str, Any]) -> Path:
    """Write the repro folder for a reduced compile failure; returns it."""
    import numpy as np

    target = build.target
    folder.mkdir(parents=True, exist_ok=True)
    save_model(reduction.model, folder / MODEL)
    np.savez(folder / "inputs.npz", **(reduction.feeds or _inputs(reduction.model)))
    info = target.ep
    write_json(folder / "options.json", {"ep": target.ep.name, "plugin_module": info.module,
                                         "device": target.device, "device_metadata": info.device_metadata,
                                         "provider_options": target.session_options(), "compiler": target.compiler,
                                         "embed": target.embed, "thresholds": reduction.thresholds})
    write_json(folder / "versions.json", versions)
    (folder / "failure.log").write_text(reduction.message.rstrip() + "\n")
    packages = " ".join(f"{name}=={version}" for name, version in versions.items()
                        if version and name in ("onnxruntime", info.package))
    diverges = reduction.kind == "divergence"
    task = build.validate_task if diverges else build.task
    what = (f"{target.ep.name} departing from CPU on a {len(reduction.kept)}-node model" if diverges else
            f"{target.ep.name} failing to compile a {len(reduction.kept)}-node model")
    passes = "every output within the thresholds of CPU" if diverges else "the model compiled and opened"
    template = REPRO_HEAD + (DIVERGENCE_MAIN if diverges else COMPILE_MAIN)
    (folder / "repro.py").write_text(template.format(what=what, stem=reduction.stem, task=task,
                                                     before=reduction.nodes_before, after=len(reduction.kept),
                                                     packages=packages or "onnxruntime", model=MODEL, passes=passes))
    ops = ", ".join(dict.fromkeys(node.op_type for node in reduction.model.graph.node))
    first_line = reduction.message.strip().splitlines()[0][:300] if reduction.message.strip() else reduction.stem
    (folder / "README.md").write_text(
        f"# {what}\n\n"
        f"{target.ep.name} ({', '.join(f'{k} {v}' for k, v in versions.items() if v)}) fails on a "
        f"{len(reduction.kept)}-node ONNX model ({ops}) with: `{first_line}`. Reproduce with `python repro.py` "
        f"in this folder (onnxruntime and the plugin only); provider options in options.json, the full log in "
        f"failure.log.\n\nReduced by `epbuild reduce {task}` from {reduction.nodes_before} nodes in "
        f"{reduction.probes} compiles ({reduction.seconds:.0f} s"
        f"{'' if reduction.complete else ', stopped by its time budget: smaller may exist'}).\n")
    (folder / "reduction.json").write_text(json.dumps({
        "task": task, "kind": reduction.kind, "nodes_before": reduction.nodes_before,
        "nodes_after": len(reduction.kept),
        "kept": reduction.kept, "ops": ops.split(", "), "stem": reduction.stem, "probes": reduction.probes,
        "seconds": round(reduction.seconds, 1), "complete": reduction.complete}, indent=1) + "\n")
    return folder
