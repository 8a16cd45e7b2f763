"""run_all.py's options checked against each other, the machine and the selected rows, before anything is
probed, created or started (runner/cli.py ``validate``).  The checks every command shares (parsers, paths,
environment variables) are runner/validate.py; these need the rows (runner.run.targets), the launchers and the
hostfile (runner.dp), so they sit on top, next to the command line.  A refusal is one line; the exit status is 2.

- **Bounds that protect the machine**, each derived from the machine or the spec:
  :func:`workers_error` (processes per usable core, :data:`WORKERS_PER_CORE`, unless ``--oversubscribe``) and
  :func:`memory_error` (the data iterator's arrays against the memory available now).
- **The hostfile** against --workers and the launchers (:func:`hosts_error`).
- **--skip** against the notebooks' parameters (:func:`skip_errors`), and the options that go together
  (:func:`run_all_errors`).
"""
import os
from typing import Dict, Iterable, List, Optional, Sequence

from runner.envs import cntk_python, framework_envs, gpu_preflight, wheelhouse
from runner.envs import use_installed as installed_mod
from runner.envs.definitions import ENVS
from runner.validate import (environment_errors, notebook_parameter_names, output_default, output_error,
                             output_in_results_error, repeated_error, results_dir_error)

#: --workers on one machine: at most this many processes per usable core.  A data-parallel worker waits in its
#: collectives (the gradient all-reduce of every step) for part of each step, so two share a core without
#: leaving it idle (the test suite's 2 workers stay allowed on a 1-core machine), while more than two per core
#: only time-slice, each slower than one worker alone.  ``--oversubscribe`` lifts the bound.
WORKERS_PER_CORE = 2
#: bytes per element of the iterator's feature pool at its peak (common/data.py): drawn in float64 (8 bytes)
#: and rounded to the float32 pool it keeps (4 bytes), both alive for that moment
POOL_PEAK_BYTES = 8 + 4
#: bytes per minibatch of the iterator's plan: a Python tuple in a list (about 80 bytes) and eight int64
#: values (frames, size, start offset, label count and start, order, and two temporaries)
BATCH_PLAN_BYTES = 80 + 8 * 8


