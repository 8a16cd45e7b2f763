"""run_all.py's command line and its failure handling: bad input gets one line and exit 2; a
framework that cannot run gets a row with its reason while the others still run."""
import os
import stat
import subprocess
import sys

import pytest

from tests.conftest import ROOT, no_cntk_python_anywhere, run_all


def cli(*args, env=None):
    return subprocess.run([sys.executable, os.path.join(ROOT, "run_all.py")] + list(args), cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, env=env)


def one_error_line(proc, message):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("run_all.py: error:") and message in lines[0], proc.stderr
    assert "Creating environment" not in proc.stdout and "Running" not in proc.stdout, proc.stdout


def fake_python(path, version, shared=True):
    """An executable that answers the interpreter probe (runner.envs.cntk_python.PROBE) like Python ``version``."""
    path.write_text("#!/bin/sh\necho '{\"version\": \"%s\", \"implementation\": \"CPython\", "
                    "\"executable\": \"%s\", \"shared\": %s}'\n" % (version, path, "true" if shared else "false"))
    path.chmod(0o755)
    return str(path)


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
    (["--migrate", "--migrate-to", "theano"], "argument --migrate-to: unknown framework 'theano'"),
    (["--use-installed", "theano=/usr/bin/python3"], "argument --use-installed: expected ENV=PATH with ENV one of"),
    (["--use-installed", "pytorch=/nonexistent/python3"], "--use-installed pytorch=/nonexistent/python3: no such "
                                                           "executable"),
    (["--use-installed", "pytorch=/usr/bin/python3", "--python", "pytorch=/usr/bin/python3"],
     "--use-installed pytorch and --python pytorch: one runs the interpreter as it is"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    one_error_line(cli(*args), message)


# ---- paths and interpreters are checked before anything is built ------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--results-dir", "/proc/x"], "--results-dir /proc/x cannot be created in /proc"),
    (["--results-dir", "/proc/x/y/z"], "--results-dir /proc/x/y/z cannot be created in /proc"),
    (["--output", "/proc/x/results.md"], "--output /proc/x/results.md: its directory /proc/x cannot be created"),
    (["--python", "mxnet=/nonexistent"], "--python mxnet=/nonexistent: not found"),
    (["--cntk-python", "/nonexistent/python3.6"], "--cntk-python /nonexistent/python3.6 not found"),
    (["--python", "cntk=/nonexistent"], "--python cntk=/nonexistent not found"),
])
def test_bad_paths_are_refused_up_front(args, message):
    one_error_line(cli("--frameworks", "pytorch", *args), message)


def test_results_dir_or_output_that_is_a_file_or_a_directory(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    one_error_line(cli("--frameworks", "pytorch", "--results-dir", str(a_file)), "is not a directory")
    one_error_line(cli("--frameworks", "pytorch", "--results-dir", str(a_file / "sub")),
                   "cannot be created: %s is not a directory" % a_file)
    one_error_line(cli("--frameworks", "pytorch", "--output", str(tmp_path)), "--output %s is a directory" % tmp_path)


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory nobody can write to: a read-only tmpfs as root (root ignores permission bits), else mode 555."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:
        ro.chmod(0o555)
        yield ro
        ro.chmod(0o755)
        return
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True)
    if proc.returncode != 0:
        pytest.skip("root without a read-only directory to test with (mount: %s)" % proc.stdout.strip())
    try:
        yield ro
    finally:
        subprocess.run(["umount", str(ro)])


def test_results_dir_that_cannot_be_written(read_only_dir):
    ro = read_only_dir
    one_error_line(cli("--frameworks", "pytorch", "--results-dir", str(ro)), "--results-dir %s is not writable" % ro)
    one_error_line(cli("--frameworks", "pytorch", "--results-dir", str(ro / "new")), "cannot be created in %s" % ro)
    one_error_line(cli("--frameworks", "pytorch", "--output", str(ro / "results.md")),
                   "--output %s: its directory %s is not writable" % (ro / "results.md", ro))


