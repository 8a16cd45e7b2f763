"""The GPU preflight (runner/envs/gpu_preflight.py) without a GPU: fake nvidia-smi outputs of typical machines
give, for every target, the CUDA build run_all.py would install or the reason none runs; the
environment of the chosen build; the run record; the command line (--check, --list, --gpu-build);
CNTK's library path; and the fat-binary reader behind the architecture facts."""
import json
import os
import stat
import struct
import subprocess
import sys

import pytest

from common import envinfo
from common.spec import get_preset
from runner.envs import framework_envs
from runner.run import execute
from runner.envs import gpu_preflight
from runner.envs import definitions
from runner.base import EnvError
from runner.envs.definitions import ENVS
from runner.run.targets import TARGETS
from tests.conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))
import fatbin_archs  # noqa: E402

# what `nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader,nounits` prints
SMI = {
    "v100-535": "Tesla V100-SXM2-16GB, 535.183.01, 16384, 7.0\n",
    "a100-550": "NVIDIA A100-SXM4-40GB, 550.90.07, 40960, 8.0\n",
    "h100-580": "NVIDIA H100 80GB HBM3, 580.65.06, 81559, 9.0\n",
    "rtx4090-570": "NVIDIA GeForce RTX 4090, 570.133.07, 24564, 8.9\n",
    "b200-580": "NVIDIA B200, 580.82.07, 183359, 10.0\n",
}

# target -> (build, how it runs) or the words its skip reason must contain
EXPECTED = {
    "v100-535": {"pytorch": ("cu128", "sass"), "keras-torch": ("cu128", "sass"),
                 "tensorflow": ("cuda12", "sass"), "keras-tensorflow": ("cuda12", "sass"),
                 "jax": ("cuda12", "codegen"), "keras-jax": ("cuda12", "codegen"),
                 "mxnet": ("cu112", "sass"), "cntk": ("cu100", "sass")},
    "a100-550": {"pytorch": ("cu128", "sass"), "keras-torch": ("cu128", "sass"),
                 "tensorflow": ("cuda12", "sass"), "keras-tensorflow": ("cuda12", "sass"),
                 "jax": ("cuda12", "codegen"), "keras-jax": ("cuda12", "codegen"),
                 "mxnet": ("cu112", "sass"), "cntk": ("cu100", "jit")},
    "h100-580": {"pytorch": ("cu130", "sass"), "keras-torch": ("cu130", "sass"),
                 "tensorflow": ("cuda12", "jit"), "keras-tensorflow": ("cuda12", "jit"),
                 "jax": ("cuda13", "codegen"), "keras-jax": ("cuda13", "codegen"),
                 "mxnet": ["mxnet-cu112", "sm_50, sm_60, sm_70, sm_80, sm_86", "no PTX", "sm_90"],
                 "cntk": ("cu100", "jit")},
    "rtx4090-570": {"pytorch": ("cu128", "sass"), "keras-torch": ("cu128", "sass"),
                    "tensorflow": ("cuda12", "sass"), "keras-tensorflow": ("cuda12", "sass"),
                    "jax": ("cuda12", "codegen"), "keras-jax": ("cuda12", "codegen"),
                    "mxnet": ("cu112", "sass"), "cntk": ("cu100", "jit")},
    "b200-580": {"pytorch": ("cu130", "sass"), "keras-torch": ("cu130", "sass"),
                 "tensorflow": ("cuda12", "jit"), "keras-tensorflow": ("cuda12", "jit"),
                 "jax": ("cuda13", "codegen"), "keras-jax": ("cuda13", "codegen"),
                 "mxnet": ["no PTX", "sm_100 GPU"], "cntk": ("cu100", "jit")},
}


def gpu(machine):
    (g,) = gpu_preflight.parse_nvidia_smi(SMI[machine])
    return g


