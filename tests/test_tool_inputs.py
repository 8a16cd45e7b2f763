"""The developer tools and benchmarks refuse bad input before any work (the project's rule; runner/validate.py):
tools/check_gpu_envs.py, tools/fatbin_archs.py, tools/gpu_session.py's options, tools/runner_structure.py,
tools/installed_offline.sh (run_all.py's options checked before .venvs/installed is made) and the options of
benchmarks/learn_parity.py, data_throughput.py, jax_unroll.py, torch_profiler_memory.py, jax_compile.py,
rnn_layer_memory.py, first_run.py and rnn_latency.py (which imports PyTorch only once its options are checked; its
``--device cuda`` on a machine without one is checked in the PyTorch CPU environment).

Each case runs its command as a careless user would and gets exit status 2, exactly one stderr line that starts
with the command's ``PROG: error:`` and names the option (or argument), nothing on stdout, and nothing written: the
scratch directory it runs in is unchanged, and so are the checkout's files a case could hit (README.md, results/,
.venvs/installed).  Only refusals run here: no environment is built, no benchmark timed."""
import hashlib
import json
import os
import subprocess
import sys

import pytest

from runner import validate
from tests.conftest import ROOT, assert_refused, cpu_env, file_tree

PY = sys.executable
TOOLS, BENCH = os.path.join(ROOT, "tools"), os.path.join(ROOT, "benchmarks")
GPU_ENVS = [PY, os.path.join(TOOLS, "check_gpu_envs.py")]
FATBIN = [PY, os.path.join(TOOLS, "fatbin_archs.py")]
SESSION = [PY, os.path.join(TOOLS, "gpu_session.py")]
STRUCTURE = [PY, os.path.join(TOOLS, "runner_structure.py")]
OFFLINE = ["bash", os.path.join(TOOLS, "installed_offline.sh")]
PARITY = [PY, os.path.join(BENCH, "learn_parity.py")]
THROUGHPUT = [PY, os.path.join(BENCH, "data_throughput.py")]
UNROLL = [PY, os.path.join(BENCH, "jax_unroll.py")]
PROFILER = [PY, os.path.join(BENCH, "torch_profiler_memory.py")]
COMPILE = [PY, os.path.join(BENCH, "jax_compile.py")]
LAYER_MEMORY = [PY, os.path.join(BENCH, "rnn_layer_memory.py")]
FIRST_RUN = [PY, os.path.join(BENCH, "first_run.py")]
LATENCY = [PY, os.path.join(BENCH, "rnn_latency.py"), "--smoke"]
LATENCY_TORCH = ["{torch}", os.path.join(BENCH, "rnn_latency.py"), "--smoke"]
PROGS = {id(GPU_ENVS): "tools/check_gpu_envs.py", id(FATBIN): "fatbin_archs.py", id(SESSION): "gpu_session.py",
         id(STRUCTURE): "python tools/runner_structure.py", id(OFFLINE): "installed_offline.sh",
         id(PARITY): "learn_parity.py", id(THROUGHPUT): "data_throughput.py", id(UNROLL): "jax_unroll.py",
         id(PROFILER): "torch_profiler_memory.py", id(COMPILE): "jax_compile.py",
         id(LAYER_MEMORY): "rnn_layer_memory.py", id(FIRST_RUN): "first_run.py", id(LATENCY): "rnn_latency.py",
         id(LATENCY_TORCH): "rnn_latency.py"}
README = os.path.join(ROOT, "README.md")
#: a refusal takes well under a second; a command that started its work would take far longer
SECONDS = 10
DRY = ["--dry-run", "--out", "{tmp}/out"]
NO_BUILD = ["--no-build", "--dest", "{tmp}/envs"]


def case(name, command, args, words, cwd="tmp"):
    """``command`` + ``args`` ({tmp}: the scratch directory) refused with a line holding every one of ``words``;
    ``cwd``: "tmp" or "root"."""
    return pytest.param(command, args, words, cwd, id=name)


