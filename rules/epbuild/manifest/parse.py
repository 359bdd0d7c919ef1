"""models.toml: parsing and schema validation into typed, immutable specs.

Every error names the file and the key path (`targets.qnn-htp.options`), says what was found and what is valid.
Only the TOML is read here: no model file is opened, so loading stays cheap at task-creation time.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import field
from pathlib import Path
from typing import Any

from ..errors import UserError, closest
from ..files.layout import GROUPS, PACKAGES
from ..records import record
from .names import check_name, shown
from .packages import PackageSpec, read_package
from .roots import Roots, check_named_files, not_a_file
from .schema import GATES, THRESHOLDS, keys
from .task_metric import read_task

RESERVED_MODEL_NAMES = (GROUPS,)


@record
class QuantizeSpec:
    """`quantize = {...}`: static QDQ quantization; `calibration` None means the fixed-seed random set."""

    calibration: tuple[Path, ...] | None
    activation_type: str
    weight_type: str
    per_channel: bool


@record
class ModelSpec:
    """A model as declared: `path` is absolute, `inputs` fixes symbolic dimensions, and the optional stages
    before compile (`optimize`, `quantize`, `squash`)."""

    name: str
    path: Path
    inputs: dict[str, tuple[int, ...]]
    targets: tuple[str, ...]
    validation: dict[str, Any]
    optimize: str | None = None
    quantize: QuantizeSpec | None = None
    squash: bool = False
    freeze: dict[str, tuple[float, ...]] | None = None  # configuration inputs turned into constants
    rewrite: tuple[str, ...] = ()  # graph rewrites (`epbuild.manifest.schema.REWRITES`), in a stage of their own
    dims: dict[str, int] = field(default_factory=dict)  # named dimensions, resolved into `inputs` once models are read
    entry: str = ""  # where it is declared, for errors: models.NAME, or models.NAME.variants.V for a variant
    # read from the model (plan.external_data), not declared: every shape already static and checked, so no shape
    # stage is needed; and whether any node only computes constants (else no fold stage)
    graph_ready: bool = False
    constant_nodes: bool = True
    opset: int | None = None  # the model's ai.onnx opset, as read (None: it imports none)
    upgrade: bool = True  # convert it to an opset the target's EP takes, where the EP has a minimum (`upgrade`)

    @property
    def key(self) -> str:
        return self.entry or f"models.{self.name}"


@record
class TargetSpec:
    """A target as declared, after `extends` was merged; EP-specific checks happen in `epbuild.plan.targets`."""

    name: str
    ep: str | None
    device: str | None
    compiler: str
    embed: bool
    options: dict[str, Any]
    option_files: tuple[str, ...]
    optimization_level: str | None
    validate: str  # "run", "structural" or "off"
    validation: dict[str, Any]
    quantized: bool  # consume the quantized variant of models that declare `quantize`
    qaic: dict[str, Any] | None = None  # compiler = "qaic": the qaic-compile flags
    qnn_sdk_root: Path | None = None  # compiler = "qairt"
    timeout_s: float | None = None  # the compile child's wall-time limit
    max_memory_gb: float | None = None  # the compile and validation children's resident-memory limit
    min_offload: float | None = None  # share of source nodes that must end inside EPContext nodes
    ship_socs: tuple[Any, ...] = ()  # QNN's soc_model list: the SoCs the binary is pruned to


@record
class GroupSpec:
    """Several models compiled, in this order, into one shared EP context."""

    name: str
    target: str
    models: tuple[str, ...]
    pipeline_tokens: int | None = None  # `pipeline`: validated as prompt + token graphs, this many token steps


@record
class BuildSpec:
    """`[build]`: how many jobs a build runs at once without `-n` (EPBUILD_JOBS wins), and the memory budget the
    jobs of this host's builds share (EPBUILD_MEMORY_GB wins): `execute.memory_ledger`."""

    jobs: int | str | None = None
    memory_gb: float | None = None
    reduce_budget_s: float = 300.0  # `epbuild reduce`: how long one reduction may take


