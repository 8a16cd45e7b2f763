"""The command line of run_all.py, on top of every package: the options parsed (runner/cli_options.py), then
checked together (:func:`validate`, runner/cli_checks.py), then the mode asked for, one function each:
--prepare-wheelhouse, --check, --list, --setup-only, --migrate, --print-host-commands, else the runs; results.md
after the runs (runner/report)."""
import os
import shlex
import sys
from typing import List, Optional

from common import envinfo
from common.spec import SKIPPABLE, get_preset, is_learn_preset

from runner import cli_checks, interrupt
from runner.cli_options import build_parser
from runner import validate as input_checks   # the checks every command shares; validate() below is run_all.py's
from runner.base import ROOT, EnvError
from runner.envs import framework_envs, gpu_preflight, wheelhouse
from runner.envs import use_installed as installed_mod
from runner.envs.definitions import ENVS
from runner.report import render
from runner.run import execute
from runner.run.targets import ALL_TARGETS, TARGETS, select_targets


def output_paths(args) -> tuple:
    """The results directory and the results page, absolute (runner/validate.py output_default)."""
    results_dir = os.path.abspath(args.results_dir)
    return results_dir, os.path.abspath(args.output or input_checks.output_default(results_dir))


def shown(path: str) -> str:
    """A path as the user reads it best: relative inside the current directory, absolute outside."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def error(message: str, status: int = 2) -> int:
    """One ``run_all.py: error:`` line on stderr; the exit status (2: bad input, refused before anything starts)."""
    interrupt.stderr_line("run_all.py: error: %s" % message.replace("\n", " "))
    return status


def main(argv=None) -> int:
    previous = interrupt.install()
    try:
        return _main(argv)
    except interrupt.Interrupted as e:   # while checking or building (a notebook's run says more: _main)
        interrupt.stderr_line("run_all.py: %s" % e.reason)
        return e.exit_status
    finally:
        framework_envs.stop_ahead()                # environments still being made in the background: ended, none outlives
        interrupt.restore(previous)


#: the variables that stand for run_all.py's options: the command a record keeps names them, as a rerun needs them
OPTION_VARIABLES = ("DS2_USE_INSTALLED", "DS2_GPU_BUILD", "DS2_WHEELHOUSE")


class Plan:
    """What run_all.py was asked to do, as :func:`validate` and the steps after it settle it: the rows, the
    environments, the interpreters, the device, the presets and the runs."""

    def __init__(self, args, argv=None):
        self.args = args
        self.targets = select_targets(args.frameworks, args.variants)
        self.destinations = select_targets(args.migrate_to) if args.migrate_to else self.targets
        self.env_names = list(ENVS) if args.list else sorted(set(t.env for t in self.targets + self.destinations),
                                                             key=list(ENVS).index)
        self.results_dir, self.output = output_paths(args)
        self.command = "".join("%s=%s " % (v, shlex.quote(os.environ[v])) for v in OPTION_VARIABLES
                               if os.environ.get(v)) + "python run_all.py" + "".join(
            " " + shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
        self.pythons, self.notes, self.discovered, self.installed, self.gpu_builds = {}, [], set(), {}, {}
        self.gpus, self.device, self.presets, self.runs, self.installed_facts = [], None, [], [], {}
        self.preset_name_given = args.preset is not None

    def can_run(self, target, precision, run_preset):
        """(the GPU preflight's decision or None, status, reason) of one run, as far as it is known before anything
        starts (execute.can_run): reason None where it can run; with --workers W, a row whose notebook trains in one
        process only is skipped too (runner/dp/launchers.py)."""
        decision, status, why = execute.can_run(target, self.run_options(precision, run_preset))
        if why is None and self.args.workers > 1:
            from runner.dp import launch
            why = launch.no_dp_reason(target, profile=self.args.profile)
            status = "skipped" if why else None
        return decision, status, why

    def run_options(self, precision, run_preset, command="", facts=None) -> execute.RunOptions:
        args = self.args
        return execute.RunOptions(run_preset, precision, args.seed, self.device, self.results_dir,
                                  timeout=args.timeout, pythons=self.pythons, command=command,
                                  gpu=self.gpus[0] if self.gpus else None, progress=not args.no_progress,
                                  found=self.discovered, gpu_builds=self.gpu_builds, profile=args.profile,
                                  init_weights=args.init_weights, installed=self.installed,
                                  installed_facts=facts or {}, wheelhouse=args.wheelhouse, skip=args.skip)


def validate(args, argv=None):
    """Every option, variable, path and interpreter checked before anything is built (runner/validate.py,
    runner/cli_checks.py): (the plan, None), or (None, the first refusal's line)."""
    plan = Plan(args, argv)
    errors = cli_checks.run_all_errors(args, plan.targets)
    plan.pythons, plan.notes, python_errors, plan.discovered = cli_checks.resolve_pythons(args, plan.env_names)
    errors += python_errors
    plan.installed, installed_errors = cli_checks.resolve_installed(args)
    errors += installed_errors
    try:
        plan.gpu_builds = gpu_preflight.env_overrides()
    except ValueError as e:
        errors.append("DS2_GPU_BUILD: %s" % e)
    else:
        for forced in args.gpu_build:
            plan.gpu_builds.update(forced)
    return (None, errors[0]) if errors else (plan, None)


def _main(argv=None) -> int:
    """run_all.py: its checks (:func:`validate`), then the mode asked for: --prepare-wheelhouse, --check, --list,
    --setup-only, --migrate, --print-host-commands, else the runs."""
    args = build_parser().parse_args(argv)
    plan, problem = validate(args, argv)
    if problem:
        return error(problem)
    if args.prepare_wheelhouse:          # for another machine: this one's GPU does not matter
        return prepare_wheelhouse(plan)
    plan.gpus = envinfo.gpus()
    plan.device = args.device if args.device != "auto" else ("cuda" if plan.gpus else "cpu")
    if plan.device == "cuda" and not plan.gpus:
        return error("--device cuda, but nvidia-smi sees no GPU")
    if args.check:
        print("\n".join(gpu_preflight.report(TARGETS.values(), plan.gpus if plan.device == "cuda" else [],
                                             plan.gpu_builds, details=True)))
        return 0
    if args.list:
        return list_targets(plan)
    status = prepare_runs(plan)
    if status is not None:
        return status
    if args.setup_only:
        return setup_only(plan)
    if args.migrate:
        return migrate_matrix(plan)
    if args.print_host_commands:
        return print_host_commands(plan)
    return run_rows(plan)


def list_targets(plan: Plan) -> int:
    """``--list``: every target, its environment and whether that is made; then the GPU preflight's report."""
    gpus, device = plan.gpus, plan.device
    print("device: %s%s" % (device, " (%s)" % gpus[0]["name"] if gpus and device == "cuda" else ""))
    decisions = gpu_preflight.plan(ALL_TARGETS.values(), gpus[0], plan.gpu_builds) if device == "cuda" else {}
    name_w, label_w = (max(len(getattr(t, a)) for t in ALL_TARGETS.values()) for a in ("name", "label"))
    for t in ALL_TARGETS.values():
        env = ENVS[t.env]
        build = decisions[t.name].build if t.name in decisions else None
        state = framework_envs.status(env, device, plan.pythons.get(env.name), build)
        present = "" if os.path.exists(t.notebook_path) else "  [notebook missing]"
        print("%-*s %-*s env %-10s %-8s %s%s" % (name_w, t.name, label_w, t.label, env.name, state, env.python_hint,
                                                 present))
    for line in plan.notes:
        print(line)
    print("\n".join(gpu_preflight.report(TARGETS.values(), gpus if device == "cuda" else [], plan.gpu_builds)))
    return 0


def prepare_runs(plan: Plan) -> Optional[int]:
    """The checks that need the device: the presets, the data against this machine's memory, --init-weights, a
    row that can run here at all, the wheelhouse and the interpreters as installed; then what the run prints
    first.  The exit status of a refusal, else None (``plan.presets``, ``plan.runs`` and ``plan.installed_facts``
    set)."""
    args = plan.args
    if not plan.preset_name_given:
        args.preset = "deepmark" if plan.device == "cuda" else "smoke"
    if is_learn_preset(args.preset):       # the real task (common/learn.py): its own batch, corpus, one process
        if args.batch_size or args.scale or args.workers > 1 or args.migrate:
            return error("--preset %s sets its own batch size and corpus and trains in one process: drop "
                         "--batch-size, --scale, --workers and --migrate" % args.preset)
        args.skip = args.skip or list(SKIPPABLE)   # pure benchmark parts; its record says what was skipped
    plan.presets = [get_preset(args.preset).with_overrides(batch_size=bs, scale=args.scale)
                    for bs in (args.batch_size or [None])]
    preset = plan.presets[0]
    # the data must fit this machine's memory (each local worker process builds the global batch's iterator)
    problem = cli_checks.memory_error(plan.presets, args.workers, 1 if args.host_list else args.workers,
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
    plan.runs = [(t, prec, p) for t in plan.targets for prec in args.precision for p in plan.presets]
    if not args.migrate and not args.setup_only:      # every row skipped for a reason known now: nothing starts
        reason = cli_checks.nothing_runs(plan.runs, lambda *run: plan.can_run(*run)[1:])
        if reason:
            return error(reason, status=1)
    for line in plan.notes:
        print(line)
    if not plan.preset_name_given:
        print("No --preset given: %s (%s)." % (args.preset, "a CUDA GPU is visible" if plan.device == "cuda"
                                                 else "no CUDA GPU visible; use a GPU machine for the real benchmark, "
                                                      "or for the full model on this CPU: --preset cpu"))
    if plan.device == "cuda":
        print("\n".join(gpu_preflight.report([t for t in plan.targets if t.env not in plan.installed], plan.gpus,
                                             plan.gpu_builds)))
    try:
        plan.installed_facts = cli_checks.offline_preflight(args, plan.env_names, plan.targets + plan.destinations,
                                                            plan.device, plan.gpus, plan.gpu_builds, plan.pythons,
                                                            plan.installed)
    except EnvError as e:            # a wheel the wheelhouse lacks, a package the installed interpreter lacks
        return error(str(e))
    return None


def setup_only(plan: Plan) -> int:
    """``--setup-only``: every selected environment and kernel made (several at once), nothing run."""
    args, device, gpus, installed = plan.args, plan.device, plan.gpus, plan.installed
    failed = 0
    framework_envs.start_ahead([(ENVS[e], device, plan.pythons.get(e), b, args.wheelhouse) for e, b in
                                _builds_to_make(plan.env_names, device, gpus, plan.gpu_builds, installed)],
                               verbose=not args.no_progress)
    for env_name in plan.env_names:
        decision = gpu_preflight.decide(env_name, gpus[0], plan.gpu_builds.get(env_name)) if device == "cuda" else None
        if decision is not None and not decision.runs:
            print("%s: skipped: %s" % (env_name, decision.reason))
            continue
        try:
            if env_name in installed:          # nothing to make: the interpreter's kernel
                kernel = installed_mod.kernel(ENVS[env_name], device, installed[env_name],
                                              plan.installed_facts[env_name])
            else:
                kernel = framework_envs.ensure(ENVS[env_name], device, plan.pythons.get(env_name),
                                               build=decision.build if decision else None, wheelhouse=args.wheelhouse)
            print("%s: ready (kernel %s)" % (env_name, kernel))
        except EnvError as e:
            failed += 1
            print("%s: %s" % (env_name, e))
    return 1 if failed else 0


def _run_one(plan: Plan, target, precision, run_preset) -> Optional[dict]:
    """One row: its record (None when --print-host-commands printed its lines instead of running it)."""
    args = plan.args
    opts = plan.run_options(precision, run_preset, plan.command, plan.installed_facts)
    if args.workers > 1:
        from runner.dp import launch
        return launch.run_target(target, opts, args.workers, mxnet_dp=args.mxnet_dp, hosts=args.host_list,
                                 ssh_options=args.ssh_options, join_timeout=args.join_timeout,
                                 print_host_commands=args.print_host_commands)
    return execute.run_target(target, opts)


def _run_all(plan: Plan):
    """Every run in order, each announced: (its records, how many printed their host commands, and (the signal,
    where) when one stopped them)."""
    records, printed = [], 0
    for i, (target, precision, run_preset) in enumerate(plan.runs, 1):
        print("[%d/%d] %s, %s, batch %d" % (i, len(plan.runs), target.name, precision, run_preset.batch_size),
              flush=True)
        try:
            rec = _run_one(plan, target, precision, run_preset)
        except interrupt.Interrupted as e:
            return records, printed, (e, "%s %s batch %d" % (target.name, precision, run_preset.batch_size))
        if rec is None:                 # --print-host-commands: printed, nothing ran
            printed += 1
        else:
            records.append(rec)
    return records, printed, None


def _announce_runs(plan: Plan) -> None:
    args, preset = plan.args, plan.presets[0]
    print("Running %d notebook(s) on %s, preset %s (batch size %s, scale %d)%s, results in %s"
          % (len(plan.runs), plan.device, preset.name, ",".join(str(p.batch_size) for p in plan.presets),
             preset.scale, ", profiling one step" if args.profile else "", shown(plan.results_dir)))


def print_host_commands(plan: Plan) -> int:
    """``--print-host-commands``: each host's lines of every selected row printed, nothing run (no results.md);
    what was printed counts as run, a row that could not be is skipped or failed."""
    _announce_runs(plan)
    records, printed, _ = _run_all(plan)
    statuses = [r["status"] for r in records]
    return (1 if "failed" in statuses else 0) if printed else _exit_status(records)


def run_rows(plan: Plan) -> int:
    """The runs: every selected row, precision and batch size, each into its record (the later rows' environments
    made while the first rows run); then results.md from every record of the results directory."""
    _announce_runs(plan)
    framework_envs.start_ahead(_row_environments(plan), verbose=not plan.args.no_progress)
    records, _, stopped = _run_all(plan)
    status = _write_report(plan, stopped, "%s regenerated from the records in %s" % (shown(plan.output),
                                                                                   shown(plan.results_dir)))
    if status is not None:
        return status
    statuses = [r["status"] for r in records]
    print("Wrote %s: %d ok, %d failed, %d skipped." % (shown(plan.output), statuses.count("ok"),
                                                     statuses.count("failed"), statuses.count("skipped")))
    return _exit_status(records)


def _write_report(plan: Plan, stopped, regenerated: str) -> Optional[int]:
    """results.md from the records; the exit status of the signal that stopped the runs (``stopped``: (it,
    where)), else None."""
    if stopped is None:
        with interrupt.deferred():      # results.md is written whole; a signal now stops the run after it
            render.write(plan.results_dir, plan.output, plan.command, execute.git_commit(), warn=warning_line)
        return None
    # a second signal now exits at once (runner.interrupt)
    render.write(plan.results_dir, plan.output, plan.command, execute.git_commit(), warn=warning_line)
    e, where = stopped
    interrupt.stderr_line("run_all.py: %s during %s: recorded as failed; %s" % (e.reason, where, regenerated))
    return e.exit_status


def _builds_to_make(env_names, device, gpus, gpu_builds, installed):
    """(environment name, CUDA build or None) of each environment ``--setup-only`` makes, in order."""
    out = []
    for env_name in env_names:
        decision = gpu_preflight.decide(env_name, gpus[0], gpu_builds.get(env_name)) if device == "cuda" else None
        if env_name not in installed and (decision is None or decision.runs):
            out.append((env_name, decision.build if decision else None))
    return out


def _row_environments(plan: Plan):
    """(env, device, interpreter, build, wheelhouse) of the environment each of the plan's rows needs made, in the
    order of the rows: none for a row that cannot run here (:meth:`Plan.can_run`), runs as installed, or whose system
    piece is missing."""
    out = []
    for target, precision, run_preset in plan.runs:
        opts = plan.run_options(precision, run_preset)
        decision, _, reason = plan.can_run(target, precision, run_preset)
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
    reason = cli_checks.none_ran(records)
    if reason:
        interrupt.stderr_line("run_all.py: %s" % reason)
        return 1
    return 1 if any(r["status"] == "failed" for r in records) else 0


def prepare_wheelhouse(plan: Plan) -> int:
    """``--prepare-wheelhouse DIR``: every wheel the selected rows' environments and the runner need, for the
    machine named by --device, --wheelhouse-python and --wheelhouse-platform; then the total size."""
    args, env_names, gpu_builds = plan.args, plan.env_names, plan.gpu_builds
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
        build = gpu_preflight.get_build(env_name, gpu_builds[env_name]) if device == "cuda" and env_name in gpu_builds \
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


def migrate_matrix(plan: Plan) -> int:
    """``--migrate``: the matrix of every selected source's export loaded into every destination (``--migrate-to``,
    else the sources), per precision and batch size (runner/migrate.py); then results.md."""
    args, targets, destinations, presets = plan.args, plan.targets, plan.destinations, plan.presets
    device, results_dir, output, gpus = plan.device, plan.results_dir, plan.output, plan.gpus
    from runner import migrate
    problem = migrate.nothing_to_migrate(targets, [plan.run_options(prec, p) for prec in args.precision
                                                   for p in presets])
    if problem:                            # a misspelt --results-dir, or the rows never ran: one line, nothing made
        return error(problem)
    print("Migrating %d framework(s) into %s on %s, preset %s (batch size %s), from the exports in %s"
          % (len(targets), "each other" if destinations == targets else ", ".join(t.name for t in destinations),
             device, presets[0].name, ",".join(str(p.batch_size) for p in presets),
             shown(os.path.join(results_dir, "weights"))), flush=True)
    records = []
    stopped = None
    for precision in args.precision:
        for run_preset in presets:
            opts = execute.RunOptions(run_preset, precision, args.seed, device, results_dir, timeout=args.timeout,
                                      pythons=plan.pythons, command=plan.command, gpu=gpus[0] if gpus else None,
                                      progress=not args.no_progress, found=plan.discovered,
                                      gpu_builds=plan.gpu_builds, installed=plan.installed,
                                      installed_facts=plan.installed_facts, wheelhouse=args.wheelhouse)
            try:
                records += migrate.run_matrix(targets, opts, destinations=destinations)
            except interrupt.Interrupted as e:
                stopped = (e, "the migration matrix (%s, batch %d)" % (precision, run_preset.batch_size))
                break
        if stopped:
            break
    status = _write_report(plan, stopped, "%s regenerated" % shown(output))
    if status is not None:
        return status
    statuses = [r["status"] for r in records]
    print("Wrote %s: %d migrations ok, %d failed, %d skipped (records in %s)."
          % (shown(output), statuses.count("ok"), statuses.count("failed"), statuses.count("skipped"),
             shown(migrate.migration_dir(results_dir))))
    return _exit_status(records)