def test_python_that_is_not_executable_or_not_python(tmp_path):
    text = tmp_path / "python3"
    text.write_text("not a program")
    one_error_line(cli("--python", "mxnet=%s" % text), "--python mxnet=%s: not an executable file" % text)
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'cannot start' >&2\nexit 3\n")
    broken.chmod(0o755)
    one_error_line(cli("--python", "jax=%s" % broken), "does not run as a Python interpreter (exit status 3: cannot start)")


@pytest.mark.parametrize("env, version, message", [
    ("mxnet", "3.12.1", "MXNet 1.9.1 needs Python 3.11 (numpy 1.23.5 has wheels up to 3.11"),
    ("mxnet", "3.10.4", "MXNet 1.9.1 needs Python 3.11"),
    ("tensorflow", "3.10.4", "TensorFlow 2.21 + Keras 3 needs Python >= 3.11"),
    ("pytorch", "3.9.1", "PyTorch 2.13 + Keras 3 needs Python >= 3.11"),
    ("jax", "3.10.4", "JAX + Flax + Keras 3 needs Python >= 3.11 (jax 0.10.2"),
    ("cntk", "3.7.1", "CNTK 2.7 needs 3.6"),
])
def test_python_of_a_version_the_pins_do_not_support(tmp_path, env, version, message):
    python = fake_python(tmp_path / "python", version)
    one_error_line(cli("--frameworks", "pytorch", "--python", "%s=%s" % (env, python)),
                   "--python %s=%s is Python %s" % (env, python, version))
    one_error_line(cli("--frameworks", "pytorch", "--python", "%s=%s" % (env, python)), message)


def test_cntk_python_given_but_unsuitable_is_an_error(tmp_path):
    static = fake_python(tmp_path / "python3.6", "3.6.15", shared=False)
    one_error_line(cli("--frameworks", "cntk", "--cntk-python", static),
                   "--cntk-python %s is Python 3.6.15 built without --enable-shared" % static)
    env = dict(os.environ, DS2_CNTK_PYTHON=fake_python(tmp_path / "python3.7", "3.7.9"))
    one_error_line(cli("--frameworks", "cntk", env=env),
                   "DS2_CNTK_PYTHON %s is Python 3.7.9; CNTK 2.7 needs 3.6" % env["DS2_CNTK_PYTHON"])