def test_parser():
    assert gpu("v100-535") == {"name": "Tesla V100-SXM2-16GB", "driver": "535.183.01", "memory_mib": 16384,
                               "compute_capability": "7.0"}
    two = gpu_preflight.parse_nvidia_smi(SMI["h100-580"] + SMI["a100-550"])
    assert [g["name"] for g in two] == ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"]
    # drivers older than 510 do not know compute_cap: three fields
    (old,) = gpu_preflight.parse_nvidia_smi("Tesla V100-PCIE-16GB, 470.256.02, 16160\n")
    assert old == {"name": "Tesla V100-PCIE-16GB", "driver": "470.256.02", "memory_mib": 16160}
    assert gpu_preflight.parse_nvidia_smi("") == [] and gpu_preflight.parse_nvidia_smi("\n\n") == []
    assert gpu_preflight.parse_version("535.183.01") == (535, 183, 1) and gpu_preflight.parse_version("[N/A]") is None
    assert gpu_preflight.parse_compute_capability("12.0") == (12, 0)
    assert gpu_preflight.parse_compute_capability("[N/A]") is None


@pytest.mark.parametrize("machine", sorted(EXPECTED))
def test_every_target_gets_its_build_or_reason(machine):
    decisions = gpu_preflight.plan(TARGETS.values(), gpu(machine))
    assert list(decisions) == list(TARGETS)
    for name, expected in EXPECTED[machine].items():
        d = decisions[name]
        if isinstance(expected, tuple):
            assert d.runs and (d.build.name, d.how) == expected, (machine, name, d.describe())
            assert not d.forced and d.warning is None
        else:
            assert not d.runs, (machine, name, d.describe())
            for words in expected:
                assert words in d.reason, (machine, name, d.reason)


def test_jit_decisions_carry_the_warm_up_caveat():
    d = gpu_preflight.decide("cntk", gpu("a100-550"))
    assert d.how == "jit" and "PTX JIT" in d.describe() and "minutes" in d.describe()


def test_no_gpu_is_the_cpu_builds():
    assert gpu_preflight.report(TARGETS.values(), []) == [
        "GPU preflight: no NVIDIA GPU visible (nvidia-smi missing or lists none): the CPU builds "
        "(envs/<env>-cpu.txt) run."]


def test_an_old_driver_runs_nothing_that_needs_a_newer_one():
    old = {"name": "Tesla V100-SXM2-16GB", "driver": "470.256.02", "compute_capability": "7.0"}
    d = gpu_preflight.decide("pytorch", old)
    assert not d.runs and d.reason.startswith("no build runs here: ")
    for words in ("CUDA 13.0 build: it needs NVIDIA driver >= 580.65.06, this machine has 470.256.02",
                  "CUDA 12.8 build: it needs NVIDIA driver >= 525.60.13", "CUDA 12.6 build"):
        assert words in d.reason
    assert gpu_preflight.decide("mxnet", old).build.name == "cu112"          # CUDA 11: >= 450.80.02
    assert gpu_preflight.decide("cntk", old).build.name == "cu100"
    assert not gpu_preflight.decide("jax", old).runs


def test_pascal_gets_the_cuda_12_6_pytorch_and_no_cuda_13_jax():
    p100 = {"name": "Tesla P100-PCIE-16GB", "driver": "580.65.06", "compute_capability": "6.0"}
    assert gpu_preflight.decide("pytorch", p100).build.name == "cu126"
    assert gpu_preflight.decide("jax", p100).build.name == "cuda12"
    kepler = {"name": "Tesla K80", "driver": "470.256.02", "compute_capability": "3.7"}
    assert "sm_37" in gpu_preflight.decide("mxnet", kepler).reason


def test_mxnet_on_every_architecture():
    build = gpu_preflight.get_build("mxnet", "cu112")
    for cc in [(5, 0), (5, 2), (6, 0), (6, 1), (7, 0), (7, 5), (8, 0), (8, 6), (8, 9)]:
        assert gpu_preflight.arch_verdict(build, cc) == (None, "sass"), cc
    for cc in [(3, 7), (9, 0), (10, 0), (12, 0)]:
        reason, how = gpu_preflight.arch_verdict(build, cc)
        assert how is None and "sm_%d%d GPU" % cc in reason and "no PTX" in reason
    assert gpu_preflight.arch_verdict(build, None) == (None, None)       # unknown: let it try


