"""Which failures a reduction takes on: asked by every failing compile and validation (to suggest `doit reduce:...`),
so it lives apart from the reduction itself, which the build process imports only when a reduce task runs."""

from __future__ import annotations

from ...manifest.builds import Build


def reducible(build: Build) -> str | None:
    """Why `build`'s failure cannot be reduced here (None: it can): a probe is a compile through ONNX Runtime of
    one model for an EP."""
    target = build.target
    if build.shared:
        return f"a group's failure: reduce the compile of one of its members (reduce:{build.members[0].name}@...)"
    if target.is_cpu:
        return "a CPU target compiles nothing to reduce (its failures are the model's: see the compile log)"
    if target.compiler not in ("ort", "ort_session"):
        return f"compiler = \"{target.compiler}\" runs outside ONNX Runtime: only ONNX Runtime compiles are reduced"
    return None
