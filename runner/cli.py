"""The command line of run_all.py."""
import argparse
import os
import shlex
import sys
from typing import List, Optional

from common import envinfo
from common.spec import CONTROL_PRECISION, LEARN_PRESETS, PRECISIONS, PRESETS, SKIPPABLE, get_preset, is_learn_preset

from . import cntk_python, envs, execute, interrupt, preflight, report
from . import installed as installed_mod
from . import validate, wheelhouse
from .bootstrap import ROOT, EnvError
from .targets import ALL_TARGETS, ENVS, TARGETS, VARIANTS, names, variants_of
from .validate import OneLineParser, non_empty, positive_int, positive_int_list, seconds  # noqa: F401


def comma_list(choices, what):
    """A comma list of ``choices``, each once (runner/validate.py); ``all`` alone is every row of record."""
    return validate.comma_list(choices, what, everything=list(TARGETS) if what == "framework" else None)


def preset_name(text: str) -> str:
    try:
        return get_preset(text).name
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


def env_python(text: str):
    name, sep, path = text.partition("=")
    if not sep or name not in ENVS or not path:
        raise argparse.ArgumentTypeError("expected ENV=PATH with ENV one of: %s; got %r" % (", ".join(ENVS), text))
    return name, path


def gpu_build(text: str):
    """ENV=BUILD for --gpu-build (runner/preflight.py BUILDS)."""
    try:
        return preflight.parse_overrides(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="run_all.py", description="Run the DS2 notebooks of every framework and write results.md.")
    p.add_argument("--frameworks", type=comma_list(list(ALL_TARGETS), "framework"), default=list(TARGETS),
                   help="comma-separated targets, or 'all' (default: every row of record). Targets: %s; "
                        "variants: %s" % (names(), ", ".join(VARIANTS)))
    p.add_argument("--variants", action="store_true",
                   help="also run each selected framework's fastest known variant (its own row)")
    p.add_argument("--preset", type=preset_name, default=None,
                   help="%s (default: deepmark on a CUDA GPU, smoke otherwise); %s: the real task, a DS2 learns "
                        "spoken English to a target CER (docs/real-task.md)" % (" | ".join(PRESETS),
                                                                                " | ".join(LEARN_PRESETS)))
    p.add_argument("--batch-size", type=positive_int_list, default=None, metavar="N[,M...]",
                   help="comma-separated minibatch sizes, each its own row (default: the preset's)")
    p.add_argument("--scale", type=positive_int, default=None,
                   help="utterances per percent point of the length mix (default: the preset's)")
    p.add_argument("--precision", type=comma_list(list(PRECISIONS) + [CONTROL_PRECISION], "precision"), default=["fp32"],
                   help="comma-separated: fp32 (TF32 off), tf32, bf16 (default fp32; on a CPU fp32 and, where the framework "
                        "has it, bf16); fp64: the float64 control, pytorch only (a reference trajectory, not a row)")
    p.add_argument("--profile", action="store_true",
                   help="also profile one training step on an 8-s batch (the record's profile section)")
    p.add_argument("--skip", type=validate.comma_list(list(SKIPPABLE), "part"), default=[], metavar="PARTS",
                   help="comma-separated parts each notebook leaves out: %s; export goes with onnx. The record says "
                        "what was skipped (options.skipped). For a timed run where only the training matters (a "
                        "lent GPU, tools/gpu_session.py); the notebook needs a skip parameter"
                        % ", ".join(SKIPPABLE))
    p.add_argument("--seed", type=validate.seed, default=0,
                   help="seed of data and initial weights, 0 to %d (default 0)" % validate.MAX_SEED)
    p.add_argument("--init-weights", type=non_empty("file"), default=None, metavar="NPZ",
                   help="start every notebook from this canonical .npz (e.g. another run's export, results/weights/"
                        "*.npz) instead of the canonical initial weights of --seed; checked against the preset's "
                        "model before anything runs (docs/migration.md)"),
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda when nvidia-smi sees a GPU (default)")
    p.add_argument("--workers", type=positive_int, default=1,
                   help="data-parallel processes per target (default 1; without --hosts at most %d per usable core "
                        "of this machine); --batch-size is then per worker and --timeout bounds the whole run "
                        "(runner/distributed.py)" % validate.WORKERS_PER_CORE)
    p.add_argument("--oversubscribe", action="store_true",
                   help="with --workers W: start W processes on this machine even when W exceeds %d per usable "
                        "core" % validate.WORKERS_PER_CORE)
    p.add_argument("--mxnet-dp", choices=["sync", "local", "dist_sync"], default="sync",
                   help="MXNet with --workers W: sync (default: one process, W devices, SyncBatchNorm), local (the same, "
                        "each device its own BatchNorm statistics), dist_sync (W processes + a ps-lite scheduler and "
                        "server; per-worker statistics; equals local) (runner/distributed.py MXNET_DP_MODES)")
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
                   help="seconds a notebook cell may run, at most %d (a week; default: no limit)" % validate.MAX_TIMEOUT_S)
    p.add_argument("--results-dir", default=os.path.join(ROOT, "results"),
                   help="where records and executed notebooks go (default: results/; never the repository root, and a folder "
                        "of tracked files only when named)")
    p.add_argument("--output", default=None, help="the Markdown table (default: results.md, or <results-dir>/results.md "
                                                  "for another results dir)")
    p.add_argument("--python", type=env_python, action="append", default=[], metavar="ENV=PATH",
                   help="build environment ENV from this interpreter")
    p.add_argument("--use-installed", type=env_python, action="append", default=[], metavar="ENV=PYTHON",
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
                        "else python3.6 on PATH, pyenv's or conda's; see python3 -m runner.cntk_python)")
    p.add_argument("--setup-only", action="store_true", help="create the environments and kernels, run nothing")
    p.add_argument("--list", action="store_true", help="list targets and their environments, then exit")
    p.add_argument("--check", action="store_true",
                   help="print the GPU preflight (GPU, driver, which build of each framework runs here) and exit")
    p.add_argument("--gpu-build", type=gpu_build, action="append", default=[], metavar="ENV=BUILD",
                   help="force a CUDA build, e.g. pytorch=cu126 (env DS2_GPU_BUILD=pytorch=cu126,jax=cuda12); "
                        "builds: %s" % "; ".join("%s: %s" % (e, ", ".join(b.name for b in bs))
                                                 for e, bs in preflight.BUILDS.items()))
    p.add_argument("--migrate", action="store_true",
                   help="load every selected framework's exported weights (results/weights/, from their last runs with "
                        "this preset, precision and batch size) into every selected framework: only the notebooks' "
                        "cells up to the correctness check plus the export cell run, no training; records in "
                        "results/migration/, the matrix in results.md (runner/migrate.py)")
    p.add_argument("--migrate-to", type=comma_list(list(ALL_TARGETS), "framework"), default=None, metavar="T[,T...]",
                   help="with --migrate: load the --frameworks exports into these frameworks only (default: into every "
                        "one of --frameworks), e.g. --frameworks mxnet,cntk --migrate-to pytorch,jax")
    p.add_argument("--no-progress", action="store_true", help="no papermill progress bars")
    return p


