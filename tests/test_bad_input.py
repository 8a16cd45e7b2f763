"""Every bad input is refused before work starts (runner/validate.py, docs/running.md): each case below runs
its command as a careless user would and gets exit status 2, exactly one stderr line that starts with the
command's ``PROG: error:`` and names the option or variable, nothing on stdout, nothing written (the scratch
directory the command runs in is unchanged; run from the repository root, ``git status --porcelain`` is too),
and no process left behind (every process the command starts carries a marker variable; none may outlive it).

The commands run with this interpreter (the runner's: run_all.py does not re-execute itself), so each takes
well under a second.  The cases that run from the repository root carry ``--device cpu --precision tf32`` as
a safety net: were the path check ever lost, that run would still stop before anything starts (every row
skipped, exit status 1) rather than write into the checkout."""
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from runner import validate
from runner import cli_checks
from runner.dp.supervisor import marked_processes
from tests.conftest import ROOT, assert_refused, file_tree

PY = sys.executable
RUN_ALL = [PY, os.path.join(ROOT, "run_all.py")]
#: run_all.py started by an interpreter outside the runner's environment, as a user starts it: it parses its options
#: before it makes (or enters) that environment
BOOT = [os.path.realpath(PY), os.path.join(ROOT, "run_all.py")]
REPORT = [PY, "-m", "runner.report"]
ROSETTA = [PY, "-m", "runner.rosetta"]
SIM = ["bash", os.path.join(ROOT, "tools", "simulate_hosts.sh")]
OFFLINE = ["bash", os.path.join(ROOT, "tools", "installed_offline.sh")]
GPU_ENVS = [PY, os.path.join(ROOT, "tools", "check_gpu_envs.py")]
SESSION = [PY, os.path.join(ROOT, "tools", "gpu_session.py")]
IMPORT = [PY, os.path.join(ROOT, "tools", "import_session.py")]
DP = [PY, "-m", "runner.dp"]
AGENT = [PY, "-m", "runner.dp.host_agent"]
WORKER = [PY, "-m", "runner.dp.worker"]
PROGS = {id(RUN_ALL): "run_all.py", id(BOOT): "run_all.py", id(REPORT): "python -m runner.report", id(ROSETTA): "python -m runner.rosetta",
         id(SIM): "simulate_hosts.sh", id(OFFLINE): "installed_offline.sh", id(GPU_ENVS): "tools/check_gpu_envs.py",
         id(SESSION): "gpu_session.py", id(IMPORT): "import_session.py", id(DP): "python -m runner.dp",
         id(AGENT): "host_agent.py", id(WORKER): "worker.py"}
MARKER = "DS2_BAD_INPUT_TAG"
#: far above the half second a refusal takes on a loaded 2-core machine, far below what starting a notebook takes
SECONDS = 10
SAFE = ["--device", "cpu", "--precision", "tf32"]     # from the root: stops before anything even without the check
RES = ["--results-dir", "{tmp}/res"]


def case(name, command, args, words, env=None, cwd="tmp"):
    """``command`` + ``args`` ({tmp}: the scratch directory) refused with a line holding every one of ``words``;
    ``env``: variables to set (None: unset); ``cwd``: "tmp", "root" (git status checked too) or a folder of it."""
    return pytest.param(command, args, words, env or {}, cwd, id=name)