CASES = [
    # ---- tools/check_gpu_envs.py ------------------------------------------------------------------------------
    case("gpu-envs-readme-as-json-with-unknown-only", GPU_ENVS,
         ["--json", README, "--only", "bogus"] + NO_BUILD, ["--only bogus", "choose from", "pytorch/cu130"]),
    case("gpu-envs-json-a-tracked-file", GPU_ENVS, ["--json", README, "--only", "pytorch"] + NO_BUILD,
         ["--json", "README.md", "tracks"]),
    case("gpu-envs-json-a-tracked-file-through-a-link", GPU_ENVS,
         ["--json", "{tmp}/checkout/README.md", "--only", "pytorch"] + NO_BUILD,
         ["--json {tmp}/checkout/README.md", "tracks"]),
    case("gpu-envs-json-a-file-of-the-users", GPU_ENVS, ["--json", "{tmp}/a-file", "--only", "pytorch"] + NO_BUILD,
         ["--json {tmp}/a-file", "not a results file"]),
    case("gpu-envs-json-a-directory", GPU_ENVS, ["--json", "{tmp}", "--only", "pytorch"] + NO_BUILD,
         ["--json {tmp}", "is a directory"]),
    case("gpu-envs-json-in-proc", GPU_ENVS, ["--json", "/proc/x.json", "--only", "pytorch"] + NO_BUILD,
         ["--json /proc/x.json", "/proc"]),
    case("gpu-envs-json-folder-missing", GPU_ENVS, ["--json", "{tmp}/none/r.json", "--only", "pytorch"] + NO_BUILD,
         ["--json {tmp}/none/r.json", "does not exist"]),
    case("gpu-envs-only-unknown-build", GPU_ENVS, ["--only", "pytorch/cu999"] + NO_BUILD,
         ["--only pytorch/cu999", "choose from"]),
    case("gpu-envs-only-twice", GPU_ENVS, ["--only", "jax", "--only", "jax"] + NO_BUILD, ["--only", "jax twice"]),
    case("gpu-envs-only-empty-item", GPU_ENVS, ["--only", "jax,,mxnet"] + NO_BUILD, ["argument --only", "empty item"]),
    case("gpu-envs-python-unknown-env", GPU_ENVS, ["--python", "foo=" + PY] + NO_BUILD,
         ["--python foo=", "unknown environment foo"]),
    case("gpu-envs-python-missing", GPU_ENVS, ["--python", "pytorch=/nonexistent"] + NO_BUILD,
         ["--python pytorch=/nonexistent", "no such executable"]),
    case("gpu-envs-python-not-a-python", GPU_ENVS, ["--python", "pytorch={tmp}/not-python"] + NO_BUILD,
         ["--python pytorch={tmp}/not-python", "Python"]),
    case("gpu-envs-python-twice", GPU_ENVS, ["--python", "jax=" + PY, "--python", "jax=" + PY] + NO_BUILD,
         ["--python", "named twice"]),
    case("gpu-envs-dest-dev-null", GPU_ENVS, ["--dest", "/dev/null"], ["--dest /dev/null", "not a directory"]),
    case("gpu-envs-dest-missing-no-build", GPU_ENVS, ["--no-build", "--dest", "{tmp}/none"],
         ["--dest {tmp}/none", "no such directory"]),
    # ---- tools/fatbin_archs.py --------------------------------------------------------------------------------
    case("fatbin-missing", FATBIN, ["/nonexistent"], ["/nonexistent", "no such file"]),
    case("fatbin-dev-null", FATBIN, ["/dev/null"], ["/dev/null", "not a regular file"]),
    case("fatbin-a-directory", FATBIN, ["{tmp}"], ["{tmp}", "not a regular file"]),
    case("fatbin-empty", FATBIN, [""], ["''", "empty"]),
    case("fatbin-unknown-option", FATBIN, ["--bogus"], ["--bogus"]),
    case("fatbin-nothing", FATBIN, ["--json"], ["no LIBRARY"]),
    # ---- tools/gpu_session.py ---------------------------------------------------------------------------------
    case("session-deadline-within-the-reserve", SESSION, DRY + ["--deadline-s", "20"],
         ["argument --deadline-s", "at least 40", "'20'"]),
    case("session-deadline-below-the-minimum", SESSION, DRY + ["--deadline-s", "39"],
         ["argument --deadline-s", "at least 40"]),
    case("session-python-not-a-python", SESSION, DRY + ["--python", "{tmp}/not-python"],
         ["--python {tmp}/not-python", "does not run as a Python"]),
    case("session-python-a-directory", SESSION, DRY + ["--python", "{tmp}"], ["--python {tmp}", "no such executable"]),
    case("session-scratch-a-tracked-folder", SESSION, ["--dry-run", "--out", "/tmp/ds2-never-made-%d" % os.getpid(),
                                                       "--scratch", "results"],
         ["--scratch results", "inside the checkout"], cwd="root"),
    case("session-scratch-a-link-to-the-checkout", SESSION, DRY + ["--scratch", "{tmp}/checkout"],
         ["--scratch {tmp}/checkout", "the root of the checkout"]),
    case("session-scratch-through-a-link", SESSION, DRY + ["--scratch", "{tmp}/checkout/results/x"],
         ["--scratch {tmp}/checkout/results/x", "inside the checkout"]),
    # ---- tools/runner_structure.py ----------------------------------------------------------------------------
    case("structure-long-0", STRUCTURE, ["--long", "0"], ["argument --long", "'0'"]),
    case("structure-long-negative", STRUCTURE, ["--long", "-5"], ["argument --long", "'-5'"]),
    case("structure-long-not-a-number", STRUCTURE, ["--long", "x"], ["argument --long", "'x'"]),
    case("structure-unknown-option", STRUCTURE, ["--bogus"], ["--bogus"]),
    # ---- tools/installed_offline.sh: run_all.py's options before .venvs/installed ------------------------------
    case("offline-frameworks-bogus", OFFLINE, ["{tmp}/wh", PY, "--frameworks", "bogus"],
         ["run_all.py argument --frameworks", "'bogus'"]),
    case("offline-unknown-option", OFFLINE, ["{tmp}/wh", PY, "--bogus"], ["run_all.py", "--bogus"]),
    case("offline-timeout-0", OFFLINE, ["{tmp}/wh", PY, "--timeout", "0"], ["run_all.py argument --timeout"]),
    case("offline-results-dir-the-root", OFFLINE, ["{tmp}/wh", PY, "--results-dir", ROOT],
         ["run_all.py --results-dir", "repository root"]),
    case("offline-python-a-directory", OFFLINE, ["{tmp}/wh", "{tmp}"], ["PYTHON {tmp}", "is a directory"]),
    case("offline-python-not-a-python", OFFLINE, ["{tmp}/wh", "{tmp}/not-python"],
         ["PYTHON {tmp}/not-python", "Python 3.8"]),
    # ---- benchmarks -------------------------------------------------------------------------------------------
    case("parity-parallel-0", PARITY, ["--parallel", "0", "--results-dir", "{tmp}/p"], ["argument --parallel", "'0'"]),
    case("parity-parallel-negative", PARITY, ["--parallel", "-2", "--results-dir", "{tmp}/p"],
         ["argument --parallel"]),
    case("parity-seeds-not-numbers", PARITY, ["--seeds", "a", "--results-dir", "{tmp}/p"], ["argument --seeds", "'a'"]),
    case("parity-seeds-repeated", PARITY, ["--seeds", "0,0", "--results-dir", "{tmp}/p"],
         ["argument --seeds", "seed 0 twice"]),
    case("parity-seeds-one", PARITY, ["--seeds", "3", "--results-dir", "{tmp}/p"], ["argument --seeds", "2 seeds"]),
    case("parity-results-dir-empty", PARITY, ["--results-dir", ""], ["argument --results-dir", "empty"]),
    case("parity-results-dir-in-proc", PARITY, ["--results-dir", "/proc/parity"], ["--results-dir /proc/parity"]),
    case("parity-timeout-0", PARITY, ["--timeout", "0", "--results-dir", "{tmp}/p"], ["argument --timeout", "'0'"]),
    case("parity-rows-unknown", PARITY, ["--rows", "bogus", "--results-dir", "{tmp}/p"], ["argument --rows", "bogus"]),
    case("throughput-batch-size-0", THROUGHPUT, ["--batch-size", "0"], ["argument --batch-size", "'0'"]),
    case("throughput-scale-negative", THROUGHPUT, ["--scale", "-1"], ["argument --scale", "'-1'"]),
    case("throughput-repeats-0", THROUGHPUT, ["--repeats", "0"], ["argument --repeats", "'0'"]),
    case("unroll-hidden-0", UNROLL, ["--hidden", "0"], ["argument --hidden", "'0'"]),
    case("unroll-steps-negative", UNROLL, ["--steps", "-1"], ["argument --steps", "'-1'"]),
    case("unroll-batch-0", UNROLL, ["--batch", "0"], ["argument --batch", "'0'"]),
    case("unroll-repeats-0", UNROLL, ["--repeats", "0"], ["argument --repeats", "'0'"]),
    case("unroll-layers-0", UNROLL, ["--layers", "0"], ["argument --layers", "'0'"]),
    case("profiler-hidden-0", PROFILER, ["--hidden", "0"], ["argument --hidden", "'0'"]),
    case("profiler-steps-negative", PROFILER, ["--steps", "-3"], ["argument --steps", "'-3'"]),
    case("compile-lengths-not-numbers", COMPILE, ["--lengths", "a"], ["argument --lengths", "'a'", "1 to 15"]),
    case("compile-lengths-twice", COMPILE, ["--lengths", "8,8"], ["argument --lengths", "names 8 twice"]),
    case("compile-steps-0", COMPILE, ["--steps", "0", "--out", "{tmp}/c.json"], ["argument --steps", "'0'"]),
    case("compile-out-a-directory", COMPILE, ["--out", "{tmp}"], ["--out {tmp}", "is a directory"]),
    case("compile-out-folder-missing", COMPILE, ["--out", "{tmp}/none/c.json"], ["--out {tmp}/none/c.json",
                                                                                "does not exist"]),
    case("compile-out-not-a-regular-file", COMPILE, ["--out", "/dev/null"], ["--out /dev/null", "not a regular file"]),
    case("compile-out-a-tracked-file", COMPILE, ["--out", README], ["--out", "README.md", "is kept"]),
    case("compile-out-empty", COMPILE, ["--out", ""], ["argument --out", "empty"]),
    case("layer-memory-steps-0", LAYER_MEMORY, ["pytorch", "--steps", "0"], ["argument --steps", "'0'"]),
    case("layer-memory-steps-not-numbers", LAYER_MEMORY, ["pytorch", "--steps", "x"], ["argument --steps", "'x'"]),
    case("layer-memory-steps-twice", LAYER_MEMORY, ["pytorch", "--steps", "100,100"], ["argument --steps", "twice"]),
    case("first-run-keep-empty", FIRST_RUN, ["--keep", ""], ["argument --keep", "empty"]),
    case("first-run-keep-a-folder-with-files", FIRST_RUN, ["--keep", "{tmp}"], ["--keep {tmp}", "not empty"]),
    case("first-run-keep-a-file", FIRST_RUN, ["--keep", "{tmp}/a-file"], ["--keep {tmp}/a-file", "not a directory"]),
    case("first-run-keep-in-proc", FIRST_RUN, ["--keep", "/proc/ds2-first-run"], ["--keep /proc/ds2-first-run"]),
    case("first-run-frameworks-unknown", FIRST_RUN, ["--frameworks", "bogus", "--envs-only"],
         ["argument --frameworks", "'bogus'", "choose from"]),
    case("first-run-frameworks-twice", FIRST_RUN, ["--frameworks", "jax,jax"], ["argument --frameworks", "twice"]),
    case("latency-out-empty", LATENCY, ["--out", ""], ["argument --out", "empty"]),
    case("latency-out-a-directory", LATENCY, ["--out", "{tmp}"], ["--out {tmp}", "is a directory"]),
    case("latency-out-folder-missing", LATENCY, ["--out", "{tmp}/none/l.json"], ["--out {tmp}/none/l.json",
                                                                                "does not exist"]),
    case("latency-out-a-file-of-the-users", LATENCY, ["--out", "{tmp}/a-file"], ["--out {tmp}/a-file",
                                                                                 "not a results file"]),
    case("latency-out-a-tracked-file", LATENCY, ["--out", README], ["--out", "README.md", "is kept"]),
    case("latency-batch-0", LATENCY, ["--batch", "0"], ["argument --batch", "'0'"]),
    case("latency-steps-not-a-number", LATENCY, ["--steps", "x"], ["argument --steps", "'x'"]),
    case("latency-precisions-unknown", LATENCY, ["--precisions", "fp64"], ["argument --precisions", "'fp64'"]),
    case("latency-precisions-twice", LATENCY, ["--precisions", "bf16,bf16"], ["argument --precisions", "twice"]),
    case("latency-cuda-without-one", LATENCY_TORCH, ["--device", "cuda"], ["--device cuda", "no CUDA device"]),
]


