"""Checks of a pipeline's CPU run against decoding that does not share its assumptions: a growing-cache run of the
model as declared (each step's past exactly what was filled, no padding), and onnxruntime-genai's own generator
where it is installed and the model's folder has a genai_config.json. Both sides of the pipeline are fed the same
cache layout; a wrong layout makes them agree on a wrong answer, which only an independent run shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...contracts.jobs import ValidationMember
from ...contracts.statuses import Verdict
from .comparison import compare
from .validation_inputs import dtype_of

PAST, PRESENT = "past_key_values.", "present."
AGREE_SNR_DB = 60.0  # CPU against CPU, one graph with static and one with growing shapes: rounding only


def _names_dims(session: Any) -> tuple[dict[str, Any], bool]:
    """The session's inputs, and whether their sequence and cache lengths are free (a growing run is possible)."""
    inputs = {i.name: i for i in session.get_inputs()}
    ids = inputs.get("input_ids")
    pasts = [i for name, i in inputs.items() if name.startswith(PAST)]
    free = ids is not None and not isinstance(ids.shape[1], int) and all(
        not isinstance(p.shape[2], int) for p in pasts)
    return inputs, free


def growing_run(session: Any, cpu: dict[str, Any]) -> dict[str, Any]:
    """The model as declared (`session`) fed what the pipeline's CPU run was fed, with a cache that grows by each
    step's tokens: {"status": "agrees" | "departs" | "not checked", "detail": ...}."""
    import numpy as np

    inputs, free = _names_dims(session)
    if not free:
        return {"status": "not checked", "detail": "the model as declared has static sequence or cache lengths: no "
                                                   "growing-cache run"}
    outputs = [o.name for o in session.get_outputs()]
    sequence, cache = list(cpu["prompt"]), None
    worst = None
    for step, (expected, token) in enumerate(zip(cpu["logits"], cpu["tokens"], strict=True)):
        new = sequence if step == 0 else sequence[-1:]
        filled = len(sequence) - len(new)
        feeds = {"input_ids": np.array([new], dtype=dtype_of(inputs["input_ids"].type))}
        if "attention_mask" in inputs:
            feeds["attention_mask"] = np.ones((1, len(sequence)), dtype=dtype_of(inputs["attention_mask"].type))
        if "position_ids" in inputs:
            feeds["position_ids"] = np.array([list(range(filled, len(sequence)))],
                                             dtype=dtype_of(inputs["position_ids"].type))
        for name, value in inputs.items():
            if name.startswith(PAST):
                shape = list(cpu["past_shapes"].get(name) or [d if isinstance(d, int) else 1 for d in value.shape])
                shape[2] = 0  # the static graph's head count and size, nothing filled yet
                feeds[name] = (np.zeros(shape, dtype=dtype_of(value.type)) if cache is None
                               else cache[PRESENT + name[len(PAST):]])
        try:
            cache = dict(zip(outputs, session.run(None, feeds), strict=True))
        except Exception as exc:  # noqa: BLE001 - a model that cannot run this way is not judged by it
            return {"status": "not checked", "detail": f"the model as declared does not run with a growing cache: "
                                                       f"{' '.join(str(exc).split())[:200]}"}
        got = cache["logits"][:, -1:]
        snr = compare(got, expected[:, -1:])["snr_db"]
        worst = snr if worst is None else min(worst, snr)
        chosen = int(got[0, -1].argmax())
        where = "prompt" if step == 0 else f"token {step}"
        if snr < AGREE_SNR_DB or chosen != token:
            return {"status": "departs", "detail": f"at {where} the pipeline's CPU run departs from a growing-cache "
                                                   f"run of the model as declared (last-position logits SNR "
                                                   f"{snr:.1f} dB, greedy token {token} against {chosen})"}
        sequence.append(token)
    return {"status": "agrees", "detail": f"a growing-cache run of the model as declared gives the same greedy "
                                          f"tokens (logits SNR >= {worst:.1f} dB)"}


def genai_run(declared: str, cpu: dict[str, Any]) -> dict[str, Any]:
    """onnxruntime-genai's greedy generator on the model's own folder, where genai is installed and the folder has
    a genai_config.json: its tokens against the pipeline's CPU tokens."""
    folder = Path(declared).parent
    if not (folder / "genai_config.json").is_file():
        return {"status": "not checked", "detail": "no genai_config.json beside the model"}
    try:
        import onnxruntime_genai as og
    except ImportError:
        return {"status": "not checked", "detail": "onnxruntime-genai is not installed here"}
    tokens = genai_greedy(og, folder, cpu["prompt"], len(cpu["tokens"]))
    want = cpu["tokens"][: len(tokens)]  # genai stops early at the end-of-sequence token
    if tokens != want:
        return {"status": "departs", "detail": f"onnxruntime-genai's own greedy decoding gives {tokens}, the "
                                               f"pipeline's CPU run {cpu['tokens']}"}
    return {"status": "agrees", "detail": f"onnxruntime-genai's own greedy decoding gives the same tokens {tokens}"}


