"""run_all.py's command line and its failure handling: bad input gets one line and exit 2; a
framework that cannot run gets a row with its reason while the others still run."""
import os
import stat
import subprocess
import sys

import pytest

from tests.conftest import ROOT, run_all


def cli(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "run_all.py")] + list(args), cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)


@pytest.mark.parametrize("args, message", [
    (["--frameworks", "theano"], "unknown framework 'theano'; choose from: pytorch, tensorflow"),
    (["--preset", "huge"], "unknown preset 'huge'; valid presets: cpu, deepmark, quick, smoke"),
    (["--batch-size", "0"], "must be a positive integer, got '0'"),
    (["--batch-size", "x"], "must be a positive integer, got 'x'"),
    (["--scale", "-2"], "must be a positive integer"),
    (["--precision", "fp8"], "unknown precision 'fp8'; choose from: fp32, tf32, bf16"),
    (["--seed", "-1"], "must be a non-negative integer"),
    (["--python", "nosuchenv=/usr/bin/python3"], "expected ENV=PATH"),
    (["--device", "tpu"], "invalid choice: 'tpu'"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    proc = cli(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("run_all.py: error:") and message in lines[0], proc.stderr


def test_list():
    proc = cli("--list")
    assert proc.returncode == 0
    for name in ("pytorch", "tensorflow", "mxnet", "cntk", "jax", "keras-jax", "keras-torch", "keras-tensorflow"):
        assert any(line.startswith(name + " ") for line in proc.stdout.splitlines()), name


def test_cuda_without_gpu_is_refused():
    proc = cli("--device", "cuda", "--frameworks", "pytorch")
    assert proc.returncode == 2 and "nvidia-smi sees no GPU" in proc.stderr


@pytest.fixture(scope="module")
def broken_run(tmp_path_factory):
    """PyTorch next to an MXNet environment built from a broken interpreter, a run that needs
    more memory than there is, and a precision the CPU does not run."""
    tmp = tmp_path_factory.mktemp("broken")
    fake = tmp / "python3"
    fake.write_text("#!/bin/sh\necho 'fake interpreter: cannot start' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return run_all(["--preset", "smoke", "--frameworks", "mxnet,pytorch", "--python", "mxnet=%s" % fake],
                   tmp / "results")


def test_broken_environment_is_a_failed_row_and_others_still_run(broken_run):
    mx = broken_run.record("mxnet")
    assert mx["status"] == "failed"
    assert "environment mxnet" in mx["error"] and "fake interpreter: cannot start" in mx["error"]
    assert broken_run.record("pytorch")["status"] == "ok"
    assert broken_run.returncode == 1
    md = broken_run.markdown()
    assert "failed: environment mxnet" in md and "| PyTorch |" in md


def test_out_of_memory_is_a_failed_row(tmp_path):
    run = run_all(["--preset", "smoke", "--frameworks", "pytorch", "--batch-size", "100000000"], tmp_path)
    rec = run.record("pytorch")
    assert rec["status"] == "failed" and rec["error"].startswith("MemoryError: Unable to allocate")
    assert rec["batch_size"] == 100000000
    assert not [n for n in os.listdir(os.path.join(str(tmp_path), "records")) if n.endswith(".partial")]


def test_precision_a_cpu_does_not_run_is_skipped_with_its_reason(tmp_path):
    """tf32 is a GPU tensor-core format; CNTK computes in fp32 only (bf16 runs on a CPU elsewhere)."""
    run = run_all(["--preset", "smoke", "--frameworks", "pytorch,cntk", "--precision", "tf32", "--device", "cpu"],
                  tmp_path)
    for target in ("pytorch", "cntk"):
        rec = run.record(target, "tf32")
        assert rec["status"] == "skipped" and "TF32 is a format of its tensor cores, a CPU has none" in rec["error"]
    run = run_all(["--preset", "smoke", "--frameworks", "cntk", "--precision", "bf16", "--device", "cpu"], tmp_path)
    rec = run.record("cntk", "bf16")
    assert rec["status"] == "skipped" and "CNTK 2.7 computes in fp32 only" in rec["error"]
    assert run.returncode == 0


def test_bf16_on_a_cpu_is_not_skipped(tmp_path, monkeypatch):
    """run_target goes on to build the environment (stopped here by a fake) for PyTorch bf16 on a CPU."""
    from common.spec import get_preset
    from runner import envs, execute
    from runner.bootstrap import EnvError
    from runner.targets import TARGETS

    def no_env(env, device, python=None, announce=print, build=None):
        raise EnvError("stopped by the test before building %s-%s" % (env.name, device))

    monkeypatch.setattr(envs, "ensure", no_env)
    opts = execute.RunOptions(get_preset("smoke"), "bf16", 0, "cpu", str(tmp_path), progress=False)
    rec = execute.run_target(TARGETS["pytorch"], opts, announce=lambda *a: None)
    assert rec["status"] == "failed" and "stopped by the test before building pytorch-cpu" in rec["error"]
    assert "gpu_build" not in rec["run"]


def test_which_precisions_run_on_a_cpu():
    from runner.targets import TARGETS
    bf16_on_cpu = {name for name, t in TARGETS.items() if t.cpu_precision_reason("bf16") is None}
    assert bf16_on_cpu == {"pytorch", "tensorflow", "jax", "keras-jax", "keras-torch", "keras-tensorflow"}
    assert all(t.cpu_precision_reason("fp32") is None for t in TARGETS.values())
    assert all("a CPU has none" in t.cpu_precision_reason("tf32") for t in TARGETS.values())


def test_missing_cntk_interpreter_is_skipped_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.delenv("DS2_CNTK_PYTHON", raising=False)
    run = run_all(["--preset", "smoke", "--frameworks", "cntk"], tmp_path)
    rec = run.record("cntk")
    assert rec["status"] == "skipped" and "--cntk-python" in rec["error"]