@record
class CacheSpec:
    """`[cache]`: where the artifact cache lives (EPBUILD_CACHE_DIR overrides `dir`), an optional size cap and an
    optional shared remote (EPBUILD_CACHE_REMOTE overrides `remote`)."""

    dir: Path | None
    max_size_mb: float | None
    remote: str | None
    hard_links: bool = False
    remote_budget_s: float = 60.0  # waiting on the remote a build process may spend before it skips it
    remote_timeout_s: float = 10.0  # one request without an answer


@record
class ExecutorSpec:
    """`[executor]`: a Dask scheduler to run builds on (EPBUILD_EXECUTOR overrides `scheduler`)."""

    scheduler: str | None
    wait_s: float


@record
class Manifest:
    """models.toml read and checked: every model, target and group, the cache and executor settings."""

    path: Path
    models: dict[str, ModelSpec]
    targets: dict[str, TargetSpec]
    groups: dict[str, GroupSpec]
    cache: CacheSpec
    toolchains: dict[str, Path]  # [toolchains.NAME] root
    executor: ExecutorSpec
    # every file and folder reading the manifest looked at (models, configs, calibration folders, validation
    # files): the no-op shortcut (`epbuild.fast_path`) holds only while each keeps its identity
    reads: tuple[Path, ...] = ()
    packages: dict[str, PackageSpec] = dataclasses.field(default_factory=dict)  # [packages.NAME]
    build: BuildSpec = dataclasses.field(default_factory=BuildSpec)  # [build]

    @property
    def root(self) -> Path:
        return self.path.parent


