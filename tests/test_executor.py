"""Builds on a real Dask cluster on loopback: a scheduler and `python -m epbuild.worker` processes, each with
its own working folder and its own resources; and CI shards."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, SOURCE, build_report, clone, ran
from epbuild.errors import BuildError
from epbuild.steps import vendor_shim
from epbuild.steps.remote_job import _check_versions, relocate
from helpers import OPENVINO_CPU_TARGET, TWO_MODELS_CPU_QNN, single_op_model, tree_bytes

MANIFEST = TWO_MODELS_CPU_QNN + """
[executor]
wait_s = 4
"""
TASKS = {f"{kind}:{m}@{t}" for kind in ("compile", "validate") for m in ("tinycnn", "encoder")
         for t in ("cpu", "qnn-htp")}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Cluster:
    """A Dask scheduler and workers started by this test, each in its own process group, all stopped at the end."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.processes: dict[str, subprocess.Popen] = {}
        self._start("scheduler", [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                  "--port", self.address.rsplit(":", 1)[1], "--no-dashboard"], os.environ.copy())

    def _start(self, name: str, command: list[str], env: dict[str, str]) -> None:
        log = open(self.tmp_path / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        self.processes[name] = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True, cwd=self.tmp_path)

    def worker(self, name: str, fake_versions: dict[str, str] | None = None, **env: str) -> Path:
        """A worker named `name`; `fake_versions` installs package metadata claiming other versions first on its
        path, as on a host where another release is installed."""
        workdir = self.tmp_path / f"worker-{name}"
        env = {**os.environ, "PYTHONPATH": str(SOURCE), **env}
        if fake_versions:
            site = self.tmp_path / f"site-{name}"
            for package, version in fake_versions.items():
                info = site / f"{package.replace('-', '_')}-{version}.dist-info"
                info.mkdir(parents=True)
                (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
            env["PYTHONPATH"] = f"{site}{os.pathsep}{SOURCE}"
        self._start(f"worker-{name}", [sys.executable, "-m", "epbuild.worker", self.address, "--workdir",
                                       str(workdir), "--name", name, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                                       "--host", "127.0.0.1"], env)
        return workdir

    def wait_for(self, names: set[str], timeout: float = 120) -> None:
        from distributed import Client

        with Client(self.address, timeout="30s") as client:
            deadline = time.monotonic() + timeout
            while {w.get("name") for w in client.scheduler_info(n_workers=-1)["workers"].values()} != names:
                assert time.monotonic() < deadline, (self.tmp_path / "scheduler.log").read_text()
                time.sleep(0.3)

    def kill(self, name: str) -> None:
        process = self.processes.pop(name)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

    def stop(self) -> None:
        for name in list(self.processes):
            self.kill(name)


@pytest.fixture
def cluster(tmp_path):
    started = Cluster(tmp_path)
    yield started
    started.stop()


def test_jobs_route_by_resources_and_versions_and_match_a_local_build(tmp_path, host_cache, cluster):
    cluster.worker("a", fake_versions={"onnxruntime-qnn": "2.6.0"})  # cannot build what 2.7.0 fingerprints
    cluster.worker("b")
    cluster.wait_for({"a", "b"})
    distributed = clone(tmp_path, host_cache, "dist", MANIFEST, EPBUILD_EXECUTOR=cluster.address)
    done = distributed.doit()
    entries = build_report(distributed)
    assert {entries[name]["worker"] for name in TASKS if "qnn-htp" in name} == {"b"}, done.stdout
    assert all(entries[name]["worker"] in ("a", "b") for name in TASKS)
    assert {entries[name]["status"] for name in TASKS} == {"compiled", "validated"}
    local = clone(tmp_path, host_cache, "local", MANIFEST)
    local.doit()
    assert tree_bytes(local.artifacts) == tree_bytes(distributed.artifacts)  # byte-identical artifacts
    assert ran(distributed.doit()) == set()  # up to date: no job submitted


def test_a_package_is_checked_through_onnx_runtime_on_a_worker_that_runs_several_jobs(tmp_path, host_cache,
                                                                                    cluster, openvino_reason):
    """A worker process runs one job after another: each job that opens a session registers the EP's plugin, and
    ONNX Runtime refused a second registration (`EP library is already registered under
    OpenVINOExecutionProvider`), so the package's variants failed their check through the package."""
    if openvino_reason:
        pytest.skip(openvino_reason)
    cluster.worker("only")
    cluster.wait_for({"only"})
    manifest = ('[models.tinycnn]\npath = "models/tinycnn.onnx"\ntargets = ["cpu", "openvino-cpu"]\n'
                '[targets.cpu]\nep = "cpu"\n' + OPENVINO_CPU_TARGET + '[packages.vision]\nmodels = ["tinycnn"]\n'
                '[executor]\nwait_s = 4\n')
    built = clone(tmp_path, host_cache, "dist", manifest, EPBUILD_EXECUTOR=cluster.address)
    done = built.doit(check=False)
    assert done.returncode == 0 and "packaged package:vision" in done.stdout, done.stdout + done.stderr
    assert "already registered" not in done.stdout + done.stderr


def test_with_a_remote_cache_outputs_travel_through_it(tmp_path, host_cache, cluster):
    from s3_server import S3Server

    s3 = S3Server()
    s3.start()
    try:
        bucket = s3.new_bucket()
        cluster.worker("b", **s3.env())
        cluster.wait_for({"b"})
        remote = MANIFEST + f'[cache]\nremote = "s3://{bucket}/cache"\n'
        project = clone(tmp_path, host_cache, "dist", remote, EPBUILD_EXECUTOR=cluster.address, **s3.env())
        project.doit()
        entries = build_report(project)
        compiled = [entries[name] for name in TASKS if name.startswith("compile:")]
        assert all(e["status"] == "compiled" and e["worker"] == "b" and e["remote_bytes"]["down"] > 0
                   for e in compiled), compiled
        local = clone(tmp_path, host_cache, "local", MANIFEST)
        local.doit()
        assert tree_bytes(local.artifacts) == tree_bytes(project.artifacts)
    finally:
        s3.stop()


def test_a_worker_that_cannot_use_the_remote_cache_fails_its_job_with_the_cause_on_the_coordinator(
        tmp_path, host_cache, cluster):
    from s3_server import S3Server

    s3 = S3Server()
    s3.start()
    try:
        bucket = s3.new_bucket()
        credentials = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
        cluster.worker("b", **{k: v for k, v in s3.env().items() if k not in credentials})
        cluster.wait_for({"b"})
        remote = MANIFEST + f'[cache]\nremote = "s3://{bucket}/cache"\n'
        project = clone(tmp_path, host_cache, "dist", remote, EPBUILD_EXECUTOR=cluster.address, **s3.env())
        done = project.doit("compile:tinycnn@cpu", check=False)
        assert done.returncode != 0
        assert (f"compile:tinycnn@cpu: this worker cannot use the remote cache s3://{bucket}/cache: "
                "NoCredentialsError") in done.stdout + done.stderr
        assert "give this process credentials for the bucket" in done.stdout + done.stderr
    finally:
        s3.stop()


def test_a_job_no_worker_can_run_fails_after_a_bounded_wait_naming_the_missing_versions(tmp_path, host_cache,
                                                                                       cluster):
    cluster.worker("a", fake_versions={"onnxruntime-qnn": "2.6.0"})
    cluster.wait_for({"a"})
    project = clone(tmp_path, host_cache, "p", MANIFEST, EPBUILD_EXECUTOR=cluster.address)
    started = time.monotonic()
    done = project.doit("--continue", check=False)
    assert done.returncode != 0 and time.monotonic() - started < 120
    assert "compile:tinycnn@qnn-htp: no Dask worker can run it after 4 s" in done.stdout + done.stderr
    assert "a lacks pkg:onnxruntime-qnn:2.7.0" in done.stdout + done.stderr
    entries = build_report(project)
    assert entries["compile:tinycnn@cpu"]["worker"] == "a" and entries["validate:encoder@cpu"]["status"] == \
        "validated"
    assert not (project.artifacts / "qnn-htp" / "tinycnn").exists()


def test_a_toolchain_only_a_worker_has_is_used_there_and_named_in_the_fingerprint(tmp_path, host_cache, cluster):
    sdk = tmp_path / "qti-aic"
    shutil.copytree(REPO / "tests" / "standins" / "qaic", sdk)  # a STAND-IN qaic-compile, only on worker b
    cluster.worker("a")
    cluster.worker("b", QAIC_ROOT=str(sdk))
    cluster.wait_for({"a", "b"})
    manifest = ('[models.dynbatch]\npath = "models/dynbatch.onnx"\ninputs = { x = [1, 3, 32, 32] }\n'
                '[targets.aic100]\ncompiler = "qaic"\n[executor]\nwait_s = 4\n')
    project = clone(tmp_path, host_cache, "p", manifest)
    project.env.pop("QAIC_ROOT", None)
    assert "skipped compile:dynbatch@aic100: qaic-compile not found" in project.doit().stdout  # not on this host
    project.env["EPBUILD_EXECUTOR"] = cluster.address
    done = project.doit()
    assert "operators are supported by qaic-compile 1.20.2.0" in done.stdout, done.stdout
    entries = build_report(project)
    assert entries["compile:dynbatch@aic100"]["worker"] == entries["validate:dynbatch@aic100"]["worker"] == "b"
    artifact = json.loads((project.artifacts / "aic100" / "dynbatch" / "artifact.json").read_text())
    assert artifact["toolchain"]["version"] == "1.20.2.0"
    assert (project.artifacts / "aic100" / "dynbatch" / "qpc" / "programqpc.bin").is_file()
    tools = [json.loads(line)[0] for line in (sdk / "calls.jsonl").read_text().splitlines()]
    assert "-operators-supported=onnx" in tools and any(t.startswith("-model=") for t in tools)
    assert ran(project.doit()) == set()  # the workers' version is in the fingerprint: up to date
    log = project.artifacts / ".logs" / "aic100" / "dynbatch.ops.log"  # the worker's log, kept here
    assert "qaic-compile -operators-supported=onnx" in log.read_text()


def test_a_failed_job_brings_its_log_back(tmp_path, host_cache, cluster):
    cluster.worker("a")
    cluster.wait_for({"a"})
    project = clone(tmp_path, host_cache, "p", '[models.det]\npath = "models/det.onnx"\n'
                    '[targets.qnn-htp]\nep = "qnn"\n', EPBUILD_EXECUTOR=cluster.address)
    single_op_model(project.root / "models" / "det.onnx", "Det")  # QNN HTP compiles nothing of it
    done = project.doit(check=False)
    assert done.returncode != 0 and "took none of the model's nodes" in done.stdout and "jobs/" not in done.stdout
    log = project.artifacts / ".logs" / "qnn-htp" / "det.compile.log"  # written on worker a, kept here
    assert "Unable to compile any nodes" in log.read_text()
    assert not (project.artifacts / "qnn-htp" / "det").exists()


def test_a_device_only_a_worker_offers_is_built_there(tmp_path, host_cache, cluster):
    """Worker a (and the coordinator) lack OpenVINO's CPU device: on a non-Intel host the vendor-id shim switched
    off, on an Intel host (no shim needed) the plugin hidden; worker b builds it."""
    if vendor_shim.needed():
        lacking = {"EPBUILD_OPENVINO_VENDOR_SHIM": "0"}
        said = "OpenVINOExecutionProvider registered but offers no device"
    else:
        hidden = tmp_path / "hidden" / "onnxruntime_ep_openvino"
        hidden.mkdir(parents=True)
        (hidden / "__init__.py").write_text("raise ImportError('onnxruntime-ep-openvino is not installed here')\n")
        lacking = {"PYTHONPATH": f"{hidden.parent}{os.pathsep}{SOURCE}"}
        said = "onnxruntime-ep-openvino"
    cluster.worker("a", **lacking)
    cluster.worker("b")
    cluster.wait_for({"a", "b"})
    manifest = ('[models.tinycnn]\npath = "models/tinycnn.onnx"\n[targets.ov]\nep = "openvino"\ndevice = "cpu"\n'
                'options = { load_config = "configs/openvino_f32.json" }\noption_files = ["load_config"]\n')
    project = clone(tmp_path, host_cache, "p", manifest, **lacking)
    (project.artifacts / ".state" / "host.json").unlink()  # the seeded probe is of a host that has the plugin
    skipped = project.doit().stdout
    assert "skipped compile:tinycnn@ov: " in skipped and said in skipped, skipped
    project.env["EPBUILD_EXECUTOR"] = cluster.address
    project.doit()
    entries = build_report(project)
    assert entries["compile:tinycnn@ov"]["worker"] == entries["validate:tinycnn@ov"]["worker"] == "b"
    assert entries["validate:tinycnn@ov"]["status"] == "validated"


def test_a_worker_refuses_a_job_whose_versions_or_epbuild_code_differ_from_its_own():
    from epbuild.execute.provenance import code_digest
    from epbuild.steps.job_modules import CODE_ROOTS

    with pytest.raises(BuildError, match=r"needs onnxruntime 0\.0\.1, this worker has 1"):
        _check_versions({"task": "compile:m@cpu", "resources": {"pkg:onnxruntime:0.0.1": 1},
                         "code": code_digest(CODE_ROOTS)})
    with pytest.raises(BuildError, match="it runs other epbuild code than the coordinator"):
        _check_versions({"task": "compile:m@cpu", "resources": {}, "code": "0" * 64})


def test_a_worker_killed_mid_job_is_replaced_by_another(tmp_path, host_cache, cluster):
    from helpers import slow_model

    workdirs = {name: cluster.worker(name) for name in ("a", "b")}
    cluster.wait_for({"a", "b"})
    project = clone(tmp_path, host_cache, "p", '[models.slow]\npath = "models/slow.onnx"\n'
                    '[targets.cpu]\nep = "cpu"\n', EPBUILD_EXECUTOR=cluster.address)
    slow_model(project.root / "models" / "slow.onnx")
    process = subprocess.Popen([sys.executable, "-m", "doit", "compile"], cwd=project.root, env=project.env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline, victim = time.monotonic() + 120, None
    while victim is None:
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()[0]
        victim = next((name for name, folder in workdirs.items() if any((folder / "jobs").glob("*"))), None)
        time.sleep(0.05)
    cluster.kill(f"worker-{victim}")
    output = process.communicate(timeout=300)[0]
    assert process.returncode == 0, output
    survivor = ({"a", "b"} - {victim}).pop()
    assert build_report(project)["compile:slow@cpu"]["worker"] == survivor


def test_the_scheduler_lost_mid_build_fails_the_task_with_one_line(tmp_path, host_cache, cluster):
    from helpers import slow_model

    workdir = cluster.worker("a")
    cluster.wait_for({"a"})
    project = clone(tmp_path, host_cache, "p", '[models.slow]\npath = "models/slow.onnx"\n'
                    '[targets.cpu]\nep = "cpu"\n', EPBUILD_EXECUTOR=cluster.address)
    slow_model(project.root / "models" / "slow.onnx")
    process = subprocess.Popen([sys.executable, "-m", "doit", "compile"], cwd=project.root, env=project.env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not any((workdir / "jobs").glob("*")):
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()[0]
        time.sleep(0.05)
    cluster.kill("scheduler")
    output = process.communicate(timeout=300)[0]
    assert process.returncode != 0 and "Traceback" not in output, output
    assert f"compile:slow@cpu: lost the Dask scheduler {cluster.address} while the job ran" in output, output


def test_an_unreachable_scheduler_is_one_error_before_any_build(tmp_path, host_cache):
    project = clone(tmp_path, host_cache, "p", MANIFEST, EPBUILD_EXECUTOR="tcp://127.0.0.1:9")
    done = project.doit(check=False)
    assert done.returncode == 2 and done.stderr.strip().startswith("error: EPBUILD_EXECUTOR: the Dask scheduler")
    assert "unreachable" in done.stderr and not (project.artifacts / "cpu").exists()
    assert "compile:tinycnn@cpu" in project.doit("list").stdout  # listing needs no cluster
    project.env["EPBUILD_EXECUTOR"] = "localhost:8786"
    assert "must be a Dask scheduler address" in project.doit("list", check=False).stderr


def test_shards_partition_the_build_and_their_union_is_everything(tmp_path, host_cache):
    manifest = MANIFEST.replace("[executor]\nwait_s = 4\n", "") + (
        '[models.dynbatch]\npath = "models/dynbatch.onnx"\ninputs = { x = [1, 3, 32, 32] }\n'
        '[models.tinycnn_qdq]\npath = "models/tinycnn_qdq.onnx"\n')
    built: list[set[str]] = []
    for index in (1, 2, 3):
        shard = clone(tmp_path, host_cache, f"shard{index}", manifest, EPBUILD_SHARD=f"{index}/3")
        built.append({name for name in ran(shard.doit()) if name.startswith(("compile:", "validate:"))})
    everything = {f"{kind}:{m}@{t}" for kind in ("compile", "validate")
                  for m in ("tinycnn", "encoder", "dynbatch", "tinycnn_qdq") for t in ("cpu", "qnn-htp")}
    assert set().union(*built) == everything
    assert sum(len(part) for part in built) == len(everything)  # no task built twice
    assert all(part for part in built)
    bad = clone(tmp_path, host_cache, "bad", manifest, EPBUILD_SHARD="4/3").doit("list", check=False)
    assert bad.returncode == 2 and "EPBUILD_SHARD: must be I/N" in bad.stderr


def test_a_shard_holds_what_its_groups_need_so_no_task_is_built_by_two(tmp_path, host_cache):
    """A group needs its members' own compiles: the group, its members' builds and their stages share a shard."""
    manifest = TWO_MODELS_CPU_QNN + ('[models.dynbatch]\npath = "models/dynbatch.onnx"\n'
                                     'inputs = { x = [1, 3, 32, 32] }\n'
                                     '[groups.pair]\ntarget = "qnn-htp"\nmodels = ["tinycnn", "encoder"]\n')
    built = []
    for index in (1, 2):
        shard = clone(tmp_path, host_cache, f"shard{index}", manifest, EPBUILD_SHARD=f"{index}/2")
        built.append(sorted(name for name in ran(shard.doit()) if name.startswith(("compile:", "group:",
                                                                                     "validate:"))))
    together = [name for part in built for name in part]
    assert len(together) == len(set(together)), built  # no task built twice
    assert {"group:pair", "compile:tinycnn@qnn-htp", "compile:encoder@qnn-htp"} <= set(together)
    assert any("group:pair" in part and "compile:encoder@qnn-htp" in part for part in built)


def test_relocate_moves_every_path_under_the_project_and_nothing_else(tmp_path):
    from epbuild.manifest.parse import load
    from epbuild.plan.targets import plan

    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "models" / "tinycnn.onnx", tmp_path / "models" / "m.onnx")
    (tmp_path / "models.toml").write_text('[models.m]\npath = "models/m.onnx"\n[targets.cpu]\nep = "cpu"\n')
    build = plan(load(tmp_path / "models.toml"), {"m": ()})[0]
    moved = relocate(build, tmp_path, Path("/elsewhere"))
    assert moved.members[0].model.path == Path("/elsewhere/models/m.onnx") and moved.name == build.name
    assert relocate("/usr/lib/x", tmp_path, Path("/elsewhere")) == "/usr/lib/x"


def test_a_plugin_registered_before_is_not_registered_again():
    """Where the registered library's devices are not (yet) listed, a second job in the same process asked to
    register it again and ONNX Runtime refused: `register_plugin` takes that refusal as the answer."""
    from epbuild.execute.host import register_plugin
    from epbuild.manifest.eps import REGISTRY

    class Runtime:
        def __init__(self):
            self.registered: list[str] = []

        def get_ep_devices(self):
            return []  # the library's devices did not come up

        def register_execution_provider_library(self, name, path):
            if name in self.registered:
                raise RuntimeError(f"[ONNXRuntimeError] : 1 : FAIL : EP library is already registered under {name}")
            self.registered.append(name)

    runtime = Runtime()
    register_plugin(runtime, REGISTRY["openvino"])
    register_plugin(runtime, REGISTRY["openvino"])  # raised before
    assert runtime.registered == ["OpenVINOExecutionProvider"]
