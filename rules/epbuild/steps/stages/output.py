"""How a stage writes its output model: one external-data file beside it when it has one, always written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def save(model: Any, output: Path, data_file: str | None) -> None:
    """Save a stage's output; with `data_file`, every initializer goes to that one file beside it."""
    import onnx

    if data_file:
        working = Path.cwd()
        os.chdir(output.parent)  # onnx refuses a location that exists relative to the working folder
        try:
            onnx.save(model, output.name, save_as_external_data=True, all_tensors_to_one_file=True,
                      location=data_file)
        finally:
            os.chdir(working)
        always_written(output.with_name(data_file))
    else:
        onnx.save(model, str(output))


def external_output(options: Any, data_file: str | None) -> None:
    """An ONNX Runtime optimized model writes its initializers to `data_file` beside it, not to the source's.
    Small ones (shapes, scalars) stay inline: ONNX Runtime cannot read a Reshape's shape from external data."""
    if data_file:
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", data_file)


def always_written(data_file: Path) -> None:
    """The external-data file is an output known before the run: a model whose initializers all stayed inline
    (below the size threshold) gets an empty one."""
    if not data_file.exists():
        data_file.touch()
