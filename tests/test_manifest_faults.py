"""Hostile and mistaken manifests get one `error:` line naming models.toml and the key path, exit 2, no traceback:
deep nesting, long `extends` chains, numbers out of range, duplicated targets, names that cannot become file
names, a byte-order mark; and a fixed-seed fuzzer over the shipped manifest."""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from epbuild.errors import UserError
from epbuild.manifest.parse import load

SHIPPED = (REPO / "models.toml").read_text()
TARGET_LINE = 'optimization_level = "extended"'


def _with(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


CASES = {
    "inline tables 400 deep": ("x = " + "{a = " * 400 + "1" + "}" * 400 + "\n" + SHIPPED,
                               "models.toml: arrays or inline tables nested too deep"),
    "arrays 2000 deep": ("x = " + "[" * 2000 + "]" * 2000 + "\n" + SHIPPED,
                         "models.toml: arrays or inline tables nested too deep"),
    "an extends chain of 1200 targets": (
        SHIPPED + "".join(f'\n[targets.t{i}]\nextends = "{"qnn-htp" if i == 0 else f"t{i - 1}"}"\n'
                          for i in range(1200)), "extends chain longer than 32 targets"),
    "an extends cycle": (SHIPPED + '\n[targets.a]\nextends = "b"\n[targets.b]\nextends = "a"\n',
                         "targets.a.extends: extends cycle: a -> b -> a"),
    "max_size_mb = inf": (SHIPPED + "\n[cache]\nmax_size_mb = inf\n",
                          "cache.max_size_mb: must be a positive number up to 1e+12, found inf"),
    "max_size_mb = 1e308": (SHIPPED + "\n[cache]\nmax_size_mb = 1e308\n", "found 1e+308"),
    "a dimension of 2^63": (_with(SHIPPED, "x = [1, 3, 32, 32]", "x = [9223372036854775808, 3, 32, 32]"),
                            "models.dynbatch.inputs.x: must be a list of positive integers below 2^31"),
    "validation timeout_s = 0": (_with(SHIPPED, TARGET_LINE, TARGET_LINE + "\nvalidation = { timeout_s = 0 }"),
                                 "targets.cpu.validation.timeout_s: must be a positive number"),
    "freeze = inf": (_with(SHIPPED, "inputs = { x = [1, 3, 32, 32] }", "freeze = { x = inf }"),
                     "models.dynbatch.freeze.x: must be a finite number or a list of them, found inf"),
    "a target listed twice": (_with(SHIPPED, 'targets = ["cpu", "qnn-htp"]\n\n[models.tinycnn_qdq]',
                                    'targets = ["cpu", "cpu"]\n\n[models.tinycnn_qdq]'),
                              "models.dynbatch.targets[1]: 'cpu' is listed twice"),
    "a model path to a .json": (_with(SHIPPED, 'path = "models/encoder.onnx"', 'path = "configs/openvino_f32.json"'),
                                "models.encoder.path: must name an .onnx model file"),
    "a UTF-8 byte-order mark": ("\ufeff" + SHIPPED, "models.toml: starts with a UTF-8 byte-order mark"),
    "a target named like a report": (SHIPPED + '\n[targets."report.html"]\nep = "cpu"\n',
                                     "targets.report.html: 'report.html' is the name of a report in artifacts/"),
    "a model name of 250 characters": (_with(SHIPPED, "[models.dynbatch]", "[models." + "d" * 250 + "]"),
                                       "name of 250 characters: at most 64"),
    "a selection overlap above 1": (
        _with(SHIPPED, TARGET_LINE, TARGET_LINE + "\nvalidation = { min_selection_overlap = 1.5 }"),
        "targets.cpu.validation.min_selection_overlap: must be a non-negative number <= 1, found 1.5"),
    "validation inputs that are not an .npz": (
        _with(SHIPPED, TARGET_LINE, TARGET_LINE + '\nvalidation = { inputs = "configs/openvino_f32.json" }'),
        "targets.cpu.validation.inputs: must name an .npz file"),
    "a 5 MB value": (_with(SHIPPED, TARGET_LINE, TARGET_LINE + '\nembed = "' + "a\\n" * 2_500_000 + '"'),
                     "targets.cpu.embed: must be a boolean, found a string 'a\\na\\n"),
}


@pytest.fixture
def folder(tmp_path) -> Path:
    shutil.copytree(REPO / "models", tmp_path / "models")
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    return tmp_path


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_manifest_is_one_short_line(folder, case):
    text, expected = CASES[case]
    (folder / "models.toml").write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as raised:
        load(folder / "models.toml")
    message = f"models.toml: {raised.value}" if not str(raised.value).startswith("models.toml") else str(raised.value)
    assert expected in message
    assert "\n" not in message and len(message) < 400


def test_an_ep_with_an_empty_source_is_refused_in_doit_list(project):
    project.manifest(_with(SHIPPED, 'ep = "openvino@pypi"', 'ep = "openvino@"'))
    done = project.doit("list", check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("error: models.toml: targets.openvino-cpu.ep: 'openvino@' names no EP source "
                                   "after '@'; valid: pypi, bundled, nuget, catalog (e.g. 'openvino@pypi'), or "
                                   "'openvino' alone")


MUTATIONS = 300


def _mutants(seed: int = 26) -> list[str]:
    """Deletions, typos, wrong types, extreme numbers, unicode, nesting and cycles applied to the shipped
    manifest's lines."""
    rng = random.Random(seed)
    lines = SHIPPED.splitlines()
    values = ["inf", "-1", "0", "nan", "1e308", "9223372036854775808", '""', '"\u00e9\u4e2d\U0001f600"', "[]", "{}",
              "true", '"../../etc/passwd"', "[[[[1]]]]", '{ a = { b = { c = 1 } } }', '"x\\ny"', "-0.0"]
    found = []
    for _ in range(MUTATIONS):
        mutant = list(lines)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(mutant))
            line = mutant[at]
            kind = rng.randrange(6)
            if kind == 0:
                del mutant[at]
            elif kind == 1 and "=" in line:
                key, _, _ = line.partition("=")
                mutant[at] = f"{key}= {rng.choice(values)}"
            elif kind == 2 and line:
                spot = rng.randrange(len(line))
                mutant[at] = line[:spot] + rng.choice("x_.[]{}\"'=@ \u00e9") + line[spot + 1:]
            elif kind == 3:
                mutant.insert(at, rng.choice(['[targets.loop]\nextends = "loop"', '[models.empty]',
                                              '[groups.g]\ntarget = "cpu"\nmodels = ["tinycnn", "tinycnn"]',
                                              'extends = "qnn-htp"', "[cache]\nmax_size_mb = 1e400"]))
            elif kind == 4:
                mutant[at] = re.sub(r"\d+", lambda m: rng.choice(["0", "-5", "99999999999999999999"]), line)
            else:
                mutant[at] = line.replace('"', "", 1)
        found.append("\n".join(mutant) + "\n")
    return found


def test_a_fuzzed_manifest_is_built_or_refused_in_one_line_never_a_traceback(folder, host_cache):
    """300 fixed-seed mutations through everything task creation does (`epbuild.tasks.loading.load_project`, as
    `doit list`; in the default suite)."""
    from epbuild.state.registry import settle_format
    from epbuild.tasks.loading import load_project

    state = folder / "artifacts" / ".state"
    settle_format(state)
    shutil.copy(host_cache, state / "host.json")
    refused = accepted = 0
    for index, text in enumerate(_mutants()):
        (folder / "models.toml").write_text(text, encoding="utf-8")
        try:
            load_project(folder / "models.toml", ["list"])
            accepted += 1
        except UserError as exc:
            line = str(exc)
            assert "\n" not in line and len(line) < 600, (index, line)
            assert line.startswith(("models.toml", "EPBUILD_")), (index, line)
            refused += 1
    assert refused + accepted == MUTATIONS and refused > MUTATIONS // 2


def test_a_manifest_that_is_not_a_regular_file_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "models.toml"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="is not a regular file; give a manifest file"):
        load(fifo)


