"""MXNet's GPU reality in run_all.py: MXNet 1.9.1's GPU wheels carry machine code for sm_50-sm_86
only and no PTX (read from libmxnet.so: runner/envs/gpu_preflight.py), so a newer GPU (Hopper) gets a skipped
row with the reason, before any environment is built; bf16 has no MXNet GPU path.  Runs without a
GPU: the GPU is described, not used."""
import json
import os

import pytest

from common.spec import get_preset
from runner.envs import framework_envs
from runner.run import execute
from runner.base import EnvError
from runner.envs import gpu_preflight
from runner.run.targets import TARGETS
from tests.conftest import ROOT

H100 = {"name": "NVIDIA H100 80GB HBM3", "driver": "580.65.06", "memory_mib": 81559, "compute_capability": "9.0"}
A100 = {"name": "NVIDIA A100-SXM4-40GB", "driver": "580.65.06", "memory_mib": 40960, "compute_capability": "8.0"}


def mxnet_gpu_unsupported(cc):
    build = gpu_preflight.get_build("mxnet", "cu112")
    return gpu_preflight.arch_verdict(build, gpu_preflight.parse_compute_capability(cc))[0]


@pytest.mark.parametrize("cc", ["5.0", "5.2", "6.0", "6.1", "7.0", "7.5", "8.0", "8.6", "8.9"])
def test_gpus_up_to_ampere_and_ada_run_mxnet(cc):
    assert mxnet_gpu_unsupported(cc) is None


def test_unknown_compute_capability_is_not_skipped():
    assert mxnet_gpu_unsupported(None) is None


@pytest.mark.parametrize("cc, arch", [("3.7", "sm_37"), ("9.0", "sm_90"), ("10.0", "sm_100"), ("12.0", "sm_120")])
def test_gpus_without_mxnet_machine_code_are_refused_with_the_reason(cc, arch):
    reason = mxnet_gpu_unsupported(cc)
    assert reason and arch in reason
    assert "sm_50, sm_60, sm_70, sm_80, sm_86" in reason and "no PTX" in reason and "mxnet-cu112" in reason


def run_mxnet(tmp_path, monkeypatch, gpu, precision="fp32"):
    """run_target for MXNet on a described GPU; building an environment stops the run (EnvError)."""
    built = []

    def no_env(env, device, python=None, announce=print, build=None, wheelhouse=None):
        built.append((env.name, device))
        raise EnvError("stopped by the test before building %s-%s" % (env.name, device))

    monkeypatch.setattr(framework_envs, "ensure", no_env)
    opts = execute.RunOptions(get_preset("smoke"), precision, 0, "cuda", str(tmp_path), gpu=gpu, progress=False,
                              command="python run_all.py --device cuda")
    record = execute.run_target(TARGETS["mxnet"], opts, announce=lambda *a: None)
    files = os.listdir(os.path.join(str(tmp_path), "records"))
    assert len(files) == 1
    with open(os.path.join(str(tmp_path), "records", files[0])) as f:
        assert json.load(f) == json.loads(json.dumps(record))
    return record, built, files[0]


def test_hopper_gets_a_skipped_row_before_any_environment_is_built(tmp_path, monkeypatch):
    record, built, name = run_mxnet(tmp_path, monkeypatch, H100)
    assert built == []
    assert record["status"] == "skipped" and "sm_90" in record["error"] and "sm_80, sm_86" in record["error"]
    assert record["target"] == "mxnet" and record["device"] == {"type": "cuda", "name": H100["name"]}
    assert record["precision"] == "fp32" and record["preset"] == "smoke"
    assert name == "mxnet_smoke_fp32_bs8_nvidia-h100-80gb-hbm3.json"


def test_ampere_is_not_skipped(tmp_path, monkeypatch):
    record, built, _ = run_mxnet(tmp_path, monkeypatch, A100)
    assert built == [("mxnet", "cuda")]
    assert record["status"] == "failed" and "stopped by the test" in record["error"]


def test_bf16_on_a_gpu_is_skipped_with_its_reason(tmp_path, monkeypatch):
    record, built, _ = run_mxnet(tmp_path, monkeypatch, A100, precision="bf16")
    assert built == []
    assert record["status"] == "skipped" and "bfloat16" in record["error"]


def test_pins_keep_numpy_below_1_24():
    for device in ("cpu", "cuda"):
        with open(os.path.join(ROOT, "envs", "mxnet-%s.txt" % device)) as f:
            pins = [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]
        assert "numpy==1.23.5" in pins
        assert ("mxnet==1.9.1" if device == "cpu" else "mxnet-cu112==1.9.1") in pins


def test_kernel_finds_the_cuda_11_libraries_of_the_nvidia_wheels(tmp_path):
    from runner.envs.definitions import ENVS, mxnet_kernel_env
    assert ENVS["mxnet"].kernel_env is mxnet_kernel_env
    assert mxnet_kernel_env(str(tmp_path)) == {}                      # the CPU environment: nothing
    site = tmp_path / "lib" / "python3.11" / "site-packages" / "nvidia"
    for name in ("cudnn", "cuda_runtime", "cublas"):
        (site / name / "lib").mkdir(parents=True)
    paths = mxnet_kernel_env(str(tmp_path))["LD_LIBRARY_PATH"].split(os.pathsep)
    assert paths == [str(site / name / "lib") for name in ("cublas", "cuda_runtime", "cudnn")] + ["${LD_LIBRARY_PATH}"]


def test_cuda_pins_bring_every_cuda_library_libmxnet_links():
    with open(os.path.join(ROOT, "envs", "mxnet-cuda.txt")) as f:
        pins = {line.split("==")[0].strip() for line in f if "==" in line and not line.startswith("#")}
    # NEEDED entries of mxnet-cu112's libmxnet.so, except the driver's libcuda.so.1
    for lib in ("cuda-runtime", "cublas", "cudnn", "cufft", "curand", "cusolver", "cusparse", "nccl", "cuda-nvrtc",
                "nvtx"):
        assert "nvidia-%s-cu11" % lib in pins