def output_paths(args) -> tuple:
    """The results directory and the results page, absolute (runner/validate.py output_default)."""
    results_dir = os.path.abspath(args.results_dir)
    return results_dir, os.path.abspath(args.output or validate.output_default(results_dir))


def python_error(env_name: str, path: str) -> Optional[str]:
    """Why the interpreter given for an environment (--python ENV=PATH) cannot build it, or None."""
    env = ENVS[env_name]
    if env.shared_python:
        cand = cntk_python.check(path, "--python %s=" % env_name)
        return None if cand.ok else "--python %s=%s %s" % (env_name, path, cand.reason)
    facts, reason = cntk_python.probe(path)
    if facts is None:
        return "--python %s=%s: %s" % (env_name, path, reason)
    problem = env.python_problem(facts["version"])
    if problem:
        return "--python %s=%s is Python %s; %s" % (env_name, path, facts["version"], problem)
    return None


def resolve_pythons(args, env_names: List[str]):
    """The interpreters per environment, what to say about them, the errors, and the environments whose
    interpreter was found rather than given: every --python is checked, and the CNTK interpreter is
    given (--cntk-python, DS2_CNTK_PYTHON) or found."""
    pythons, notes, errors, discovered = {}, [], [], set()
    for name, path in args.python:
        error = python_error(name, path)
        if error:
            errors.append(error)
        pythons[name] = path
    if "cntk" in ENVS and "cntk" not in pythons and (
            "cntk" in env_names or args.cntk_python or os.environ.get(cntk_python.ENV_VAR)):
        found = cntk_python.discover(args.cntk_python)
        if found.error:
            errors.append(found.error)
        elif found.chosen:
            pythons["cntk"] = found.path
            if found.given is None:
                discovered.add("cntk")
        if "cntk" in env_names:
            notes += found.lines()
    elif "cntk" in pythons and "cntk" in env_names:
        notes.append("CNTK interpreter: %s (from --python cntk=)" % pythons["cntk"])
    return pythons, notes, errors, discovered