CASES = [
    # ---- an empty value is not "here" ----------------------------------------------------------------------
    case("results-dir-empty-from-root", RUN_ALL, ["--frameworks", "pytorch", "--results-dir", ""] + SAFE,
         ["--results-dir ''", "is empty"], cwd="root"),
    case("results-dir-dot-from-root", RUN_ALL, ["--frameworks", "pytorch", "--results-dir", "."] + SAFE,
         ["--results-dir '.'", "repository root"], cwd="root"),
    case("results-dir-dot-in-docs", RUN_ALL, ["--frameworks", "pytorch", "--results-dir", "."] + SAFE,
         ["--results-dir '.'", "tracked files", os.path.join(ROOT, "docs")], cwd="docs"),
    case("results-dir-is-the-root-by-name", RUN_ALL, ["--frameworks", "pytorch", "--results-dir", ROOT] + SAFE,
         ["--results-dir", "repository root"], cwd="root"),
    case("results-dir-filesystem-root", RUN_ALL, ["--frameworks", "pytorch", "--results-dir", "/"] + SAFE,
         ["--results-dir '/'", "filesystem root"]),
    case("output-empty", RUN_ALL, ["--frameworks", "pytorch", "--output", ""] + RES, ["--output ''", "is empty"]),
    case("output-a-tracked-file", RUN_ALL, ["--frameworks", "pytorch", "--output", os.path.join(ROOT, "README.md")]
         + RES, ["--output", "README.md", "not a results page"]),
    case("output-not-a-regular-file", RUN_ALL, ["--frameworks", "pytorch", "--output", "/dev/null"] + RES,
         ["--output /dev/null", "not a regular file"]),
    case("output-a-directory", RUN_ALL, ["--frameworks", "pytorch", "--output", "{tmp}"] + RES,
         ["--output", "is a directory"]),
    case("hosts-empty-with-workers", RUN_ALL, ["--frameworks", "pytorch", "--hosts", "", "--workers", "2"] + RES,
         ["argument --hosts", "is empty"]),
    case("init-weights-empty", RUN_ALL, ["--frameworks", "pytorch", "--init-weights", ""] + RES,
         ["argument --init-weights", "is empty"]),
    case("wheelhouse-empty", RUN_ALL, ["--frameworks", "pytorch", "--wheelhouse", ""] + RES,
         ["argument --wheelhouse", "is empty"]),
    case("cntk-python-empty", RUN_ALL, ["--frameworks", "pytorch", "--cntk-python", ""] + RES,
         ["argument --cntk-python", "is empty"]),
    case("wheelhouse-platform-empty", RUN_ALL, ["--prepare-wheelhouse", "{tmp}/wh", "--wheelhouse-platform", ""] + RES,
         ["argument --wheelhouse-platform", "is empty"]),
    # ---- tracebacks before: now one line ---------------------------------------------------------------------
    case("hostfile-uneven-slots-torchrun", RUN_ALL, ["--frameworks", "pytorch", "--workers", "3", "--hosts",
                                                     "{tmp}/uneven", "--print-host-commands"] + RES,
         ["--hosts", "node1:2, node2:1", "torchrun", "same slots"]),
    case("hostfile-slots-not-workers", RUN_ALL, ["--frameworks", "pytorch", "--workers", "2", "--hosts",
                                                 "{tmp}/four"] + RES, ["--workers 2", "slots add up to 4"]),
    case("hostfile-missing", RUN_ALL, ["--frameworks", "pytorch", "--workers", "2", "--hosts", "{tmp}/none"] + RES,
         ["--hosts", "No such file"]),
    case("prepare-wheelhouse-in-proc", RUN_ALL, ["--frameworks", "pytorch", "--prepare-wheelhouse", "/proc/x"] + RES,
         ["--prepare-wheelhouse /proc/x", "cannot be created"]),
    case("prepare-wheelhouse-a-file", RUN_ALL, ["--frameworks", "pytorch", "--prepare-wheelhouse", "{tmp}/a-file"]
         + RES, ["--prepare-wheelhouse", "a-file is not a directory"]),
    case("runner-current-broken-import", RUN_ALL, ["--frameworks", "pytorch"] + RES,
         ["DS2_RUNNER=current", "cannot import tabulate", "broken on purpose", "--force-reinstall"],
         env={"DS2_RUNNER": "current", "PYTHONPATH": "{tmp}/broken"}),
    case("envs-dir-in-proc", RUN_ALL, ["--frameworks", "pytorch"] + RES, ["DS2_ENVS_DIR=/proc/x", "cannot be created"],
         env={"DS2_ENVS_DIR": "/proc/x"}),
    # ---- documented variables: set means non-empty and meaningful --------------------------------------------
    case("envs-dir-empty", RUN_ALL, ["--frameworks", "pytorch"] + RES, ["DS2_ENVS_DIR is set but empty"],
         env={"DS2_ENVS_DIR": ""}),
    case("runner-not-current", RUN_ALL, ["--frameworks", "pytorch"] + RES, ["DS2_RUNNER=yes", "expected current"],
         env={"DS2_RUNNER": "yes"}),
    case("wheelhouse-variable-empty", RUN_ALL, ["--frameworks", "pytorch"] + RES, ["DS2_WHEELHOUSE is set but empty"],
         env={"DS2_WHEELHOUSE": ""}),
    case("gpu-build-variable-empty", RUN_ALL, ["--frameworks", "pytorch"] + RES, ["DS2_GPU_BUILD is set but empty"],
         env={"DS2_GPU_BUILD": ""}),
    case("use-installed-variable-empty", RUN_ALL, ["--frameworks", "pytorch"] + RES,
         ["DS2_USE_INSTALLED is set but empty"], env={"DS2_USE_INSTALLED": ""}),
    case("cntk-python-variable-empty", RUN_ALL, ["--frameworks", "pytorch"] + RES,
         ["DS2_CNTK_PYTHON is set but empty"], env={"DS2_CNTK_PYTHON": ""}),
    case("gpu-build-variable-unknown", RUN_ALL, ["--check"] + RES, ["DS2_GPU_BUILD", "unknown environment 'theano'"],
         env={"DS2_GPU_BUILD": "theano=x"}),
    # ---- bounds that protect the machine ------------------------------------------------------------------------
    case("workers-100000", RUN_ALL, ["--frameworks", "pytorch", "--workers", "100000"] + RES,
         ["--workers 100000", "usable core", "--oversubscribe"]),
    case("batch-and-scale-a-billion", RUN_ALL, ["--frameworks", "pytorch", "--batch-size", "1000000000", "--scale",
                                                "1000000000"] + RES, ["--batch-size 1000000000", "available"]),
    case("scale-a-billion", RUN_ALL, ["--frameworks", "pytorch", "--scale", "1000000000"] + RES,
         ["--scale 1000000000", "available"]),
    case("batch-of-a-hundred-million", RUN_ALL, ["--frameworks", "pytorch", "--batch-size", "100000000"] + RES,
         ["--batch-size 100000000", "feature pool", "batch sizes up to"]),
    case("timeout-1e20", RUN_ALL, ["--frameworks", "pytorch", "--timeout", "1e20"] + RES,
         ["argument --timeout", "'1e20'"]),
    case("timeout-past-a-week", RUN_ALL, ["--frameworks", "pytorch", "--timeout", "100000000000000000000"] + RES,
         ["argument --timeout", "a week"]),
    case("join-timeout-past-a-week", RUN_ALL, ["--frameworks", "pytorch", "--workers", "2", "--hosts", "{tmp}/two",
                                               "--join-timeout", "604801"] + RES, ["argument --join-timeout", "a week"]),
    case("seed-past-32-bits", RUN_ALL, ["--frameworks", "pytorch", "--seed", "4294967296"] + RES,
         ["argument --seed", "4294967295"]),
    case("oversubscribe-alone", RUN_ALL, ["--frameworks", "pytorch", "--oversubscribe"] + RES,
         ["--oversubscribe", "--workers 2 or more"]),
    # ---- duplicates ---------------------------------------------------------------------------------------------
    case("frameworks-empty-item-and-twice", RUN_ALL, ["--frameworks", "pytorch,,jax,pytorch"] + RES,
         ["argument --frameworks", "empty item"]),
    case("frameworks-twice", RUN_ALL, ["--frameworks", "pytorch,jax,pytorch"] + RES,
         ["argument --frameworks", "names pytorch twice"]),
    case("precision-twice", RUN_ALL, ["--frameworks", "pytorch", "--precision", "fp32,fp32"] + RES,
         ["argument --precision", "names fp32 twice"]),
    case("batch-size-twice", RUN_ALL, ["--frameworks", "pytorch", "--batch-size", "8,08"] + RES,
         ["argument --batch-size", "names 8 twice"]),
    case("python-env-twice", RUN_ALL, ["--frameworks", "pytorch", "--python", "pytorch=%s" % PY, "--python",
                                       "pytorch=%s" % PY] + RES, ["--python pytorch=", "named twice"]),
    case("migrate-to-twice", RUN_ALL, ["--migrate", "--migrate-to", "jax,jax"] + RES,
         ["argument --migrate-to", "names jax twice"]),
    # ---- --skip: the parts a notebook leaves out -------------------------------------------------------------------
    case("skip-unknown-part", RUN_ALL, ["--frameworks", "pytorch", "--skip", "warmup"] + RES,
         ["argument --skip", "unknown part 'warmup'", "export, onnx, forward"]),
    case("skip-empty-item", RUN_ALL, ["--frameworks", "pytorch", "--skip", "onnx,,forward"] + RES,
         ["argument --skip", "empty item"]),
    case("skip-empty", RUN_ALL, ["--frameworks", "pytorch", "--skip", ""] + RES, ["argument --skip", "no part given"]),
    case("skip-twice", RUN_ALL, ["--frameworks", "pytorch", "--skip", "forward,forward"] + RES,
         ["argument --skip", "names forward twice"]),
    case("skip-export-without-onnx", RUN_ALL, ["--frameworks", "pytorch", "--skip", "export"] + RES,
         ["--skip export", "starts from the files the export writes", "--skip export,onnx"]),
    case("skip-with-migrate", RUN_ALL, ["--migrate", "--frameworks", "pytorch", "--skip", "onnx"] + RES,
         ["--skip onnx", "--migrate", "drop --skip"]),
    # ---- what already worked --------------------------------------------------------------------------------------
    case("unknown-framework", RUN_ALL, ["--frameworks", "theano"] + RES, ["argument --frameworks", "'theano'"]),
    case("unknown-preset", RUN_ALL, ["--preset", "huge"] + RES, ["argument --preset", "'huge'"]),
    case("batch-size-0", RUN_ALL, ["--batch-size", "0"] + RES, ["argument --batch-size", "'0'"]),
    case("workers-0", RUN_ALL, ["--workers", "0"] + RES, ["argument --workers", "'0'"]),
    case("unknown-device", RUN_ALL, ["--device", "tpu"] + RES, ["argument --device", "'tpu'"]),
    case("results-dir-in-proc", RUN_ALL, ["--frameworks", "pytorch", "--results-dir", "/proc/x"],
         ["--results-dir /proc/x", "cannot be created in /proc"]),
    case("results-dir-a-file", RUN_ALL, ["--frameworks", "pytorch", "--results-dir", "{tmp}/a-file"],
         ["--results-dir", "is not a directory"]),
    case("host-options-without-hosts", RUN_ALL, ["--frameworks", "pytorch", "--workers", "2",
                                                 "--print-host-commands"] + RES, ["go with --hosts HOSTFILE"]),
    case("mxnet-dp-without-workers", RUN_ALL, ["--frameworks", "mxnet", "--mxnet-dp", "local"] + RES,
         ["--mxnet-dp local", "--workers 2 or more"]),
    case("migrate-to-without-migrate", RUN_ALL, ["--migrate-to", "pytorch"] + RES, ["--migrate-to", "add --migrate"]),
    case("fp64-not-pytorch", RUN_ALL, ["--precision", "fp64", "--frameworks", "tensorflow"] + RES,
         ["--precision fp64", "pytorch only"]),
    case("unknown-option", RUN_ALL, ["--frameworkz", "pytorch"] + RES, ["unrecognized arguments: --frameworkz"]),
    # ---- found by an audit of every option: refused now ------------------------------------------------------
    case("bad-option-before-the-runner-environment-is-made", BOOT, ["--frameworks", "bogus"] + RES,
         ["argument --frameworks", "'bogus'"], env={"DS2_ENVS_DIR": "{tmp}/newenvs"}),
    case("results-dir-a-link-to-the-root", RUN_ALL, ["--frameworks", "pytorch", "--results-dir", "{tmp}/rootlink"]
         + SAFE, ["--results-dir '{tmp}/rootlink'", "repository root"]),
    case("results-dir-git", RUN_ALL, ["--frameworks", "pytorch", "--results-dir", ".git"] + SAFE,
         ["--results-dir '.git'", "git's own directory"], cwd="root"),
    case("results-dir-in-venvs", RUN_ALL, ["--frameworks", "pytorch", "--results-dir", ".venvs/r"] + SAFE,
         ["--results-dir '.venvs/r'", "the environments' directory"], cwd="root"),
    case("output-ends-in-a-slash", RUN_ALL, ["--frameworks", "pytorch", "--output", "{tmp}/page/"] + RES,
         ["--output '{tmp}/page/'", "names a directory"]),
    case("output-in-records", RUN_ALL, ["--frameworks", "pytorch", "--output", "{tmp}/res/records/page.md"] + RES,
         ["--output", "records/", "fills (and reads) itself"]),
    case("option-given-twice", RUN_ALL, ["--skip", "export,onnx", "--skip=forward"] + RES,
         ["argument --skip", "given twice"]),
    case("option-abbreviated", RUN_ALL, ["--frame", "pytorch"] + RES, ["unrecognized arguments: --frame"]),
    case("two-modes", RUN_ALL, ["--list", "--check"], ["--list and --check", "give one"]),
    case("list-results-dir-empty", RUN_ALL, ["--list", "--results-dir", ""], ["--results-dir ''", "empty"]),
    case("list-output-blank", RUN_ALL, ["--list", "--output", " "], ["--output ' '", "empty"]),
    case("init-weights-a-text-file", RUN_ALL, ["--frameworks", "pytorch", "--device", "cpu", "--init-weights",
                                               "{tmp}/a-file"] + RES, ["--init-weights", "not a NumPy .npz archive"]),
    case("init-weights-in-a-mode-that-runs-nothing", RUN_ALL, ["--setup-only", "--init-weights", "{tmp}/none.npz"],
         ["--init-weights", "--setup-only runs no notebook"]),
    case("prepare-wheelhouse-with-wheelhouse", RUN_ALL, ["--prepare-wheelhouse", "{tmp}/wh", "--wheelhouse", "{tmp}"]
         + RES, ["--prepare-wheelhouse", "--wheelhouse", "give one"]),
    case("cntk-python-twice-over", RUN_ALL, ["--list", "--cntk-python", PY, "--python", "cntk=%s" % PY],
         ["--cntk-python", "--python cntk=", "give one"]),
    case("gpu-build-names-an-environment-twice", RUN_ALL, ["--list", "--gpu-build", "pytorch=cu126,pytorch=cu128"],
         ["argument --gpu-build", "pytorch is named twice"]),
    case("gpu-build-trailing-comma", RUN_ALL, ["--list", "--gpu-build", "pytorch=cu126,"],
         ["argument --gpu-build", "empty item"]),
    case("gpu-build-variable-empty-item", RUN_ALL, ["--list"], ["DS2_GPU_BUILD", "empty item"],
         env={"DS2_GPU_BUILD": ","}),
    case("use-installed-variable-twice", RUN_ALL, ["--list"], ["DS2_USE_INSTALLED", "pytorch is named twice"],
         env={"DS2_USE_INSTALLED": "pytorch=%s,pytorch=%s" % (PY, PY)}),
    case("use-installed-variable-missing-python", RUN_ALL, ["--list"],
         ["DS2_USE_INSTALLED pytorch={tmp}/none", "no such executable"], env={"DS2_USE_INSTALLED": "pytorch={tmp}/none"}),
    case("wheelhouse-variable-a-file", RUN_ALL, ["--list"], ["DS2_WHEELHOUSE={tmp}/a-file", "no such directory"],
         env={"DS2_WHEELHOUSE": "{tmp}/a-file"}),
    case("migrate-with-no-export", RUN_ALL, ["--migrate", "--frameworks", "pytorch", "--preset", "smoke", "--device",
                                             "cpu"] + RES, ["--migrate: no selected source has an export",
                                                            "no record pytorch_smoke_fp32_bs8_cpu.json"]),
    case("report-output-ends-in-a-slash", REPORT, ["--output", "{tmp}/page/"], ["--output '{tmp}/page/'",
                                                                              "names a directory"]),
    case("dp-takes-no-arguments", DP, ["--bogus"], ["takes no arguments", "--bogus"]),
    case("host-agent-spec-not-base64", AGENT, ["--bogus"], ["SPEC", "'--bogus'"]),
    case("host-agent-spec-empty", AGENT, [""], ["SPEC", "''"]),
    case("worker-empty-prefixes", WORKER, ["--log-prefix", "", "--status-prefix", "", "{tmp}/none.py"],
         ["--log-prefix P --status-prefix S", "ends in a name"]),
    case("report-option-given-twice", REPORT, ["--results-dir", "results", "--results-dir", "{tmp}/empty"],
         ["argument --results-dir", "given twice"], cwd="root"),
    # ---- python -m runner.report ------------------------------------------------------------------------------------
    case("report-results-dir-empty-from-root", REPORT, ["--results-dir", "", "--output", "{tmp}/out.md"],
         ["--results-dir ''", "is empty"], cwd="root"),
    case("report-results-dir-dot-from-root", REPORT, ["--results-dir", ".", "--output", "{tmp}/out.md"],
         ["--results-dir '.'", "repository root"], cwd="root"),
    case("report-results-dir-misspelt", REPORT, ["--results-dir", "{tmp}/resluts"],
         ["--results-dir", "resluts: no such directory"]),
    case("report-results-dir-without-records", REPORT, ["--results-dir", "{tmp}/empty"],
         ["--results-dir", "holds no records"]),
    case("report-output-empty", REPORT, ["--output", ""], ["--output ''", "is empty"]),
    case("report-output-a-tracked-file", REPORT, ["--output", os.path.join(ROOT, "README.md")],
         ["--output", "not a results page"]),
    case("report-unknown-argument", REPORT, ["results"], ["unrecognized arguments: results"]),
    # ---- python -m runner.rosetta -----------------------------------------------------------------------------------
    case("rosetta-extract-empty", ROSETTA, ["--extract", ""], ["argument --extract", "invalid choice: ''"]),
    case("rosetta-extract-unknown", ROSETTA, ["--extract", "theano"], ["argument --extract", "'theano'"]),
    case("rosetta-check-and-extract", ROSETTA, ["--check", "--extract", "all"], ["--check and --extract all"]),
    case("rosetta-unknown-argument", ROSETTA, ["--chek"], ["unrecognized arguments: --chek"]),
    # ---- the tools ----------------------------------------------------------------------------------------------------
    case("simulate-hosts-up-huge", SIM, ["up", "99999999999999999999"], ["up N", "1 to 50", "99999999999999999999"]),
    case("simulate-hosts-up-08", SIM, ["up", "08"], ["up N", "leading zeros", "'08'"]),
    case("simulate-hosts-up-0", SIM, ["up", "0"], ["up N", "'0'"]),
    case("simulate-hosts-up-extra", SIM, ["up", "2", "extra"], ["up N takes one argument", "'2 extra'"]),
    case("simulate-hosts-up-missing", SIM, ["up"], ["up N", "missing"]),
    case("simulate-hosts-down-extra", SIM, ["down", "now"], ["down takes no argument", "'now'"]),
    case("simulate-hosts-no-command", SIM, [], ["no command"]),
    case("simulate-hosts-unknown-command", SIM, ["start"], ["unknown command 'start'"]),
    case("simulate-hosts-dir-empty", SIM, ["status"], ["DS2_SIM_DIR is set but empty"], env={"DS2_SIM_DIR": ""}),
    case("simulate-hosts-dir-relative", SIM, ["status"], ["DS2_SIM_DIR=sim", "absolute"], env={"DS2_SIM_DIR": "sim"}),
    case("simulate-hosts-dir-not-its-own", SIM, ["down"], ["DS2_SIM_DIR=", "mine", "not a directory this script made"],
         env={"DS2_SIM_DIR": "{tmp}/mine"}),
    case("installed-offline-wheelhouse-empty", OFFLINE, ["", PY], ["WHEELHOUSE ''", "is empty"]),
    case("installed-offline-python-empty", OFFLINE, ["{tmp}", ""], ["PYTHON ''", "is empty"]),
    case("check-gpu-envs-dest-empty", GPU_ENVS, ["--dest", "", "--no-build"], ["argument --dest", "is empty"]),
    case("check-gpu-envs-python-not-env-path", GPU_ENVS, ["--python", "cntk", "--no-build"],
         ["--python 'cntk'", "expected ENV=PATH"]),
    case("gpu-session-no-gpu", SESSION, ["--out", "{tmp}/out"], ["nvidia-smi sees no GPU", "--dry-run"],
         env={"PATH": "{tmp}/empty"}),
    case("gpu-session-out-empty", SESSION, ["--dry-run", "--out", ""], ["argument --out", "is empty"]),
    case("gpu-session-out-not-empty", SESSION, ["--dry-run", "--out", "{tmp}/mine"],
         ["--out {tmp}/mine holds 1 entry already", "at most 8 files"]),
    case("gpu-session-rows-fp64", SESSION, ["--dry-run", "--out", "{tmp}/out", "--rows", "pytorch:fp64"],
         ["argument --rows", "'pytorch:fp64'", "ROW:PRECISION"]),
    case("gpu-session-rows-empty-item", SESSION, ["--dry-run", "--out", "{tmp}/out", "--rows",
                                                  "pytorch:fp32,,jax:fp32"], ["argument --rows", "empty item"]),
    case("gpu-session-rows-twice", SESSION, ["--dry-run", "--out", "{tmp}/out", "--rows",
                                             "pytorch:bf16,pytorch:bf16"], ["argument --rows", "names pytorch:bf16 twice"]),
    case("gpu-session-rows-thrice", SESSION, ["--dry-run", "--out", "{tmp}/out", "--rows",
                                              "jax:bf16,jax:bf16,jax:bf16"], ["argument --rows", "3 times"]),
    case("gpu-session-deadline-0", SESSION, ["--dry-run", "--out", "{tmp}/out", "--deadline-s", "0"],
         ["argument --deadline-s", "'0'"]),
    case("gpu-session-estimate-twice", SESSION, ["--dry-run", "--out", "{tmp}/out", "--estimate", "jax:fp32=300",
                                                 "--estimate", "jax:fp32=400"], ["--estimate jax:fp32", "twice"]),
    case("gpu-session-repeat-without-dump", SESSION, ["--dry-run", "--out", "{tmp}/out", "--rows", "jax:fp32,jax:fp32",
                                                     "--no-autotune-dump"],
         ["--rows names jax:fp32 twice, but with --no-autotune-dump", "name it once"]),
    case("gpu-session-estimate-of-no-row", SESSION, ["--dry-run", "--out", "{tmp}/out", "--rows", "jax:fp32",
                                                    "--estimate", "jax+hoist:fp32=300"],
         ["--estimate jax+hoist:fp32 names a row the session does not run", "its rows: jax:fp32"]),
    case("gpu-session-wheelhouse-missing", SESSION, ["--dry-run", "--out", "{tmp}/out", "--wheelhouse", "{tmp}/none"],
         ["--wheelhouse {tmp}/none", "no such directory"]),
    case("import-session-tarball-empty", IMPORT, ["", "--results-dir", "{tmp}/res"], ["argument tarball", "is empty"]),
    case("import-session-tarball-missing", IMPORT, ["{tmp}/none.tar", "--results-dir", "{tmp}/res"],
         ["{tmp}/none.tar", "no such file"]),
    case("import-session-a-folder", IMPORT, ["{tmp}", "--results-dir", "{tmp}/res"], ["{tmp}: not a regular file"]),
    case("import-session-not-a-tarball", IMPORT, ["{tmp}/a-file", "--results-dir", "{tmp}/res"],
         ["{tmp}/a-file", "not a readable tarball"]),
    case("import-session-member-leaves-its-folder", IMPORT, ["{tmp}/escape.tar", "--results-dir", "{tmp}/res"],
         ["'records/../../x.json'", "not a device session's tarball"]),
    case("import-session-nothing-to-import", IMPORT, ["{tmp}/logs-only.tar", "--results-dir", "{tmp}/res"],
         ["no record, no latency figures and no autotuning results"]),
    case("import-session-results-dir-empty", IMPORT, ["{tmp}/logs-only.tar", "--results-dir", ""],
         ["argument --results-dir", "is empty"], cwd="root"),
]


