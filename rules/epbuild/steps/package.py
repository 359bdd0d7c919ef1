"""Ready-to-run folders for onnxruntime-genai: a model exported by genai's builder (a `genai_config.json` beside it
naming it as the decoder) is published with that config, rewritten for the artifact (its file name, the target's
session options), and the tokenizer and processing files, so the artifact folder is what `onnxruntime_genai.Model`
loads. Only for builds whose graph keeps genai's dynamic shapes (no `dims`, `inputs` or variants): genai grows the
cache step by step."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

GENAI_CONFIG = "genai_config.json"
MODEL_SUFFIXES = (".onnx", ".data", ".onnx_data", ".bin")  # the builder's graphs and weights: not packaged
PROVIDER_NAMES = {"qnn": "qnn", "openvino": "OpenVINO", "dml": "dml", "nvtensorrtrtx": "NvTensorRtRtx",
                  "vitisai": "VitisAI", "migraphx": "MIGraphX"}  # genai_config's provider_options keys


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


def write_package(files: tuple[Path, ...], folder: Path, model_file: str, ep_alias: str,
                  options: dict[str, str]) -> None:
    """Copy `files` into `folder`, the config rewritten for the artifact `model_file` and the target's options."""
    config, *others = files
    data: dict[str, Any] = json.loads(config.read_text())
    decoder = data["model"]["decoder"]
    decoder["filename"] = model_file
    session = decoder.setdefault("session_options", {})
    provider = PROVIDER_NAMES.get(ep_alias)
    session["provider_options"] = [{provider: dict(sorted(options.items()))}] if provider else []
    (folder / GENAI_CONFIG).write_text(json.dumps(data, indent=4, sort_keys=True) + "\n")
    for path in others:
        shutil.copyfile(path, folder / path.name)
