"""The child job of a divergence reduction's probes (`steps.reduction.reduce`), in the EP's fork server like a
validation:

- `tensors`: the model run on CPU with the validation's inputs (from its .npz, else generated as the validation
  generates them), every tensor a node computes saved beside the inputs, so any subgraph is fed the values it
  reads in the whole model;
- `departs`: one subgraph compiled for the EP (ModelCompiler, as the compile does), run there and on CPU with those
  values, each output compared with the validation's thresholds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...contracts.jobs import DepartureProbe, ProbeAnswer, TensorsProbe
from ...errors import ModelError
from ...execute.child import serve
from ...execute.forked_jobs import Handoff
from ...files.weights import load_with_weights
from ..validation.comparison import compare
from ..validation.localise import _held, _run_with_outputs
from ..validation.validation_inputs import make_inputs, signature_of


def _cpu_options(ort: Any) -> Any:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return options


def tensors(job: TensorsProbe) -> ProbeAnswer:
    import numpy as np
    import onnxruntime as ort

    model = load_with_weights(job.model, Path(job.weights) if job.weights else None)
    feeds, _ = make_inputs(signature_of(model), model, job.inputs, job.inputs_file, job.frozen)
    values = _run_with_outputs(ort, model, list(job.names), lambda: _cpu_options(ort), ["CPUExecutionProvider"],
                               feeds)
    np.savez(job.out, **feeds, **values)
    return ProbeAnswer(saved=len(feeds) + len(values))


def departs(job: DepartureProbe) -> ProbeAnswer:
    import numpy as np
    import onnxruntime as ort

    from ...execute.host import register_plugin, select_ep_device
    from ...manifest.eps import known

    info = known(job.ep)
    register_plugin(ort, info)
    device = select_ep_device(ort, info, job.device)
    model, compiled = Path(job.model), Path(job.model).with_name("compiled.onnx")
    options = _cpu_options(ort)
    options.add_provider_for_devices([device], job.options)
    flags = int(ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED)
    ort.ModelCompiler(options, str(model), embed_compiled_data_into_model=False,
                      flags=flags).compile_to_file(str(compiled))
    ep_options = _cpu_options(ort)
    ep_options.add_provider_for_devices([device], job.options)
    on_ep = ort.InferenceSession(str(compiled), ep_options)
    on_cpu = ort.InferenceSession(str(model), _cpu_options(ort), providers=["CPUExecutionProvider"])
    with np.load(job.tensors) as saved:
        feeds = {i.name: saved[i.name] for i in on_cpu.get_inputs()}
    got, want = on_ep.run(None, feeds), on_cpu.run(None, feeds)
    metrics = {o.name: compare(g, w) for o, g, w in zip(on_cpu.get_outputs(), got, want, strict=True)}
    if not metrics:
        raise ModelError("the subgraph has no output")
    worst = min(m.get("snr_db", 0.0) for m in metrics.values())
    return ProbeAnswer(departs=not all(_held(m, job.thresholds) for m in metrics.values()),
                       snr_db=round(float(worst), 1))


def _job(request: dict[str, Any]) -> dict[str, Any]:
    kind = request.get("kind") if isinstance(request, dict) else None
    answer = tensors(TensorsProbe.from_json(request)) if kind == "tensors" else departs(
        DepartureProbe.from_json(request))
    return answer.to_json()


def main(handoff: Handoff | None = None) -> None:
    """`python -m` this module, or a fork server's child, runs this."""
    serve(_job, handoff)


if __name__ == "__main__":
    main()