def test_unknown_compute_capability_is_not_refused():
    d = gpu_preflight.decide("mxnet", {"name": "?", "driver": "550.90.07"})
    assert d.runs and d.how is None


def test_a_forced_build_runs_with_a_warning_when_the_facts_say_no():
    d = gpu_preflight.decide("pytorch", gpu("h100-580"), "cu126")
    assert d.runs and d.forced and d.build.name == "cu126" and d.warning is None     # sm_90 SASS
    d = gpu_preflight.decide("pytorch", gpu("v100-535"), "cu130")
    assert d.runs and d.forced and "needs NVIDIA driver >= 580" in d.warning and "WARNING" in d.describe()
    with pytest.raises(ValueError, match="unknown build 'cu999' for pytorch; choose from: cu130, cu128, cu126"):
        gpu_preflight.decide("pytorch", gpu("v100-535"), "cu999")


def test_overrides():
    assert gpu_preflight.parse_overrides("pytorch=cu126, jax=cuda12") == {"pytorch": "cu126", "jax": "cuda12"}
    assert gpu_preflight.parse_overrides("") == {} and gpu_preflight.parse_overrides(None) == {}
    for bad, message in [("pytorch", "expected ENV=BUILD"), ("theano=cu1", "unknown environment 'theano'"),
                         ("jax=cu126", "unknown build 'cu126' for jax")]:
        with pytest.raises(ValueError, match=message):
            gpu_preflight.parse_overrides(bad)
    assert gpu_preflight.env_overrides({"DS2_GPU_BUILD": "pytorch=cu128"}) == {"pytorch": "cu128"}


def test_tf32_needs_ampere():
    assert "sm_70" in gpu_preflight.precision_reason("tf32", gpu("v100-535"))
    assert gpu_preflight.precision_reason("tf32", gpu("a100-550")) is None
    assert gpu_preflight.precision_reason("bf16", gpu("v100-535")) is None


def test_every_build_has_pins_and_facts():
    for env, builds in gpu_preflight.BUILDS.items():
        assert env in ENVS and builds
        assert len({b.name for b in builds}) == len(builds)
        for b in builds:
            assert os.path.exists(os.path.join(ROOT, "envs", b.pins)), b.pins
            assert b.cuda_major in gpu_preflight.DRIVER_MINIMUM and b.source
            assert b.sass or b.ptx or b.codegen
    # the GPU pins every environment had before stay the default build of its environment
    for env in ENVS.values():
        assert env.requirements("cuda") in [os.path.join(ROOT, "envs", b.pins) for b in gpu_preflight.builds(env.name)]


def test_build_pins_differ_from_the_default_only_in_the_framework():
    from tests.test_pins import requirement_pins
    for env, builds in gpu_preflight.BUILDS.items():
        default = requirement_pins(ENVS[env].requirements("cuda"))
        for b in builds:
            with open(os.path.join(ROOT, "envs", b.pins)) as f:
                lines = [l.split("#", 1)[0].strip() for l in f if l.split("#", 1)[0].strip()]
            options = [l for l in lines if l.startswith("--")]
            if b.name in ("cu126", "cu128"):     # PyTorch's own index, for the +cuXYZ wheel only
                assert options == ["--extra-index-url https://download.pytorch.org/whl/%s" % b.name]
                assert "torch==2.13.0+%s" % b.name in lines
            else:
                assert options == []
            for line in lines:
                if line.startswith(("--", "torch==")) or "[" in line.split("==")[0]:
                    continue
                name, version = line.split("==")
                assert version.split(";")[0].strip() in [v for v, _ in default[name.lower()]], (b.pins, line)