def test_list_names_the_cntk_interpreter_it_found(tmp_path):
    pyenv = tmp_path / "pyenv" / "versions"
    (pyenv / "3.6.15" / "bin").mkdir(parents=True)
    (pyenv / "3.6.9" / "bin").mkdir(parents=True)
    good = fake_python(pyenv / "3.6.15" / "bin" / "python3.6", "3.6.15")
    static = fake_python(pyenv / "3.6.9" / "bin" / "python3.6", "3.6.9", shared=False)
    env = no_cntk_python_anywhere(tmp_path)
    env["PYENV_ROOT"] = str(tmp_path / "pyenv")
    proc = cli("--list", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "CNTK interpreter: %s (Python 3.6.15, shared library; from pyenv" % good in proc.stdout
    proc = cli("--list", "--cntk-python", static, env=env)
    assert proc.returncode == 2 and "built without --enable-shared" in proc.stderr
    os.remove(good)
    proc = cli("--list", env=env)
    assert "CNTK interpreter: none found" in proc.stdout
    assert "rejected %s (pyenv" % static in proc.stdout and "built without --enable-shared" in proc.stdout


def test_list():
    proc = cli("--list")
    assert proc.returncode == 0
    for name in ("pytorch", "tensorflow", "mxnet", "cntk", "jax", "keras-jax", "keras-torch", "keras-tensorflow"):
        assert any(line.startswith(name + " ") for line in proc.stdout.splitlines()), name
    from runner.run.targets import ALL_TARGETS
    rows = [line for line in proc.stdout.splitlines() if line.split(" ")[0] in ALL_TARGETS]
    assert len(rows) == len(ALL_TARGETS)
    assert len(set(line.index(" env ") for line in rows)) == 1, rows        # the columns line up, longest name too


def test_batch_size_list_parsing():
    from runner.cli_options import build_parser
    parse = build_parser().parse_args
    assert parse(["--batch-size", "8,32"]).batch_size == [8, 32]
    assert parse(["--batch-size", " 32 , 8"]).batch_size == [32, 8]           # order kept
    with pytest.raises(SystemExit):                                          # a size named twice is refused
        parse(["--batch-size", "32,8,32"])
    assert parse(["--batch-size", "16"]).batch_size == [16]
    assert parse([]).batch_size is None and parse([]).profile is False
    assert parse(["--profile"]).profile is True


def test_variants_expand_to_the_variant_targets():
    from runner.run.targets import select_targets
    from runner.run.targets import VARIANTS
    names = lambda ts: [t.name for t in ts]  # noqa: E731
    assert names(select_targets(["pytorch"])) == ["pytorch"]
    torch_variants = ["pytorch+compile", "pytorch+graphs", "pytorch+bidir2", "pytorch+bidir2+graphs"]
    assert names(select_targets(["pytorch"], True)) == ["pytorch"] + torch_variants
    assert names(select_targets(["pytorch", "keras-torch", "cntk", "keras-jax"], True)) == [
        "pytorch", "keras-torch", "cntk", "keras-jax"] + torch_variants   # CNTK, keras-jax, keras-torch: none
    assert names(select_targets(["pytorch+compile", "pytorch"], True)) == [
        "pytorch+compile", "pytorch", "pytorch+graphs", "pytorch+bidir2", "pytorch+bidir2+graphs"]  # once each
    everything = select_targets(["pytorch", "tensorflow", "mxnet", "cntk", "jax", "keras-jax", "keras-torch",
                                 "keras-tensorflow"], True)
    assert sorted(names(everything)[8:]) == sorted(VARIANTS)
    assert all(t.variant_of == t.name.split("+")[0] for t in everything[8:])


@pytest.fixture
def planned_runs(monkeypatch, tmp_path):
    """run_all.py's main() with the notebook runs and results.md replaced by recorders: what it would run."""
    from runner import cli
    from runner.run import execute
    from runner.report import render
    runs = []

    def fake_run(target, opts, announce=print):
        runs.append((target, opts))
        return {"status": "ok"}
    monkeypatch.setattr(execute, "run_target", fake_run)
    monkeypatch.setattr(render, "write", lambda *a, **k: None)
    monkeypatch.setattr(cli.envinfo, "gpus", lambda: [])

    def main(*args):
        del runs[:]
        assert cli.main(["--results-dir", str(tmp_path), "--no-progress"] + list(args)) == 0
        return runs
    return main


def test_runs_loop_over_targets_precisions_and_batch_sizes(planned_runs, capsys):
    runs = planned_runs("--frameworks", "pytorch,jax", "--variants", "--batch-size", "8,32", "--preset", "smoke")
    names = ["pytorch", "jax", "pytorch+compile", "pytorch+graphs", "pytorch+bidir2", "pytorch+bidir2+graphs",
             "jax+unroll", "jax+hoist", "jax+graphs", "jax+bidir2"]
    assert [(t.name, o.precision, o.preset.batch_size) for t, o in runs] == [
        (name, "fp32", batch) for name in names for batch in (8, 32)]
    assert all(o.preset.name == "smoke" and o.preset.scale == 1 and not o.profile for _, o in runs)
    out = capsys.readouterr().out
    assert "Running 20 notebook(s) on cpu, preset smoke (batch size 8,32, scale 1)" in out
    assert "[2/20] pytorch, fp32, batch 32" in out


def test_profile_reaches_the_notebook_parameters(planned_runs, tmp_path):
    from runner.run import execute
    target, opts = planned_runs("--frameworks", "pytorch", "--profile", "--preset", "smoke")[0]
    assert opts.profile is True
    params = execute.notebook_parameters(target, opts, "r.json")
    assert params["profile"] is True and params["batch_size"] == 8 and "forward_repeats" not in params
    target, opts = planned_runs("--frameworks", "pytorch+compile", "--preset", "smoke")[0]
    params = execute.notebook_parameters(target, opts, "r.json")
    assert "profile" not in params and params["variant"] == "compile"     # older notebooks need no profile parameter


def test_skip_reaches_the_notebook_parameters_as_a_list(planned_runs):
    """--skip PARTS is passed as the notebook parameter ``skip``, a list in the order given; without --skip no
    ``skip`` is passed (a notebook without the parameter still runs).  The notebooks that declare it are those
    run_all.py's check reads, the same names as the data-parallel runner's reading of the parameters cell."""
    from runner.dp import launch
    from runner.run import execute
    from runner import validate
    from runner.run.targets import ALL_TARGETS
    target, opts = planned_runs("--frameworks", "pytorch", "--skip", "forward,onnx,export", "--preset", "smoke")[0]
    assert execute.notebook_parameters(target, opts, "r.json")["skip"] == ["forward", "onnx", "export"]
    target, opts = planned_runs("--frameworks", "pytorch", "--preset", "smoke")[0]
    assert "skip" not in execute.notebook_parameters(target, opts, "r.json")
    import ast
    import nbformat
    for t in ALL_TARGETS.values():                     # the same names as nbformat and ast read them
        cells = nbformat.read(t.notebook_path, as_version=4).cells
        source = [c.source for c in cells if "parameters" in c.metadata.get("tags", [])][0]
        names = [n.targets[0].id for n in ast.parse(source).body if isinstance(n, ast.Assign)]
        assert validate.notebook_parameter_names(t.notebook_path) == names == \
            launch.notebook_parameter_names(t.notebook_path), t.name
    declares = {t.name for t in ALL_TARGETS.values() if "skip" in validate.notebook_parameter_names(t.notebook_path)}
    assert declares == set(ALL_TARGETS)                # every row and variant: --skip is refused for none of them
    assert validate.notebook_parameter_names(os.path.join(ROOT, "no-such.ipynb")) is None


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
    """MXNet next to a TensorFlow environment built from a broken interpreter."""
    tmp = tmp_path_factory.mktemp("broken")
    fake = tmp / "python3"        # a real Python 3.11 to the up-front check, which cannot make a venv
    fake.write_text("#!/bin/sh\ncase \"$*\" in *venv*) echo 'fake interpreter: cannot start' >&2; exit 3;; esac\n"
                    "exec %s \"$@\"\n" % getattr(sys, "_base_executable", sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    from runner.envs.definitions import ENVS
    from runner.envs.framework_envs import env_path
    made = env_path(ENVS["tensorflow"], "cpu", str(fake))     # in the checkout's .venvs/, named after the interpreter
    yield run_all(["--preset", "smoke", "--frameworks", "tensorflow,mxnet", "--python", "tensorflow=%s" % fake],
                  tmp / "results")
    for leftover in (made + ".lock", made + ".log"):     # its lock and log, one pair per test run: not kept
        if os.path.exists(leftover):
            os.remove(leftover)
    assert not os.path.exists(made), made


def test_broken_environment_is_a_failed_row_and_others_still_run(broken_run):
    tf = broken_run.record("tensorflow")
    assert tf["status"] == "failed"
    assert "environment tensorflow" in tf["error"] and "fake interpreter: cannot start" in tf["error"]
    assert broken_run.record("mxnet")["status"] == "ok"
    assert broken_run.returncode == 1
    md = broken_run.markdown()
    assert "failed: environment tensorflow" in md and "| MXNet |" in md


def test_out_of_memory_is_a_failed_row(tmp_path):
    """A notebook that runs out of memory is a failed row with the reason.  run_all.py refuses a batch size whose
    data alone would not fit (tests/test_bad_input.py), so the row is run as run_all.py runs it, past that check."""
    from common.spec import get_preset
    from runner.run import execute
    from runner.run.targets import TARGETS
    opts = execute.RunOptions(get_preset("smoke").with_overrides(batch_size=100000000), "fp32", 0, "cpu",
                              str(tmp_path), progress=False)
    rec = execute.run_target(TARGETS["pytorch"], opts, announce=lambda *a: None)
    assert rec["status"] == "failed" and rec["error"].startswith("MemoryError: Unable to allocate")
    assert rec["batch_size"] == 100000000
    assert not [n for n in os.listdir(os.path.join(str(tmp_path), "records")) if n.endswith(".partial")]


def test_precision_a_cpu_does_not_run_is_skipped_with_its_reason(tmp_path):
    """tf32 is a GPU tensor-core format; CNTK computes in fp32 only (bf16 runs on a CPU elsewhere).  A row run
    with it is skipped with the reason; a run whose every row would be is stopped before anything starts: exit
    status 1, one line with each reason, nothing written."""
    from common.spec import get_preset
    from runner.run import execute
    from runner.run.targets import TARGETS
    for target in ("pytorch", "cntk"):
        opts = execute.RunOptions(get_preset("smoke"), "tf32", 0, "cpu", str(tmp_path / "rows"), progress=False)
        rec = execute.run_target(TARGETS[target], opts, announce=lambda *a: None)
        assert rec["status"] == "skipped" and "TF32 is a format of its tensor cores, a CPU has none" in rec["error"]
    opts = execute.RunOptions(get_preset("smoke"), "bf16", 0, "cpu", str(tmp_path / "rows"), progress=False)
    rec = execute.run_target(TARGETS["cntk"], opts, announce=lambda *a: None)
    assert rec["status"] == "skipped" and "CNTK 2.7 computes in fp32 only" in rec["error"]
    for args, reasons in ((["--frameworks", "pytorch,cntk", "--precision", "tf32"],
                           ["pytorch tf32: precision tf32 needs", "cntk tf32: precision tf32 needs", "a CPU has none"]),
                          (["--frameworks", "cntk", "--precision", "bf16"], ["cntk bf16: precision bf16: CNTK 2.7 computes in fp32"])):
        proc = cli(*(args + ["--preset", "smoke", "--device", "cpu", "--results-dir", str(tmp_path / "run")]))
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, (proc.returncode, proc.stderr)
        assert lines[0].startswith("run_all.py: error: no selected row can run on this machine, nothing was started")
        assert all(r in lines[0] for r in reasons), lines[0]
        assert not os.path.exists(str(tmp_path / "run")) and proc.stdout == "", proc.stdout


def test_a_row_whose_notebook_trains_in_one_process_is_skipped_with_workers_before_anything_starts(tmp_path):
    """Keras on torch and on TensorFlow, the PyTorch and TensorFlow variants, and Keras on JAX with --profile train in
    one process only (their notebooks refuse workers > 1; tests/test_notebook_refusals.py): with --workers W the row
    is skipped with that reason, without its environment or a process started; a run whose every row would be is
    stopped before anything starts (exit status 1, one line, nothing written)."""
    from common.spec import get_preset
    from runner.dp import launch
    from runner.run import execute
    from runner.run.targets import ALL_TARGETS
    opts = execute.RunOptions(get_preset("smoke"), "fp32", 0, "cpu", str(tmp_path / "rows"), progress=False)
    rec = launch.run_target(ALL_TARGETS["keras-torch"], opts, 2, announce=lambda *a: None)
    assert rec["status"] == "skipped" and rec["distributed"]["world_size"] == 2, rec
    assert rec["error"].startswith("keras-torch trains in one process only (--workers 1): not offered on the torch "
                                   "backend: keras.distribution (Keras 3's data-parallel API) is JAX-only"), rec["error"]
    for args, reasons in ((["--frameworks", "keras-torch,tensorflow+xla,pytorch+bidir2"],
                           ["keras-torch fp32: keras-torch trains in one process only",
                            "tensorflow+xla fp32: tensorflow+xla trains in one process only (--workers 1): variant "
                            "xla: the TensorFlow notebook's variants have no data-parallel code",
                            "pytorch+bidir2 fp32: pytorch+bidir2 trains in one process only (--workers 1): variant "
                            "bidir2: the PyTorch notebook's data-parallel code wraps the eager model in DDP"]),
                          (["--frameworks", "keras-jax", "--profile"],
                           ["keras-jax fp32: keras-jax with --profile trains in one process only (--workers 1): the "
                            "Keras notebook profiles one process's step"])):
        proc = cli(*(args + ["--preset", "smoke", "--device", "cpu", "--workers", "2",
                             "--results-dir", str(tmp_path / "run")]))
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, (proc.returncode, proc.stderr)
        assert lines[0].startswith("run_all.py: error: no selected row can run on this machine, nothing was started")
        assert all(r in lines[0] for r in reasons), lines[0]
        assert not os.path.exists(str(tmp_path / "run")) and proc.stdout == "", proc.stdout


# ---- the exit status: 0 a row ran and none failed, 1 a row failed or none ran, 2 bad input ---------------------
@pytest.mark.parametrize("outcomes, status, line", [
    (["ok", "skipped"], 0, None),
    (["ok", "failed"], 1, None),
    (["skipped", "skipped"], 1, "no selected row ran (2 skipped); pytorch fp32: why pytorch"),
    (["failed", "skipped"], 1, "no selected row ran (1 failed, 1 skipped); pytorch fp32: why pytorch"),
    (["failed", "failed"], 1, "no selected row ran (2 failed); pytorch fp32: why pytorch"),
])
def test_exit_status_says_whether_a_row_ran(monkeypatch, tmp_path, capsys, outcomes, status, line):
    from runner import cli
    from runner.run import execute
    from runner.report import render
    written = []
    rows = iter(outcomes)

    def fake_run(target, opts, announce=print):
        got = next(rows)
        return {"status": got, "target": target.name, "precision": opts.precision,
                "error": None if got == "ok" else "why %s" % target.name}
    monkeypatch.setattr(execute, "run_target", fake_run)
    monkeypatch.setattr(render, "write", lambda *a, **k: written.append(a))
    monkeypatch.setattr(cli.envinfo, "gpus", lambda: [])
    got = cli.main(["--results-dir", str(tmp_path), "--no-progress", "--frameworks", "pytorch,jax", "--preset",
                    "smoke"])
    err = capsys.readouterr().err.strip().splitlines()
    assert got == status and len(written) == 1                        # results.md says why, from the records
    assert err == (["run_all.py: %s" % line] if line else []), err


def test_bf16_on_a_cpu_is_not_skipped(tmp_path, monkeypatch):
    """run_target goes on to build the environment (stopped here by a fake) for PyTorch bf16 on a CPU."""
    from common.spec import get_preset
    from runner.envs import framework_envs
    from runner.run import execute
    from runner.base import EnvError
    from runner.run.targets import TARGETS

    def no_env(env, device, python=None, announce=print, build=None, wheelhouse=None):
        raise EnvError("stopped by the test before building %s-%s" % (env.name, device))

    monkeypatch.setattr(framework_envs, "ensure", no_env)
    opts = execute.RunOptions(get_preset("smoke"), "bf16", 0, "cpu", str(tmp_path), progress=False)
    rec = execute.run_target(TARGETS["pytorch"], opts, announce=lambda *a: None)
    assert rec["status"] == "failed" and "stopped by the test before building pytorch-cpu" in rec["error"]
    assert "gpu_build" not in rec["run"]


def test_which_precisions_run_on_a_cpu():
    from runner.run.targets import ALL_TARGETS, TARGETS
    avx512 = {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}
    bf16_on_cpu = {name for name, t in TARGETS.items() if t.cpu_precision_reason("bf16", avx512) is None}
    assert bf16_on_cpu == {"pytorch", "tensorflow", "mxnet", "jax", "keras-jax", "keras-torch", "keras-tensorflow"}
    # MXNet's oneDNN has no bfloat16 convolution without AVX-512: skipped with the reason, the others run
    avx2 = {name: t.cpu_precision_reason("bf16", {"avx2", "fma"}) for name, t in ALL_TARGETS.items()}
    assert {name for name, why in avx2.items() if why is None} == bf16_on_cpu - {"mxnet"} | {
        "pytorch+compile", "pytorch+bidir2", "tensorflow+xla", "jax+unroll", "jax+hoist", "jax+bidir2",
        "keras-tensorflow+xla"}
    for name in ("mxnet", "mxnet+static"):
        assert "avx512_core" in avx2[name] and avx2[name].endswith("this CPU lacks avx512f, avx512bw, avx512vl, avx512dq")
    assert all(t.cpu_precision_reason("fp32") is None for t in TARGETS.values())
    assert all("a CPU has none" in t.cpu_precision_reason("tf32") for t in TARGETS.values())


def test_missing_cntk_interpreter_is_skipped_with_its_reason(tmp_path, monkeypatch):
    for key, value in no_cntk_python_anywhere(tmp_path / "home").items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("DS2_CNTK_PYTHON", raising=False)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    run = run_all(["--preset", "smoke", "--frameworks", "cntk"], tmp_path / "results")
    rec = run.record("cntk")
    assert rec["status"] == "skipped" and "--cntk-python" in rec["error"]
    assert "CNTK interpreter: none found" in run.output


def test_init_weights_is_checked_before_anything_runs(tmp_path):
    """--init-weights: a file that does not fit the preset's model is one line before any environment or notebook."""
    from common.spec import get_preset
    from common.weights import canonical_state, save_weights
    state = canonical_state(get_preset("quick").config, 0)           # another preset's widths
    path = str(tmp_path / "quick.npz")
    save_weights(path, state)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "run_all.py"), "--preset", "smoke", "--frameworks",
                          "pytorch", "--init-weights", path, "--results-dir", str(tmp_path / "res")],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    assert out.returncode != 0
    lines = [l for l in out.stdout.splitlines() if "--init-weights" in l]
    assert lines and "not a canonical name of this model" in lines[0] and path in lines[0], out.stdout
    assert not os.path.exists(str(tmp_path / "res" / "records"))
    missing = str(tmp_path / "none.npz")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "run_all.py"), "--preset", "smoke", "--frameworks",
                          "pytorch", "--init-weights", missing, "--results-dir", str(tmp_path / "res")],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    assert out.returncode != 0 and "does not exist" in out.stdout, out.stdout