def test_an_empty_epbuild_manifest_means_the_default(project):
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\ntargets = ["cpu"]\n[targets.cpu]\nep = "cpu"\n')
    project.env["EPBUILD_MANIFEST"] = ""
    assert "compile:tinycnn@cpu" in project.doit("list").stdout


def test_a_read_only_artifacts_folder_lists_with_a_warning_and_refuses_a_build_in_one_line(project, tmp_path):
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\ntargets = ["cpu"]\n[targets.cpu]\nep = "cpu"\n')
    project.doit("list")
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(project.artifacts), str(project.artifacts)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a read-only bind mount is not permitted here: {mounted.stderr.strip()}")
    subprocess.run(["mount", "-o", "remount,ro,bind", str(project.artifacts)], capture_output=True)
    try:
        project.env["EPBUILD_FAST_PATH"] = "0"
        listed = project.doit("list", check=False)
        assert listed.returncode == 0 and "compile:tinycnn@cpu" in listed.stdout, listed.stderr
        assert "warning: artifacts/ is not writable" in listed.stderr and "Traceback" not in listed.stderr
        built = project.doit(check=False)
        assert built.returncode == 2 and "Traceback" not in built.stderr
        assert built.stderr.strip().startswith("error: models.toml: artifacts/ is not writable: Read-only file system")
    finally:
        subprocess.run(["umount", str(project.artifacts)], capture_output=True)


