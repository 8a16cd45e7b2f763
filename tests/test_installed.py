"""Frameworks as they are installed (``--use-installed ENV=PYTHON``) and the runner in the current interpreter
(``DS2_RUNNER=current``), with no package registry.

* The session's PyTorch environment stands in for a machine's preinstalled interpreter: ``run_all.py
  --use-installed pytorch=<it>`` runs the pytorch row with no registry at all -- in a network namespace
  of its own with only loopback (``unshare -n``, as root), ``PIP_NO_INDEX=1``, an unreachable proxy, an
  empty environments directory (anything that made a venv would call pip there and fail) and
  ``DS2_RUNNER=current`` -- and its first-loss check is the pinned row's.  ``--full`` does the same for jax.
* Missing packages, a framework older than the oldest supported, a runner interpreter without papermill:
  one line naming what is missing and how to install it, exit status 2, before anything runs.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from runner.envs import framework_envs
from runner.envs import use_installed
from runner.envs import bootstrap
from runner.envs.bootstrap import env_python
from runner.envs.definitions import ENVS
from tests.conftest import ROOT, RunAll, selected_targets

NO_REGISTRY = {"PIP_NO_INDEX": "1", "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_FIND_LINKS": "",
               "PIP_EXTRA_INDEX_URL": "", "PIP_CONFIG_FILE": os.devnull, "HTTP_PROXY": "http://127.0.0.1:9",
               "HTTPS_PROXY": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9",
               "https_proxy": "http://127.0.0.1:9", "DS2_RUNNER": "current"}


def no_network_prefix():
    """``unshare -n`` with loopback up (kernels talk to papermill over 127.0.0.1): a network with nothing beyond
    this machine; [] where that cannot be had (not root, no unshare), the proxy and PIP_NO_INDEX still hold."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        return []
    probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    return ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"] if probe.returncode == 0 else []


def run_all(args, env_extra, results_dir):
    env = dict(os.environ, **env_extra)
    cmd = no_network_prefix() + [sys.executable, os.path.join(ROOT, "run_all.py"), "--results-dir", str(results_dir),
                                 "--no-progress"] + list(args)
    return subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True)


def one_error_line(proc, *words):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith(("run_all.py: error: ", "python -m tests: error: ")), proc.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


@pytest.mark.parametrize("target", ["pytorch", pytest.param("jax", marks=pytest.mark.full)])
def test_a_preinstalled_interpreter_runs_its_row_with_no_registry(smoke, tmp_path, target):
    pinned = smoke.record(target)
    if pinned["status"] != "ok":
        pytest.skip("%s's pinned row did not run: %s" % (target, pinned["error"]))
    python = env_python(framework_envs.env_path(ENVS[target], "cpu"))     # "preinstalled": the session's environment
    empty_envs = tmp_path / "no-envs"
    results_dir = tmp_path / "results"
    # the route is what is tested, not the export, ONNX or forward timing that the smoke run already checked
    proc = run_all(["--preset", "smoke", "--device", "cpu", "--frameworks", target, "--use-installed",
                    "%s=%s" % (target, python), "--skip", "export,onnx,forward"],
                   dict(NO_REGISTRY, DS2_ENVS_DIR=str(empty_envs)), results_dir)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    # the preflight: the versions beside the pins
    assert "--use-installed %s: %s (Python" % (target, python) in proc.stdout
    assert "pin " in proc.stdout and "ipykernel" in proc.stdout
    assert not empty_envs.exists() or not os.listdir(str(empty_envs)), "an environment was made"
    rec = RunAll([], results_dir, _run=False).record(target)
    assert rec["status"] == "ok", rec["error"]
    assert rec["as_is"] is True and rec["run"]["installed"]["python"] == python
    framework = {"pytorch": "torch", "jax": "jax"}[target]
    assert rec["run"]["installed"]["packages"][framework] == pinned["versions"]["framework"] == \
        rec["versions"]["framework"]
    # the same first-loss check as the pinned row: the same code on the same interpreter
    mine, theirs = rec["checks"]["loss"], pinned["checks"]["loss"]
    assert mine["ok"] and mine["reference"] == theirs["reference"]
    assert abs(mine["framework"] - theirs["framework"]) <= 1e-6 * abs(theirs["framework"]), (mine, theirs)
    assert rec["data"]["checksum"] == pinned["data"]["checksum"]
    md = (results_dir / "results.md").read_text()
    assert "(as installed)" in md and "ran in an interpreter whose frameworks were already installed" in md


