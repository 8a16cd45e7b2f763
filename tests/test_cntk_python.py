"""One discovery of the CNTK interpreter (runner.envs.cntk_python), shared by run_all.py and .ci/run."""
import os
import subprocess
import sys

import pytest

from runner.envs import cntk_python
from tests.conftest import ROOT, no_cntk_python_anywhere

PYENV_36 = sorted(__import__("glob").glob(os.path.expanduser("~/.pyenv/versions/3.6*/bin/python3.6")))


def fake(path, version, shared=True, implementation="CPython", real=None):
    """An executable answering the probe like an interpreter; ``real`` is the sys.executable it reports
    (a pyenv shim reports the interpreter behind it)."""
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(str(path), "w") as f:
        f.write("#!/bin/sh\necho '{\"version\": \"%s\", \"implementation\": \"%s\", \"executable\": \"%s\", "
                "\"shared\": %s}'\n" % (version, implementation, real or path, "true" if shared else "false"))
    os.chmod(str(path), 0o755)
    return str(path)


@pytest.fixture
def home(tmp_path):
    env = no_cntk_python_anywhere(tmp_path / "home")
    env["PATH"] = str(tmp_path / "bin")
    return tmp_path, env


def test_explicit_interpreter_first_then_the_variable(home):
    tmp, env = home
    good = fake(tmp / "a" / "python3.6", "3.6.15")
    other = fake(tmp / "b" / "python3.6", "3.6.8")
    env[cntk_python.ENV_VAR] = other
    found = cntk_python.discover(good, environ=env)
    assert found.path == good and found.chosen.source == "--cntk-python" and found.error is None
    found = cntk_python.discover(None, environ=env)
    assert found.path == other and found.chosen.source == "DS2_CNTK_PYTHON"


@pytest.mark.parametrize("make, reason", [
    (lambda p: fake(p, "3.6.15", shared=False), "built without --enable-shared"),
    (lambda p: fake(p, "3.7.16"), "is Python 3.7.16; CNTK 2.7 needs 3.6"),
    (lambda p: fake(p, "3.6.9", implementation="PyPy"), "is PyPy 3.6.9, not CPython"),
    (lambda p: str(p), "not found"),
])
def test_a_given_interpreter_that_cannot_be_used_is_an_error_not_a_fallback(home, make, reason):
    tmp, env = home
    fake(tmp / "home" / ".pyenv" / "versions" / "3.6.15" / "bin" / "python3.6", "3.6.15")   # would be found
    bad = make(tmp / "bad" / "python")
    found = cntk_python.discover(bad, environ=env)
    assert found.chosen is None and found.error.startswith("--cntk-python %s " % bad), found.error
    assert reason in found.error


def test_search_order_and_rejections(home):
    tmp, env = home
    h = tmp / "home"
    shim_target = fake(h / ".pyenv" / "versions" / "3.6.15" / "bin" / "python3.6", "3.6.15", shared=False)
    fake(h / ".pyenv" / "versions" / "3.6.9" / "bin" / "python3.6", "3.6.9", shared=False)
    fake(tmp / "bin" / "python3.6", "3.6.15", shared=False, real=shim_target)            # a shim on PATH
    fake(h / "miniconda3" / "envs" / "aaa" / "bin" / "python3.6", "3.6.13")
    cntk36 = fake(h / "miniconda3" / "envs" / "cntk36" / "bin" / "python3.6", "3.6.13")
    found = cntk_python.discover(None, environ=env, home=str(h))
    assert found.path == cntk36 and found.chosen.source == "conda environment cntk36"
    assert [(c.path, c.source.split(" (")[0]) for c in found.rejected] == [
        (str(tmp / "bin" / "python3.6"), "python3.6 on PATH"),
        (shim_target, "pyenv"),
        (str(h / ".pyenv" / "versions" / "3.6.9" / "bin" / "python3.6"), "pyenv")]   # 3.6.15 before 3.6.9
    assert all("built without --enable-shared" in c.reason for c in found.rejected)
    lines = found.lines()
    assert lines[0].startswith("CNTK interpreter: %s (Python 3.6.13, shared library; from conda environment cntk36)"
                               % cntk36)
    assert len(lines) == 4 and all(l.startswith("  rejected ") for l in lines[1:])


