"""One share of a validation's samples, in a process of its own (`sample_workers`): the artifact's session, opened
as the validation opens it, run on the share's batches in order; how far it got in a file the validating child
reads; the outputs in an .npz beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _share(request: dict[str, Any]) -> dict[str, Any]:
    """In a worker: the artifact's session, opened as the validation opens it, run on this share's batches."""
    import numpy as np
    import onnxruntime as ort

    from ...contracts.jobs import ValidationMember
    from ...manifest.eps import known
    from .artifact_session import open_session

    member = ValidationMember.from_json(request["member"])
    session, refused = open_session(ort, known(member.ep), member)
    if session is None:
        raise RuntimeError((refused or {}).get("reason", "the artifact's session did not open"))
    wanted: list[str] = request["wanted"]
    start, stop = int(request["runs"][0]), int(request["runs"][1])
    outputs: dict[str, Any] = {}
    done = 0
    with np.load(request["share"], allow_pickle=False) as share:
        for run, samples in zip(range(start, stop), request["samples"], strict=True):
            feeds = {name: share[f"{run}/{name}"] for name in request["inputs"]}
            for name, value in zip(wanted, session.run(wanted, feeds), strict=True):
                outputs[f"{run}/{name}"] = value
            done += samples
            Path(request["progress"]).write_text(str(done))
    np.savez(request["out"], **outputs)
    return {"runs": stop - start}


def main() -> None:
    """`python -m` this module: one share of a validation's samples (the code and packages the build names, checked
    by `serve`; tied to the validating child)."""
    from ...execute.child import serve

    serve(_share)


if __name__ == "__main__":
    main()
