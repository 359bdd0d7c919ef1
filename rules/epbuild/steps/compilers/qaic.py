"""`qaic`: Qualcomm Cloud AI `qaic-compile` turns a single-file ONNX model into a QPC, validated on the hardware with
`qaic-qpc validate`."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ...contracts.statuses import ValidationMode, Verdict
from ...errors import BuildError, ModelError, UserError
from ...files.layout import Layout, write_json
from ...manifest.builds import QPC_PROGRAM, SIDECAR, Build, ResolvedTarget
from ...manifest.parse import TargetSpec
from ...store.cache import Workspace
from ..graph import static_dims
from ..toolchain.toolchains import Toolchain, cloud_ai_devices, find_qaic, qaic_command, run_tool
from .base import _not_for
from .external import ExternalToolCompiler, external_sidecar


class QaicCompiler(ExternalToolCompiler):
    """Qualcomm Cloud AI `qaic-compile`: a single-file ONNX model to a QPC, validated with `qaic-qpc validate`."""

    name = "qaic"
    single_file = True
    operator_check = True
    exact_outputs = False  # qaic-compile decides the QPC's files
    foreign_keys = ("qnn_sdk_root",)

    def check(self, spec: TargetSpec, file: str) -> None:
        super().check(spec, file)
        _not_for(spec, file, ("ep", "options", "embed", "option_files", "quantized"),
                 "does not apply to compiler = \"qaic\" (qaic-compile takes its flags from the `qaic` table)")
        if spec.device not in (None, "npu"):
            raise UserError(file, f"targets.{spec.name}.device", "qaic-compile builds for npu (Cloud AI 100) only")
        _not_for(spec, file, ("min_offload",), "applies to ONNX Runtime EP targets (EPContext nodes)")

    def toolchain(self, target: ResolvedTarget) -> Toolchain | str:
        return find_qaic(target.sdk_root)

    def output_names(self, target: ResolvedTarget, members: list[Any], shared: bool) -> tuple[str, ...]:
        return (SIDECAR, "compile.log", QPC_PROGRAM)

    def produce(self, build: Build, workspace: Workspace, scratch: Path) -> None:
        """qaic-compile the single-file model into scratch/qpc; its output is kept in compile.log next to it."""
        import onnx

        (member,) = build.members
        toolchain, log = self.found(build), build.log(workspace.layout, "compile")
        source = onnx.load(str(member.model.path), load_external_data=False)
        try:
            symbols = static_dims(source, {k: list(v) for k, v in member.model.inputs.items()}, needs_static=True)
        except ModelError as exc:
            raise BuildError(f"compile {build.name}: {exc}") from None
        assert build.target.qaic is not None, "a qaic target's options are resolved with it (plan.targets)"
        command = qaic_command(toolchain.executables["qaic-compile"], member.model.path, scratch / "qpc",
                               build.target.qaic, symbols)
        try:
            run_tool(command, scratch / "compile.log", f"compile {build.name} (qaic-compile)", build.target.timeout_s)
        finally:
            if (scratch / "compile.log").exists():
                log.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(scratch / "compile.log", log)
        if not (scratch / QPC_PROGRAM).is_file():
            raise BuildError(f"compile {build.name}: qaic-compile exited 0 but wrote no {QPC_PROGRAM}")
        files = sorted([SIDECAR, *(p.relative_to(scratch).as_posix() for p in scratch.rglob("*") if p.is_file())])
        write_json(scratch / SIDECAR, external_sidecar(build, toolchain, len(source.graph.node), files).to_json())

    def validate(self, build: Build, layout: Layout) -> dict[str, Any] | None:
        """`qaic-qpc validate` checks a QPC against the Cloud AI hardware installed here; without it, skipped."""
        (member,) = build.members
        program = build.out_dir(layout) / QPC_PROGRAM
        if not program.is_file():
            return {"status": Verdict.FAILED, "reason": f"{QPC_PROGRAM} is missing"}
        if member.validation.mode == ValidationMode.STRUCTURAL:
            return {"status": Verdict.STRUCTURAL, "reason": 'validate = "structural": the QPC program exists; '
                    "nothing was run"}
        found = self.toolchain(build.target)
        if isinstance(found, str):
            return {"status": Verdict.SKIPPED, "reason": found}
        if not cloud_ai_devices():
            return {"status": Verdict.SKIPPED, "reason": "no Cloud AI device on this host (/dev/accel/accel* or "
                                                   "/dev/qaic_*): qaic-qpc validate needs the hardware"}
        try:
            run_tool([str(found.executables["qaic-qpc"]), "validate", "-i", str(program.parent)],
                     build.log(layout, "validate"), f"validate {build.name} (qaic-qpc)", member.validation.timeout_s)
        except BuildError as exc:
            return {"status": Verdict.FAILED, "reason": str(exc)}
        return {"status": Verdict.PASSED, "ran_on": {"qaic-qpc validate": cloud_ai_devices()}}

    def describe(self, nodes: dict[str, Any]) -> str:
        return f"QPC from {nodes['source']} source nodes"