def test_a_declared_shape_too_large_to_generate_is_refused_before_any_allocation(project):
    from onnx import TensorProto, helper, save

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "dyn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "c"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    save(model, str(project.root / "models" / "dyn.onnx"))
    project.manifest('[models.dyn]\npath = "models/dyn.onnx"\ninputs = { x = [1000000, 1000000] }\n'
                     'targets = ["cpu"]\n[targets.cpu]\nep = "cpu"\n')
    done = project.doit(check=False)
    assert done.returncode == 1 and "internal error" not in done.stdout + done.stderr
    assert ("input 'x' of shape [1000000, 1000000] would take 3,725.3 GiB to generate (at most 4 GiB); check "
            "inputs.x or give validation.inputs") in done.stdout + done.stderr
    graph.input[0].CopyFrom(helper.make_tensor_value_info("x", TensorProto.FLOAT, [0, 4]))  # static, zero-size
    graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, [0, 4]))
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9),
         str(project.root / "models" / "dyn.onnx"))
    project.manifest('[models.dyn]\npath = "models/dyn.onnx"\ntargets = ["cpu"]\n[targets.cpu]\nep = "cpu"\n')
    done = project.doit(check=False)
    assert "input 'x' has a zero-size dimension ([0, 4]): nothing to generate" in done.stdout + done.stderr


