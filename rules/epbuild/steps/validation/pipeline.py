"""Validating a prompt + token group as an LLM application runs it (`[groups.NAME] pipeline`), in the validating
child: the prompt graph on generated prompt tokens, then N greedy token steps, each fed the previous step's KV
cache, on the target's EP and on CPU with the source models, compared step by step.

The conventions are onnxruntime-genai's names: `present.X` outputs feed `past_key_values.X` inputs (where the token
graph's cache is shorter than what a step returns, its newest positions: a fixed context window slides);
`input_ids` gets the prompt, then each greedy token; `attention_mask` (batch, total) marks filled positions with 1;
`position_ids`, when the model has it, counts the filled positions. Both sides are fed the CPU's greedy tokens, so
every step compares the same computation; the EP's own greedy tokens are reported and must agree.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ...contracts.jobs import ValidationJob, ValidationMember, ValidationReport
from ...contracts.statuses import Verdict
from ...errors import ModelError
from ...files.weights import read_weights_from, weights_folder
from ...manifest.eps import known
from ..packaging.package import GENAI_CONFIG
from .artifact_session import is_qdq, open_session
from .comparison import DEFAULT_THRESHOLDS, compare
from .pipeline_checks import genai_folder_run, genai_run, growing_run
from .reference import NO_TIME, session_options
from .validation_inputs import SEED, dtype_of

PAST, PRESENT = "past_key_values.", "present."
SLIDING, FROM_START = "sliding", "from-start"  # cache layouts (`layout_of`)


def layout_of(model_path: str) -> str:
    """How the model keeps its KV cache. GroupQueryAttention (onnxruntime-genai's builder) writes the cache from
    position 0 and attends to as many positions as the mask marks: the cache is handed on from its start, the mask
    marks the filled positions first. Otherwise a fixed window slides: the newest positions, the mask's padding
    first."""
    import onnx

    graph = onnx.load(model_path, load_external_data=False).graph
    return FROM_START if any(n.op_type == "GroupQueryAttention" for n in graph.node) else SLIDING


class Graph:
    """One graph of the pipeline (a session) and what its inputs need."""

    def __init__(self, session: Any, role: str, layout: str = SLIDING):
        self.session, self.role, self.layout = session, role, layout
        self.inputs = {i.name: i for i in session.get_inputs()}
        self.outputs = [o.name for o in session.get_outputs()]
        unknown = [n for n in self.inputs if not n.startswith(PAST)
                   and n not in ("input_ids", "attention_mask", "position_ids")]
        if unknown or "input_ids" not in self.inputs or "logits" not in self.outputs:
            raise ModelError(f"the {role} graph does not follow the pipeline's conventions (input_ids, "
                             f"attention_mask, position_ids, past_key_values.*; logits, present.*): "
                             f"{'inputs ' + ', '.join(unknown) if unknown else 'no input_ids or logits'}")
        ids = self.inputs["input_ids"].shape
        if not all(isinstance(d, int) for d in ids):
            raise ModelError(f"the {role} graph's input_ids has symbolic shape {ids}: fix it with dims")
        self.sequence = ids[1]

    def cache_length(self) -> int:
        past = [i for n, i in self.inputs.items() if n.startswith(PAST)]
        return past[0].shape[2] if past else 0

    def feeds(self, tokens: list[int], filled: int, cache: dict[str, Any] | None) -> dict[str, Any]:
        """Inputs for the last `self.sequence` of `tokens`, with `filled` positions of the cache in use."""
        import numpy as np

        length = self.cache_length()
        total = length + self.sequence
        feeds = {"input_ids": np.array([tokens[-self.sequence:]], dtype=dtype_of(self.inputs["input_ids"].type))}
        if self.layout == FROM_START:
            return self._from_start(feeds, filled, cache)
        if "attention_mask" in self.inputs:
            in_use = min(filled, length)
            mask = [0] * (length - in_use) + [1] * (in_use + self.sequence)
            feeds["attention_mask"] = np.array([mask[-total:]], dtype=dtype_of(self.inputs["attention_mask"].type))
        if "position_ids" in self.inputs:
            start = len(tokens) - self.sequence
            feeds["position_ids"] = np.array([list(range(start, start + self.sequence))],
                                             dtype=dtype_of(self.inputs["position_ids"].type))
        for name, value in self.inputs.items():
            if not name.startswith(PAST):
                continue
            shape = [d if isinstance(d, int) else 1 for d in value.shape]
            if cache is None:
                feeds[name] = np.zeros(shape, dtype=dtype_of(value.type))
                continue
            present = cache.get(PRESENT + name[len(PAST):])
            if present is None:
                raise ModelError(f"the {self.role} graph's input '{name}' has no '{PRESENT}{name[len(PAST):]}' "
                                 "output to come from")
            feeds[name] = present[:, :, present.shape[2] - shape[2]:, :].astype(dtype_of(value.type))
        return feeds

    def _from_start(self, feeds: dict[str, Any], filled: int, cache: dict[str, Any] | None) -> dict[str, Any]:
        """The cache from position 0 (`FROM_START`): the mask marks the `filled` positions and this step's, then
        padding; each past input takes the first positions of the present output it continues."""
        import numpy as np

        mask_shape = self.inputs["attention_mask"].shape if "attention_mask" in self.inputs else []
        total = mask_shape[1] if len(mask_shape) == 2 and isinstance(mask_shape[1], int) else None
        length = self.cache_length()
        if filled + self.sequence > (total or length + self.sequence) or (filled and filled > length):
            raise ModelError(f"the {self.role} graph's cache holds {length} positions and its mask "
                             f"{total or length + self.sequence}: {filled} filled + {self.sequence} new do not fit; "
                             "raise past_sequence_length and total_sequence_length in its dims, or lower "
                             "pipeline.tokens")
        if total is not None:
            mask = [1] * (filled + self.sequence) + [0] * (total - filled - self.sequence)
            feeds["attention_mask"] = np.array([mask], dtype=dtype_of(self.inputs["attention_mask"].type))
        if "position_ids" in self.inputs:
            feeds["position_ids"] = np.array([list(range(filled, filled + self.sequence))],
                                             dtype=dtype_of(self.inputs["position_ids"].type))
        for name, value in self.inputs.items():
            if not name.startswith(PAST):
                continue
            shape = [d if isinstance(d, int) else 1 for d in value.shape]
            past = np.zeros(shape, dtype=dtype_of(value.type))
            present = None if cache is None else cache.get(PRESENT + name[len(PAST):])
            if cache is not None and present is None:
                raise ModelError(f"the {self.role} graph's input '{name}' has no '{PRESENT}{name[len(PAST):]}' "
                                 "output to come from")
            if present is not None:
                kept = min(present.shape[2], shape[2])
                past[:, :, :kept] = present[:, :, :kept]
            feeds[name] = past
        return feeds

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        return dict(zip(self.outputs, self.session.run(None, feeds), strict=True))


PIPELINE_FILE = "pipeline.npz"  # a cache entry of the CPU run: the prompt, each step's logits, the greedy tokens
PIPELINE_FILES = [PIPELINE_FILE]


def source_options(ort: Any, source: str, weights: dict[str, str]) -> Any:
    """A CPU session's options for a member's source model, wherever its weights are."""
    options = session_options(ort)
    read_weights_from(options, weights_folder(source, weights))
    return options


def cpu_run(prompt: Any, token: Any, tokens: int, layout: str = SLIDING) -> dict[str, Any]:
    """The application's greedy run on CPU with the source models (`prompt`, `token`: their sessions): the prompt
    tokens, each step's filled positions and logits, and the greedy tokens. It depends on the sources alone, so it
    is computed once and kept in the caches (`cached_reference`)."""
    import numpy as np

    graphs = Graph(prompt, "prompt", layout), Graph(token, "token", layout)
    vocab = prompt.get_outputs()[graphs[0].outputs.index("logits")].shape[-1]
    vocab = vocab if isinstance(vocab, int) else 2
    sequence = [int(t) for t in np.random.default_rng(SEED).integers(0, vocab, graphs[0].sequence)]
    run: dict[str, Any] = {"prompt": list(sequence), "filled": [], "logits": [], "tokens": [],
                           "past_shapes": {name: list(value.shape) for name, value in graphs[0].inputs.items()
                                           if name.startswith(PAST)}}
    cache = None
    for step in range(tokens + 1):
        graph = graphs[min(step, 1)]
        filled = len(sequence) - graph.sequence
        cache = graph.run(graph.feeds(sequence, filled, cache))
        chosen = int(cache["logits"][0, -1].argmax())
        run["filled"].append(filled)
        run["logits"].append(cache["logits"])
        run["tokens"].append(chosen)
        sequence.append(chosen)
    return run


def ep_run(prompt: Any, token: Any, cpu: dict[str, Any], layout: str = SLIDING,
           ) -> tuple[list[dict[str, Any]], list[int]]:
    """(per-step metrics, the EP's greedy tokens): the EP's sessions fed what the CPU run was fed, step by step
    (the CPU's greedy tokens, so that every step compares the same computation)."""
    graphs = Graph(prompt, "prompt", layout), Graph(token, "token", layout)
    steps, chosen, cache = [], [], None
    sequence = list(cpu["prompt"])
    for step, (filled, expected, cpu_next) in enumerate(zip(cpu["filled"], cpu["logits"], cpu["tokens"],
                                                            strict=True)):
        graph = graphs[min(step, 1)]
        cache = graph.run(graph.feeds(sequence, filled, cache))
        metrics = compare(cache["logits"], expected)
        ep_next = int(cache["logits"][0, -1].argmax())
        steps.append({"step": "prompt" if step == 0 else f"token {step}", "snr_db": round(metrics["snr_db"], 2),
                      "cosine": metrics["cosine"], "max_abs_error": metrics["max_abs_error"],
                      "token_cpu": cpu_next, "token_ep": ep_next})
        chosen.append(ep_next)
        sequence.append(cpu_next)
    return steps, chosen


def save_cpu_run(run: dict[str, Any], folder: Path) -> None:
    """The CPU run into `folder` (PIPELINE_FILES), without a timestamp: the entry holds what its key names."""
    import zipfile

    import numpy as np

    arrays = {"prompt": run["prompt"], "filled": run["filled"], "tokens": run["tokens"],
              "checks": json.dumps(run.get("checks", []), sort_keys=True),
              **{f"logits/{step}": logits for step, logits in enumerate(run["logits"])}}
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / PIPELINE_FILE, "w") as archive:
        for name, value in arrays.items():
            with archive.open(zipfile.ZipInfo(f"{name}.npy", NO_TIME), "w", force_zip64=True) as out:
                np.lib.format.write_array(out, np.asanyarray(value), allow_pickle=False)


def load_cpu_run(folder: Path) -> dict[str, Any]:
    import numpy as np

    with np.load(folder / PIPELINE_FILE, allow_pickle=False) as data:
        steps = len([key for key in data.files if key.startswith("logits/")])
        return {"prompt": [int(t) for t in data["prompt"]], "filled": [int(f) for f in data["filled"]],
                "tokens": [int(t) for t in data["tokens"]], "logits": [data[f"logits/{i}"] for i in range(steps)],
                "checks": json.loads(str(data["checks"])) if "checks" in data.files else []}


def independent_checks(ort: Any, member: ValidationMember, cpu: dict[str, Any]) -> list[dict[str, Any]]:
    """The CPU run against a growing-cache run of the model as declared and against onnxruntime-genai's own
    generator (`steps.validation.pipeline_checks`), each {"kind", "status", "detail"}."""
    declared = member.declared
    session = ort.InferenceSession(declared, source_options(ort, declared, {}),
                                   providers=["CPUExecutionProvider"])
    checks = [{"kind": "growing cache", **growing_run(session, cpu)}]
    del session
    checks.append({"kind": "onnxruntime-genai", **genai_run(declared, cpu)})
    return checks


def judge(steps: list[dict[str, Any]], thresholds: dict[str, float]) -> list[str]:
    """Failures: a step's logits below the thresholds, or greedy tokens that differ."""
    failures = []
    for step in steps:
        if step["snr_db"] < thresholds.get("min_snr_db", 0.0):
            failures.append(f"{step['step']}: logits snr_db {step['snr_db']:g} < min_snr_db "
                            f"{thresholds['min_snr_db']:g}")
        if step["cosine"] < thresholds.get("min_cosine", 0.0):
            failures.append(f"{step['step']}: logits cosine {step['cosine']:.6g} < min_cosine "
                            f"{thresholds['min_cosine']:g}")
        if step["token_cpu"] != step["token_ep"]:
            failures.append(f"{step['step']}: greedy token {step['token_ep']} on the EP, {step['token_cpu']} on CPU")
    return failures


def validate_pipeline(request: ValidationJob) -> ValidationReport:
    """The group as an LLM application runs it (`steps.validation.pipeline`): on the shared context where this host
    loads it; else on the members compiled alone, and then the shared binary itself is not validated: skipped, with the
    pipeline's figures, never passed."""
    import onnxruntime as ort

    pipeline, blocked = request.pipeline, request.run_blocked
    assert pipeline is not None, "a request for a group with a pipeline"
    members = list(pipeline["alone"].values()) if blocked else list(request.members.values())
    if any(member is None for member in members):
        missing = [name for name, member in pipeline["alone"].items() if member is None]
        return {"status": Verdict.SKIPPED, "structural": Verdict.PASSED,
                "reason": f"{blocked}; the pipeline runs here on the members compiled alone, and {', '.join(missing)} "
                          "is not built alone for this target: add the target to the model's targets"}
    kept, save_to = pipeline.get("cpu"), pipeline.get("cpu_to")
    answer: dict[str, Any] = {}
    layout = layout_of(members[0].source)
    try:
        if kept:
            cpu = load_cpu_run(Path(kept))
        else:  # its sessions end before the EP's open: never both in memory
            prompt, token = (ort.InferenceSession(m.source, source_options(ort, m.source, m.weights),
                                                  providers=["CPUExecutionProvider"]) for m in members)
            cpu = cpu_run(prompt, token, pipeline["tokens"], layout)
            cpu["checks"] = independent_checks(ort, members[0], cpu)
            if save_to:
                try:
                    save_cpu_run(cpu, Path(save_to))
                    answer["reference_saved"] = True
                except OSError as exc:  # the artifact is judged anyway; the run is computed again next time
                    answer["reference_unsaved"] = f"{exc.strerror or exc}: {exc.filename}"
        info = known(members[0].ep)
        sessions = []
        for member in members:
            session, refused = open_session(ort, info, dataclasses.replace(member, share=not blocked))
            if refused:
                return {**refused, "structural": Verdict.PASSED, **answer}
            sessions.append(session)
        steps, ep_tokens = ep_run(sessions[0], sessions[1], cpu, layout)
        del sessions  # genai opens the shared context again, in the members' order
        folder = Path(next(iter(request.members.values())).artifact).parent
        packaged = genai_folder_run(info, folder, cpu, blocked) if (folder / GENAI_CONFIG).is_file() else None
    except ModelError as exc:
        return {"status": Verdict.FAILED, "structural": Verdict.PASSED, "reason": exc.message, **answer}
    cpu_tokens = cpu["tokens"]
    kind = "qdq" if is_qdq(members[0].reference) else members[0].precision
    thresholds = {**DEFAULT_THRESHOLDS[kind], **members[0].thresholds}
    failures = judge(steps, thresholds) + [f"{check['detail']}: the pipeline's cache layout ({layout}) is not the "
                                           "model's" for check in cpu["checks"] if check["status"] == "departs"]
    if packaged is not None and packaged["status"] == "departs":
        failures.append(packaged["detail"])
    where = "the members compiled alone" if blocked else "the shared context"
    figures = (f"pipeline on {where}: prompt + {pipeline['tokens']} token steps, logits SNR >= "
               f"{min(s['snr_db'] for s in steps):.1f} dB, greedy tokens "
               f"{'equal' if cpu_tokens == ep_tokens else 'differ'} ({ep_tokens} on the EP, {cpu_tokens} on CPU); "
               f"the CPU run against {', '.join(c['kind'] + ': ' + c['status'] for c in cpu['checks']) or 'nothing'}"
               + (f"; the folder in onnxruntime-genai: {packaged['status']}" if packaged else ""))
    report: ValidationReport = {"structural": Verdict.PASSED, "precision": kind, "thresholds": thresholds,
                                "pipeline": {"ran_on": where, "layout": layout, "prompt": cpu["prompt"], "steps": steps,
                                             "tokens_cpu": cpu_tokens, "tokens_ep": ep_tokens,
                                             "cpu_checked": cpu["checks"],
                                             **({"genai_folder": packaged} if packaged else {})}}
    if failures:
        return {**report, **answer, "status": Verdict.FAILED, "reason": f"{figures}: " + "; ".join(failures)}
    if blocked:
        return {**report, **answer, "status": Verdict.SKIPPED,
                "reason": f"the shared binary itself needs the device ({blocked}); {figures}"}
    return {**report, **answer, "status": Verdict.PASSED, "summary": figures}
