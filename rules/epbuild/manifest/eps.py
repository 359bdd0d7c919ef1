"""The execution-provider registry: aliases, devices, packages, option names, output file names, precision.

Everything known about one EP lives in one `EpInfo` entry, so adding an EP or an option name is a one-place
change (how an artifact is produced lives in `steps.compilers`). Nothing here imports onnxruntime: the registry is
read at task-creation time.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Collection
from dataclasses import field

from ..records import record

DEVICES = ("npu", "gpu", "cpu")
SOURCES = ("pypi", "bundled", "nuget", "catalog")


OWN_BACKEND = "+own-backend"  # after a fork server's alias: it serves targets that name their own backend library


@record
class EpInfo:
    """One execution provider as this project builds for it."""

    alias: str
    name: str  # the full ONNX Runtime name, e.g. QNNExecutionProvider
    default_device: str
    devices: tuple[str, ...]
    default_source: str
    package: str | None = None  # PyPI distribution that ships the plugin library
    module: str | None = None  # its import name, with get_library_path()
    platform: str | None = None  # sys.platform prefix the EP exists on, None for any
    known_options: frozenset[str] | None = None  # None: this EP's option names are not checked
    ignored_options: dict[str, str] = field(default_factory=dict)  # accepted by the EP, silently ignored: why
    # the documented values of options whose other values the EP ignores without a word (QNN's `backend_type =
    # "tpu"` compiles for the HTP); a pattern where only the form is known (a SoC model is a number)
    option_values: dict[str, tuple[str, ...] | re.Pattern[str]] = field(default_factory=dict)
    # values known to be meaningful where the EP accepts any of the form without a word (an unknown SoC model
    # compiles for some default SoC): another value gets a warning, not a refusal, since new SoCs appear
    known_values: dict[str, dict[str, str]] = field(default_factory=dict)
    required_defaults: dict[str, str] = field(default_factory=dict)
    runtime_options: frozenset[str] = frozenset()  # options a runtime must pass again when loading the artifact
    binary_suffix: str | None = None  # context binary: <stem><suffix>, None when the EP writes none
    can_share_contexts: bool = False
    shares_one_binary: bool = False  # in a shared context: one binary for all members (named after the first)
    # in a shared context the binaries hold no weights: they refer to the compiled models' external-data files by
    # name, which then ship with the group (OpenVINO's weight sharing)
    shared_weights_outside: bool = False
    float_precision: str = "fp32"  # what float graphs compute in: "fp16" for the HTP
    precision_option: str | None = None  # an option file whose text says the precision ("f16" in it: fp16)
    quantize_flavour: str = "generic"  # which QDQ configuration a `quantized` target consumes
    device_metadata: str | None = None  # EP-device metadata key naming the device (OpenVINO: ov_device)
    no_device_hint: str = ""  # said when the EP registers but offers no device on this host
    host_specific: bool = False  # artifacts depend on this host's CPU (OpenVINO embeds the ISA)
    shared_context_unloadable: dict[str, str] = field(default_factory=dict)  # machine -> why a group cannot load
    vendor_shim: bool = False  # loaded through epbuild.steps.vendor_shim on non-Intel x86-64 hosts
    # May jobs run one after another in a fork server's warm worker instead of a forked child each? Only where
    # repeating them in one process was tested to give the same outputs: compiles byte for byte (not QNN: its
    # context binary differs on a second compile in one process), validations figure for figure (an
    # artifact whose outputs hold what ran before on the EP fails in any order: `history_check`).
    warm_compiles: bool = False
    warm_validations: bool = False
    # May part of an output hold what ran before on the EP (QNN's HTP leaves some values unwritten)? A validation
    # then repeats its run in a new session after another graph ran on the EP (`steps.validation.history`).
    history_check: bool = False
    # Libraries of the plugin's own folder its sessions load on first use (QNN's HTP backend): the EP's fork server
    # loads them once before it forks a job, so that no job loads them again (the same bytes and figures, checked by
    # the tests). A target naming a backend of its own (`backend_option`) is served by a server that loaded none.
    backend_libraries: tuple[str, ...] = ()
    backend_option: str | None = None
    # The lowest ai.onnx opset the EP takes a model at (found by trying each op at each opset); a model below it gets
    # an `upgrade` stage (ONNX's version converter) for this EP's targets. None: no minimum known.
    min_opset: int | None = None

    def binary_name(self, stem: str) -> str | None:
        return f"{stem}{self.binary_suffix}" if self.binary_suffix else None

    @property
    def fork_server(self) -> str:
        """Which fork server runs this EP's jobs (`execute.fork_server`): its own where it loads a plugin library,
        else the one shared with CPU-only work ("")."""
        return self.alias if self.module else ""

    def fork_server_for(self, options: Collection[str]) -> str:
        """The fork server of a target with these options (their names): `fork_server`, or for a target naming a
        backend library of its own one that loads none ahead (`OWN_BACKEND` after it): two builds of one backend
        in one process are never risked."""
        if self.backend_libraries and self.backend_option in options:
            return self.fork_server + OWN_BACKEND
        return self.fork_server

    @property
    def is_cpu(self) -> bool:
        """The CPU EP: an optimized ONNX model, no EP context."""
        return self.name == "CPUExecutionProvider"


QNN_OPTION_VALUES: dict[str, tuple[str, ...] | re.Pattern[str]] = {  # onnxruntime-qnn 2.7.0's documented values
    "backend_type": ("cpu", "gpu", "htp", "saver", "ir"),
    "htp_performance_mode": ("burst", "balanced", "default", "high_performance", "high_power_saver",
                             "low_balanced", "extreme_power_saver", "low_power_saver", "power_saver",
                             "sustained_high_performance"),
    "qnn_context_priority": ("low", "normal", "normal_high", "high"),
    "htp_graph_finalization_optimization_mode": ("0", "1", "2", "3"),
    "profiling_level": ("off", "basic", "detailed", "optrace"),
    "soc_model": re.compile(r"[0-9]+"),
    "htp_arch": re.compile(r"[0-9]+"),
    "vtcm_mb": re.compile(r"[0-9]+"),
    "device_id": re.compile(r"[0-9]+"),
}
# QNN's SoC model numbers (QnnTypes.h's QNN_SOC_MODEL_*, as the QNN SDK's "Supported Snapdragon devices" table
# lists them) and HTP architectures
QNN_KNOWN_VALUES = {
    "soc_model": {"30": "SM8350", "36": "SM8450", "39": "SA8295", "42": "SM8475", "43": "SM8550", "45": "SXR1230P",
                  "46": "SSG2115P", "52": "SA8255", "53": "SXR2230P", "57": "SM8650", "58": "SSG2125P",
                  "60": "SC8380XP", "62": "SA8540", "68": "SM8635", "69": "SM8750", "72": "SA8797", "75": "SXR2330P",
                  "77": "QCS9100", "85": "SM8735", "87": "SM8850", "93": "QCM6490", "95": "SAR2230P",
                  "96": "SW6100", "97": "SM8845"},
    "htp_arch": {arch: f"v{arch}" for arch in ("68", "69", "73", "75", "79", "81")},
}
QNN_OPTIONS = frozenset(
    {
        # change the compiled bytes
        "backend_type", "backend_path", "soc_model", "htp_arch", "vtcm_mb",
        "htp_graph_finalization_optimization_mode", "htp_bf16_enable", "offload_graph_io_quantization",
        "qnn_context_priority", "enable_htp_shared_memory_allocator", "enable_htp_prepare_only", "op_packages",
        "enable_htp_fp16_precision", "enable_htp_spill_fill_buffer", "enable_htp_graph_splitting",
        "htp_graph_splitting_num_prepare_threads", "enable_block_quant_weight_optimization",
        "enable_htp_fp16_clamp_overflow", "enable_htp_monolithic_lstm", "htp_share_resource_optimization",
        "enable_vtcm_backup_buffer_sharing", "skip_backend_op_validation", "device_id", "extended_udma",
        # runtime or diagnostics only
        "htp_performance_mode", "rpc_control_latency", "profiling_level", "profiling_file_path",
        "num_graph_prepare_threads", "qnn_saver_path", "dump_json_qnn_graph", "json_qnn_graph_dir",
        "skip_qnn_version_check", "htp_reused_io_limit_mb", "disable_file_mapped_weights",
    }
)

OPENVINO_OPTIONS = frozenset({"load_config", "reshape_input", "enable_qdq_optimizer", "enable_causallm"})
OPENVINO_IGNORED = {
    key: "the OpenVINO plugin EP ignores it; set it in the load_config JSON instead"
    for key in ("precision", "num_of_threads", "num_streams", "cache_dir", "device_type", "device_id",
                "device_luid", "model_priority", "enable_opencl_throttling")
}

REGISTRY: dict[str, EpInfo] = {
    info.alias: info
    for info in (
        EpInfo("cpu", "CPUExecutionProvider", "cpu", ("cpu",), "bundled", package="onnxruntime",
               warm_compiles=True, warm_validations=True),
        EpInfo(
            "qnn", "QNNExecutionProvider", "npu", ("npu", "gpu", "cpu"), "pypi",
            package="onnxruntime-qnn", module="onnxruntime_qnn",
            known_options=QNN_OPTIONS, option_values=QNN_OPTION_VALUES, known_values=QNN_KNOWN_VALUES,
            required_defaults={"backend_type": "htp"},
            runtime_options=frozenset({"backend_type", "backend_path", "htp_performance_mode",
                                       "rpc_control_latency", "qnn_context_priority", "device_id",
                                       "profiling_level", "profiling_file_path"}),
            binary_suffix="_qnn.bin", can_share_contexts=True, shares_one_binary=True,
            float_precision="fp16", quantize_flavour="qnn",
            shared_context_unloadable={"x86_64": "loading a multi-graph QNN context crashes the process on x86_64 "
                                                 "hosts (HTP simulator); run-validate on the device"},
            warm_validations=True, history_check=True,
            backend_libraries=("libQnnHtp.so", "libQnnSystem.so"), backend_option="backend_path",
            # below opset 7 ONNX Runtime's layout transformer, which QNN's NHWC ops go through, refuses the model
            # and QNN takes none of its nodes (measured with onnxruntime-qnn 2.7.0 for 20 op types at opsets 6-14:
            # each fails at 6 and compiles at 7 and above)
            min_opset=7,
        ),
        EpInfo(
            "openvino", "OpenVINOExecutionProvider", "cpu", ("cpu", "gpu", "npu"), "pypi",
            package="onnxruntime-ep-openvino", module="onnxruntime_ep_openvino",
            known_options=OPENVINO_OPTIONS, ignored_options=OPENVINO_IGNORED,
            runtime_options=frozenset({"load_config"}),
            binary_suffix="_OpenVINOExecutionProvider.bin", can_share_contexts=True, shared_weights_outside=True,
            precision_option="load_config", device_metadata="ov_device",
            no_device_hint="; the OpenVINO plugin lists Intel hardware only (on other x86-64 CPUs epbuild loads it "
                           "through its vendor-id shim unless EPBUILD_OPENVINO_VENDOR_SHIM=0)",
            host_specific=True, vendor_shim=True,
            # no min_opset: it compiled the same 20 op types at opsets 6-14 (onnxruntime-ep-openvino 1.8.1)
        ),
        EpInfo("dml", "DmlExecutionProvider", "gpu", ("gpu",), "bundled", package="onnxruntime-directml",
               platform="win32"),
        EpInfo("vitisai", "VitisAIExecutionProvider", "npu", ("npu",), "catalog", platform="win32"),
        EpInfo("migraphx", "MIGraphXExecutionProvider", "gpu", ("gpu",), "bundled",
               package="onnxruntime-migraphx", platform="linux"),
        EpInfo("nvtensorrtrtx", "NvTensorRTRTXExecutionProvider", "gpu", ("gpu",), "catalog", platform="win32"),
    )
}
BY_NAME = {info.name: info for info in REGISTRY.values()}

# Not an ONNX Runtime EP: targets with compiler = "qaic" compile to a QPC with Qualcomm's qaic-compile.
QAIC = EpInfo("qaic", "qaic-compile", "npu", ("npu",), "sdk")

# The EP a target gets from its device when it names none.
DEFAULT_EP = {"npu": "qnn", "gpu": "dml" if sys.platform == "win32" else "openvino", "cpu": "cpu"}


def lookup(ep: str) -> EpInfo | None:
    """An EP by alias or full name (case-insensitive alias), None when unknown."""
    return REGISTRY.get(ep.lower()) or BY_NAME.get(ep)


def known(ep: str) -> EpInfo:
    """The EP of a manifest already checked (its targets' `ep` resolved) or of a job's request: an unknown one here
    is epbuild's bug, never a user's mistake (KeyError)."""
    info = lookup(ep)
    if info is None:
        raise KeyError(f"unknown EP {ep!r}")
    return info


def served_ep(server: str) -> tuple[EpInfo, bool]:
    """A fork server's EP (`EpInfo.fork_server_for` named the server) and whether it loads its backend ahead."""
    info = known(server.removesuffix(OWN_BACKEND))
    return info, bool(info.backend_libraries) and not server.endswith(OWN_BACKEND)


def valid_ep_names() -> list[str]:
    return [*REGISTRY, *BY_NAME]


def platform_reason(info: EpInfo) -> str | None:
    """Why this EP cannot exist on this operating system, or None."""
    if info.platform and not sys.platform.startswith(info.platform):
        return f"{info.name} exists only on {info.platform}, this host is {sys.platform}"
    return None