# ---- the environment and the record of the chosen build ---------------------------------------------
def test_each_build_gets_its_own_environment_and_kernel(tmp_path):
    cu126, cu130 = gpu_preflight.get_build("pytorch", "cu126"), gpu_preflight.get_build("pytorch", "cu130")
    assert os.path.basename(framework_envs.env_path(ENVS["pytorch"], "cuda", build=cu126)) == "pytorch-cuda-cu126"
    assert os.path.basename(framework_envs.env_path(ENVS["pytorch"], "cuda", build=cu130)) == "pytorch-cuda-cu130"
    assert framework_envs.kernel_name(ENVS["pytorch"], "cuda", build=cu126) == "ds2-pytorch-cuda-cu126"
    assert ENVS["pytorch"].requirements("cuda", cu126).endswith("envs/pytorch-cuda-cu126.txt")
    mx = gpu_preflight.get_build("mxnet", "cu112")       # one build: the name it always had
    assert os.path.basename(framework_envs.env_path(ENVS["mxnet"], "cuda", build=mx)) == "mxnet-cuda"
    assert os.path.basename(framework_envs.env_path(ENVS["pytorch"], "cpu", build=None)) == "pytorch-cpu"


def test_the_stamp_records_the_build(tmp_path, monkeypatch):
    made = {}

    def fake_create(path, req, base, stamp, log, pip="pip", wheelhouse=None):
        made.update(path=path, req=req, stamp=stamp)
        raise EnvError("stopped by the test")

    monkeypatch.setattr(framework_envs, "create_venv", fake_create)
    monkeypatch.setattr(framework_envs, "ENVS_DIR", str(tmp_path))
    with pytest.raises(EnvError):
        framework_envs.ensure(ENVS["pytorch"], "cuda", announce=lambda *a: None, build=gpu_preflight.get_build("pytorch", "cu128"))
    assert made["req"].endswith("envs/pytorch-cuda-cu128.txt")
    assert made["stamp"]["gpu_build"] == {"build": "cu128", "package": "torch 2.13.0+cu128 (download.pytorch.org/whl/cu128)",
                                          "cuda": "12.8", "pins": "envs/pytorch-cuda-cu128.txt"}


def run_on(tmp_path, monkeypatch, target, machine, precision="fp32", gpu_builds=None):
    """run_target on a described GPU; building the environment stops the run (EnvError)."""
    built = []

    def no_env(env, device, python=None, announce=print, build=None, wheelhouse=None):
        built.append((env.name, device, build.name if build else None))
        raise EnvError("stopped by the test before building %s" % env.name)

    monkeypatch.setattr(framework_envs, "ensure", no_env)
    opts = execute.RunOptions(get_preset("smoke"), precision, 0, "cuda", str(tmp_path), gpu=gpu(machine),
                              progress=False, command="python run_all.py", gpu_builds=gpu_builds)
    record = execute.run_target(TARGETS[target], opts, announce=lambda *a: None)
    with open(os.path.join(str(tmp_path), "records", os.listdir(os.path.join(str(tmp_path), "records"))[0])) as f:
        assert json.load(f) == json.loads(json.dumps(record))
    return record, built


def test_run_builds_the_chosen_build_and_records_it(tmp_path, monkeypatch):
    record, built = run_on(tmp_path, monkeypatch, "keras-torch", "v100-535")
    assert built == [("pytorch", "cuda", "cu128")]
    assert record["run"]["environment"] == "envs/pytorch-cuda-cu128.txt"
    assert record["run"]["gpu_build"] == {"env": "pytorch", "build": "cu128", "package": gpu_preflight.get_build(
        "pytorch", "cu128").package, "cuda": "12.8", "pins": "envs/pytorch-cuda-cu128.txt", "chosen": "auto",
        "runs_via": "sass", "facts_verified": False}


def test_run_with_a_forced_build(tmp_path, monkeypatch):
    record, built = run_on(tmp_path, monkeypatch, "pytorch", "h100-580", gpu_builds={"pytorch": "cu126"})
    assert built == [("pytorch", "cuda", "cu126")] and record["run"]["gpu_build"]["chosen"] == "forced"


