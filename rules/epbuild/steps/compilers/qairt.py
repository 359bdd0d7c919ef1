"""`qairt`: the QAIRT SDK converts the model to DLC and generates a QNN HTP context binary, wrapped in an EPContext
model that the QNN EP loads."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ...errors import BuildError, UserError
from ...files.layout import write_json
from ...manifest.builds import SIDECAR, Build, ResolvedTarget
from ...manifest.parse import TargetSpec
from ...store.cache import Workspace
from ..toolchain.toolchains import Toolchain, ep_context_model, find_qairt, run_tool
from .external import ExternalToolCompiler, external_sidecar, standalone


class QairtCompiler(ExternalToolCompiler):
    """QAIRT: convert to DLC, generate the HTP context binary, wrap it in an EPContext model for the QNN EP."""

    name = "qairt"
    foreign_keys = ("qaic",)

    def check(self, spec: TargetSpec, file: str) -> None:
        super().check(spec, file)
        if spec.ep not in (None, "qnn", "QNNExecutionProvider"):
            raise UserError(file, f"targets.{spec.name}.ep",
                            "compiler = \"qairt\" builds QNN context binaries: use ep = \"qnn\"")

    def toolchain(self, target: ResolvedTarget) -> Toolchain | str:
        return find_qairt(target.sdk_root)

    def produce(self, build: Build, workspace: Workspace, scratch: Path) -> None:
        import onnx

        (member,) = build.members
        target, toolchain, log = build.target, self.found(build), build.log(workspace.layout, "compile")
        source = onnx.load(str(member.model.path), load_external_data=False)
        work = scratch / ".qairt"
        work.mkdir()
        what = f"compile {build.name} (QAIRT)"
        shapes = [arg for name, shape in sorted(member.model.inputs.items())
                  for arg in ("--source_model_input_shape", name, ",".join(map(str, shape)))]
        run_tool([str(toolchain.executables["converter"]), "--input_network", str(standalone(member, work)),
                  "--output_path", str(work / "model.dlc"), *shapes], log, what, target.timeout_s)
        binary = target.ep.binary_name(member.name)
        assert binary is not None, "QAIRT compiles QNN targets, whose EP writes a context binary"
        run_tool([str(toolchain.executables["context"]), "--backend", str(toolchain.executables["backend"]),
                  "--model", str(toolchain.root / "lib" / "x86_64-linux-clang" / "libQnnModelDlc.so"),
                  "--dlc_path", str(work / "model.dlc"), "--binary_file", Path(binary).stem,
                  "--output_dir", str(work)], log, what, target.timeout_s)
        if not (work / binary).is_file():
            raise BuildError(f"{what}: qnn-context-binary-generator wrote no {binary}")
        os.replace(work / binary, scratch / binary)
        shutil.rmtree(work)
        ep_context_model(source, binary, member.name, scratch / member.model_file)
        nodes = len(source.graph.node)
        record = external_sidecar(build, toolchain, nodes, list(build.outputs)).replace(
            ep=target.ep.name, embed=False,
            runtime_options={k: v for k, v in target.options.items() if k in target.ep.runtime_options},
            nodes={"source": nodes, "ep_context": 1, "cpu": 0, "in_ep": nodes})
        write_json(scratch / SIDECAR, record.to_json())
