"""The options of run_all.py: the argparse parser, each option's type checked as it is parsed (one line, exit
status 2: runner/validate.py).  The checks between options, and against the machine, come after the parse
(runner/cli.py ``validate``, runner/cli_checks.py)."""
import argparse
import os

from common.spec import CONTROL_PRECISION, LEARN_PRESETS, PRECISIONS, PRESETS, SKIPPABLE, get_preset

from runner import cli_checks
from runner import validate as input_checks
from runner.base import ROOT
from runner.envs import gpu_preflight
from runner.envs.definitions import ENVS
from runner.run.targets import ALL_TARGETS, TARGETS, VARIANTS, names
from runner.validate import OneLineParser, non_empty, positive_int, positive_int_list, seconds


def choice_list(choices, what):
    """A comma list of ``choices``, each once (runner/validate.py); ``all`` alone is every row of record."""
    return input_checks.comma_list(choices, what, everything=list(TARGETS) if what == "framework" else None)


def preset_name(text: str) -> str:
    try:
        return get_preset(text).name
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


def env_assignment(text: str):
    name, sep, path = text.partition("=")
    if not sep or name not in ENVS or not path:
        raise argparse.ArgumentTypeError("expected ENV=PATH with ENV one of: %s; got %r" % (", ".join(ENVS), text))
    return name, path