# ---- bounds: the machine's cores and memory ------------------------------------------------------------------
def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container or taskset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available_memory() -> Optional[int]:
    """Bytes of memory available now without swapping (MemAvailable), else free pages; None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return "%d B" % n if unit == "B" else "%.1f %s" % (n, unit)
        n /= 1024.0


def workers_error(workers: int, oversubscribe: bool, hosts: bool = False, cores: Optional[int] = None) -> \
        Optional[str]:
    """--workers on this machine (not --hosts: there the hostfile's slots are the bound): at most
    :data:`WORKERS_PER_CORE` per usable core unless ``--oversubscribe``."""
    if hosts or oversubscribe:
        return None
    cores = cores or usable_cores()
    limit = cores * WORKERS_PER_CORE
    if workers > limit:
        return ("--workers %d: this machine has %d usable core(s), and at most %d workers per core (%d here) run "
                "without starving each other; give --workers 1 to %d, or add --oversubscribe to start %d anyway"
                % (workers, cores, WORKERS_PER_CORE, limit, limit, workers))
    return None


def iterator_bytes(batch_size: int, scale: int, n_freq: int, lengths: Iterable[int]) -> Dict[str, int]:
    """The memory the DeepMark iterator (common/data.py) takes at ``batch_size`` and ``scale``: its feature pool
    (2 x batch x the longest utterance's frames x n_freq elements, :data:`POOL_PEAK_BYTES` each at its peak)
    and its epoch plan (every label as int32, :data:`BATCH_PLAN_BYTES` per minibatch)."""
    from common.spec import FRAMES_PER_SECOND, LABEL_LENGTHS, LENGTH_SHARE_PERCENT, UTTERANCE_SECONDS
    lengths = list(lengths)
    pool = 2 * batch_size * max(lengths) * FRAMES_PER_SECOND * n_freq * POOL_PEAK_BYTES
    labels = batches = 0
    for length_s, share, label_length in zip(UTTERANCE_SECONDS, LENGTH_SHARE_PERCENT, LABEL_LENGTHS):
        if length_s in lengths:
            count = share * scale
            labels += count * label_length * 4
            batches += -(-count // batch_size)
    return {"pool": pool, "plan": labels + batches * BATCH_PLAN_BYTES}


def memory_error(presets, workers: int, processes: int, batch_given: bool, available: Optional[int] = None) -> \
        Optional[str]:
    """Whether the data alone fits: each of ``processes`` processes on this machine (the W workers; with --hosts
    the runner alone, which checks the data's checksum) builds the iterator of the global batch (``workers`` x
    --batch-size; common/data.py), against the memory available now.  None when it fits or when the machine
    does not say.  ``batch_given``: --batch-size was given (else the preset's is named)."""
    available = available_memory() if available is None else available
    if not available:
        return None
    from common.spec import FRAMES_PER_SECOND, UTTERANCE_SECONDS
    for preset in presets:
        lengths = getattr(preset, "lengths", None) or UTTERANCE_SECONDS
        need = iterator_bytes(preset.batch_size * workers, preset.scale, preset.config.n_freq, lengths)
        frames = max(lengths) * FRAMES_PER_SECOND
        per_batch = 2 * frames * preset.config.n_freq * POOL_PEAK_BYTES * workers * processes
        who = "each of %d worker processes" % processes if processes > 1 else "the notebook"
        if need["pool"] * processes > available:
            return ("--batch-size %d%s: %s builds the data iterator's feature pool of 2 x %d utterances x %d frames "
                    "x %d bins, %d bytes each at its peak (float64 drawn, float32 kept) = %s, more than the %s this "
                    "machine has available (MemAvailable); batch sizes up to %d fit"
                    % (preset.batch_size, "" if batch_given else " (preset %s)" % preset.name, who,
                       preset.batch_size * workers, frames, preset.config.n_freq, POOL_PEAK_BYTES,
                       size(need["pool"] * processes), size(available), max(0, available // per_batch)))
        if (need["pool"] + need["plan"]) * processes > available:
            per_scale = iterator_bytes(preset.batch_size * workers, 1, preset.config.n_freq, lengths)["plan"]
            fits = max(0, (available // processes - need["pool"]) // max(1, per_scale))
            return ("--scale %d: %s holds the epoch's labels (int32) and minibatch plan, %s (and the feature pool, "
                    "%s), more than the %s this machine has available (MemAvailable); scales up to about %d fit"
                    % (preset.scale, who, size(need["plan"] * processes), size(need["pool"] * processes),
                       size(available), fits))
    return None


# ---- hosts ----------------------------------------------------------------------------------------------------
def hosts_error(hosts, workers: int, launchers: Dict[str, object], path: str) -> Optional[str]:
    """The hostfile against --workers (its slots add up to W) and the selected rows' launchers (torchrun starts
    the same number of processes on every host)."""
    from runner.dp.hosts import check_workers
    error = check_workers(hosts, workers)
    if error:
        return error
    slots = ", ".join("%s:%d" % (h.name, h.slots) for h in hosts)
    if len(set(h.slots for h in hosts)) > 1:
        uneven = [name for name, launcher in launchers.items() if getattr(launcher, "kind", None) == "torchrun"]
        if uneven:
            return ("--hosts %s has %s: torchrun, the launcher of %s, starts the same number of processes on every "
                    "host (--nproc_per_node); give every host the same slots" % (path, slots, ", ".join(uneven)))
    return None


def skip_errors(skip: Sequence[str], targets, migrate: bool = False) -> List[str]:
    """``--skip PARTS`` (each part known and once: the argument's type): ``export`` goes with ``onnx``; not with
    ``--migrate``; and every selected row's notebook declares the ``skip`` parameter."""
    from common.spec import skip_error
    if not skip:
        return []
    text = ",".join(skip)
    errors = []
    problem = skip_error(list(skip))
    if problem:
        errors.append("--skip %s: %s (--skip %s)" % (text, problem, ",".join(
            list(skip) + [p for p in ("onnx",) if p not in skip])))
    if migrate:
        errors.append("--skip %s leaves parts out of a timed run; --migrate times nothing and loads the exports: "
                      "drop --skip" % text)
    lacking = []
    for t in targets:
        names = notebook_parameter_names(t.notebook_path)
        if names is not None and "skip" not in names and t.name not in lacking:
            lacking.append(t.name)
    if lacking:
        one = len(lacking) == 1
        errors.append("--skip %s: the notebook%s of %s declare%s no skip parameter, so %s cannot leave parts out; run "
                      "%s without --skip" % (text, "" if one else "s", ", ".join(lacking), "s" if one else "",
                                             "its run" if one else "their runs", "it" if one else "them"))
    return errors


# ---- run_all.py: every option and variable, before anything is probed, created or started ----------------------
def _launchers(targets, mxnet_dp: str) -> Dict[str, object]:
    """{target: the launcher its --workers run starts} (runner/dp/launchers.py)."""
    from runner.dp.launchers import LAUNCHERS, TARGET_LAUNCHERS
    from runner.run.targets import MXNET_DP_MODES
    out = {}
    for t in targets:
        if t.row_of_record == "mxnet" and mxnet_dp in MXNET_DP_MODES:
            out[t.name] = LAUNCHERS[MXNET_DP_MODES[mxnet_dp]["launcher"]]
        elif t.row_of_record in TARGET_LAUNCHERS:
            out[t.name] = LAUNCHERS[TARGET_LAUNCHERS[t.row_of_record]]
    return out


def _path_errors(args) -> List[Optional[str]]:
    """--results-dir and --output: where the run writes; with --list, which writes nothing, only that neither is
    empty (an empty path is a slip whatever the mode)."""
    if args.list:
        return [results_dir_error("--results-dir", args.results_dir) if not args.results_dir.strip() else None,
                output_error("--output", "", args.output) if args.output is not None and not args.output.strip()
                else None]
    output = args.output or output_default(os.path.abspath(args.results_dir))
    return [results_dir_error("--results-dir", args.results_dir), output_error("--output", output, args.output),
            output_in_results_error("--output", output, os.path.abspath(args.results_dir)) if args.output else None]


def run_all_errors(args, targets) -> List[str]:
    """run_all.py's refusals, in the order they are told (the first is the one line printed): the documented
    variables, the paths, the bounds on --workers, the hostfile, options named twice, and the options that go
    together.  Sets ``args.host_list`` (the parsed hostfile, or None) and ``args.ssh_options``."""
    import re
    import shlex
    from common.spec import CONTROL_PRECISION
    from runner.run.targets import control_precision_error
    errors = environment_errors() + _path_errors(args)
    errors.append(workers_error(args.workers, args.oversubscribe, hosts=bool(args.hosts)))
    if args.oversubscribe and (args.workers < 2 or args.hosts):
        errors.append("--oversubscribe lets --workers W exceed %d per core of this machine: it goes with --workers 2 "
                      "or more and without --hosts (there the hostfile's slots place the workers)" % WORKERS_PER_CORE)
    if args.mxnet_dp != "sync" and (args.workers < 2 or any(t.row_of_record != "mxnet" for t in targets)):
        errors.append("--mxnet-dp %s is a data-parallel mode of MXNet: it needs --workers 2 or more and only MXNet "
                      "targets (mxnet, mxnet+static)" % args.mxnet_dp)
    args.host_list = None
    if args.hosts:
        from runner.dp import hosts as hosts_mod
        try:
            args.host_list = hosts_mod.parse_hostfile(args.hosts)
        except hosts_mod.HostsError as e:
            errors.append(str(e))
        else:
            errors.append(hosts_error(args.host_list, args.workers, _launchers(targets, args.mxnet_dp), args.hosts))
        if args.migrate:
            errors.append("--hosts trains data-parallel; --migrate trains nothing")
    elif args.print_host_commands or args.join_timeout or args.ssh:
        errors.append("--print-host-commands, --join-timeout and --ssh go with --hosts HOSTFILE")
    try:
        args.ssh_options = shlex.split(args.ssh)
    except ValueError as e:
        args.ssh_options = []
        errors.append("--ssh %r: %s" % (args.ssh, e))
    errors.append(together_error(args))
    errors.append(repeated_error("--python", args.python))
    errors.append(repeated_error("--use-installed", args.use_installed))
    errors.append(repeated_error("--gpu-build", [item for forced in args.gpu_build for item in forced.items()]))
    platforms = [p.strip() for p in args.wheelhouse_platform]
    if len(set(platforms)) != len(platforms):
        twice = next(p for p in platforms if platforms.count(p) > 1)
        errors.append("--wheelhouse-platform %s is given twice; give each tag once" % twice)
    if not args.list and not args.check:
        errors.append(control_precision_error(targets, args.precision))
        if args.migrate and args.workers > 1:
            errors.append("--migrate runs each destination notebook in one process; drop --workers %d" % args.workers)
        if args.migrate and CONTROL_PRECISION in args.precision:
            errors.append("--migrate --precision %s: the canonical format is float32, the control does not migrate"
                          % CONTROL_PRECISION)
        if args.migrate and args.profile:
            errors.append("--migrate trains nothing, so there is no step to --profile")
        if args.migrate and args.init_weights:
            errors.append("--migrate loads each source's export itself; drop --init-weights")
        if args.migrate_to and not args.migrate:
            errors.append("--migrate-to names the destinations of --migrate; add --migrate")
    if not args.list and not args.check:
        errors += skip_errors(args.skip, targets, args.migrate)
    if args.wheelhouse_python and not re.match(r"^3\.\d+$", args.wheelhouse_python):
        errors.append("--wheelhouse-python %s: expected a version such as 3.12" % args.wheelhouse_python)
    if (args.wheelhouse_python or args.wheelhouse_platform) and not args.prepare_wheelhouse:
        errors.append("--wheelhouse-python and --wheelhouse-platform describe the machine of --prepare-wheelhouse DIR; "
                      "add it")
    if args.prepare_wheelhouse:
        errors.append(results_dir_error("--prepare-wheelhouse", args.prepare_wheelhouse))
    named = "--wheelhouse " if args.wheelhouse else "DS2_WHEELHOUSE="     # what the error line names
    args.wheelhouse = args.wheelhouse or os.environ.get("DS2_WHEELHOUSE") or None
    if args.wheelhouse and not args.prepare_wheelhouse:
        args.wheelhouse = os.path.abspath(args.wheelhouse)
        if not os.path.isdir(args.wheelhouse):
            errors.append("%s%s: no such directory" % (named, args.wheelhouse))
    return [e for e in errors if e]


#: run_all.py's modes other than running the rows: each does one thing, so two are refused rather than one dropped
MODES = ("--list", "--check", "--setup-only", "--migrate", "--prepare-wheelhouse", "--print-host-commands")


def together_error(args) -> Optional[str]:
    """Two modes at once (:data:`MODES`), an option that only a run reads given to a mode that runs nothing (its
    value would go unchecked and unused), or two options that say one thing two ways; else None."""
    given = [m for m in MODES if getattr(args, m[2:].replace("-", "_"))]
    if len(given) > 1:
        return "%s and %s are two modes of run_all.py, each run on its own; give one" % (given[0], given[1])
    if given and given[0] in ("--list", "--check", "--setup-only", "--prepare-wheelhouse") and args.init_weights:
        return "--init-weights is the weights a run starts from; %s runs no notebook: drop it" % given[0]
    if args.prepare_wheelhouse and args.wheelhouse:
        return ("--prepare-wheelhouse %s fills a wheelhouse from the registry; --wheelhouse %s installs from one: "
                "give one" % (args.prepare_wheelhouse, args.wheelhouse))
    if args.cntk_python and "cntk" in dict(args.python):
        return ("--cntk-python %s and --python cntk=%s both name CNTK's interpreter; give one"
                % (args.cntk_python, dict(args.python)["cntk"]))
    return None


def nothing_runs(runs, can_run) -> Optional[str]:
    """When every selected run would be skipped on this machine for a reason known now (``can_run(target,
    precision, preset)`` -> (status, reason): the precision, the GPU), the line that says so; else None."""
    reasons = []
    for target, precision, preset in runs:
        status, why = can_run(target, precision, preset)
        if status != "skipped":
            return None
        line = "%s %s: %s" % (target.name, precision, why)
        if line not in reasons:
            reasons.append(line)
    return "no selected row can run on this machine, nothing was started or written: %s" % "; ".join(reasons) \
        if reasons else None


def none_ran(records: List[dict]) -> Optional[str]:
    """When no selected row ran (each one skipped or failed), the line that says so and why; else None."""
    if not records or any(r.get("status") == "ok" for r in records):
        return None
    counts = ["%d %s" % (sum(r.get("status") == s for r in records), s) for s in ("failed", "skipped")
              if any(r.get("status") == s for r in records)]
    first = records[0]
    name = first.get("target") or "%s -> %s" % (first.get("source"), first.get("destination"))
    return "no selected row ran (%s); %s %s: %s" % (", ".join(counts), name, first.get("precision") or "",
                                                     first.get("error") or first.get("status"))


# ---- interpreters: --python, --cntk-python, --use-installed; the wheelhouse ----------------------------------
def python_error(env_name: str, path: str) -> Optional[str]:
    """Why the interpreter given for an environment (--python ENV=PATH) cannot build it, or None."""
    env = ENVS[env_name]
    if env.shared_python:
        cand = cntk_python.check_interpreter(path, "--python %s=" % env_name)
        return None if cand.ok else "--python %s=%s %s" % (env_name, path, cand.reason)
    facts, reason = cntk_python.probe_interpreter(path)
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
    source = {}                             # env -> what named it, as the error lines say it
    for name, path in from_env:
        if name not in ENVS:
            errors.append("DS2_USE_INSTALLED: unknown environment %r; choose from: %s" % (name, ", ".join(ENVS)))
        out[name], source[name] = path, "DS2_USE_INSTALLED"
    for name, path in args.use_installed:
        out[name], source[name] = path, "--use-installed"
    for name, path in out.items():
        if name in dict(args.python):
            errors.append("%s %s and --python %s: one runs the interpreter as it is, the other builds an "
                          "environment from it; give one" % (source[name], name, name))
        elif not (os.path.isfile(path) and os.access(path, os.X_OK)):
            errors.append("%s %s=%s: no such executable" % (source[name], name, path))
    return {k: os.path.abspath(v) for k, v in out.items()}, errors


def offline_preflight(args, env_names, targets, device, gpus, gpu_builds, pythons, installed) -> dict:
    """Before anything runs: every environment still to be made is in the wheelhouse (``--wheelhouse``: asked of
    pip, offline), and every interpreter of ``--use-installed`` has what its rows import (its versions printed
    beside the pins).  Returns {env: the installed interpreter's probe}; raises EnvError with one line."""
    if args.wheelhouse:
        for env_name in [e for e in env_names if e not in installed]:
            decision = gpu_preflight.decide(env_name, gpus[0], gpu_builds.get(env_name)) if device == "cuda" else None
            if decision is not None and not decision.runs:
                continue
            build = decision.build if decision else None
            env = ENVS[env_name]
            if framework_envs.status(env, device, pythons.get(env_name), build) == "ready" or \
                    (env.needs_python and env_name not in pythons):
                continue
            wheelhouse.require_wheels(args.wheelhouse, env.requirements(device, build),
                             framework_envs.python_version(pythons.get(env_name) or framework_envs.default_python()),
                             "environment %s" % env_name, pip_spec=env.pip)
    facts = {}
    for env_name in [e for e in env_names if e in installed]:
        used = [t for t in targets if t.env == env_name]
        facts[env_name], lines = installed_mod.check_env(ENVS[env_name], device, used, installed[env_name])
        print("\n".join(lines))
    return facts
