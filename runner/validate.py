"""Every input of the project's commands, checked before anything is created or started.

run_all.py (runner/cli.py), ``python -m runner.report``, ``python -m runner.rosetta`` and the bootstrap
(runner/bootstrap.py: ``DS2_RUNNER``, ``DS2_ENVS_DIR``) take their checks from here.  A refusal is one line,
``PROG: error: ...``, that names the option (or variable), its value and what is accepted; the exit status is 2.

- **Values**: no empty strings (an empty path is not "here"); comma lists without empty items or duplicates;
  an option that names an environment once at most; integers in range.
- **Paths** (:func:`results_dir_error`, :func:`output_error`): writable; never the repository root; a folder
  of the project's tracked files only when the argument names it (``--results-dir results``, the default,
  names the project's results folder; ``""``, ``.`` or ``..`` name whatever the current directory is); an
  ``--output`` that exists is a regular file holding a results page (its first line :data:`REPORT_TITLE`) or
  nothing, so no other file is overwritten.
- **Bounds that protect the machine**, each derived from the machine or the spec:
  :func:`workers_error` (processes per usable core, :data:`WORKERS_PER_CORE`, unless ``--oversubscribe``),
  :func:`memory_error` (the data iterator's arrays against the memory available now), :data:`MAX_TIMEOUT_S`
  and :data:`MAX_SEED`.
- **The environment variables** the docs name (:data:`ENV_VARS`): set means non-empty.

Standard library only at import: the bootstrap runs this before the runner's environment exists.
"""
import argparse
import os
import subprocess
import sys
import tempfile
from typing import Dict, Iterable, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(ROOT, "results")
#: the first line of every results page runner/report.py writes: an --output that exists must start with it
REPORT_TITLE = "# DS2 Rosetta results"

#: --timeout and --join-timeout: a week.  Both are wall-clock limits on an unattended job; the longest run this
#: project describes, the full DeepMark epoch (211 h of audio) on one GPU, takes hours, and the full model's
#: CPU preset minutes, so a limit past a week is a slip of the keyboard (1e20 s), never a plan.
MAX_TIMEOUT_S = 7 * 24 * 3600
#: --workers on one machine: at most this many processes per usable core.  A data-parallel worker waits in its
#: collectives (the gradient all-reduce of every step) for part of each step, so two share a core without
#: leaving it idle (the test suite's 2 workers stay allowed on a 1-core machine), while more than two per core
#: only time-slice, each slower than one worker alone.  ``--oversubscribe`` lifts the bound.
WORKERS_PER_CORE = 2
#: --seed: keras.utils.set_random_seed (the Keras rows) seeds NumPy's legacy generator, which takes 0..2**32-1
MAX_SEED = 2 ** 32 - 1
#: bytes per element of the iterator's feature pool at its peak (common/data.py): drawn in float64 (8 bytes)
#: and rounded to the float32 pool it keeps (4 bytes), both alive for that moment
POOL_PEAK_BYTES = 8 + 4
#: bytes per minibatch of the iterator's plan: a Python tuple in a list (about 80 bytes) and eight int64
#: values (frames, size, start offset, label count and start, order, and two temporaries)
BATCH_PLAN_BYTES = 80 + 8 * 8

#: the environment variables the docs name, and what each holds
ENV_VARS = {
    "DS2_RUNNER": "current (run in this interpreter), or unset (the runner's own .venvs/runner)",
    "DS2_ENVS_DIR": "the directory of the environments (default .venvs/)",
    "DS2_WHEELHOUSE": "a wheel directory (as --wheelhouse DIR)",
    "DS2_CNTK_PYTHON": "a CPython 3.6 (as --cntk-python PATH)",
    "DS2_USE_INSTALLED": "ENV=PYTHON[,ENV=PYTHON...] (as --use-installed)",
    "DS2_GPU_BUILD": "ENV=BUILD[,ENV=BUILD...] (as --gpu-build)",
}


class OneLineParser(argparse.ArgumentParser):
    """Bad input gets one clear line and exit status 2 (not a usage dump)."""

    def error(self, message):
        self.exit(2, "%s: error: %s\n" % (self.prog, message))