@pytest.mark.full     # installs PyTorch's oldest supported release (its CUDA build from PyPI: about 7 GB)
@pytest.mark.skipif("pytorch" not in selected_targets(), reason="pytorch is not among DS2_TEST_FRAMEWORKS")
def test_the_oldest_supported_pytorch_runs_its_row(smoke, tmp_path):
    """``installed.OLDEST["torch"]`` is not a hope: a venv with that release (and the other pins) runs the
    pytorch row through --use-installed, passes every check, and starts where the pinned row starts."""
    pinned = smoke.record("pytorch")
    venv = tmp_path / "oldest"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True)
    pins = use_installed.needed_pins(ENVS["pytorch"], "cpu", [], "3.11")
    pins["torch"] = use_installed.OLDEST["torch"]
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q"] + ["%s==%s" % kv for kv in pins.items()], check=True)
    python = str(venv / "bin" / "python")
    proc = run_all(["--preset", "smoke", "--device", "cpu", "--frameworks", "pytorch", "--use-installed",
                    "pytorch=%s" % python], NO_REGISTRY, tmp_path / "results")
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    rec = RunAll([], tmp_path / "results", _run=False).record("pytorch")
    assert rec["status"] == "ok" and rec["as_is"] and rec["versions"]["framework"].startswith(use_installed.OLDEST["torch"])
    assert rec["checks"]["loss"]["ok"] and rec["export"]["inference"]["ok"] and rec["onnx"]["status"] == "ok"
    assert abs(rec["checks"]["loss"]["framework"] / pinned["checks"]["loss"]["framework"] - 1) <= 1e-6


def bare_python(tmp_path, name="bare"):
    """A Python with nothing installed (a venv without pip)."""
    path = tmp_path / name
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(path)],
                   check=True)
    return str(path / "bin" / "python")


def fake_distributions(python, versions):
    """Installed-looking packages in ``python``'s site-packages: a module and a dist-info with a version each."""
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout.strip()
    for dist, version in versions.items():
        module = use_installed.MODULES.get(dist, dist.lower().replace("-", "_"))
        os.makedirs(os.path.join(site, module), exist_ok=True)
        open(os.path.join(site, module, "__init__.py"), "w").close()
        info = os.path.join(site, "%s-%s.dist-info" % (dist.replace("-", "_"), version))
        os.makedirs(info, exist_ok=True)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (dist, version))


def test_an_interpreter_without_the_frameworks_packages_is_one_line_and_exit_2(tmp_path):
    python = bare_python(tmp_path)
    proc = run_all(["--preset", "smoke", "--device", "cpu", "--frameworks", "pytorch", "--use-installed",
                    "pytorch=%s" % python], {}, tmp_path / "results")
    line = one_error_line(proc, "--use-installed pytorch", "lacks torch", "ipykernel",
                          "install them with: %s -m pip install 'torch==" % python)
    assert "keras" not in line                     # Keras only for the Keras rows
    assert not (tmp_path / "results" / "records").exists()


def test_missing_ipykernel_alone_is_named(tmp_path):
    python = bare_python(tmp_path)
    pins = use_installed.needed_pins(ENVS["pytorch"], "cpu", [], "3.11")
    fake_distributions(python, {n: v for n, v in pins.items() if n != "ipykernel"})
    proc = run_all(["--preset", "smoke", "--device", "cpu", "--frameworks", "pytorch", "--use-installed",
                    "pytorch=%s" % python], {}, tmp_path / "results")
    one_error_line(proc, "lacks ipykernel; install it with: %s -m pip install 'ipykernel==%s'" % (python,
                                                                                                  pins["ipykernel"]))


def test_a_framework_older_than_the_oldest_supported_is_refused_and_the_oldest_is_not(tmp_path):
    python = bare_python(tmp_path)
    pins = use_installed.needed_pins(ENVS["jax"], "cpu", [], "3.11")
    fake_distributions(python, dict(pins, jax="0.4.30"))
    proc = run_all(["--preset", "smoke", "--device", "cpu", "--frameworks", "jax", "--use-installed",
                    "jax=%s" % python], {}, tmp_path / "results")
    one_error_line(proc, "has jax 0.4.30, older than %s, the oldest this project runs" % use_installed.OLDEST["jax"],
                   "%s -m pip install 'jax==%s'" % (python, pins["jax"]))
    # exactly the oldest: the preflight passes (--setup-only registers its kernel, and nothing else happens)
    python = bare_python(tmp_path, "oldest")
    fake_distributions(python, dict(pins, jax=use_installed.OLDEST["jax"]))
    proc = run_all(["--setup-only", "--device", "cpu", "--frameworks", "jax", "--use-installed",
                    "jax=%s" % python], {}, tmp_path / "results")
    assert proc.returncode == 0, proc.stderr
    assert "jax: ready (kernel ds2-jax-cpu-installed-" in proc.stdout
    kernel = [l for l in proc.stdout.splitlines() if "ready (kernel" in l][0].split("kernel ")[1].rstrip(")")
    spec = json.load(open(os.path.join(sys.prefix, "share", "jupyter", "kernels", kernel, "kernel.json")))
    assert spec["argv"][:3] == [python, "-m", "ipykernel_launcher"]


def test_the_runner_in_an_interpreter_without_papermill_is_one_line_and_exit_2(tmp_path):
    python = bare_python(tmp_path)
    env = dict(os.environ, DS2_RUNNER="current")
    for argv, prog in (([os.path.join(ROOT, "run_all.py"), "--frameworks", "pytorch"], "run_all.py"),
                       (["-m", "tests", "-k", "nothing"], "python -m tests")):
        proc = subprocess.run([python] + argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True)
        line = one_error_line(proc, "DS2_RUNNER=current", "lacks papermill", "%s -m pip install" % python)
        assert line.startswith("%s: error: " % prog)
        assert ("'pytest==" in line) == (prog == "python -m tests")