@pytest.fixture
def scratch(tmp_path):
    """The directory the commands run in, with what the cases name: hostfiles, a file, a package that does not
    import, an empty directory, and a directory of the user's own."""
    tmp = tmp_path / "scratch"
    tmp.mkdir()
    (tmp / "uneven").write_text("node1:2\nnode2:1\n")
    (tmp / "four").write_text("a:2\nb:2\n")
    (tmp / "two").write_text("a\nb\n")
    (tmp / "a-file").write_text("a file of the user's\n")
    (tmp / "broken" / "tabulate").mkdir(parents=True)
    (tmp / "broken" / "tabulate" / "__init__.py").write_text("raise ImportError('broken on purpose')\n")
    (tmp / "empty").mkdir()
    (tmp / "rootlink").symlink_to(ROOT)
    (tmp / "mine").mkdir()
    (tmp / "mine" / "keep.txt").write_text("the user's\n")
    import io
    import tarfile
    for name, member in (("escape.tar", "records/../../x.json"), ("logs-only.tar", "logs/row.log")):
        with tarfile.open(str(tmp / name), "w") as t:
            info = tarfile.TarInfo(member)
            info.size = 2
            t.addfile(info, io.BytesIO(b"{}"))
    return tmp


tree = file_tree            # tests/conftest.py