def test_a_gpu_no_build_runs_on_is_skipped_before_building(tmp_path, monkeypatch):
    record, built = run_on(tmp_path, monkeypatch, "mxnet", "h100-580")
    assert built == [] and record["status"] == "skipped" and "sm_90" in record["error"]
    assert record["run"]["gpu_build"]["build"] is None and "sm_90" in record["run"]["gpu_build"]["reason"]


def test_tf32_on_volta_is_skipped(tmp_path, monkeypatch):
    record, built = run_on(tmp_path, monkeypatch, "pytorch", "v100-535", precision="tf32")
    assert built == [] and record["status"] == "skipped" and "Ampere" in record["error"]


# ---- the command line ---------------------------------------------------------------------------------
def fake_nvidia_smi(directory, line):
    fake = directory / "nvidia-smi"
    fake.write_text("#!/bin/sh\ncase \"$1\" in\n  --query-gpu=*) printf '%s' ;;\n"
                    "  *) echo '| NVIDIA-SMI x   Driver Version: x   CUDA Version: 12.2 |' ;;\nesac\n" % line)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return dict(os.environ, PATH=str(directory) + os.pathsep + os.environ["PATH"])


def cli(env, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "run_all.py")] + list(args), cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)


def test_fake_nvidia_smi_on_path_is_what_envinfo_sees(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path, SMI["a100-550"].strip())["PATH"])
    assert envinfo.gpus() == [gpu("a100-550")]


def test_check_prints_the_preflight(tmp_path):
    proc = cli(fake_nvidia_smi(tmp_path, SMI["v100-535"].strip()), "--check")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == ("GPU preflight: Tesla V100-SXM2-16GB, compute capability 7.0 (sm_70), "
                        "NVIDIA driver 535.183.01")
    end = lines.index("Builds considered (newest first; runner/envs/gpu_preflight.py BUILDS):")
    rows = {l.split()[0]: l for l in lines[1:end]}
    assert set(rows) == set(TARGETS)
    assert "cu128 (torch 2.13.0+cu128" in rows["pytorch"] and "cu100" in rows["cntk"]
    builds = lines[end + 1:]
    assert len(builds) == sum(len(b) for b in gpu_preflight.BUILDS.values())
    assert any(l.split()[:2] == ["pytorch", "cu130"] and "needs NVIDIA driver >= 580.65.06" in l for l in builds)
    assert any(l.split()[:2] == ["mxnet", "cu112"] and l.endswith("runs here") for l in builds)


def test_check_with_a_forced_build_and_the_list(tmp_path):
    env = fake_nvidia_smi(tmp_path, SMI["h100-580"].strip())
    proc = cli(env, "--check", "--gpu-build", "pytorch=cu126")
    assert proc.returncode == 0 and "cu126 (torch 2.13.0+cu126" in proc.stdout and ", forced" in proc.stdout
    assert "cannot run: mxnet-cu112" in proc.stdout
    proc = cli(dict(env, DS2_GPU_BUILD="jax=cuda12"), "--list")
    assert proc.returncode == 0 and "GPU preflight: NVIDIA H100" in proc.stdout
    assert [l for l in proc.stdout.splitlines() if l.strip().startswith("jax ") and "cuda12" in l and "forced" in l]


@pytest.mark.parametrize("args, env, message", [
    (["--gpu-build", "pytorch=cu999"], {}, "run_all.py: error: argument --gpu-build: unknown build 'cu999' for pytorch"),
    (["--check"], {"DS2_GPU_BUILD": "theano=x"}, "run_all.py: error: DS2_GPU_BUILD: unknown environment 'theano'"),
])
def test_bad_build_is_one_line_and_exit_2(tmp_path, args, env, message):
    proc = cli(dict(os.environ, **env), *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), proc.stderr