def test_init_weights_reaches_the_notebook_parameters():
    from runner.run import execute
    from runner.run.targets import ALL_TARGETS
    from common.spec import get_preset
    opts = execute.RunOptions(get_preset("smoke"), "fp32", 0, "cpu", "/tmp/r", init_weights="/x/y.npz")
    assert execute.notebook_parameters(ALL_TARGETS["pytorch"], opts, "r.json")["init_weights"] == "/x/y.npz"
    plain = execute.RunOptions(get_preset("smoke"), "fp32", 0, "cpu", "/tmp/r")
    assert "init_weights" not in execute.notebook_parameters(ALL_TARGETS["pytorch"], plain, "r.json")


def test_the_command_a_record_keeps_names_the_variables_that_stand_for_options(monkeypatch):
    """DS2_USE_INSTALLED (which tools/installed_offline.sh sets), DS2_GPU_BUILD and DS2_WHEELHOUSE change the run as
    their options do: the command in the records names them, so that it can be run again."""
    from runner import cli
    from runner.cli_options import build_parser
    argv = ["--frameworks", "pytorch", "--preset", "smoke"]
    for name in cli.OPTION_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert cli.Plan(build_parser().parse_args(argv), argv).command == "python run_all.py --frameworks pytorch " \
        "--preset smoke"
    monkeypatch.setenv("DS2_USE_INSTALLED", "pytorch=/opt/my python/bin/python3")
    assert cli.Plan(build_parser().parse_args(argv), argv).command == (
        "DS2_USE_INSTALLED='pytorch=/opt/my python/bin/python3' python run_all.py --frameworks pytorch --preset smoke")