def git_status():
    """What the checkout holds: ``git status`` where git and .git are there, else every file's size and time
    outside the environments (so a case run from the root is checked on any machine)."""
    if shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")):
        return {name: state for name, state in tree(ROOT).items()
                if not name.startswith((".venvs" + os.sep, ".git" + os.sep)) and name not in (".venvs", ".git")}
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                          stdout=subprocess.PIPE, universal_newlines=True).stdout


@pytest.mark.parametrize("command, args, words, env, cwd", CASES)
def test_bad_input_is_refused_in_one_line_before_anything(scratch, command, args, words, env, cwd):
    tmp = str(scratch)
    fill = lambda text: text.replace("{tmp}", tmp)  # noqa: E731
    tag = uuid.uuid4().hex
    environ = dict(os.environ, PYTHONPATH=ROOT, **{MARKER: tag})
    environ.pop("DS2_RUNNER", None)
    for name, value in env.items():
        environ[name] = fill(value) if name != "PYTHONPATH" else fill(value) + os.pathsep + ROOT
    where = {"tmp": tmp, "root": ROOT}.get(cwd) or os.path.join(ROOT, cwd)
    before, status_before = tree(tmp), git_status() if cwd != "tmp" else None
    assert_refused(command, [fill(a) for a in args], PROGS[id(command)], [fill(w) for w in words], where, environ,
                   SECONDS)
    assert tree(tmp) == before, "the command wrote into its scratch directory"
    if status_before is not None:                    # None: the case runs in its scratch folder (checked above)
        assert git_status() == status_before, "the command changed the checkout"
    assert marked_processes(tag, name=MARKER) == [], "a process the command started outlived it"