def genai_greedy(og: Any, folder: Path, prompt: list[int], count: int) -> list[int]:
    """The tokens onnxruntime-genai's generator appends to `prompt`, greedily, at most `count`."""
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + count, do_sample=False, batch_size=1)
    generator = og.Generator(model, params)
    generator.append_tokens([prompt])
    while not generator.is_done():
        generator.generate_next_token()
    produced = [int(t) for t in generator.get_sequence(0)][len(prompt):]
    del generator, params, model
    return produced


def genai_folder_run(info: Any, folder: Path, cpu: dict[str, Any], blocked: str | None) -> dict[str, Any]:
    """onnxruntime-genai's greedy generator on a group's folder (its decoder-pipeline config,
    `steps.packaging.package`), with the target's EP registered with genai, against the pipeline's CPU tokens. Not
    checked where the shared context cannot load here (`blocked`) or genai is not installed; any other failure to
    run is the folder's."""
    if blocked:
        return {"status": "not checked", "detail": f"the shared context cannot load here ({blocked})"}
    try:
        import onnxruntime_genai as og
    except ImportError:
        return {"status": "not checked", "detail": "onnxruntime-genai is not installed here: pip install "
                                                   "'epbuild[genai]'"}
    from ...execute.host import plugin_library

    try:
        if info.module:
            og.register_execution_provider_library(info.name, plugin_library(info))
        tokens = genai_greedy(og, folder, cpu["prompt"], len(cpu["tokens"]))
    except Exception as exc:  # noqa: BLE001 - genai's refusal of the folder is the finding
        return {"status": "departs", "detail": f"onnxruntime-genai cannot run the folder: "
                                               f"{str(exc).strip().splitlines()[-1]}"}
    if tokens != cpu["tokens"][: len(tokens)]:
        return {"status": "departs", "detail": f"onnxruntime-genai's greedy decoding of the folder gives {tokens}, "
                                               f"the pipeline's CPU run {cpu['tokens']}"}
    return {"status": "agrees", "detail": f"onnxruntime-genai loads the folder on {info.name} and gives the "
                                          f"pipeline's tokens {tokens}"}


GENAI_PROMPT, GENAI_TOKENS = 8, 8  # a fixed-seed prompt and the greedy tokens compared


def genai_validation(request: ValidationMember) -> dict[str, Any]:
    """A packaged artifact folder (`steps.packaging.package`) run as onnxruntime-genai runs it: greedy tokens from a
    fixed-seed prompt on the artifact's folder against the same on the model's own folder. What was checked is
    the tokens, and the report says only that."""
    import json

    import numpy as np

    from .validation_inputs import SEED

    folder, source = Path(request.artifact).parent, Path(request.declared).parent
    if request.ep != "cpu":
        return {"status": Verdict.SKIPPED,
                "reason": "the artifact keeps genai's dynamic shapes, which a single run cannot feed, and "
                          "onnxruntime-genai runs this EP only where genai has it: not checked here"}
    try:
        import onnxruntime_genai as og
    except ImportError:
        return {"status": Verdict.SKIPPED,
                "reason": "the artifact keeps genai's dynamic shapes and onnxruntime-genai is not installed to run "
                          "its folder: pip install 'epbuild[genai]'"}
    vocab = int(json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"])
    prompt = [int(t) for t in np.random.default_rng(SEED).integers(3, vocab, GENAI_PROMPT)]
    got = genai_greedy(og, folder, prompt, GENAI_TOKENS)
    want = genai_greedy(og, source, prompt, GENAI_TOKENS)
    report = {"mode": "genai", "genai": {"prompt": prompt, "tokens_artifact": got, "tokens_source": want}}
    if got != want:
        return {**report, "status": Verdict.FAILED,
                "reason": f"onnxruntime-genai's greedy decoding of the artifact folder gives {got}, of the model's "
                          f"own folder {want}"}
    return {**report, "status": Verdict.PASSED,
            "summary": f"onnxruntime-genai loads the folder; greedy tokens equal the source's ({len(got)} tokens "
                       f"from a "
                       f"fixed-seed prompt of {len(prompt)})"}
