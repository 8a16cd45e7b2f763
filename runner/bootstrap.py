"""Give ``python run_all.py`` and ``python -m tests`` their own environment on a fresh machine.

Standard library only: this runs before anything is installed.  The runner environment
(``.venvs/runner``, pins in ``envs/runner.txt``) is created once and re-created only when the
pins change; the command is then re-executed inside it.  Set ``DS2_RUNNER=current`` to use the
current interpreter instead (e.g. a conda environment made from environment.yml).
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
from typing import Optional

from common.results import atomic_write_text  # standard library only, like this module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENVS_DIR = os.path.abspath(os.environ.get("DS2_ENVS_DIR", os.path.join(ROOT, ".venvs")))
RUNNER_REQUIREMENTS = os.path.join(ROOT, "envs", "runner.txt")
STAMP = ".ds2-stamp.json"


class EnvError(RuntimeError):
    """An environment could not be created; the message is one line."""


class WheelhouseError(EnvError):
    """The wheelhouse (``--wheelhouse DIR``) lacks a wheel an environment needs: run_all.py exits 2."""


def env_python(path: str) -> str:
    return os.path.join(path, "Scripts" if os.name == "nt" else "bin", "python")


def file_digest(*paths: str) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def read_stamp(path: str) -> dict:
    try:
        with open(os.path.join(path, STAMP)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def write_stamp(path: str, stamp: dict) -> None:
    atomic_write_text(os.path.join(path, STAMP), json.dumps(stamp, indent=1))


def last_error_line(text: str) -> str:
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    for line in reversed(lines):
        if line.startswith(("ERROR", "error:", "E:")) or "Error" in line:
            return line
    return lines[-1] if lines else "no output"


def run_logged(args, log_path: str, what: str, env=None, cwd=ROOT) -> None:
    """Run a command, appending its output to ``log_path``; raise EnvError with one line on failure."""
    with open(log_path, "a") as log:
        log.write("\n$ %s\n" % " ".join(args))
        log.flush()
        proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                              cwd=cwd, env=env)
        log.write(proc.stdout)
    if proc.returncode != 0:
        raise EnvError("%s failed: %s (log: %s)" % (what, last_error_line(proc.stdout), log_path))


def create_venv(path: str, requirements: str, base_python: str, stamp: dict, log_path: str,
                pip: str = "pip", wheelhouse: Optional[str] = None) -> None:
    """(Re)create a virtual environment at ``path`` with ``requirements`` installed; stamp it last.

    ``pip`` is the requirement pip is upgraded to first (old interpreters need a bound: the newest
    pip a local wheel directory offers may not support them).  ``wheelhouse``: install from that
    directory only, no index (runner/wheelhouse.py).
    """
    offline = ["--no-index", "--find-links", wheelhouse] if wheelhouse else []
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.abspath(base_python) == os.path.abspath(sys.executable) and sys.prefix == sys.base_prefix:
        venv.EnvBuilder(with_pip=True).create(path)
    else:
        run_logged([base_python, "-m", "venv", path], log_path, "creating a virtual environment with %s" % base_python)
    py = env_python(path)
    # The pip a new venv starts with can be old (18.1 on Python 3.6) and misreads PIP_NO_CACHE_DIR=1 as
    # a cache path: give it the flag instead of the variable until it is upgraded.
    env = dict(os.environ)
    no_cache = ["--no-cache-dir"] if env.pop("PIP_NO_CACHE_DIR", None) not in (None, "", "0", "false") else []
    run_logged([py, "-m", "pip", "install", "--upgrade"] + no_cache + offline + [pip], log_path,
               "upgrading pip in %s" % path, env=env)
    run_logged([py, "-m", "pip", "install"] + offline + ["-r", requirements], log_path,
               "pip install -r %s" % os.path.relpath(requirements, ROOT))
    write_stamp(path, stamp)


def runner_dir() -> str:
    return os.path.join(ENVS_DIR, "runner")


def ensure_runner_env(announce=print, wheelhouse: Optional[str] = None) -> str:
    """The runner environment's Python, created from envs/runner.txt if missing or outdated (from
    ``wheelhouse`` only, when given: checked first, WheelhouseError naming what it lacks)."""
    path = runner_dir()
    stamp = {"requirements": file_digest(RUNNER_REQUIREMENTS)}
    if read_stamp(path) != stamp or not os.path.exists(env_python(path)):
        base = getattr(sys, "_base_executable", None) or sys.executable
        if wheelhouse:
            from . import wheelhouse as wh
            wh.check(wheelhouse, RUNNER_REQUIREMENTS, "%d.%d" % sys.version_info[:2], "the runner's environment")
        announce("Creating the runner environment %s from envs/runner.txt (once; a few minutes)..." % path)
        os.makedirs(ENVS_DIR, exist_ok=True)
        create_venv(path, RUNNER_REQUIREMENTS, base, stamp, os.path.join(ENVS_DIR, "runner.log"),
                    wheelhouse=wheelhouse)
    return env_python(path)


def in_runner_env() -> bool:
    return os.path.abspath(sys.prefix) == os.path.abspath(runner_dir())


#: the modules run_all.py and the report import from envs/runner.txt (import name: distribution), cheapest first
RUNNER_IMPORTS = (("numpy", "numpy"), ("tabulate", "tabulate"), ("tqdm", "tqdm"), ("mistune", "mistune"),
                  ("pygments", "Pygments"), ("nbformat", "nbformat"), ("nbclient", "nbclient"),
                  ("papermill", "papermill"), ("pandas", "pandas"), ("matplotlib", "matplotlib"))


def import_problem() -> Optional[str]:
    """``DS2_RUNNER=current``: the first module the runner needs that is installed but does not import here (a
    broken or half-upgraded package), in one line with how to reinstall it; None when all import."""
    import importlib
    for module, dist in RUNNER_IMPORTS:
        try:
            importlib.import_module(module)
        except Exception as e:  # ImportError, and whatever a broken package raises while it initialises
            from .installed import read_pins
            pin = read_pins(RUNNER_REQUIREMENTS, "%d.%d" % sys.version_info[:2]).get(dist)
            return ("DS2_RUNNER=current: %s cannot import %s (%s: %s); reinstall it with: %s -m pip install "
                    "--force-reinstall '%s%s'" % (sys.executable, module, type(e).__name__,
                                                  " ".join(str(e).split())[:200], sys.executable, dist,
                                                  "==" + pin if pin else ""))
    return None


def reexec_in_runner(argv) -> None:
    """Re-execute ``argv`` (arguments after the interpreter) inside the runner environment; with
    ``DS2_RUNNER=current``, check instead that the current interpreter has what the runner imports (one line
    naming what it lacks and how to install it, exit status 2)."""
    prog = "python -m tests" if argv[:2] == ["-m", "tests"] else os.path.basename(argv[0])
    from .validate import environment_errors, refuse     # standard library only, like this module
    errors = environment_errors(names=("DS2_RUNNER", "DS2_ENVS_DIR", "DS2_WHEELHOUSE"))
    for i, arg in enumerate(argv):          # read below before argparse is in charge: an empty one is not "here"
        value = arg.split("=", 1)[1] if arg.startswith("--wheelhouse=") else \
            argv[i + 1] if arg == "--wheelhouse" and i + 1 < len(argv) else None
        if value is not None and not value.strip():
            errors.append("argument --wheelhouse: %r is empty: an empty value names no directory (it is not "
                          "'here')" % value)
    if errors:
        sys.exit(refuse(prog, errors[0]))
    if os.environ.get("DS2_RUNNER") == "current":
        from .installed import runner_problem     # standard library only, like this module
        problem = runner_problem(tests=prog == "python -m tests") or import_problem()
        if problem:
            sys.exit(refuse(prog, problem))
        return
    if in_runner_env():
        return
    from . import interrupt            # standard library only, like this module
    previous = interrupt.install()
    try:
        from .wheelhouse import from_argv
        python = ensure_runner_env(announce=lambda m: print(m, file=sys.stderr, flush=True),
                                   wheelhouse=from_argv(list(argv)))
    except WheelhouseError as e:
        print("%s: error: %s" % (prog, e), file=sys.stderr)
        sys.exit(2)
    except EnvError as e:
        sys.exit("error: %s" % e)
    except interrupt.Interrupted as e:  # pip is stopped with it; the half-made environment has no stamp
        interrupt.stderr_line("%s: %s while creating the runner environment" % (prog, e.reason))
        sys.exit(e.exit_status)
    interrupt.restore(previous)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(python, [python] + list(argv))