def test_every_promised_refusal_is_in_the_table():
    """The table keeps a case for each input this suite promises to refuse (a renamed case is fine, a dropped one
    is not)."""
    ids = {p.id for p in CASES}
    for name in ("results-dir-empty-from-root", "hosts-empty-with-workers", "init-weights-empty", "output-empty",
                 "hostfile-uneven-slots-torchrun", "prepare-wheelhouse-in-proc", "prepare-wheelhouse-a-file",
                 "runner-current-broken-import", "envs-dir-in-proc", "workers-100000", "batch-and-scale-a-billion",
                 "timeout-1e20", "frameworks-empty-item-and-twice", "report-results-dir-misspelt",
                 "report-unknown-argument", "rosetta-unknown-argument", "simulate-hosts-up-huge",
                 "simulate-hosts-up-08", "simulate-hosts-up-extra", "skip-unknown-part", "skip-empty-item",
                 "skip-twice"):
        assert name in ids, name


def test_skip_is_refused_for_a_notebook_without_the_parameter():
    """Every row's notebook declares ``skip``, so no row can be named to run_all.py for this refusal; the check that
    refuses --skip for a notebook without the parameter (runner/cli_checks.py) is held here to a notebook without it
    (the data-parallel fixture): one line that names it."""
    from runner.run.targets import ALL_TARGETS, Target
    assert cli_checks.skip_errors(["forward"], list(ALL_TARGETS.values())) == []
    fixture = Target("fixture", "Fixture (stdlib)", "../tests/fixtures/dp_fixture.ipynb", "pytorch")
    errors = cli_checks.skip_errors(["forward"], [ALL_TARGETS["pytorch"], fixture])
    assert len(errors) == 1 and "\n" not in errors[0], errors
    for words in ("--skip forward", "of fixture declares no skip parameter", "without --skip"):
        assert words in errors[0], (words, errors[0])
    assert "pytorch" not in errors[0]