@pytest.fixture
def scratch(tmp_path):
    """The directory the commands run in: a file of the user's, a wheel directory, an empty --dest, a program
    that is not a Python, and a link to the checkout."""
    tmp = tmp_path / "scratch"
    tmp.mkdir()
    (tmp / "a-file").write_text("a file of the user's\n")
    (tmp / "wh").mkdir()
    (tmp / "envs").mkdir()
    (tmp / "not-python").write_text("#!/bin/sh\nexit 1\n")
    os.chmod(str(tmp / "not-python"), 0o755)
    os.symlink(ROOT, str(tmp / "checkout"))
    return tmp


tree = file_tree            # tests/conftest.py


def checkout_state():
    """What a case could write in the checkout: README.md (its bytes), results/'s entries, .venvs/installed."""
    with open(README, "rb") as f:
        readme = hashlib.sha256(f.read()).hexdigest()
    installed = os.path.join(ROOT, ".venvs", "installed")
    cfg = os.path.join(installed, "pyvenv.cfg")
    return {"README.md": (readme, os.stat(README).st_mtime_ns),
            "results": sorted(os.listdir(os.path.join(ROOT, "results"))),
            ".venvs/installed": os.stat(cfg).st_mtime_ns if os.path.exists(cfg) else os.path.exists(installed)}