def test_models_that_cannot_work_are_refused_before_any_build(project):
    from onnx import TensorProto, helper, save

    from helpers import model_with_location

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "no_outputs",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])], [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    save(model, str(project.root / "models" / "noout.onnx"))
    model_with_location(project.root, "itself.onnx", "itself.onnx")  # its external data: the model file
    for name, expected in (("noout", "noout.onnx: the model has no outputs: nothing to compile or compare"),
                           ("itself", "external data location 'itself.onnx' is the model file itself")):
        project.manifest(f'[models.{name}]\npath = "models/{name}.onnx"\ntargets = ["cpu"]\n'
                         '[targets.cpu]\nep = "cpu"\n')
        done = project.doit("list", check=False)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith(f"error: models.toml: models.{name}.path: ") and expected in done.stderr
        assert done.stderr.count("\n") == 1


def test_freeze_naming_an_input_the_model_lacks_is_refused_before_any_task(project):
    project.manifest('[models.tinycnn]\npath = "models/tinycnn.onnx"\nfreeze = { sr = 16000 }\ntargets = ["cpu"]\n'
                     '[targets.cpu]\nep = "cpu"\n')
    done = project.doit(check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: models.toml: models.tinycnn.freeze.sr: the model has no input 'sr'; its "
                                  "inputs: x")
    assert not (project.artifacts / "cpu").exists()


@pytest.mark.parametrize(("option", "expected"), [
    ('backend_type = "tpu"', "targets.qnn-htp.options.backend_type: 'tpu' is not a value QNNExecutionProvider "
                             "knows (did you mean 'htp'?) (it would be ignored without a word); valid: cpu, gpu, "
                             "htp, saver, ir"),
    ('soc_model = "sm8651"', "targets.qnn-htp.options.soc_model: must be a number or a chip name epbuild knows "
                             "(did you mean 'SM8650'?); known: QCM6490, QCS9100, SA8255, SA8295, SA8540, SA8797, "
                             "SAR2230P, SC8380XP, SM8350, SM8450, SM8475, SM8550, SM8635, SM8650, SM8735, SM8750, "
                             "SM8845, SM8850, SSG2115P, SSG2125P, SW6100, SXR1230P, SXR2230P, SXR2330P, "
                             "found 'sm8651'"),
])
def test_qnn_option_values_the_ep_would_ignore_are_refused(project, option, expected):
    shipped_options = 'options = { backend_type = "htp", soc_model = 60 }'
    project.manifest(_with(SHIPPED, shipped_options, f"options = {{ {option} }}"))
    done = project.doit("list", check=False)
    assert done.returncode == 2 and done.stderr.strip() == f"error: models.toml: {expected}"


def test_a_chip_name_is_taken_for_its_soc_model_number(project):
    """`soc_model = "sm8650"` (any case) is the number QNN takes, 57: the same target, the same fingerprint."""
    from epbuild.manifest.parse import load
    from epbuild.plan.targets import resolve_target

    shipped_options = 'options = { backend_type = "htp", soc_model = 60 }'
    resolved = []
    for value in ('"sm8650"', '"SM8650"', "57"):
        project.manifest(_with(SHIPPED, shipped_options, f'options = {{ backend_type = "htp", soc_model = {value} }}'))
        manifest = load(project.root / "models.toml")
        resolved.append(resolve_target(manifest.targets["qnn-htp"], manifest))
    assert [target.options["soc_model"] for target in resolved] == ["57", "57", "57"]
    assert resolved[0] == resolved[2] and not resolved[0].warnings


@pytest.mark.parametrize(("shape", "dims", "said"), [
    (("batch", 3, "h", "w"), "{ batch = 1 }", "has symbolic dimensions 2 ('h'), 3 ('w'); target 'qnn-htp' needs "
     "static shapes: set dims = { h = ..., w = ... } (every input with those dimensions) or inputs = { x = [...] }"),
    (("p2o.DynamicDimension.0", 3, 8, 8), "{}", "has symbolic dimension 0 ('p2o.DynamicDimension.0'); target "
     "'qnn-htp' needs static shapes: set dims = { \"p2o.DynamicDimension.0\" = ... } (every input with that "
     "dimension) or inputs = { x = [...] }"),
])
def test_a_symbolic_dimension_message_names_those_left_open_as_toml_keys(project, shape, dims, said):
    """The dimensions `dims` leaves open are named (not one it already sets), and a dotted name is quoted: bare,
    TOML would read it as nested tables."""
    from helpers import single_op_model

    single_op_model(project.root / "models" / "dyn.onnx", "Relu", shape)
    project.manifest(f'[models.dyn]\npath = "models/dyn.onnx"\ndims = {dims}\ntargets = ["qnn-htp"]\n'
                     '[targets.qnn-htp]\nep = "qnn"\noptions = { soc_model = 60 }\n')
    line = f"models.toml: models.dyn.inputs: input 'x' ({_dims(shape)}) {said}"
    assert "[blocked: models.dyn.inputs needs a fix]" in project.doit("list").stdout
    done = project.doit(check=False)
    assert done.returncode == 1
    assert f"error: {line} (2 task(s) wait for it: compile:dyn@qnn-htp, validate:dyn@qnn-htp; " in done.stdout


def _dims(shape) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) else "?" for d in shape) + "]"


def _written(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if "__pycache__" not in p.parts}


WHERE = re.compile(r"^error: models\.toml: (TOML syntax error: .*line \d+|[^\s:]+: \S)")  # a key path, or the line