def test_pins_markers_and_versions():
    pins = use_installed.read_pins(os.path.join(ROOT, "envs", "jax-cpu.txt"), "3.12.1")
    assert pins["jax"] == "0.12.0.1" and pins["flax"] == "0.12.12"
    assert use_installed.read_pins(os.path.join(ROOT, "envs", "jax-cpu.txt"), "3.11.7")["jax"] == "0.10.2"
    assert "jax" in use_installed.read_pins(os.path.join(ROOT, "envs", "jax-cuda.txt"), "3.11.7")    # jax[cuda12]
    assert use_installed.version_tuple("2.11.0+cu130") == (2, 11, 0) and use_installed.version_tuple("2.7.post2") == (2, 7)
    assert use_installed.parse_assignments("pytorch=/a, jax=/b") == [("pytorch", "/a"), ("jax", "/b")]
    with pytest.raises(ValueError):
        use_installed.parse_assignments("pytorch")


# ---- a wheelhouse: prepared where a registry is, installed where none is --------------------------------------
def test_a_wheelhouse_without_the_pinned_wheels_is_refused_in_one_line_before_anything_is_made(tmp_path):
    """The check before any environment is made (pip's offline dry run of the pins): a wheelhouse with none of
    MXNet's wheels is one line naming a wheel it lacks and how to add it, exit 2, and no environment is left."""
    empty = tmp_path / "wheels"
    empty.mkdir()
    proc = run_all(["--setup-only", "--device", "cpu", "--frameworks", "mxnet", "--wheelhouse", str(empty)],
                   dict(NO_REGISTRY, DS2_ENVS_DIR=str(tmp_path / "envs")), tmp_path / "r")
    one_error_line(proc, "--wheelhouse %s lacks " % empty, "--prepare-wheelhouse")
    assert not (tmp_path / "envs").exists() or not [n for n in os.listdir(str(tmp_path / "envs"))
                                                    if not n.endswith(".log")]


@pytest.mark.full
def test_a_prepared_wheelhouse_makes_an_environment_with_no_registry_and_a_missing_wheel_is_named(tmp_path):
    """MXNet's CPU environment (the smallest) and the runner's: ``--prepare-wheelhouse`` here (from the registry:
    about a minute, so in the full tier), then ``--wheelhouse`` with no network; a copy without NumPy's wheel is
    refused in one line."""
    wheels = tmp_path / "wheels"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "run_all.py"), "--prepare-wheelhouse", str(wheels),
                           "--frameworks", "mxnet", "--device", "cpu"], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert "envs/mxnet-cpu.txt" in proc.stdout and "envs/runner.txt" in proc.stdout
    assert " in all, to " in proc.stdout.strip().splitlines()[-1]
    names = os.listdir(str(wheels))
    assert any(n.startswith("mxnet-1.9.1-") for n in names) and any(n.startswith("papermill-") for n in names)

    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))   # --python: a kernel of its own name
    envs_dir = tmp_path / "envs"
    proc = run_all(["--setup-only", "--device", "cpu", "--frameworks", "mxnet", "--wheelhouse", str(wheels),
                    "--python", "mxnet=%s" % base], dict(NO_REGISTRY, DS2_ENVS_DIR=str(envs_dir)), tmp_path / "r")
    kernel = None
    try:
        assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
        ready = [l for l in proc.stdout.splitlines() if l.startswith("mxnet: ready (kernel ")]
        assert ready, proc.stdout
        kernel = ready[0].split("kernel ")[1].rstrip(")")
        python = env_python(framework_envs.env_path(ENVS["mxnet"], "cpu", base).replace(bootstrap.ENVS_DIR, str(envs_dir)))
        out = subprocess.run([python, "-c", "import mxnet, onnxruntime, ipykernel; print(mxnet.__version__)"],
                             stdout=subprocess.PIPE, universal_newlines=True)
        assert out.returncode == 0 and out.stdout.strip() == "1.9.1"
        log = open(os.path.join(str(envs_dir), os.path.basename(os.path.dirname(os.path.dirname(python))) + ".log"))
        assert "--no-index --find-links %s" % wheels in log.read()
    finally:
        if kernel:
            shutil.rmtree(os.path.join(sys.prefix, "share", "jupyter", "kernels", kernel), ignore_errors=True)

    partial = tmp_path / "partial"
    shutil.copytree(str(wheels), str(partial), ignore=shutil.ignore_patterns("numpy-*"))
    proc = run_all(["--setup-only", "--device", "cpu", "--frameworks", "mxnet", "--wheelhouse", str(partial)],
                   dict(NO_REGISTRY, DS2_ENVS_DIR=str(tmp_path / "envs2")), tmp_path / "r2")
    one_error_line(proc, "--wheelhouse %s lacks numpy" % partial, "--prepare-wheelhouse")
    assert not (tmp_path / "envs2").exists() or not [n for n in os.listdir(str(tmp_path / "envs2"))
                                                     if not n.endswith(".log")]