@pytest.mark.parametrize("command, args, words, cwd", CASES)
def test_bad_input_is_refused_in_one_line_before_anything(scratch, command, args, words, cwd):
    tmp = str(scratch)
    torch = cpu_env("pytorch")[1] if "{torch}" in command else None         # made where it is missing
    fill = lambda text: text.replace("{tmp}", tmp).replace("{torch}", torch or "{torch}")  # noqa: E731
    environ = dict(os.environ, PYTHONPATH=ROOT)
    environ.pop("DS2_RUNNER", None)
    before, checkout_before = tree(tmp), checkout_state()
    assert_refused([fill(c) for c in command], [fill(a) for a in args], PROGS[id(command)], [fill(w) for w in words],
                   ROOT if cwd == "root" else tmp, environ, SECONDS)
    assert tree(tmp) == before, "the command wrote into its scratch directory"
    assert checkout_state() == checkout_before, "the command changed the checkout"


# ---- what is accepted ---------------------------------------------------------------------------------------------
def test_check_gpu_envs_writes_its_json_whole_and_replaces_only_its_own(tmp_path):
    """--no-build over an empty --dest (nothing built: every build reported, nothing started) writes the JSON
    through a temporary file renamed over it (no other file left in its folder), and a second run replaces it."""
    (tmp_path / "envs").mkdir()
    out = tmp_path / "out"
    out.mkdir()
    argv = GPU_ENVS + ["--no-build", "--dest", str(tmp_path / "envs"), "--only", "mxnet", "--only", "jax/cuda12",
                       "--json", str(out / "r.json")]
    for _ in range(2):
        proc = subprocess.run(argv, cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=60)
        assert proc.returncode == 1 and proc.stderr == "", proc.stderr            # 1: nothing built
        assert "2 environment(s) checked" in proc.stdout
        assert os.listdir(str(out)) == ["r.json"]
        results = json.loads((out / "r.json").read_text())
        assert [(r["env"], r["build"], r["built"]) for r in results] == [("jax", "cuda12", False),
                                                                          ("mxnet", "cu112", False)]


def test_gpu_session_takes_the_shortest_deadline_and_a_scratch_folder_outside_the_checkout(tmp_path):
    sys.path.insert(0, TOOLS)
    import gpu_session
    args = gpu_session.build_parser().parse_args(["--out", str(tmp_path / "out"), "--dry-run", "--deadline-s",
                                                  str(gpu_session.MIN_DEADLINE_S), "--scratch", str(tmp_path / "s")])
    assert args.deadline_s == gpu_session.MIN_DEADLINE_S > gpu_session.RESERVE_S
    assert gpu_session.scratch_error(str(tmp_path / "s")) is None
    assert validate.python3_error("--python %s" % PY, PY) is None
    assert not (tmp_path / "out").exists() and not (tmp_path / "s").exists()


def test_runner_structure_long_lists_only_the_long_functions():
    proc = subprocess.run(STRUCTURE + ["--long", "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "no function over 100000 lines without a comment saying why\n"