@pytest.mark.slow
def test_every_fuzzed_manifest_through_doit_exits_2_in_one_line_and_writes_nothing(project):
    """The same 300 mutations as `doit list` runs them (~1 min): a refusal is exit 2, one `error: models.toml:` line
    with the key path (or the TOML line), nothing written; an accepted manifest lists its tasks."""
    from concurrent.futures import ThreadPoolExecutor

    mutants = _mutants()
    folders = []
    for index, text in enumerate(mutants):
        folder = project.root.parent / f"m{index}"
        shutil.copytree(project.root, folder, symlinks=True)
        (folder / "models.toml").write_text(text, encoding="utf-8")
        folders.append(folder)
    before = [_written(folder) for folder in folders]

    def listing(folder: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "doit", "list"], cwd=folder, env=project.env,
                              capture_output=True, text=True, timeout=120)

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        results = list(pool.map(listing, folders))
    refused = 0
    for index, done in enumerate(results):
        assert "Traceback" not in done.stdout + done.stderr and "internal error" not in done.stderr, (index, done)
        if done.returncode == 0:
            assert "compile:" in done.stdout or "unavailable" in done.stdout, (index, done.stdout[-300:])
            continue
        refused += 1
        assert done.returncode == 2, (index, done.returncode, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and WHERE.match(lines[0]), (index, lines)
        assert _written(folders[index]) == before[index], (index, lines)
    assert refused > MUTATIONS // 2


def test_a_soc_model_no_device_has_is_built_with_one_warning_naming_the_known_ones(project):
    manifest = ('[models.tinycnn]\npath = "models/tinycnn.onnx"\ntargets = ["npu"]\n'
                '[targets.npu]\nep = "qnn"\noptions = { soc_model = SOC }\n')
    project.manifest(manifest.replace("SOC", "61"))
    done = project.doit("list")
    assert "compile:tinycnn@npu" in done.stdout
    (warning,) = done.stderr.strip().splitlines()
    assert warning.startswith("warning: models.toml: targets.npu.options.soc_model: 61 is not a soc_model epbuild "
                              "knows, and QNNExecutionProvider compiles without checking it; known: 30 (SM8350), ")
    assert "60 (SC8380XP)" in warning
    project.manifest(manifest.replace("SOC", "60"))
    assert project.doit("list").stderr == ""


def test_a_path_the_locale_cannot_spell_is_said_so_not_missing(project):
    """Under an ASCII locale an existing 'dïr ü/m.onnx' read as "model file not found": the line says the locale
    cannot encode the name, and how to run with one that can."""
    import shutil

    folder = project.root / "d\u00efr \u00fc"
    folder.mkdir()
    shutil.copy(project.root / "models" / "tinycnn.onnx", folder / "m.onnx")
    project.manifest('[models.m]\npath = "d\u00efr \u00fc/m.onnx"\n\n[targets.cpu]\nep = "cpu"\n')
    project.env.update({"LC_ALL": "C", "PYTHONUTF8": "0", "LANG": "C"})
    done = project.doit("list", check=False)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "models.m.path: model file cannot be named in this locale's file-name encoding (ascii)" in done.stderr
    assert "PYTHONUTF8=1" in done.stderr and "not found" not in done.stderr
    project.env.update({"PYTHONUTF8": "1"})
    assert project.doit("list").returncode == 0


def test_the_roots_check_resolves_as_the_file_system_does(tmp_path):
    """`Roots.resolved` resolves each folder once per reading (10,000 models in one folder); its answer is
    `Path.resolve()`'s for plain files, links to files, links to folders, `..` after a link and absent files."""
    import os

    from epbuild.manifest.roots import Roots

    (tmp_path / "proj" / "models").mkdir(parents=True)
    (tmp_path / "outside" / "deep").mkdir(parents=True)
    (tmp_path / "proj" / "models" / "m.onnx").write_bytes(b"x")
    (tmp_path / "outside" / "deep" / "o.onnx").write_bytes(b"x")
    os.symlink(tmp_path / "outside" / "deep" / "o.onnx", tmp_path / "proj" / "models" / "link.onnx")
    os.symlink(tmp_path / "outside" / "deep", tmp_path / "proj" / "away")
    roots = Roots(tmp_path / "proj" / "models.toml")
    for relative in ("models/m.onnx", "models/link.onnx", "away/o.onnx", "away/../m.onnx", "models/./m.onnx",
                     "models/absent.onnx", "away/absent.onnx"):
        path = tmp_path / "proj" / relative
        assert roots.resolved(path) == path.resolve(), relative