# ---- CNTK's library path keeps the driver ----------------------------------------------------------
def test_cntk_kernel_environment_keeps_a_driver_directory_from_ld_library_path(tmp_path):
    driver, other, nvml = tmp_path / "driver", tmp_path / "other", tmp_path / "nvml"
    for d in (driver, other, nvml):
        d.mkdir()
    (driver / "libcuda.so.1").write_text("not really the driver")
    (nvml / "libnvidia-ml.so.1").write_text("nor NVML")
    (other / "libfoo.so.1").write_text("")
    venv = str(tmp_path / "venv")
    environ = {"LD_LIBRARY_PATH": os.pathsep.join([str(other), str(driver), "", str(nvml), str(driver)])}
    env = definitions.cntk_kernel_env(venv, environ)
    assert env["LD_LIBRARY_PATH"].split(os.pathsep) == [definitions.cntk_mpi_dir(venv), str(driver), str(nvml)]
    assert env["CUDA_CACHE_MAXSIZE"] == str(4 << 30)
    # without one: the soname links only (the default directories are reached through ld.so.cache)
    alone = definitions.cntk_kernel_env(venv, {"LD_LIBRARY_PATH": str(other)})["LD_LIBRARY_PATH"]
    assert alone.split(os.pathsep)[0] == definitions.cntk_mpi_dir(venv)
    assert str(other) not in alone.split(os.pathsep)
    assert not set(alone.split(os.pathsep)) & {"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"}


def test_the_kernel_is_re_registered_when_its_environment_changes(tmp_path, monkeypatch):
    spec = tmp_path / "kernel.json"
    spec.write_text(json.dumps({"argv": ["python"], "env": {"LD_LIBRARY_PATH": "/old", "CUDA_CACHE_MAXSIZE": "1"}}))
    assert not framework_envs._kernel_env_current(ENVS["cntk"], str(tmp_path / "venv"), str(spec))
    spec.write_text(json.dumps({"argv": ["python"], "env": definitions.cntk_kernel_env(str(tmp_path / "venv"))}))
    assert framework_envs._kernel_env_current(ENVS["cntk"], str(tmp_path / "venv"), str(spec))
    assert framework_envs._kernel_env_current(ENVS["pytorch"], str(tmp_path / "venv"), str(spec))   # no kernel env


# ---- the fat-binary reader behind the architecture facts ----------------------------------------------
def fatbin(entries):
    """A fat binary as nvcc lays it out: header, then per entry a 64-byte header and the payload."""
    body = b""
    for kind, arch, payload in entries:
        header = struct.pack("<HHIQII", {"ptx": 1, "sass": 2}[kind], 0x0101, 64, len(payload), 0, 0)
        header += struct.pack("<HHI", 0, 0, arch) + b"\0" * (64 - 32)
        body += header + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_fatbin_reader(tmp_path):
    lib = tmp_path / "libfake.so"
    blob = fatbin([("sass", 70, b"x" * 40), ("sass", 80, b"y" * 24), ("ptx", 70, b"z" * 16)])
    # two copies (two translation units), a false magic, and noise around them
    lib.write_bytes(b"\x7fELF" + b"\0" * 100 + blob + struct.pack("<I", 0xBA55ED50) + b"junk" * 5 + blob + b"\0" * 9)
    assert fatbin_archs.archs(str(lib)) == {"sass": [70, 80], "ptx": [70], "entries": 6}
    assert fatbin_archs.describe(fatbin_archs.archs(str(lib))) == "SASS: sm_70, sm_80 | PTX: compute_70 | 6 entries"
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    assert fatbin_archs.archs(str(empty)) == {"sass": [], "ptx": [], "entries": 0}


def test_readme_table_is_the_one_the_facts_give():
    with open(os.path.join(ROOT, "docs", "gpus.md")) as f:
        readme = f.read()
    assert "\n".join(gpu_preflight.gpu_table()) in readme, "regenerate with runner.envs.gpu_preflight.gpu_table()"