def refuse(prog: str, message: str) -> int:
    """Print ``PROG: error: MESSAGE`` as one line on stderr; returns 2, the exit status of bad input."""
    print("%s: error: %s" % (prog, str(message).replace("\n", " ")), file=sys.stderr, flush=True)
    return 2


# ---- argparse types: one value at a time -----------------------------------------------------------------------
def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a positive integer, got %r" % text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be a positive integer, got %r" % text)
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError("must be a non-negative integer, got %r" % text)
    return value


def seed(text: str) -> int:
    value = non_negative_int(text)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError("must be 0 to %d (the Keras rows seed NumPy's generator, which takes 32 "
                                         "bits), got %r" % (MAX_SEED, text))
    return value


def seconds(text: str) -> int:
    """A timeout: a positive integer of seconds, at most :data:`MAX_TIMEOUT_S`."""
    value = positive_int(text)
    if value > MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError("must be 1 to %d seconds (a week), got %r" % (MAX_TIMEOUT_S, text))
    return value


def _items(text: str, expected: str) -> List[str]:
    """The items of a comma list, stripped; ArgumentTypeError for an empty list or an empty item."""
    items = [t.strip() for t in text.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError("must be %s, got %r" % (expected, text))
    if "" in items:
        raise argparse.ArgumentTypeError("%r has an empty item; expected %s" % (text, expected))
    return items


def _twice(values: Sequence, text: str) -> None:
    seen = []
    for value in values:
        if value in seen:
            raise argparse.ArgumentTypeError("%r names %s twice; name each once" % (text, value))
        seen.append(value)


def positive_int_list(text: str) -> List[int]:
    """A comma list of positive integers (``--batch-size 8,32``), in order, each once."""
    values = [positive_int(item) for item in _items(text, "a positive integer or a comma list of them")]
    _twice(values, text)
    return values


def comma_list(choices: Sequence[str], what: str, everything: Optional[Sequence[str]] = None):
    """A comma list of ``choices`` (each once); ``all`` alone is ``everything`` when given."""
    def parse(text: str) -> List[str]:
        if not text.strip():
            raise argparse.ArgumentTypeError("no %s given" % what)
        items = _items(text, "a comma list of: %s" % ", ".join(choices))
        if everything is not None and items == ["all"]:
            return list(everything)
        for item in items:
            if item not in choices:
                raise argparse.ArgumentTypeError("unknown %s %r; choose from: %s" % (what, item, ", ".join(choices)))
        _twice(items, text)
        return items
    return parse


def non_empty(what: str):
    """A string option that names something (a path, a version, a tag): the empty string names nothing."""
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError("%r is empty: an empty value names no %s (it is not 'here')"
                                             % (text, what))
        return text
    return parse


# ---- paths ----------------------------------------------------------------------------------------------------
def unwritable_dir(path: str) -> Optional[str]:
    """Why no file can be written in directory ``path`` (created if missing), or None -- tried, not guessed
    from permission bits (root passes those everywhere, /proc included).  Leaves nothing behind."""
    path = os.path.abspath(path)
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return ("is not a directory" if existing == path else "cannot be created: %s is not a directory" % existing)
    try:
        tempfile.TemporaryDirectory(prefix=".ds2-write-test-", dir=existing).cleanup()
    except OSError as e:
        if existing == path:
            return "is not writable: %s" % (e.strerror or e)
        return "cannot be created in %s: %s" % (existing, e.strerror or e)
    return None


def names_itself(arg: str) -> bool:
    """Whether a path as typed ends in a name (``results``, ``/tmp/r``) rather than in ``""``, ``.``, ``..``
    or ``/``, which name whatever directory the command happens to run in (or above)."""
    return os.path.basename(os.path.normpath(arg)) not in ("", ".", "..")


def holds_tracked_files(path: str) -> bool:
    """Whether directory ``path`` holds files the repository tracks (asked of git; without git, any file in
    the tree below the repository root counts)."""
    path = os.path.abspath(path)
    inside = path == ROOT or path.startswith(ROOT + os.sep)
    if not inside or not os.path.isdir(path):
        return False
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--", os.path.relpath(path, ROOT)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30)
        if out.returncode == 0:
            return bool(out.stdout.strip(b"\0"))
    except (OSError, subprocess.SubprocessError):
        pass
    return any(files for _, _, files in os.walk(path))


def results_dir_error(option: str, arg: str) -> Optional[str]:
    """Why ``arg`` cannot be the results directory of ``option`` (records, notebooks, plots, logs), or None."""
    if not arg.strip():
        return "%s %r is empty: an empty path is not 'here'; name a directory (default: results/)" % (option, arg)
    path = os.path.abspath(arg)
    if path in (ROOT, os.path.abspath(os.sep)):
        return ("%s %r is the %s root (%s): records, notebooks, plots and logs would land among its files; name a "
                "directory of their own (results/, the default, or results/experiments/NAME)"
                % (option, arg, "repository" if path == ROOT else "filesystem", path))
    if not names_itself(arg) and holds_tracked_files(path):
        return ("%s %r is %s, which holds the project's tracked files, named only as %r (wherever the command "
                "runs): name the directory itself (%s %s) if it is meant" % (option, arg, path, arg, option, path))
    why = unwritable_dir(path)
    return "%s %s %s" % (option, path, why) if why else None


def output_error(option: str, path: str, arg: Optional[str] = None) -> Optional[str]:
    """Why ``path`` cannot take the results page (``option``, typed as ``arg``; None: the default), or None:
    an existing file is replaced only when it is a results page this project wrote, or empty."""
    if arg is not None and not arg.strip():
        return "%s %r is empty: an empty path names no file; name one (default: results.md)" % (option, arg)
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return "%s %s is a directory" % (option, path)
    why = unwritable_dir(os.path.dirname(path))
    if why:
        return "%s %s: its directory %s %s" % (option, path, os.path.dirname(path), why)
    if os.path.lexists(path):
        if os.path.islink(path) or not os.path.isfile(path):
            return "%s %s exists and is not a regular file; name a new file or a results page" % (option, path)
        try:
            with open(path, errors="replace") as f:
                first = f.readline().rstrip("\n")
        except OSError as e:
            return "%s %s cannot be read: %s" % (option, path, e.strerror or e)
        if first and first != REPORT_TITLE:
            return ("%s %s exists and is not a results page (its first line is not %r): it is kept; name a new "
                    "file or a results.md this project wrote" % (option, path, REPORT_TITLE))
    return None


def output_default(results_dir: str) -> str:
    """results.md for the project's results folder, else ``<results_dir>/results.md``."""
    return os.path.join(ROOT, "results.md") if os.path.abspath(results_dir) == RESULTS_DIR \
        else os.path.join(results_dir, "results.md")


def report_error(results_dir_arg: str, output_arg: Optional[str]) -> Optional[str]:
    """``python -m runner.report``: the results directory exists and holds records (a misspelt one is not made
    and given an empty page), and the page may be written where --output says."""
    problem = results_dir_error("--results-dir", results_dir_arg)
    if problem:
        return problem
    path = os.path.abspath(results_dir_arg)
    if not os.path.isdir(path):
        return "--results-dir %s: no such directory; name one that holds records (default: results/)" % path
    records = os.path.join(path, "records")
    if not os.path.isdir(records) and not any(n.endswith(".json") for n in os.listdir(path)):
        return ("--results-dir %s holds no records (no records/ folder and no *.json): nothing to report; name the "
                "directory run_all.py --results-dir wrote to" % path)
    return output_error("--output", output_arg or output_default(path), output_arg)


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
    from .hosts import check_workers
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


# ---- repeated options and environment variables ----------------------------------------------------------------
def repeated_error(option: str, pairs: Iterable) -> Optional[str]:
    """An ``ENV=...`` option (``--python``, ``--use-installed``, ``--gpu-build``) that names one ENV twice."""
    seen = {}
    for name, value in pairs:
        if name in seen:
            return "%s %s=%s and %s=%s: %s is named twice; give each environment once" % (
                option, name, seen[name], name, value, name)
        seen[name] = value
    return None


def environment_errors(environ=None, names: Iterable[str] = tuple(ENV_VARS)) -> List[str]:
    """The documented variables of ``names`` that are set but hold nothing usable: set means non-empty;
    DS2_RUNNER holds ``current``; DS2_ENVS_DIR is a writable directory other than the repository root."""
    environ = os.environ if environ is None else environ
    errors = []
    for name in names:
        if name not in environ:
            continue
        value = environ[name]
        if not value.strip():
            errors.append("%s is set but empty; unset it, or set it to %s" % (name, ENV_VARS[name]))
        elif name == "DS2_RUNNER" and value != "current":
            errors.append("DS2_RUNNER=%s: expected %s" % (value, ENV_VARS[name]))
        elif name == "DS2_ENVS_DIR":
            path = os.path.abspath(value)
            if path == ROOT:
                errors.append("DS2_ENVS_DIR=%s is the repository root: environments would land among the "
                              "project's files; name a directory of their own (default .venvs/)" % value)
                continue
            why = unwritable_dir(path)
            if why:
                errors.append("DS2_ENVS_DIR=%s: %s %s" % (value, path, why))
    return errors


# ---- notebooks ------------------------------------------------------------------------------------------------
def notebook_parameter_names(path: str) -> Optional[List[str]]:
    """The names assigned in the notebook's cell tagged ``parameters`` (read as JSON, standard library only); None
    when the file cannot be read (its run reports that)."""
    import ast
    import json
    try:
        with open(path) as f:
            cells = json.load(f).get("cells", [])
    except (OSError, ValueError):
        return None
    names = []
    for cell in cells:
        if cell.get("cell_type") == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            source = cell.get("source", "")
            try:
                tree = ast.parse(source if isinstance(source, str) else "".join(source))
            except SyntaxError:
                continue
            for node in tree.body:
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, ast.AnnAssign) else []
                names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


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
    """{target: the launcher its --workers run starts} (runner/launchers.py)."""
    from .launchers import LAUNCHERS, MXNET_DP_MODES, TARGET_LAUNCHERS
    out = {}
    for t in targets:
        if t.row_of_record == "mxnet" and mxnet_dp in MXNET_DP_MODES:
            out[t.name] = LAUNCHERS[MXNET_DP_MODES[mxnet_dp]["launcher"]]
        elif t.row_of_record in TARGET_LAUNCHERS:
            out[t.name] = LAUNCHERS[TARGET_LAUNCHERS[t.row_of_record]]
    return out