class TableReader:
    """Type-checked access to one TOML table, with the key path for error messages."""

    def __init__(self, file: Path, path: str, table: Any, reads: list[Path] | None = None):
        self.file, self.path = file, path
        self.reads = [] if reads is None else reads  # the files one reading looked at, shared by its tables
        if not isinstance(table, dict):
            self.fail(f"must be a table, found {_type_name(table)}")
        self.table: dict[str, Any] = table

    def fail(self, message: str, key: str | None = None):
        path = ".".join(part for part in (self.path, key) if part)
        raise UserError(self.file.name, path or None, message)

    def declared(self, key: str, names: list[Any], declared: dict[str, Any], kind: str) -> None:
        """Each of `names` (the list at `key`) is a declared `kind` (model, group), listed once; else one line."""
        for index, name in enumerate(names):
            if not isinstance(name, str) or name not in declared:
                self.fail(f"unknown {kind} {name!r}{closest(str(name), declared)}; declared {kind}s: "
                          f"{', '.join(declared) or 'none'}", f"{key}[{index}]")
            if names.index(name) != index:
                self.fail(f"{kind} '{name}' is listed twice; each {kind} appears once", f"{key}[{index}]")

    def only(self, allowed: tuple[str, ...] | dict[str, Any]) -> None:
        for key in self.table:
            if key not in allowed:
                self.fail(f"unknown key{closest(key, allowed)}; valid keys: {', '.join(allowed)}", key)

    def read(self, scope: str, skip: tuple[str, ...] = ()) -> dict[str, Any]:
        """Every key of `scope` (epbuild.manifest.schema): unknown keys refused, each value type-checked and checked,
        absent ones at their default; keys in `skip` are only checked for being allowed (their reader handles them)."""
        declared = keys(scope)
        self.only(declared)
        values = {}
        for name, key in declared.items():
            if name in skip:
                continue
            value = self.get(name, key.kind, key.default, key.required)
            if name in self.table:
                if key.choices is not None and value not in key.choices:
                    self.fail(f"{shown(value)} is not valid{closest(value, key.choices)}; valid: "
                              f"{', '.join(key.choices)}", name)
                problem = key.check(value) if key.check else None
                if problem:
                    self.fail(problem, name)
            values[name] = value
        return values

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = None, required: bool = False) -> Any:
        if key not in self.table:
            if required:
                self.fail("is required", key)
            return default
        value = self.table[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
            self.fail(f"must be {_kind_name(kind)}, found {_type_name(value)} {shown(value)}", key)
        return value

    def child(self, key: str) -> TableReader:
        return TableReader(self.file, f"{self.path}.{key}" if self.path else key, self.table.get(key, {}), self.reads)


def _type_name(value: Any) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
            float: "a float"}.get(type(value), type(value).__name__)


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = _kinds(kind)
    if kinds == (int, float):
        return "a number"
    names = {dict: "a table", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
             float: "a number"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


MAX_DEPTH = 16  # tables and arrays inside one another; the deepest real key path is 5


def _check_depth(path: Path, data: dict[str, Any]) -> None:
    """Refuse nesting deeper than any manifest key: the readers below walk values recursively."""
    todo: list[tuple[Any, tuple[str, ...]]] = [(data, ())]
    while todo:
        value, where = todo.pop()
        if len(where) > MAX_DEPTH:
            shown = ".".join(where[:3]).replace(".[", "[")
            raise UserError(path.name, f"{shown}…", f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            todo.extend((v, (*where, str(k))) for k, v in value.items())
        elif isinstance(value, list):
            todo.extend((v, (*where, f"[{i}]")) for i, v in enumerate(value))


def _looked_at(table: TableReader, path: Path) -> Path:
    table.reads.append(path)
    return path


def load(path: str | Path) -> Manifest:
    """Read and validate a manifest; raises UserError naming the file and key path."""
    path = Path(path).absolute()
    if path.exists() and not path.is_file():  # a FIFO would block the read forever
        raise UserError(path.name, None, f"{path} is not a regular file; give a manifest file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(path.name, None, f"manifest not found at {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(path.name, None, f"cannot read the manifest: {exc}") from None
    if text.startswith("\ufeff"):
        raise UserError(path.name, None, "starts with a UTF-8 byte-order mark, which TOML does not allow: save it "
                        "as UTF-8 without BOM")
    import tomllib  # imported here: a run whose plan is saved reads no TOML

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # an error at the end says so without its line: name it
        said = str(exc).replace("(at end of document)", f"(at end of document, line {len(text.splitlines()) or 1})")
        raise UserError(path.name, None, f"TOML syntax error: {said}") from None
    except RecursionError:
        raise UserError(path.name, None, "arrays or inline tables nested too deep for a manifest (TOML syntax "
                        "error)") from None
    _check_depth(path, data)
    return parse(data, path)


def parse(data: dict[str, Any], path: Path) -> Manifest:
    reads = [path]  # the files this reading looks at (the manifest's `reads`: a change to any re-plans)
    top = TableReader(path, "", data, reads)
    top.read("top", skip=("models", "targets", "groups", "packages", "build", "cache", "toolchains", "executor"))
    targets_table = top.child("targets")
    for name in targets_table.table:
        check_name(path, f"targets.{name}", name)
        if name == PACKAGES:
            targets_table.fail(f"'{name}' is reserved (artifacts/{name}/ holds model packages); rename the target",
                               name)
    targets = {name: _target(targets_table, name) for name in targets_table.table}
    models_table = top.child("models")
    if not models_table.table:
        top.fail("declares no models: add a [models.NAME] table with a 'path'", "models")
    models = {}
    for name in models_table.table:
        check_name(path, f"models.{name}", name)
        if name in RESERVED_MODEL_NAMES:
            models_table.fail(f"'{name}' is reserved (artifacts/<target>/{name}/ holds shared-context groups); "
                              f"rename the model", name)
        model = _model(models_table.child(name), name, targets)
        variants = _variants(models_table.child(name), model)
        for variant in variants:
            if variant in models_table.table:
                models_table.fail(f"a variant of '{name}' is named '{variant}' as another model is; rename one",
                                  f"{name}.variants.{variant.split('.', 1)[1]}")
        models.update(variants or {name: model})
    groups_table = top.child("groups")
    groups = {}
    for name in groups_table.table:
        check_name(path, f"groups.{name}", name)
        groups[name] = _group(groups_table.child(name), name, models, targets)
    packages_table = top.child("packages")
    packages = {}
    for name in packages_table.table:
        check_name(path, f"packages.{name}", name)
        packages[name] = read_package(packages_table.child(name), name, models, groups)
    cache = top.child("cache").read("cache")
    cache_spec = CacheSpec(path.parent / cache["dir"] if cache["dir"] else None, cache["max_size_mb"],
                           cache["remote"], cache["hard_links"], cache["remote_budget_s"], cache["remote_timeout_s"])
    toolchains_table = top.child("toolchains")
    toolchains_table.only(("qaic",))
    toolchains = {name: path.parent / toolchains_table.child(name).read("toolchain")["root"]
                  for name in toolchains_table.table}
    executor = top.child("executor").read("executor")
    build = top.child("build").read("build")
    manifest = Manifest(path, models, targets, groups, cache_spec, toolchains,
                        ExecutorSpec(executor["scheduler"], executor["wait_s"]), tuple(dict.fromkeys(reads)), packages,
                        BuildSpec(build["jobs"], build["memory_gb"], build["reduce_budget_s"]))
    check_named_files(manifest)
    return manifest


def _group(table: TableReader, name: str, models: dict[str, ModelSpec], targets: dict[str, TargetSpec]) -> GroupSpec:
    values = table.read("group", skip=("pipeline",))
    target, members = values["target"], values["models"]
    if target not in targets:
        table.fail(f"unknown target '{target}'{closest(target, targets)}; declared targets: "
                   f"{', '.join(targets) or 'none'}", "target")
    table.declared("models", members, models, "model")
    if len(members) < 2:
        table.fail(f"a shared context needs at least two models, found {len(members)}", "models")
    tokens = None
    if "pipeline" in table.table:
        tokens = table.child("pipeline").read("pipeline")["tokens"]
        if len(members) != 2:
            table.fail(f"a pipeline is a prompt graph and a token graph: 2 models, found {len(members)}", "pipeline")
    return GroupSpec(name, target, tuple(members), tokens)


def _inputs(table: TableReader) -> dict[str, tuple[int, ...]]:
    inputs: dict[str, tuple[int, ...]] = {}
    inputs_table = table.child("inputs")
    for input_name in inputs_table.table:
        shape = inputs_table.get(input_name, list)
        if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and 0 < d < 2**31 for d in shape):
            inputs_table.fail(f"must be a list of positive integers below 2^31, found {shown(shape)}", input_name)
        inputs[input_name] = tuple(shape)
    return inputs


def _dims(table: TableReader) -> dict[str, int]:
    dims_table = table.child("dims")
    for dim, size in dims_table.table.items():
        if not isinstance(size, int) or isinstance(size, bool) or not 0 < size < 2**31:
            dims_table.fail(f"must be a positive integer below 2^31, found {shown(size)}", dim)
    return dict(dims_table.table)


def _variants(table: TableReader, model: ModelSpec) -> dict[str, ModelSpec]:
    """A model's variants (`variants`), each the model with its own `dims` and `inputs` over the model's."""
    variants_table = table.child("variants")
    found = {}
    for variant in variants_table.table:
        check_name(table.file, f"{variants_table.path}.{variant}", variant)
        sub = variants_table.child(variant)
        sub.read("variant", skip=("inputs", "dims"))
        found[f"{model.name}.{variant}"] = dataclasses.replace(
            model, name=f"{model.name}.{variant}", inputs={**model.inputs, **_inputs(sub)},
            dims={**model.dims, **_dims(sub)}, entry=f"models.{model.name}.variants.{variant}")
    return found


def _model(table: TableReader, name: str, targets: dict[str, TargetSpec]) -> ModelSpec:
    values = table.read("model", skip=("validation", "quantize", "freeze", "inputs", "dims", "variants"))
    model_path = _looked_at(table, table.file.parent / values["path"])
    if model_path.suffix.lower() != ".onnx":
        table.fail(f"must name an .onnx model file, found {shown(values['path'])}", "path")
    inputs = _inputs(table)
    wanted = values["targets"]
    if wanted is None:
        wanted = list(targets)
    for index, target in enumerate(wanted):
        if not isinstance(target, str) or target not in targets:
            valid = ", ".join(targets) or "none declared"
            table.fail(f"unknown target {shown(target)}{closest(str(target), targets)}; declared targets: {valid}",
                       f"targets[{index}]")
        if wanted.index(target) != index:
            table.fail(f"'{target}' is listed twice", f"targets[{index}]")
    return ModelSpec(name, model_path, inputs, tuple(wanted), _validation(table.child("validation"), model=True),
                     optimize=values["optimize"], quantize=_quantize(table) if "quantize" in table.table else None,
                     squash=values["squash"], freeze=_freeze(table, inputs), rewrite=tuple(values["rewrite"]),
                     dims=_dims(table), upgrade=values["upgrade"])


def _freeze(model: TableReader, inputs: dict[str, tuple[int, ...]]) -> dict[str, tuple[float, ...]] | None:
    """`freeze = { sr = 16000 }`: inputs that select a configuration become constants (a number or a list)."""
    if "freeze" not in model.table:
        return None
    table = model.child("freeze")
    if not table.table:
        model.fail("must name at least one input, e.g. freeze = { sr = 16000 }", "freeze")
    frozen = {}
    for name, value in table.table.items():
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                 and abs(v) < 2**63 for v in values):
            table.fail(f"must be a finite number or a list of them, found {shown(value)}", name)
        if name in inputs:
            table.fail("is also fixed in `inputs`; a frozen input is no longer an input", name)
        frozen[name] = tuple(values)
    return frozen


def _quantize(model: TableReader) -> QuantizeSpec:
    table = model.child("quantize")
    values = table.read("quantize")
    calibration = values["calibration"]
    files: tuple[Path, ...] | None = None
    if calibration != "random":
        folder = _looked_at(table, table.file.parent / calibration)  # a sample added or removed changes its identity
        if not folder.is_dir():
            table.fail(f"calibration folder not found: {folder} (a folder of .npz files, one sample each, or "
                       f"\"random\" for a fixed-seed smoke-test set)", "calibration")
        files = tuple(sorted(p.resolve() for p in folder.glob("*.npz")))
        if not files:
            table.fail(f"calibration folder {folder} holds no .npz files", "calibration")
        odd = next((p for p in files if not p.is_file()), None)  # a FIFO would block the reader forever
        if odd is not None:
            table.fail(f"calibration sample {odd} {not_a_file(odd)}: every .npz there must be a file", "calibration")
    return QuantizeSpec(files, values["activation_type"], values["weight_type"], values["per_channel"])


def _validation(table: TableReader, model: bool) -> dict[str, Any]:
    """A `validation` table: input/reference files (checked to exist), thresholds, the child's timeout; in a
    model's, per-target thresholds (`targets`)."""
    if not model:
        table.only(tuple(k for k in keys("validation") if k not in ("reference", "targets")))
    values = table.read("validation", skip=("targets",))
    settings: dict[str, Any] = {}
    per_target = table.child("targets")
    if not isinstance(per_target.table, dict):
        table.fail(f"must be a table of target names, found {_type_name(per_target.table)}", "targets")
    for name in per_target.table:
        sub = per_target.child(name)
        if not isinstance(sub.table, dict):
            per_target.fail(f"must be a table of thresholds, found {_type_name(sub.table)}", name)
        sub.only((*THRESHOLDS, *GATES))
        found = sub.read("validation")
        settings.setdefault("targets", {})[name] = {k: float(found[k]) for k in (*THRESHOLDS, *GATES)
                                                    if found[k] is not None}
    for key in ("inputs", "reference"):
        if values[key] is not None:
            path = _looked_at(table, table.file.parent / values[key])
            if not path.is_file():
                table.fail(f"file {not_a_file(path)}: {path}", key)
            settings[key] = path.resolve()
    for key in (*THRESHOLDS, "timeout_s", "repeat_within_s"):
        if values[key] is not None:
            settings[key] = float(values[key])
    for key in ("localise", "inconclusive"):
        if values[key] is not None:
            settings[key] = values[key]
    settings.update(read_task(table.file, table.path, values, lambda path: _looked_at(table, path)))
    return settings


EXTENDS_DEPTH = 32  # a chain of `extends` longer than this is a generated manifest gone wrong


def _merged_target(targets: TableReader, name: str) -> dict[str, Any]:
    """The target's table with `extends` applied: own keys win, `options` merge per key. The chain is walked
    iteratively, so neither a cycle nor a long chain can exhaust the stack."""
    chain = [name]
    while (parent := targets.child(chain[-1]).get("extends", str)) is not None:
        if parent not in targets.table:
            targets.child(chain[-1]).fail(f"unknown target '{parent}'{closest(parent, targets.table)}", "extends")
        if parent in chain:
            raise UserError(targets.file.name, f"targets.{name}.extends",
                            f"extends cycle: {' -> '.join([*chain, parent])}")
        if len(chain) >= EXTENDS_DEPTH:
            raise UserError(targets.file.name, f"targets.{name}.extends",
                            f"extends chain longer than {EXTENDS_DEPTH} targets ({' -> '.join(chain[:4])} -> ...)")
        chain.append(parent)
    merged = dict(targets.child(chain[-1]).table)
    for child in reversed(chain[:-1]):
        own = targets.child(child).table
        inherited = {key: merged.get(key) for key in ("options", "validation")}
        merged.update({k: v for k, v in own.items() if k != "extends"})
        for key, parent_table in inherited.items():
            if isinstance(parent_table, dict) and isinstance(own.get(key), dict):
                merged[key] = {**parent_table, **own[key]}
        if "option_files" in own and isinstance(own["option_files"], list):
            merged["option_files"] = sorted({*merged.get("option_files", []), *own["option_files"]})
    merged.pop("extends", None)
    return merged


def _target(targets: TableReader, name: str) -> TargetSpec:
    table = TableReader(targets.file, f"targets.{name}", targets.table[name], targets.reads)
    table.only(keys("target"))
    table = TableReader(targets.file, f"targets.{name}", _merged_target(targets, name), targets.reads)
    values = table.read("target", skip=("validation",))
    options, option_files = values["options"], values["option_files"]
    if values["config"] is not None:
        imported, imported_files = _winml_config(table)
        options = {**imported, **options}
        option_files = sorted({*imported_files, *option_files})
    validate = values["validate"]
    if isinstance(validate, str) and validate != "structural":
        table.fail(f"must be true, false or \"structural\", found {validate!r}", "validate")
    return TargetSpec(
        name=name, ep=values["ep"], device=values["device"], compiler=values["compiler"], embed=values["embed"],
        options=dict(options), option_files=tuple(option_files), optimization_level=values["optimization_level"],
        validate={True: "run", False: "off"}.get(validate, validate),
        validation=_validation(table.child("validation"), model=False), quantized=values["quantized"],
        qaic=values["qaic"],
        qnn_sdk_root=table.file.parent / values["qnn_sdk_root"] if values["qnn_sdk_root"] else None,
        timeout_s=_number(values["timeout_s"]), max_memory_gb=_number(values["max_memory_gb"]),
        min_offload=_number(values["min_offload"]), ship_socs=tuple(values["ship_socs"] or ()),
    )


def _number(value: float | None) -> float | None:
    return None if value is None else float(value)


def _winml_config(target: TableReader) -> tuple[dict[str, Any], list[str]]:
    """`config = "winml_build_config.json"`: its `compile.provider_options` and `provider_option_file_keys`.

    File-valued options are resolved relative to the config file and re-expressed relative to the manifest."""
    import json

    config_path = _looked_at(target, target.file.parent / target.get("config", str))
    if config_path.exists() or config_path.is_symlink():  # a FIFO would block the reader forever
        Roots(target.file).check_file(f"{target.path}.config", config_path, "WinMLBuildConfig file")
    else:
        Roots(target.file).check(f"{target.path}.config", config_path)
    try:
        data = json.loads(config_path.read_text())
    except FileNotFoundError:
        target.fail(f"WinMLBuildConfig file not found: {config_path}", "config")
    except (OSError, ValueError) as exc:
        target.fail(f"{config_path.name} is not readable JSON: {exc}", "config")
    config = TableReader(config_path, "", data, target.reads)
    compile_table = config.child("compile")
    options = compile_table.get("provider_options", dict, {})
    file_keys = compile_table.get("provider_option_file_keys", list, [])
    for index, key in enumerate(file_keys):
        if not isinstance(key, str) or key not in options:
            compile_table.fail(f"names {key!r}, which compile.provider_options does not set",
                               f"provider_option_file_keys[{index}]")
        resolved = (config_path.parent / str(options[key])).resolve()
        options[key] = os.path.relpath(resolved, target.file.parent)
    return dict(options), list(file_keys)
