"""The compiler backends a target can name (`compiler = ...`), behind one interface (`base.Compiler`), one module
each: `ort` and `ort_session` compile in a fresh ONNX Runtime child (`steps.compile`); `qaic` runs Qualcomm's
qaic-compile to a QPC; `qairt` runs the QAIRT SDK to a QNN context binary wrapped in an EPContext model. Each
backend says which manifest keys apply, what enters the fingerprint, which files it writes, how to produce them, how
its artifacts are validated and whether this host can run it; EP facts come from `epbuild.manifest.eps`. Adding a
backend is one module here and its line below.
"""

from __future__ import annotations

from ...manifest.builds import ResolvedTarget
from .base import Compiler
from .ort import OrtCompiler, OrtSessionCompiler
from .qaic import QaicCompiler
from .qairt import QairtCompiler

COMPILERS: dict[str, Compiler] = {c.name: c for c in (OrtCompiler(), OrtSessionCompiler(), QaicCompiler(),
                                                        QairtCompiler())}


def compiler(target: ResolvedTarget) -> Compiler:
    return COMPILERS[target.compiler]