def test_a_shim_resolves_to_the_interpreter_behind_it(home):
    tmp, env = home
    real = fake(tmp / "home" / "real" / "python3.6", "3.6.15")
    fake(tmp / "bin" / "python3.6", "3.6.15", real=real)
    found = cntk_python.discover(None, environ=env, home=str(tmp / "home"))
    assert found.path == real and found.chosen.path == str(tmp / "bin" / "python3.6")


def test_conda_prefix_and_its_siblings(home):
    tmp, env = home
    root = tmp / "somewhere" / "conda"
    env["CONDA_PREFIX"] = str(root / "envs" / "work")
    fake(root / "envs" / "work" / "bin" / "python3.11", "3.11.7")
    py36 = fake(root / "envs" / "ds2-cntk" / "bin" / "python3.6", "3.6.15")
    found = cntk_python.discover(None, environ=env, home=str(tmp / "home"))
    assert found.path == py36 and found.chosen.source == "conda environment ds2-cntk"


def run_module(python, env, *args):
    return subprocess.run([python, "-m", "runner.envs.cntk_python"] + list(args), cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)


@pytest.mark.parametrize("python", [sys.executable] + PYENV_36[:1])
def test_command_line_for_ci(home, python):
    """``python3 -m runner.envs.cntk_python``: standard library only (``-S``: no site-packages), Python 3.6 too;
    prints the path (exit 0), exit 1 when there is none, 2 when DS2_CNTK_PYTHON is unusable."""
    tmp, env = home
    proc = run_module(python, env)
    assert proc.returncode == 1 and proc.stdout == "" and "CNTK interpreter: none found" in proc.stderr, proc.stderr
    good = fake(tmp / "home" / ".pyenv" / "versions" / "3.6.15" / "bin" / "python3.6", "3.6.15")
    proc = subprocess.run([python, "-S", "-m", "runner.envs.cntk_python"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 0 and proc.stdout == good + "\n", proc.stderr
    env[cntk_python.ENV_VAR] = fake(tmp / "x" / "python", "3.8.1")
    proc = run_module(python, env, "-q")
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr == ""


def test_ci_asks_the_same_module():
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = f.read()
    assert "python3 -m runner.envs.cntk_python" in ci
    code = "\n".join(l for l in ci.splitlines() if not l.lstrip().startswith("#"))
    assert "versions/3.6" not in code and "Py_ENABLE_SHARED" not in code      # no search of its own
    for package in ("libopenmpi3", "openmpi-bin", "chromium"):
        assert package in ci


@pytest.mark.skipif(not PYENV_36, reason="no pyenv CPython 3.6 on this machine")
def test_finds_this_machines_pyenv_36():
    env = dict(os.environ)
    env.pop(cntk_python.ENV_VAR, None)
    found = cntk_python.discover(None, environ=env)
    assert found.chosen is not None and found.chosen.version.startswith("3.6."), found.lines()


@pytest.mark.parametrize("found, status", [({"cntk"}, "skipped"), (set(), "failed")])
def test_a_found_interpreter_without_openmpi_skips_cntk_a_given_one_fails(tmp_path, monkeypatch, found, status):
    """Nobody asked for CNTK when its interpreter was only found: a missing system library skips the row
    (exit status 0) instead of failing it; with --cntk-python it is a failure to fix."""
    from common.spec import get_preset
    from runner.run import execute
    from runner.run import targets
    from runner.envs import definitions
    env = definitions.ENVS["cntk"]
    monkeypatch.setattr(env, "needs", lambda: "this machine lacks OpenMPI 4's libmpi.so.40")
    python = fake(tmp_path / "py" / "python3.6", "3.6.15")
    opts = execute.RunOptions(get_preset("smoke"), "fp32", 0, "cpu", str(tmp_path / "results"),
                              pythons={"cntk": python}, found=found, progress=False)
    rec = execute.run_target(targets.TARGETS["cntk"], opts, announce=lambda m: None)
    assert rec["status"] == status and "lacks OpenMPI 4's libmpi.so.40" in rec["error"], rec["error"]