def gpu_build(text: str):
    """ENV=BUILD for --gpu-build (runner/envs/gpu_preflight.py BUILDS)."""
    try:
        return gpu_preflight.parse_overrides(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


# long: one add_argument per option, in the order --help lists them; splitting it would scatter the options
def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="run_all.py", description="Run the DS2 notebooks of every framework and write results.md.")
    p.add_argument("--frameworks", type=choice_list(list(ALL_TARGETS), "framework"), default=list(TARGETS),
                   help="comma-separated targets, or 'all' (default: every row of record). Targets: %s; "
                        "variants: %s" % (names(), ", ".join(VARIANTS)))
    p.add_argument("--variants", action="store_true",
                   help="also run every variant of each selected framework, each its own row")
    p.add_argument("--preset", type=preset_name, default=None,
                   help="%s (default: deepmark on a CUDA GPU, smoke otherwise); %s: the real task, a DS2 learns "
                        "spoken English to a target CER (docs/real-task.md)" % (" | ".join(PRESETS),
                                                                                " | ".join(LEARN_PRESETS)))
    p.add_argument("--batch-size", type=positive_int_list, default=None, metavar="N[,M...]",
                   help="comma-separated minibatch sizes, each its own row (default: the preset's)")
    p.add_argument("--scale", type=positive_int, default=None,
                   help="utterances per percent point of the length mix (default: the preset's)")
    p.add_argument("--precision", type=choice_list(list(PRECISIONS) + [CONTROL_PRECISION], "precision"), default=["fp32"],
                   help="comma-separated: fp32 (TF32 off), tf32, bf16 (default fp32; on a CPU fp32 and, where the framework "
                        "has it, bf16); fp64: the float64 control, pytorch only (a reference trajectory, not a row)")
    p.add_argument("--profile", action="store_true",
                   help="also profile one training step on an 8-s batch (the record's profile section)")
    p.add_argument("--skip", type=input_checks.comma_list(list(SKIPPABLE), "part"), default=[], metavar="PARTS",
                   help="comma-separated parts each notebook leaves out: %s; export goes with onnx. The record says "
                        "what was skipped (options.skipped). For a timed run where only the training matters (a "
                        "lent GPU, tools/gpu_session.py); the notebook needs a skip parameter"
                        % ", ".join(SKIPPABLE))
    p.add_argument("--seed", type=input_checks.seed, default=0,
                   help="seed of data and initial weights, 0 to %d (default 0)" % input_checks.MAX_SEED)
    p.add_argument("--init-weights", type=non_empty("file"), default=None, metavar="NPZ",
                   help="start every notebook from this canonical .npz (e.g. another run's export, results/weights/"
                        "*.npz) instead of the canonical initial weights of --seed; checked against the preset's "
                        "model before anything runs (docs/migration.md)"),
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda when nvidia-smi sees a GPU (default)")
    p.add_argument("--workers", type=positive_int, default=1,
                   help="data-parallel processes per target (default 1; without --hosts at most %d per usable core "
                        "of this machine); --batch-size is then per worker and --timeout bounds the whole run "
                        "(runner/dp/launch.py)" % cli_checks.WORKERS_PER_CORE)
    p.add_argument("--oversubscribe", action="store_true",
                   help="with --workers W: start W processes on this machine even when W exceeds %d per usable "
                        "core" % cli_checks.WORKERS_PER_CORE)
    p.add_argument("--mxnet-dp", choices=["sync", "local", "dist_sync"], default="sync",
                   help="MXNet with --workers W: sync (default: one process, W devices, SyncBatchNorm), local (the same, "
                        "each device its own BatchNorm statistics), dist_sync (W processes + a ps-lite scheduler and "
                        "server; per-worker statistics; equals local) (runner/run/targets.py MXNET_DP_MODES)")
    p.add_argument("--hosts", type=non_empty("hostfile"), metavar="HOSTFILE", default=None,
                   help="with --workers W: train on several machines, one host[:slots] per line (W = the slots' sum); "
                        "each host's processes start over ssh with the framework's own multi-node launcher "
                        "(docs/data-parallel.md)")
    p.add_argument("--ssh", default="", metavar="OPTIONS",
                   help="options for ssh with --hosts, one string (e.g. \"-F /run/ds2-hosts/ssh_config\")")
    p.add_argument("--join-timeout", type=seconds, default=None, metavar="S",
                   help="with --hosts: seconds within which every host must start its processes (default 60; at "
                        "most a week)")
    p.add_argument("--print-host-commands", action="store_true",
                   help="with --hosts: print each host's command (for a Slurm or Kubernetes job) instead of running")
    p.add_argument("--timeout", type=seconds, default=None,
                   help="seconds a notebook cell may run, at most %d (a week; default: no limit)" % input_checks.MAX_TIMEOUT_S)
    p.add_argument("--results-dir", default=os.path.join(ROOT, "results"),
                   help="where records and executed notebooks go (default: results/; never the repository root, and a folder "
                        "of tracked files only when named)")
    p.add_argument("--output", default=None, help="the Markdown table (default: results.md, or <results-dir>/results.md "
                                                  "for another results dir)")
    p.add_argument("--python", type=env_assignment, action="append", default=[], metavar="ENV=PATH",
                   help="build environment ENV from this interpreter")
    p.add_argument("--use-installed", type=env_assignment, action="append", default=[], metavar="ENV=PYTHON",
                   help="run ENV's rows in this interpreter as it is installed: no environment is made, pip is not "
                        "called (env DS2_USE_INSTALLED=pytorch=/usr/bin/python3,jax=/usr/bin/python3); a preflight "
                        "checks what the notebooks import and shows the versions beside the pins")
    p.add_argument("--wheelhouse", type=non_empty("directory"), default=None, metavar="DIR",
                   help="make every environment from the wheels in DIR, with no package index (env DS2_WHEELHOUSE); "
                        "a wheel it lacks is named before anything is made")
    p.add_argument("--prepare-wheelhouse", type=non_empty("directory"), default=None, metavar="DIR",
                   help="download into DIR every wheel the selected rows' environments and the runner need (for "
                        "--device, --wheelhouse-python and --wheelhouse-platform), print the total size, and exit")
    p.add_argument("--wheelhouse-python", type=non_empty("Python version"), default=None, metavar="X.Y",
                   help="with --prepare-wheelhouse: the Python version of the machine the wheels are for (default: "
                        "this one's; an environment that needs another, such as CNTK's 3.6, gets its own)")
    p.add_argument("--wheelhouse-platform", type=non_empty("platform tag"), action="append", default=[], metavar="TAG",
                   help="with --prepare-wheelhouse: a platform tag of that machine, repeatable (default: this "
                        "machine's), e.g. manylinux_2_28_x86_64")
    p.add_argument("--cntk-python", type=non_empty("interpreter"), default=None, metavar="PATH",
                   help="a CPython 3.6 (shared-library build) for the CNTK environment (default: DS2_CNTK_PYTHON, "
                        "else python3.6 on PATH, pyenv's or conda's; see python3 -m runner.envs.cntk_python)")
    p.add_argument("--setup-only", action="store_true", help="create the environments and kernels, run nothing")
    p.add_argument("--list", action="store_true", help="list targets and their environments, then exit")
    p.add_argument("--check", action="store_true",
                   help="print the GPU preflight (GPU, driver, which build of each framework runs here) and exit")
    p.add_argument("--gpu-build", type=gpu_build, action="append", default=[], metavar="ENV=BUILD",
                   help="force a CUDA build, e.g. pytorch=cu126 (env DS2_GPU_BUILD=pytorch=cu126,jax=cuda12); "
                        "builds: %s" % "; ".join("%s: %s" % (e, ", ".join(b.name for b in bs))
                                                 for e, bs in gpu_preflight.BUILDS.items()))
    p.add_argument("--migrate", action="store_true",
                   help="load every selected framework's exported weights (results/weights/, from their last runs with "
                        "this preset, precision and batch size) into every selected framework: only the notebooks' "
                        "cells up to the correctness check plus the export cell run, no training; records in "
                        "results/migration/, the matrix in results.md (runner/migrate.py)")
    p.add_argument("--migrate-to", type=choice_list(list(ALL_TARGETS), "framework"), default=None, metavar="T[,T...]",
                   help="with --migrate: load the --frameworks exports into these frameworks only (default: into every "
                        "one of --frameworks), e.g. --frameworks mxnet,cntk --migrate-to pytorch,jax")
    p.add_argument("--no-progress", action="store_true", help="no papermill progress bars")
    return p
