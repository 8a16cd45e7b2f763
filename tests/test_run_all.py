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
    (["--batch-size", "8,x"], "argument --batch-size: must be a positive integer, got 'x'"),
    (["--batch-size", "8,0,32"], "argument --batch-size: must be a positive integer, got '0'"),
    (["--batch-size", "8,2.5"], "must be a positive integer, got '2.5'"),
    (["--batch-size", ","], "must be a positive integer or a comma list of them, got ','"),
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


def test_batch_size_list_parsing():
    from runner.cli import build_parser
    parse = build_parser().parse_args
    assert parse(["--batch-size", "8,32"]).batch_size == [8, 32]
    assert parse(["--batch-size", " 32 , 8,32"]).batch_size == [32, 8]       # order kept, duplicates dropped
    assert parse(["--batch-size", "16"]).batch_size == [16]
    assert parse([]).batch_size is None and parse([]).profile is False
    assert parse(["--profile"]).profile is True


def test_variants_expand_to_the_variant_targets():
    from runner.cli import select_targets
    from runner.targets import VARIANTS
    names = lambda ts: [t.name for t in ts]  # noqa: E731
    assert names(select_targets(["pytorch"])) == ["pytorch"]
    assert names(select_targets(["pytorch"], True)) == ["pytorch", "pytorch+compile"]
    assert names(select_targets(["pytorch", "keras-torch", "cntk", "keras-jax"], True)) == [
        "pytorch", "keras-torch", "cntk", "keras-jax", "pytorch+compile", "keras-torch+compile"]   # CNTK, keras-jax: none
    assert names(select_targets(["pytorch+compile", "pytorch"], True)) == ["pytorch+compile", "pytorch"]  # once each
    everything = select_targets(["pytorch", "tensorflow", "mxnet", "cntk", "jax", "keras-jax", "keras-torch",
                                 "keras-tensorflow"], True)
    assert sorted(names(everything)[8:]) == sorted(VARIANTS)
    assert all(t.variant_of == t.name.split("+")[0] for t in everything[8:])


@pytest.fixture
def planned_runs(monkeypatch, tmp_path):
    """run_all.py's main() with the notebook runs and results.md replaced by recorders: what it would run."""
    from runner import cli, execute, report
    runs = []

    def fake_run(target, opts, announce=print):
        runs.append((target, opts))
        return {"status": "ok"}
    monkeypatch.setattr(execute, "run_target", fake_run)
    monkeypatch.setattr(report, "write", lambda *a, **k: None)
    monkeypatch.setattr(cli.envinfo, "gpus", lambda: [])

    def main(*args):
        del runs[:]
        assert cli.main(["--results-dir", str(tmp_path), "--no-progress"] + list(args)) == 0
        return runs
    return main


def test_runs_loop_over_targets_precisions_and_batch_sizes(planned_runs, capsys):
    runs = planned_runs("--frameworks", "pytorch,jax", "--variants", "--batch-size", "8,32", "--preset", "smoke")
    assert [(t.name, o.precision, o.preset.batch_size) for t, o in runs] == [
        ("pytorch", "fp32", 8), ("pytorch", "fp32", 32), ("jax", "fp32", 8), ("jax", "fp32", 32),
        ("pytorch+compile", "fp32", 8), ("pytorch+compile", "fp32", 32), ("jax+unroll", "fp32", 8),
        ("jax+unroll", "fp32", 32)]
    assert all(o.preset.name == "smoke" and o.preset.scale == 1 and not o.profile for _, o in runs)
    out = capsys.readouterr().out
    assert "Running 8 notebook(s) on cpu, preset smoke (batch size 8,32, scale 1)" in out
    assert "[2/8] pytorch, fp32, batch 32" in out


def test_profile_reaches_the_notebook_parameters(planned_runs, tmp_path):
    from runner import execute
    target, opts = planned_runs("--frameworks", "pytorch", "--profile", "--preset", "smoke")[0]
    assert opts.profile is True
    params = execute.notebook_parameters(target, opts, "r.json")
    assert params["profile"] is True and params["batch_size"] == 8 and "forward_repeats" not in params
    target, opts = planned_runs("--frameworks", "pytorch+compile", "--preset", "smoke")[0]
    params = execute.notebook_parameters(target, opts, "r.json")
    assert "profile" not in params and params["variant"] == "compile"     # older notebooks need no profile parameter


def test_no_preset_on_a_cpu_names_the_cpu_preset(planned_runs, capsys):
    runs = planned_runs("--frameworks", "pytorch")
    assert runs[0][1].preset.name == "smoke"
    assert "for the full model on this CPU: --preset cpu" in capsys.readouterr().out
    assert planned_runs("--frameworks", "pytorch", "--preset", "cpu")[0][1].preset.batch_size == 8


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
    assert bf16_on_cpu == {"pytorch", "tensorflow", "mxnet", "jax", "keras-jax", "keras-torch", "keras-tensorflow"}
    assert all(t.cpu_precision_reason("fp32") is None for t in TARGETS.values())
    assert all("a CPU has none" in t.cpu_precision_reason("tf32") for t in TARGETS.values())


def test_missing_cntk_interpreter_is_skipped_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.delenv("DS2_CNTK_PYTHON", raising=False)
    run = run_all(["--preset", "smoke", "--frameworks", "cntk"], tmp_path)
    rec = run.record("cntk")
    assert rec["status"] == "skipped" and "--cntk-python" in rec["error"]