def run_all_errors(args, targets) -> List[str]:
    """run_all.py's refusals, in the order they are told (the first is the one line printed): the documented
    variables, the paths, the bounds on --workers, the hostfile, options named twice, and the options that go
    together.  Sets ``args.host_list`` (the parsed hostfile, or None) and ``args.ssh_options``."""
    import re
    import shlex
    from .targets import CONTROL_PRECISION, control_precision_error
    errors = environment_errors()
    if not args.list:
        errors.append(results_dir_error("--results-dir", args.results_dir))
        output = args.output or output_default(os.path.abspath(args.results_dir))
        errors.append(output_error("--output", output, args.output))
    errors.append(workers_error(args.workers, args.oversubscribe, hosts=bool(args.hosts)))
    if args.oversubscribe and (args.workers < 2 or args.hosts):
        errors.append("--oversubscribe lets --workers W exceed %d per core of this machine: it goes with --workers 2 "
                      "or more and without --hosts (there the hostfile's slots place the workers)" % WORKERS_PER_CORE)
    if args.mxnet_dp != "sync" and (args.workers < 2 or any(t.row_of_record != "mxnet" for t in targets)):
        errors.append("--mxnet-dp %s is a data-parallel mode of MXNet: it needs --workers 2 or more and only MXNet "
                      "targets (mxnet, mxnet+static)" % args.mxnet_dp)
    args.host_list = None
    if args.hosts:
        from . import hosts as hosts_mod
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
    args.wheelhouse = args.wheelhouse or os.environ.get("DS2_WHEELHOUSE") or None
    if args.wheelhouse and not args.prepare_wheelhouse:
        args.wheelhouse = os.path.abspath(args.wheelhouse)
        if not os.path.isdir(args.wheelhouse):
            errors.append("--wheelhouse %s: no such directory" % args.wheelhouse)
    return [e for e in errors if e]


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
