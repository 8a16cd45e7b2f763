"""Every input of the project's commands, checked before anything is created or started.

run_all.py (runner/cli.py), ``python -m runner.report``, ``python -m runner.rosetta`` and the bootstrap
(runner/envs/bootstrap.py: ``DS2_RUNNER``, ``DS2_ENVS_DIR``) take their checks from here.  A refusal is one line,
``PROG: error: ...``, that names the option (or variable), its value and what is accepted; the exit status is 2.

- **Values**: no empty strings (an empty path is not "here"); comma lists without empty items or duplicates;
  an option that names an environment once at most; integers in range; an option of one value given once and
  spelt in full (:class:`OneLineParser`).
- **Paths** (:func:`results_dir_error`, :func:`output_error`): writable; never the repository root; a folder
  of the project's tracked files only when the argument names it (``--results-dir results``, the default,
  names the project's results folder; ``""``, ``.`` or ``..`` name whatever the current directory is); an
  ``--output`` that exists is a regular file holding a results page (its first line :data:`REPORT_TITLE`) or
  nothing, so no other file is overwritten; no results directory in ``.git`` or ``.venvs`` or that is the
  checkout through a link; no ``--output`` that names a directory (a trailing ``/``) or lies in a folder the
  runner fills (:data:`RESULTS_FOLDERS`).
- **Bounds**: :data:`MAX_TIMEOUT_S` and :data:`MAX_SEED`; those that need the machine or the selected rows
  (workers per core, memory, the hostfile, --skip) are runner/cli_checks.py.
- **The environment variables** the docs name (:data:`ENV_VARS`): set means non-empty.

Standard library only at import: the bootstrap runs this before the runner's environment exists.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Iterable, List, Optional, Sequence, Tuple

from runner.base import ROOT

RESULTS_DIR = os.path.join(ROOT, "results")
#: the folders run_all.py fills in a results directory (records read back by every later run and report)
RESULTS_FOLDERS = ("records", "notebooks", "logs", "weights", "plots", "migration", "latency", "autotune", ".staging")
#: the first line of every results page runner/report/render.py writes: an --output that exists must start with it
REPORT_TITLE = "# DS2 Rosetta results"

#: --timeout and --join-timeout: a week.  Both are wall-clock limits on an unattended job; the longest run this
#: project describes, the full DeepMark epoch (211 h of audio) on one GPU, takes hours, and the full model's
#: CPU preset minutes, so a limit past a week is a slip of the keyboard (1e20 s), never a plan.
MAX_TIMEOUT_S = 7 * 24 * 3600
#: --seed: keras.utils.set_random_seed (the Keras rows) seeds NumPy's legacy generator, which takes 0..2**32-1
MAX_SEED = 2 ** 32 - 1
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
    """Bad input gets one clear line and exit status 2 (not a usage dump).  An option is spelt in full (no
    abbreviation: ``--frame`` is not ``--frameworks``), and one that holds a single value is given once: argparse
    would keep the last silently (``--skip export,onnx --skip forward`` would drop the first)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        twice = given_twice(self, sys.argv[1:] if args is None else list(args))
        if twice:
            self.error("argument %s: given twice; give it once%s" % (
                twice, "" if twice == "--help" else " (an option's last value would silently replace the first)"))
        return super().parse_known_args(args, namespace)

    def error(self, message):
        self.exit(2, "%s: error: %s\n" % (self.prog, message))


def given_twice(parser: argparse.ArgumentParser, argv: Sequence[str]) -> Optional[str]:
    """The first option of ``argv`` that ``parser`` keeps one value of (not ``append`` or ``count``) and that is
    given twice, under any of its spellings (``--x V``, ``--x=V``), or None.  Tokens after ``--`` are values."""
    seen = {}
    for token in argv:
        if token == "--":
            break
        name = token.split("=", 1)[0] if token.startswith("--") else token if token.startswith("-") else None
        action = parser._option_string_actions.get(name) if name else None      # noqa: SLF001 (argparse's own map)
        if action is None or isinstance(action, (argparse._AppendAction, argparse._CountAction)):   # noqa: SLF001
            continue
        if action.dest in seen:
            return name if name == seen[action.dest] else "%s (as %s)" % (name, seen[action.dest])
        seen[action.dest] = name
    return None


def assignments(text: Optional[str], value: str) -> List[Tuple[str, str]]:
    """``"a=x, b=y"`` -> ``[("a", "x"), ("b", "y")]`` (None or "": none): the ENV=VALUE lists of the options and
    variables that name environments (``--gpu-build``, ``DS2_GPU_BUILD``, ``DS2_USE_INSTALLED``); ValueError with
    one line for an empty item (a comma too many), an item that is not ENV=``value``, or an ENV named twice."""
    out = []
    for item in [t.strip() for t in text.split(",")] if text else []:
        if not item:
            raise ValueError("%r has an empty item (a comma too many); expected ENV=%s[,ENV=%s...]"
                             % (text, value, value))
        name, sep, given = (part.strip() for part in item.partition("="))
        if not sep or not name or not given:
            raise ValueError("expected ENV=%s, got %r" % (value, item))
        if name in dict(out):
            raise ValueError("%s is named twice in %r; give each environment once" % (name, text))
        out.append((name, given))
    return out