def resolve_installed(args):
    """{env: interpreter} of --use-installed and DS2_USE_INSTALLED (the option wins), and the errors: an unknown
    environment, an interpreter that is not there, an environment also given --python."""
    errors, out = [], {}
    try:
        from_env = installed_mod.parse_assignments(os.environ.get("DS2_USE_INSTALLED", ""))
    except ValueError as e:
        return {}, ["DS2_USE_INSTALLED: %s" % e]
    for name, path in from_env:
        if name not in ENVS:
            errors.append("DS2_USE_INSTALLED: unknown environment %r; choose from: %s" % (name, ", ".join(ENVS)))
        out[name] = path
    for name, path in args.use_installed:
        out[name] = path
    for name, path in out.items():
        if name in dict(args.python):
            errors.append("--use-installed %s and --python %s: one runs the interpreter as it is, the other builds an "
                          "environment from it; give one" % (name, name))
        elif not (os.path.isfile(path) and os.access(path, os.X_OK)):
            errors.append("--use-installed %s=%s: no such executable" % (name, path))
    return {k: os.path.abspath(v) for k, v in out.items()}, errors


def offline_preflight(args, env_names, targets, device, gpus, gpu_builds, pythons, installed) -> dict:
    """Before anything runs: every environment still to be made is in the wheelhouse (``--wheelhouse``: asked of
    pip, offline), and every interpreter of ``--use-installed`` has what its rows import (its versions printed
    beside the pins).  Returns {env: the installed interpreter's probe}; raises EnvError with one line."""
    if args.wheelhouse:
        for env_name in [e for e in env_names if e not in installed]:
            decision = preflight.decide(env_name, gpus[0], gpu_builds.get(env_name)) if device == "cuda" else None
            if decision is not None and not decision.runs:
                continue
            build = decision.build if decision else None
            env = ENVS[env_name]
            if envs.status(env, device, pythons.get(env_name), build) == "ready" or \
                    (env.needs_python and env_name not in pythons):
                continue
            wheelhouse.check(args.wheelhouse, env.requirements(device, build),
                             envs.python_version(pythons.get(env_name) or envs.default_python()),
                             "environment %s" % env_name, pip_spec=env.pip)
    facts = {}
    for env_name in [e for e in env_names if e in installed]:
        used = [t for t in targets if t.env == env_name]
        facts[env_name], lines = installed_mod.check_env(ENVS[env_name], device, used, installed[env_name])
        print("\n".join(lines))
    return facts


