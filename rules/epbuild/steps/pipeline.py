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

from typing import Any

from ..errors import ModelError
from ..execute.requests import ValidationReport, ValidationRequest
from ..manifest.eps import lookup
from .artifact_session import is_qdq, open_session
from .comparison import DEFAULT_THRESHOLDS, compare
from .reference import session_options
from .validation_inputs import SEED, dtype_of

PAST, PRESENT = "past_key_values.", "present."
class Graph:
    """One graph of the pipeline (a session) and what its inputs need."""

    def __init__(self, session: Any, role: str):
        self.session, self.role = session, role
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

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        return dict(zip(self.outputs, self.session.run(None, feeds), strict=True))


def run_pipeline(cpu: tuple[Any, Any], ep: tuple[Any, Any], tokens: int
                 ) -> tuple[list[dict[str, Any]], list[int], list[int]]:
    """(per-step metrics, the CPU's greedy tokens, the EP's): `cpu` and `ep` are (prompt, token) sessions."""
    import numpy as np

    cpu_prompt, cpu_token = Graph(cpu[0], "prompt"), Graph(cpu[1], "token")
    ep_prompt, ep_token = Graph(ep[0], "prompt"), Graph(ep[1], "token")
    vocab = cpu[0].get_outputs()[cpu_prompt.outputs.index("logits")].shape[-1]
    vocab = vocab if isinstance(vocab, int) else 2
    prompt = [int(t) for t in np.random.default_rng(SEED).integers(0, vocab, cpu_prompt.sequence)]
    steps, cpu_tokens, ep_tokens = [], [], []
    sequence, cpu_cache, ep_cache = list(prompt), None, None
    for step in range(tokens + 1):
        cpu_graph, ep_graph = (cpu_prompt, ep_prompt) if step == 0 else (cpu_token, ep_token)
        filled = len(sequence) - cpu_graph.sequence
        on_cpu = cpu_graph.run(cpu_graph.feeds(sequence, filled, cpu_cache))
        on_ep = ep_graph.run(ep_graph.feeds(sequence, filled, ep_cache))
        metrics = compare(on_ep["logits"], on_cpu["logits"])
        cpu_next, ep_next = int(on_cpu["logits"][0, -1].argmax()), int(on_ep["logits"][0, -1].argmax())
        steps.append({"step": "prompt" if step == 0 else f"token {step}", "snr_db": round(metrics["snr_db"], 2),
                      "cosine": metrics["cosine"], "max_abs_error": metrics["max_abs_error"],
                      "token_cpu": cpu_next, "token_ep": ep_next})
        cpu_tokens.append(cpu_next)
        ep_tokens.append(ep_next)
        sequence.append(cpu_next)  # both sides continue from the CPU's token: every step compares the same work
        cpu_cache, ep_cache = on_cpu, on_ep
    return steps, cpu_tokens, ep_tokens


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


def validate_pipeline(request: ValidationRequest) -> ValidationReport:
    """The group as an LLM application runs it (`steps.pipeline`): on the shared context where this host loads it;
    else on the members compiled alone, and then the shared binary itself is not validated: skipped, with the
    pipeline's figures, never passed."""
    import onnxruntime as ort

    pipeline, blocked = request["pipeline"], request["run_blocked"]
    members = list(pipeline["alone"].values()) if blocked else list(request["members"].values())
    if any(member is None for member in members):
        missing = [name for name, member in pipeline["alone"].items() if member is None]
        return {"status": "skipped", "structural": "passed",
                "reason": f"{blocked}; the pipeline runs here on the members compiled alone, and {', '.join(missing)} "
                          "is not built alone for this target: add the target to the model's targets"}
    info = lookup(members[0]["ep"])
    sessions = []
    for member in members:
        session, refused = open_session(ort, info, {**member, "share": not blocked})
        if refused:
            return {**refused, "structural": "passed"}
        sessions.append(session)
    cpu = [ort.InferenceSession(m["source"], session_options(ort), providers=["CPUExecutionProvider"])
           for m in members]
    try:
        steps, cpu_tokens, ep_tokens = run_pipeline((cpu[0], cpu[1]), (sessions[0], sessions[1]), pipeline["tokens"])
    except ModelError as exc:
        return {"status": "failed", "structural": "passed", "reason": exc.message}
    kind = "qdq" if is_qdq(members[0]["reference"]) else members[0]["precision"]
    thresholds = {**DEFAULT_THRESHOLDS[kind], **members[0]["thresholds"]}
    failures = judge(steps, thresholds)
    where = "the members compiled alone" if blocked else "the shared context"
    figures = (f"pipeline on {where}: prompt + {pipeline['tokens']} token steps, logits SNR >= "
               f"{min(s['snr_db'] for s in steps):.1f} dB, greedy tokens "
               f"{'equal' if cpu_tokens == ep_tokens else 'differ'} ({ep_tokens} on the EP, {cpu_tokens} on CPU)")
    report: ValidationReport = {"structural": "passed", "precision": kind, "thresholds": thresholds,
                                "pipeline": {"ran_on": where, "steps": steps, "tokens_cpu": cpu_tokens,
                                             "tokens_ep": ep_tokens}}
    if failures:
        return {**report, "status": "failed", "reason": f"{figures}: " + "; ".join(failures)}
    if blocked:
        return {**report, "status": "skipped",
                "reason": f"the shared binary itself needs the device ({blocked}); {figures}"}
    return {**report, "status": "passed", "summary": figures}