def python3_error(label: str, python: str) -> Optional[str]:
    """Why ``python`` (a path, or a name on PATH; ``label``: the option as the line names it, such as ``--python
    pytorch=PATH``) cannot run a tool's work, or None: an executable that runs as a Python 3."""
    found = os.path.abspath(python) if os.path.isfile(python) else shutil.which(python)
    if not found or not os.access(found, os.X_OK):
        return "%s: no such executable" % label
    try:
        proc = subprocess.run([found, "-c", "import sys; print(sys.version_info[0])"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, universal_newlines=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return "%s does not run: %s" % (label, e)
    if proc.returncode != 0 or proc.stdout.strip() != "3":
        return "%s does not run as a Python 3 (exit %s)" % (label, proc.returncode)
    return None


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


def first_repeated(values: Sequence):
    """The first value of ``values`` that an earlier one equals, or None when each is there once."""
    return next((v for i, v in enumerate(values) if v in values[:i]), None)


def _twice(values: Sequence, text: str) -> None:
    value = first_repeated(values)
    if value is not None:
        raise argparse.ArgumentTypeError("%r names %s twice; name each once" % (text, value))


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
    """Whether ``path``, a directory or a file, is or holds a file the repository tracks (asked of git; without
    git, any file in the tree below the repository root counts).  Links are resolved: a link into the checkout is
    the checkout."""
    path, root = os.path.realpath(path), os.path.realpath(ROOT)
    inside = path == root or path.startswith(root + os.sep)
    if not inside or not (os.path.isdir(path) or os.path.isfile(path)):
        return False
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--", os.path.relpath(path, root)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30)
        if out.returncode == 0:
            return bool(out.stdout.strip(b"\0"))
    except (OSError, subprocess.SubprocessError):
        pass
    return os.path.isfile(path) or any(files for _, _, files in os.walk(path))


def results_dir_error(option: str, arg: str) -> Optional[str]:
    """Why ``arg`` cannot be the results directory of ``option`` (records, notebooks, plots, logs), or None."""
    if not arg.strip():
        return "%s %r is empty: an empty path is not 'here'; name a directory (default: results/)" % (option, arg)
    path = os.path.abspath(arg)
    real = os.path.realpath(arg)            # a link to the checkout is the checkout
    for root in (ROOT, os.path.abspath(os.sep)):
        if real == os.path.realpath(root):
            return ("%s %r is the %s root (%s): records, notebooks, plots and logs would land among its files; name "
                    "a directory of their own (results/, the default, or results/experiments/NAME)"
                    % (option, arg, "repository" if root == ROOT else "filesystem", real))
    envs = os.path.realpath(os.environ.get("DS2_ENVS_DIR") or os.path.join(ROOT, ".venvs"))
    for tool_dir, what, below in ((os.path.join(ROOT, ".git"), "git's own directory", True),
                                  (os.path.join(ROOT, ".venvs"), "the environments' directory", True),
                                  (envs, "the environments' directory (DS2_ENVS_DIR)", False)):
        tool_dir = os.path.realpath(tool_dir)
        if real == tool_dir or (below and real.startswith(tool_dir + os.sep)):
            return "%s %r is %s (%s); name a directory of its own (default: results/)" % (
                option, arg, what if real == tool_dir else "in " + what, tool_dir)
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
    if arg is not None and (arg.endswith(os.sep) or os.path.basename(arg) in (".", "..")):
        return "%s %r names a directory, not a file; name the page's file (default: results.md)" % (option, arg)
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


def result_file_error(option: str, arg: str, ours) -> Optional[str]:
    """Why ``arg`` cannot take a tool's results file, or None: a file (not a directory) in a folder that exists
    and takes files; one that exists is replaced only when it is a regular file that ``ours(path)`` says this tool
    wrote (or that is empty), and never one the repository tracks."""
    path = os.path.abspath(arg)
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        return "%s %s is a directory; name a file" % (option, path)
    if not os.path.isdir(folder):
        return "%s %s: its folder %s does not exist" % (option, path, folder)
    why = unwritable_dir(folder)
    if why:
        return "%s %s: its folder %s %s" % (option, path, folder, why)
    if not os.path.lexists(path):
        return None
    if os.path.islink(path) or not os.path.isfile(path):
        return "%s %s exists and is not a regular file; name a new file" % (option, path)
    if holds_tracked_files(path):
        return "%s %s is a file the repository tracks: it is kept; name a new file" % (option, path)
    try:
        with open(path) as f:
            empty = not f.read().strip()
    except (OSError, UnicodeDecodeError):
        empty = False
    if not empty and not ours(path):
        return "%s %s exists and is not a results file of this tool: it is kept; name a new file" % (option, path)
    return None


def benchmark_file(name: str):
    """For :func:`result_file_error`: a predicate, whether a path holds the JSON object that the benchmark ``name``
    writes (its ``"benchmark"`` key is ``name``), so that a second run replaces only its own results."""
    def ours(path: str) -> bool:
        try:
            with open(path) as f:
                return json.load(f).get("benchmark") == name
        except (OSError, ValueError, AttributeError):
            return False
    return ours


def output_in_results_error(option: str, output: str, results_dir: str) -> Optional[str]:
    """An ``--output`` in one of the folders the runner fills in ``results_dir`` (:data:`RESULTS_FOLDERS`:
    records/, whose every *.json a later run reads as a record, and the others), or None."""
    folder = os.path.realpath(os.path.dirname(os.path.abspath(output)))
    for name in RESULTS_FOLDERS:
        owned = os.path.realpath(os.path.join(results_dir, name))
        if folder == owned or folder.startswith(owned + os.sep):
            return ("%s %s is in the results directory's %s/, which the runner fills (and reads) itself; put the "
                    "page beside it (default: %s)" % (option, output, name, output_default(results_dir)))
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
    output = output_arg or output_default(path)
    return output_error("--output", output, output_arg) or (
        output_in_results_error("--output", output, path) if output_arg else None)


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