def shown(path: str) -> str:
    """A path as the user reads it best: relative inside the current directory, absolute outside."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def error(message: str, status: int = 2) -> int:
    """One ``run_all.py: error:`` line on stderr; the exit status (2: bad input, refused before anything starts)."""
    interrupt.stderr_line("run_all.py: error: %s" % message.replace("\n", " "))
    return status


def select_targets(frameworks: List[str], with_variants: bool = False) -> list:
    """The targets of ``--frameworks`` in order; ``--variants`` adds each one's variant targets
    (``<row>+<variant>``) after them, once each."""
    targets = [ALL_TARGETS[name] for name in frameworks]
    if with_variants:
        targets += [v for t in list(targets) for v in variants_of(t.name) if v not in targets]
    return targets


def main(argv=None) -> int:
    previous = interrupt.install()
    try:
        return _main(argv)
    except interrupt.Interrupted as e:   # while checking or building (a notebook's run says more: _main)
        interrupt.stderr_line("run_all.py: %s" % e.reason)
        return e.exit_status
    finally:
        envs.stop_ahead()                # environments still being made in the background: ended, none outlives
        interrupt.restore(previous)


def _main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    targets = select_targets(args.frameworks, args.variants)
    destinations = select_targets(args.migrate_to) if args.migrate_to else targets
    env_names = list(ENVS) if args.list else sorted(set(t.env for t in targets + destinations), key=list(ENVS).index)
    # every option, variable, path and interpreter is checked before anything is built (runner/validate.py)
    results_dir, output = output_paths(args)
    errors = validate.run_all_errors(args, targets)
    pythons, notes, python_errors, discovered = resolve_pythons(args, env_names)
    errors += python_errors
    installed, installed_errors = resolve_installed(args)
    errors += installed_errors
    try:
        gpu_builds = preflight.env_overrides()
    except ValueError as e:
        errors.append("DS2_GPU_BUILD: %s" % e)
    else:
        for forced in args.gpu_build:
            gpu_builds.update(forced)
    if errors:
        return error(errors[0])
    if args.prepare_wheelhouse:          # for another machine: this one's GPU does not matter
        return _prepare_wheelhouse(args, env_names, gpu_builds)
    gpus = envinfo.gpus()
    device = args.device if args.device != "auto" else ("cuda" if gpus else "cpu")
    if device == "cuda" and not gpus:
        return error("--device cuda, but nvidia-smi sees no GPU")

    if args.check:
        print("\n".join(preflight.report(TARGETS.values(), gpus if device == "cuda" else [], gpu_builds, details=True)))
        return 0
    if args.list:
        print("device: %s%s" % (device, " (%s)" % gpus[0]["name"] if gpus and device == "cuda" else ""))
        decisions = preflight.plan(ALL_TARGETS.values(), gpus[0], gpu_builds) if device == "cuda" else {}
        for t in ALL_TARGETS.values():
            env = ENVS[t.env]
            build = decisions[t.name].build if t.name in decisions else None
            state = envs.status(env, device, pythons.get(env.name), build)
            present = "" if os.path.exists(t.notebook_path) else "  [notebook missing]"
            print("%-18s %-40s env %-10s %-8s %s%s" % (t.name, t.label, env.name, state, env.python_hint, present))
        for line in notes:
            print(line)
        print("\n".join(preflight.report(TARGETS.values(), gpus if device == "cuda" else [], gpu_builds)))
        return 0

    preset_name_given = args.preset is not None
    if not preset_name_given:
        args.preset = "deepmark" if device == "cuda" else "smoke"
    if is_learn_preset(args.preset):       # the real task (common/learn.py): its own batch, corpus, one process
        if args.batch_size or args.scale or args.workers > 1 or args.migrate:
            return error("--preset %s sets its own batch size and corpus and trains in one process: drop "
                         "--batch-size, --scale, --workers and --migrate" % args.preset)
        args.skip = args.skip or list(SKIPPABLE)   # pure benchmark parts; its record says what was skipped
    presets = [get_preset(args.preset).with_overrides(batch_size=bs, scale=args.scale)
               for bs in (args.batch_size or [None])]
    preset = presets[0]
    # the data must fit this machine's memory (each local worker process builds the global batch's iterator)
    problem = validate.memory_error(presets, args.workers, 1 if args.host_list else args.workers,
                                    args.batch_size is not None)
    if problem:
        return error(problem)
    if args.init_weights:                 # a bad file is one line now, not eight failed notebooks later
        from common.weights import WeightsError, load_state
        args.init_weights = os.path.abspath(args.init_weights)
        try:
            load_state(args.init_weights, preset.config)
        except WeightsError as e:
            return error("--init-weights: %s (preset %s)" % (e, preset.name))

    def run_options(precision, run_preset, command="", facts=None):
        return execute.RunOptions(run_preset, precision, args.seed, device, results_dir, timeout=args.timeout,
                                  pythons=pythons, command=command, gpu=gpus[0] if gpus else None,
                                  progress=not args.no_progress, found=discovered, gpu_builds=gpu_builds,
                                  profile=args.profile, init_weights=args.init_weights, installed=installed,
                                  installed_facts=facts or {}, wheelhouse=args.wheelhouse, skip=args.skip)

    runs = [(t, prec, p) for t in targets for prec in args.precision for p in presets]
    if not args.migrate and not args.setup_only:      # every row skipped for a reason known now: nothing starts
        reason = validate.nothing_runs(runs, lambda t, prec, p: execute.can_run(t, run_options(prec, p))[1:])
        if reason:
            return error(reason, status=1)
    for line in notes:
        print(line)
    if not preset_name_given:
        print("No --preset given: %s (%s)." % (args.preset, "a CUDA GPU is visible" if device == "cuda"
                                                 else "no CUDA GPU visible; use a GPU machine for the real benchmark, "
                                                      "or for the full model on this CPU: --preset cpu"))
    if device == "cuda":
        print("\n".join(preflight.report([t for t in targets if t.env not in installed], gpus, gpu_builds)))
    try:
        installed_facts = offline_preflight(args, env_names, targets + destinations, device, gpus, gpu_builds, pythons,
                                            installed)
    except EnvError as e:            # a wheel the wheelhouse lacks, a package the installed interpreter lacks
        return error(str(e))

    if args.setup_only:
        failed = 0
        envs.start_ahead([(ENVS[e], device, pythons.get(e), b, args.wheelhouse) for e, b in
                          _builds_to_make(env_names, device, gpus, gpu_builds, installed)], verbose=not args.no_progress)
        for env_name in env_names:
            decision = preflight.decide(env_name, gpus[0], gpu_builds.get(env_name)) if device == "cuda" else None
            if decision is not None and not decision.runs:
                print("%s: skipped: %s" % (env_name, decision.reason))
                continue
            try:
                if env_name in installed:          # nothing to make: the interpreter's kernel
                    kernel = installed_mod.kernel(ENVS[env_name], device, installed[env_name],
                                                  installed_facts[env_name])
                else:
                    kernel = envs.ensure(ENVS[env_name], device, pythons.get(env_name),
                                         build=decision.build if decision else None, wheelhouse=args.wheelhouse)
                print("%s: ready (kernel %s)" % (env_name, kernel))
            except EnvError as e:
                failed += 1
                print("%s: %s" % (env_name, e))
        return 1 if failed else 0

    command = "python run_all.py" + "".join(" " + shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    if args.migrate:
        return _migrate(args, targets, destinations, presets, device, results_dir, output, pythons, command, gpus,
                        discovered, gpu_builds, installed, installed_facts)
    print("Running %d notebook(s) on %s, preset %s (batch size %s, scale %d)%s, results in %s"
          % (len(runs), device, preset.name, ",".join(str(p.batch_size) for p in presets), preset.scale,
             ", profiling one step" if args.profile else "", shown(results_dir)))
    records, printed = [], 0
    stopped = None
    if not args.print_host_commands:   # the later rows' environments are made while the first rows run
        envs.start_ahead(_row_environments(runs, run_options), verbose=not args.no_progress)
    for i, (target, precision, run_preset) in enumerate(runs, 1):
        print("[%d/%d] %s, %s, batch %d" % (i, len(runs), target.name, precision, run_preset.batch_size), flush=True)
        opts = run_options(precision, run_preset, command, installed_facts)
        try:
            if args.workers > 1:
                from . import distributed
                rec = distributed.run_target(target, opts, args.workers, mxnet_dp=args.mxnet_dp, hosts=args.host_list,
                                             ssh_options=args.ssh_options, join_timeout=args.join_timeout,
                                             print_host_commands=args.print_host_commands)
                if rec is None:                 # --print-host-commands: printed, nothing ran
                    printed += 1
                    continue
                records.append(rec)
            else:
                records.append(execute.run_target(target, opts))
        except interrupt.Interrupted as e:
            stopped = (e, "%s %s batch %d" % (target.name, precision, run_preset.batch_size))
            break
    statuses = [r["status"] for r in records]
    if args.print_host_commands:        # what was printed counts as run; a row that could not be is skipped or failed
        return (1 if "failed" in statuses else 0) if printed else _exit_status(records)
    if stopped is None:
        with interrupt.deferred():      # results.md is written whole; a signal now stops the run after it
            report.write(results_dir, output, command, execute.git_commit(), warn=warning_line)
    else:                               # a second signal now exits at once (runner.interrupt)
        report.write(results_dir, output, command, execute.git_commit(), warn=warning_line)
        e, where = stopped
        interrupt.stderr_line("run_all.py: %s during %s: recorded as failed; %s regenerated from the records in %s"
                              % (e.reason, where, shown(output), shown(results_dir)))
        return e.exit_status
    print("Wrote %s: %d ok, %d failed, %d skipped." % (shown(output), statuses.count("ok"),
                                                     statuses.count("failed"), statuses.count("skipped")))
    return _exit_status(records)


def _builds_to_make(env_names, device, gpus, gpu_builds, installed):
    """(environment name, CUDA build or None) of each environment ``--setup-only`` makes, in order."""
    out = []
    for env_name in env_names:
        decision = preflight.decide(env_name, gpus[0], gpu_builds.get(env_name)) if device == "cuda" else None
        if env_name not in installed and (decision is None or decision.runs):
            out.append((env_name, decision.build if decision else None))
    return out


def _row_environments(runs, run_options):
    """(env, device, interpreter, build, wheelhouse) of the environment each row of ``runs`` needs made, in the
    order of the rows: none for a row that cannot run here, runs as installed, or whose system piece is missing."""
    out = []
    for target, precision, run_preset in runs:
        opts = run_options(precision, run_preset)
        decision, _, reason = execute.can_run(target, opts)
        env = ENVS[target.env]
        if reason or env.name in opts.installed or (env.needs and env.name in opts.found and env.needs()):
            continue
        out.append((env, opts.device, opts.pythons.get(env.name), decision.build if decision else None,
                    opts.wheelhouse))
    return out


def warning_line(message: str) -> None:
    """One ``run_all.py: warning:`` line on stderr (an unreadable record the report leaves out)."""
    interrupt.stderr_line("run_all.py: warning: %s" % message)


def _exit_status(records: List[dict]) -> int:
    """0 when a selected row ran and none failed; 1 when one failed or none ran (every one skipped or failed),
    with a line saying so."""
    reason = validate.none_ran(records)
    if reason:
        interrupt.stderr_line("run_all.py: %s" % reason)
        return 1
    return 1 if any(r["status"] == "failed" for r in records) else 0


def _prepare_wheelhouse(args, env_names, gpu_builds) -> int:
    """``--prepare-wheelhouse DIR``: every wheel the selected rows' environments and the runner need, for the
    machine named by --device, --wheelhouse-python and --wheelhouse-platform; then the total size."""
    device = "cpu" if args.device == "auto" else args.device
    directory = os.path.abspath(args.prepare_wheelhouse)
    os.makedirs(directory, exist_ok=True)
    target_python = args.wheelhouse_python or "%d.%d" % sys.version_info[:2]
    print("Downloading into %s the wheels of %s (%s) and of the runner, for Python %s%s:"
          % (shown(directory), ", ".join(env_names), device, target_python,
             " on " + ", ".join(args.wheelhouse_platform) if args.wheelhouse_platform else " on this platform"))
    jobs = [(os.path.join(ROOT, "envs", "runner.txt"), target_python, "pip")]
    for env_name in env_names:
        env = ENVS[env_name]
        version = target_python
        if env.python_problem(version + ".0"):          # CNTK's 3.6, MXNet's <= 3.11: the version it needs
            version = env.python_versions[1] if env.python_versions[1] else env.python_versions[0]
            print("  (%s needs Python %s: its wheels are for %s)" % (env_name, env.python_range(), version))
        build = preflight.get_build(env_name, gpu_builds[env_name]) if device == "cuda" and env_name in gpu_builds \
            else None                               # a forced build (--gpu-build), else the default CUDA pins
        jobs.append((env.requirements(device, build), version, env.pip))
    try:
        for requirements, version, pip_spec in jobs:
            wheelhouse.download(directory, requirements, version, args.wheelhouse_platform, pip_spec)
    except EnvError as e:
        return error(str(e))
    files = [n for n in os.listdir(directory) if n.endswith(".whl")]
    print("Wrote %d wheels, %s in all, to %s. On the machine without a registry: python run_all.py --wheelhouse %s"
          % (len(files), wheelhouse.shown_size(wheelhouse.total_bytes(directory)), shown(directory),
             shown(directory)))
    return 0


def _migrate(args, targets, destinations, presets, device, results_dir, output, pythons, command, gpus, discovered,
             gpu_builds, installed, installed_facts) -> int:
    """``--migrate``: the matrix of every selected source's export loaded into every destination (``--migrate-to``,
    else the sources), per precision and batch size (runner/migrate.py); then results.md."""
    from . import migrate
    print("Migrating %d framework(s) into %s on %s, preset %s (batch size %s), from the exports in %s"
          % (len(targets), "each other" if destinations == targets else ", ".join(t.name for t in destinations),
             device, presets[0].name, ",".join(str(p.batch_size) for p in presets),
             shown(os.path.join(results_dir, "weights"))), flush=True)
    records = []
    stopped = None
    for precision in args.precision:
        for run_preset in presets:
            opts = execute.RunOptions(run_preset, precision, args.seed, device, results_dir, timeout=args.timeout,
                                      pythons=pythons, command=command, gpu=gpus[0] if gpus else None,
                                      progress=not args.no_progress, found=discovered, gpu_builds=gpu_builds,
                                      installed=installed, installed_facts=installed_facts,
                                      wheelhouse=args.wheelhouse)
            try:
                records += migrate.run_matrix(targets, opts, destinations=destinations)
            except interrupt.Interrupted as e:
                stopped = (e, "the migration matrix (%s, batch %d)" % (precision, run_preset.batch_size))
                break
        if stopped:
            break
    if stopped is None:
        with interrupt.deferred():      # results.md is written whole
            report.write(results_dir, output, command, execute.git_commit(), warn=warning_line)
    else:                               # a second signal now exits at once (runner.interrupt)
        report.write(results_dir, output, command, execute.git_commit(), warn=warning_line)
        e, where = stopped
        interrupt.stderr_line("run_all.py: %s during %s: recorded as failed; %s regenerated" % (e.reason, where,
                                                                                                 shown(output)))
        return e.exit_status
    statuses = [r["status"] for r in records]
    print("Wrote %s: %d migrations ok, %d failed, %d skipped (records in %s)."
          % (shown(output), statuses.count("ok"), statuses.count("failed"), statuses.count("skipped"),
             shown(migrate.migration_dir(results_dir))))
    return _exit_status(records)
