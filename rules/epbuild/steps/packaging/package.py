"""Ready-to-run folders for onnxruntime-genai: a model exported by genai's builder (a `genai_config.json` beside it
naming it as the decoder) is published with that config, rewritten for the artifact (its file name, the target's
session options), and the tokenizer and processing files, so the artifact folder is what `onnxruntime_genai.Model`
loads.

Two kinds of build get one: a build whose graph keeps genai's dynamic shapes (no `dims`, `inputs` or variants: genai
grows the cache step by step), and a pipeline group of the model's prompt and token variants (`pipeline_files`),
whose folder gets a `decoder-pipeline` config: the prompt graph runs on the prompt in windows of its sequence length,
the token graph on each new token, both over one cache of `total_sequence_length` positions that genai allocates
once and the graphs read and write in place (GroupQueryAttention counts the filled positions from the mask), each
session with the target's provider options and `ep.share_ep_contexts`, created in the group's order."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

GENAI_CONFIG = "genai_config.json"
GENAI_DISTRIBUTION = "onnxruntime-genai"  # its generator judges these folders: its version is in their verdicts' keys
MODEL_SUFFIXES = (".onnx", ".data", ".onnx_data", ".bin")  # the builder's graphs and weights: not packaged
PROVIDER_NAMES = {"qnn": "qnn", "openvino": "OpenVINO", "dml": "dml", "nvtensorrtrtx": "NvTensorRtRtx",
                  "vitisai": "VitisAI", "migraphx": "MIGraphX"}  # genai_config's provider_options keys
INLINE_OPTIONS = {"openvino": ("load_config",)}  # option files the EP also takes as their text


def genai_files(model_path: Path) -> tuple[Path, ...]:
    """The config and the processing files beside a genai builder's model, or () when the model is not one (no
    config, or a config whose decoder is another file)."""
    config = model_path.parent / GENAI_CONFIG
    if not os.path.isfile(config):  # every plan asks, for every model: one stat
        return ()
    try:
        decoder = json.loads(config.read_text())["model"]["decoder"]
    except (OSError, ValueError, KeyError, TypeError):
        return ()
    if decoder.get("filename") != model_path.name:
        return ()
    others = sorted(p for p in model_path.parent.iterdir() if p.is_file() and p.name != GENAI_CONFIG
                    and not p.name.endswith(MODEL_SUFFIXES))
    return (config, *others)


def _providers(folder: Path, ep_alias: str, options: dict[str, str]) -> list[dict[str, dict[str, str]]]:
    """genai_config's `provider_options`: genai hands them to the EP as they are, so an option file named by its
    place in the folder would resolve against the application's working folder. Those an EP also takes as their
    text (OpenVINO's `load_config` JSON) are written inline; the folder stays movable."""
    provider = PROVIDER_NAMES.get(ep_alias)
    if not provider:
        return []
    inline = INLINE_OPTIONS.get(ep_alias, ())
    written = {key: (folder / value).read_text().strip() if key in inline and (folder / value).is_file() else value
               for key, value in sorted(options.items())}
    return [{provider: written}]


def write_package(files: tuple[Path, ...], folder: Path, model_file: str, ep_alias: str,
                  options: dict[str, str]) -> None:
    """Copy `files` into `folder`, the config rewritten for the artifact `model_file` and the target's options."""
    config, *others = files
    data: dict[str, Any] = json.loads(config.read_text())
    decoder = data["model"]["decoder"]
    decoder["filename"] = model_file
    session = decoder.setdefault("session_options", {})
    session["provider_options"] = _providers(folder, ep_alias, options)
    _write(folder, data, others)


def _write(folder: Path, config: dict[str, Any], others: list[Path]) -> None:
    """The rewritten config and the processing files, copied (never linked) into the artifact folder."""
    (folder / GENAI_CONFIG).write_text(json.dumps(config, indent=4, sort_keys=True) + "\n")
    for path in others:
        shutil.copyfile(path, folder / path.name)


def pipeline_files(members: tuple[Any, ...], pipeline_tokens: int | None) -> tuple[tuple[Path, ...], str | None]:
    """(the genai files a pipeline group ships, why none where the group is a genai model's but genai could not
    run it). A group qualifies when it is validated as a pipeline and lists one genai builder model's prompt variant
    (sequence_length > 1) then its token variant (sequence_length 1), each over the whole cache
    (past_sequence_length = total_sequence_length: genai's static cache is one buffer the graphs share)."""
    if not pipeline_tokens or len(members) != 2:
        return (), None
    sources = {m.declared or m.model.path for m in members}
    files = genai_files(next(iter(sources))) if len(sources) == 1 else ()
    if not files:
        return (), None
    dims = [m.model.dims for m in members]
    if not (dims[0].get("sequence_length", 0) > 1 and dims[1].get("sequence_length") == 1):
        return (), ("no onnxruntime-genai folder: list the prompt variant (sequence_length > 1) first and the token "
                    "variant (sequence_length = 1) second")
    if any(d.get("past_sequence_length") is None or d.get("past_sequence_length") != d.get("total_sequence_length")
           for d in dims):
        return (), ("no onnxruntime-genai folder: genai gives static prompt and token graphs one cache of "
                    "total_sequence_length positions, so set past_sequence_length = total_sequence_length in both "
                    "variants' dims")
    return files, None


def write_pipeline_package(files: tuple[Path, ...], folder: Path, stages: list[tuple[str, str, Any]],
                           ep_alias: str, options: dict[str, str], config_entries: dict[str, str]) -> None:
    """A group's folder as genai's `decoder-pipeline`: `stages` are (member name, its model file, its dims) in the
    group's order, prompt then token; each stage lists the graph's own inputs and outputs."""
    import onnx

    config, *others = files
    data: dict[str, Any] = json.loads(config.read_text())
    model, decoder = data["model"], data["model"]["decoder"]
    decoder.pop("filename", None)
    prompt_dims = stages[0][2]
    window, context = prompt_dims["sequence_length"], prompt_dims["total_sequence_length"]
    model["type"], model["context_length"] = "decoder-pipeline", context
    data.setdefault("search", {}).update(max_length=context, past_present_share_buffer=True)
    decoder["session_options"] = {**decoder.get("session_options", {}), "provider_options": []}  # the CPU's memory
    decoder["sliding_window"] = {"window_size": window, "pad_value": 0,
                                 "alignment": "left", "slide_key_value_cache": False, "slide_inputs": True}
    session = {**decoder["session_options"], **config_entries,
               "provider_options": _providers(folder, ep_alias, options)}
    pipeline = []
    for index, (name, model_file, _) in enumerate(stages):
        graph = onnx.load(str(folder / model_file), load_external_data=False).graph
        pipeline.append({name: {"filename": model_file, "session_options": session,
                                "inputs": [i.name for i in graph.input], "outputs": [o.name for o in graph.output],
                                "run_on_prompt": index == 0, "run_on_token_gen": index == 1}})
    decoder["pipeline"] = pipeline
    _write(folder, data, others)