def test_the_bounds_come_from_the_machine_and_the_spec():
    """--workers: 2 per usable core (the test suite's 2 workers stay allowed on one core); the memory bound is the
    iterator's own arithmetic (common/data.py), checked against a real iterator's arrays."""
    assert cli_checks.workers_error(2, False, cores=1) is None
    assert "at most 2 workers per core (2 here)" in cli_checks.workers_error(3, False, cores=1)
    assert cli_checks.workers_error(3, True, cores=1) is None and cli_checks.workers_error(99, False, hosts=True) is None
    from common.data import DeepMarkIterator
    it = DeepMarkIterator(4, scale=2, seed=0, n_freq=161)
    need = cli_checks.iterator_bytes(4, 2, 161, range(1, 16))
    assert need["pool"] == it._pool.nbytes * cli_checks.POOL_PEAK_BYTES // 4      # float32 kept, float64 drawn
    assert it._labels.nbytes <= need["plan"] <= it._labels.nbytes + len(it) * cli_checks.BATCH_PLAN_BYTES
    from common.spec import get_preset
    smoke = get_preset("smoke")
    assert cli_checks.memory_error([smoke], 1, 1, True, available=10 ** 12) is None
    line = cli_checks.memory_error([smoke.with_overrides(batch_size=10 ** 6)], 1, 1, True, available=10 ** 9)
    assert line.startswith("--batch-size 1000000:") and "batch sizes up to" in line
    fits = int(line.rsplit("batch sizes up to ", 1)[1].split()[0])
    assert cli_checks.memory_error([smoke.with_overrides(batch_size=fits)], 1, 1, True, available=10 ** 9) is None
    assert cli_checks.memory_error([smoke.with_overrides(batch_size=fits + 1)], 1, 1, True, available=10 ** 9)
    # two workers: each of the two processes holds the iterator of the global batch (2 x b)
    two = cli_checks.memory_error([smoke.with_overrides(batch_size=fits)], 2, 2, True, available=10 ** 9)
    assert two and "each of 2 worker processes" in two


def test_names_itself_and_the_results_folder_rules(tmp_path):
    assert validate.names_itself("results") and validate.names_itself("/tmp/r") and validate.names_itself("a/b/")
    assert not any(validate.names_itself(a) for a in ("", ".", "./", "..", "results/..", "/"))
    assert validate.results_dir_error("--results-dir", os.path.join(ROOT, "results")) is None   # the default
    assert validate.results_dir_error("--results-dir", str(tmp_path / "new")) is None
    assert not os.path.exists(str(tmp_path / "new"))                                            # tried, not made
    page = tmp_path / "page.md"
    page.write_text(validate.REPORT_TITLE + "\n\nold\n")
    assert validate.output_error("--output", str(page)) is None
    (tmp_path / "empty.md").write_text("")
    assert validate.output_error("--output", str(tmp_path / "empty.md")) is None
    (tmp_path / "notes.md").write_text("# My notes\n")
    assert "not a results page" in validate.output_error("--output", str(tmp_path / "notes.md"))
