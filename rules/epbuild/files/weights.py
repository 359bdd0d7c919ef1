"""Graphs whose weights live in another folder. A graph-only stage (`stages.WEIGHTLESS`) writes the graph alone:
its external-data references still name its input's files, which stay where they are, so a 3 GiB model gains no
copy of its weights per stage and per variant. Whoever opens such a graph is told the folder: ONNX Runtime through
`session.model_external_initializers_file_folder_path`, onnx by loading the tensors from it.

ONNX Runtime names compiled graphs after that folder string as given (not resolved: `../x` and `/abs/x` name them
differently), where it would otherwise use the model's file name. So the string is relative (checkout-independent)
and passes through the graph's own folder, `../../<model>/<stage>/...`: members of one shared context that read
the same weights (prompt and token variants of one decoder) still get distinct graph names.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

FOLDER_OPTION = "session.model_external_initializers_file_folder_path"


def folder_string(graph: Path, weights: Path) -> str:
    """How `graph` (a stage output, `.stages/<model>/<stage>/<model>.onnx`) names the folder `weights` its
    external data resolves in, relative to its own folder and through it."""
    own = graph.parent
    return Path(os.pardir, os.pardir, own.parent.name, own.name, os.path.relpath(weights, own)).as_posix()


def resolved(graph: Path | str, folder: str) -> Path:
    """The folder a folder string names, from `graph`'s folder."""
    return Path(os.path.normpath(Path(graph).parent / folder))


def weights_folder(graph: Path | str, weights: dict[str, str]) -> Path | None:
    """The folder `graph`'s external data resolves in when it is not the graph's own (`weights`: the request's
    graph -> folder string), else None."""
    folder = weights.get(str(graph))
    return None if folder is None else resolved(graph, folder)


def read_weights_from(options: Any, folder: Path | None) -> None:
    """Session options that find a graph's weights in `folder` (`weights_folder`; None: beside the graph). For CPU
    sessions, whose graph names do not matter: the folder is given absolute and the working folder is free."""
    if folder is not None:
        options.add_session_config_entry(FOLDER_OPTION, str(folder))


def load_with_weights(graph: Path | str, folder: Path | None) -> Any:
    """The model with every tensor's bytes, read from `folder` (None: the graph's own folder)."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    model = onnx.load(str(graph), load_external_data=False)
    load_external_data_for_model(model, str(folder or Path(graph).parent))
    return model
