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
    """An executable that answers the interpreter probe (runner.cntk_python.PROBE) like Python ``version``."""
    path.write_text("#!/bin/sh\necho '{\"version\": \"%s\", \"implementation\": \"CPython\", "
                    "\"executable\": \"%s\", \"shared\": %s}'\n" % (version, path, "true" if shared else "false"))
    path.chmod(0o755)
    return str(path)


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


def test_cuda_without_gpu_is_refused():
    proc = cli("--device", "cuda", "--frameworks", "pytorch")
    assert proc.returncode == 2 and "nvidia-smi sees no GPU" in proc.stderr


@pytest.fixture(scope="module")
def broken_run(tmp_path_factory):
    """PyTorch next to an MXNet environment built from a broken interpreter, a run that needs
    more memory than there is, and a precision the CPU does not run."""
    tmp = tmp_path_factory.mktemp("broken")
    fake = tmp / "python3"        # a real Python 3.11 to the up-front check, which cannot make a venv
    fake.write_text("#!/bin/sh\ncase \"$*\" in *venv*) echo 'fake interpreter: cannot start' >&2; exit 3;; esac\n"
                    "exec %s \"$@\"\n" % getattr(sys, "_base_executable", sys.executable))
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
    run = run_all(["--preset", "smoke", "--frameworks", "pytorch", "--precision", "bf16"], tmp_path)
    rec = run.record("pytorch", "bf16")
    assert rec["status"] == "skipped" and "needs a CUDA GPU" in rec["error"]
    assert run.returncode == 0


def test_missing_cntk_interpreter_is_skipped_with_its_reason(tmp_path, monkeypatch):
    for key, value in no_cntk_python_anywhere(tmp_path / "home").items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("DS2_CNTK_PYTHON", raising=False)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    run = run_all(["--preset", "smoke", "--frameworks", "cntk"], tmp_path / "results")
    rec = run.record("cntk")
    assert rec["status"] == "skipped" and "--cntk-python" in rec["error"]
    assert "CNTK interpreter: none found" in run.output
