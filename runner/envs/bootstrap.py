"""Give ``python run_all.py`` and ``python -m tests`` their own environment on a fresh machine.

Standard library only: this runs before anything is installed.  The runner environment
(``.venvs/runner``, pins in ``envs/runner.txt``) is created once and re-created only when the
pins change; the command is then re-executed inside it.  Set ``DS2_RUNNER=current`` to use the
current interpreter instead (e.g. a conda environment made from environment.yml).

Every environment is installed with uv (``uv pip install``: parallel downloads, a shared cache) where it
can be: the runner's environment gets uv first (its pin in envs/runner.txt, with pip), the framework
environments use the runner's.  uv reads the same package sources pip would (pip's own configuration,
read by pip: index, extra indexes, find-links, constraints; pip's choice among them, the best version
of any), so both install the same files.  pip installs instead with ``--wheelhouse``, where no uv is
installed (``DS2_RUNNER=current`` without it), where pip's configuration cannot be read or holds what
uv cannot follow, after uv failed, and with ``DS2_INSTALLER=pip``.
"""
import contextlib
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import venv
from typing import Callable, List, Optional, Tuple

from common.results import atomic_write_text  # standard library only, like this module
from runner import interrupt  # standard library only, like this module
from runner.base import ROOT, EnvError, WheelhouseError, last_error_line

ENVS_DIR = os.path.abspath(os.environ.get("DS2_ENVS_DIR", os.path.join(ROOT, ".venvs")))
RUNNER_REQUIREMENTS = os.path.join(ROOT, "envs", "runner.txt")
STAMP = ".ds2-stamp.json"


#: which installer makes environments: "uv" or "pip" (unset: uv where it can serve, else pip)
INSTALLER_VAR = "DS2_INSTALLER"
INSTALLERS = ("uv", "pip")


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


_children = {}                    # pid -> Popen of every install command running now (any thread)
_children_lock = threading.Lock()
_stopping = threading.Event()     # set by stop_children(): no new command starts


def run_logged(args, log_path: str, what: str, env=None, cwd=ROOT, on_line: Optional[Callable[[str], None]] = None
               ) -> None:
    """Run a command, appending its output to ``log_path`` line by line (``on_line`` sees each line); raise
    EnvError with one line on failure.  Off the main thread the command gets a process group of its own, which
    :func:`stop_children` ends (a terminal's Ctrl-C reaches only the foreground's).  The command gets a temporary
    folder of its own (``TMPDIR``), removed when it ends: what a stopped pip leaves there (a downloaded wheel, its
    build and unpack folders) goes with it."""
    if _stopping.is_set():
        raise EnvError("%s: not started, the run is stopping" % what)
    background = threading.current_thread() is not threading.main_thread()
    env = dict(os.environ if env is None else env)
    with interrupt.temporary_folder("ds2-install-", env.get("TMPDIR")) as tmp:
        env["TMPDIR"] = tmp
        _run_logged(args, log_path, what, env, cwd, on_line, background)


def _run_logged(args, log_path, what, env, cwd, on_line, background) -> None:
    with open(log_path, "a") as log:
        log.write("\n$ %s\n" % " ".join(args))
        log.flush()
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                                cwd=cwd, env=env, start_new_session=background)
        with _children_lock:
            _children[proc.pid] = proc
            missed = _stopping.is_set()   # stop_children set it before listing _children: this one may not be there
        if missed:
            _kill(proc, signal.SIGKILL)
        tail = []
        try:
            for line in proc.stdout:
                log.write(line)
                tail.append(line)
                del tail[:-200]
                if on_line is not None:
                    on_line(line.rstrip("\n"))
            proc.wait()
        except BaseException:             # a signal (runner.interrupt) or a failing callback: the command goes too
            _kill(proc, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            proc.stdout.close()
            with _children_lock:
                _children.pop(proc.pid, None)
    if missed:
        raise EnvError("%s: stopped, the run is stopping" % what)
    if proc.returncode != 0:
        raise EnvError("%s failed: %s (log: %s)" % (what, last_error_line("".join(tail)), log_path))


def _kill(proc, sig) -> None:
    try:
        if proc.pid == os.getpgid(proc.pid):      # its own process group: with whatever it started
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    except OSError:
        pass


def stop_children(sig=signal.SIGTERM, wait_s: float = 5.0) -> None:
    """End every install command still running (``sig``, then SIGKILL after ``wait_s``); none starts after this
    until :func:`allow_children`.  For a run that stops while environments are made in the background."""
    import time
    _stopping.set()
    with _children_lock:
        procs = list(_children.values())
    for proc in procs:
        _kill(proc, sig)
    deadline = time.time() + wait_s
    while time.time() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    for proc in procs:
        if proc.poll() is None:
            _kill(proc, signal.SIGKILL)


def allow_children() -> None:
    _stopping.clear()


# ---- the installer: uv where it serves, else pip -------------------------------------------------------------
def installer_problem(environ=None) -> Optional[str]:
    """One line when DS2_INSTALLER holds something other than uv or pip, else None."""
    value = (os.environ if environ is None else environ).get(INSTALLER_VAR)
    if value is None or value in INSTALLERS:
        return None
    return "%s=%s: expected %s (unset: uv where it can serve, else pip)" % (INSTALLER_VAR, value,
                                                                          " or ".join(INSTALLERS))


def uv_requirement() -> Optional[str]:
    """The uv pin of envs/runner.txt ("uv==0.13.9"), or None."""
    with open(RUNNER_REQUIREMENTS) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line.lower().startswith("uv=="):
                return line
    return None


def uv_executable() -> Optional[str]:
    """The uv installed beside this interpreter (the runner's environment has it: envs/runner.txt), or None."""
    path = os.path.join(sysconfig.get_path("scripts"), "uv")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


#: pip's own reading of its configuration (files, PIP_* variables) for ``pip install``, as JSON
PIP_OPTIONS = r'''
import json
from pip._internal.commands import create_command
o, _ = create_command("install").parse_args([])
fc = o.format_control
print(json.dumps(dict(index_url=o.index_url, extra_index_urls=o.extra_index_urls, find_links=o.find_links,
                      no_index=o.no_index, constraints=o.constraints, cert=o.cert, trusted_hosts=o.trusted_hosts,
                      pre=o.pre, only_binary=sorted(fc.only_binary), no_binary=sorted(fc.no_binary),
                      timeout=o.timeout, proxy=o.proxy or None, requirements=o.requirements, editables=o.editables,
                      client_cert=o.client_cert, prefer_binary=o.prefer_binary)))
'''

_pip_options_cache = {}


def pip_options(python: str = sys.executable) -> Tuple[Optional[dict], str]:
    """(pip's configured options for ``pip install``, as ``python``'s pip reads them; None and why when it
    cannot say)."""
    if python not in _pip_options_cache:
        env = {k: v for k, v in os.environ.items() if k != "PIP_REQUIRE_VIRTUALENV"}
        try:
            proc = subprocess.run([python, "-c", PIP_OPTIONS], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  universal_newlines=True, timeout=120, env=env)
            _pip_options_cache[python] = (json.loads(proc.stdout.strip().splitlines()[-1]), "") \
                if proc.returncode == 0 else (None, "pip's configuration could not be read: %s"
                                              % last_error_line(proc.stderr))
        except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
            _pip_options_cache[python] = (None, "pip's configuration could not be read: %s" % e)
    return _pip_options_cache[python]


def uv_arguments(options: dict) -> Tuple[Optional[List[str]], dict, str]:
    """``uv pip install`` arguments and environment variables that reach the package sources pip's ``options``
    name, chosen among as pip does (every index, the best version: ``--index-strategy unsafe-best-match``);
    (None, {}, why) for a setting uv would not follow."""
    unsupported = [name for name in ("requirements", "editables", "client_cert", "prefer_binary")
                   if options.get(name)]
    if unsupported:
        return None, {}, "pip's configuration sets %s, which uv would not follow" % ", ".join(unsupported)
    args = ["--index-strategy", "unsafe-best-match"]
    if options.get("no_index"):
        args.append("--no-index")
    elif options.get("index_url"):
        args += ["--index-url", options["index_url"]]
    for url in options.get("extra_index_urls") or []:
        args += ["--extra-index-url", url]
    for link in options.get("find_links") or []:
        args += ["--find-links", link]
    for constraint in options.get("constraints") or []:
        args += ["--constraint", constraint]
    for host in options.get("trusted_hosts") or []:
        args += ["--allow-insecure-host", host]
    if options.get("pre"):
        args += ["--prerelease", "allow"]
    for name, flag in (("only_binary", "--only-binary"), ("no_binary", "--no-binary")):
        if options.get(name):
            args += [flag, ",".join(options[name])]
    env = {}
    if options.get("cert") and not os.environ.get("SSL_CERT_FILE"):
        env["SSL_CERT_FILE"] = options["cert"]
    if options.get("timeout") and not os.environ.get("UV_HTTP_TIMEOUT"):
        env["UV_HTTP_TIMEOUT"] = str(int(options["timeout"]))
    if options.get("proxy"):
        env.update(HTTP_PROXY=options["proxy"], HTTPS_PROXY=options["proxy"])
    return args, env, ""


class _NoUv(Exception):
    """uv does not make this environment (the message says why); pip does, and nothing failed."""


def uv_excluded(wheelhouse: Optional[str]) -> Optional[str]:
    """Why pip, not uv, makes environments whatever is installed (DS2_INSTALLER=pip, --wheelhouse), or None."""
    if os.environ.get(INSTALLER_VAR) == "pip":
        return "%s=pip" % INSTALLER_VAR
    if wheelhouse:
        return "--wheelhouse (pip installs from it)"
    return None


def bundled_seed(python: str) -> List[str]:
    """The setuptools wheel ``python``'s ensurepip bundles (what ``python -m venv`` installs beside pip; none from
    Python 3.12 on), so that an environment uv makes starts as pip's does."""
    if os.path.realpath(python) == os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable):
        stdlib = sysconfig.get_path("stdlib")
    else:
        try:
            stdlib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True,
                                    timeout=60).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return []
    return sorted(glob.glob(os.path.join(stdlib, "ensurepip", "_bundled", "setuptools-*.whl")))[-1:]


def count_installs(installer: str, on_count: Callable[[int], None]) -> Callable[[str], None]:
    """An ``on_line`` for :func:`run_logged` that calls ``on_count(n)`` once the installer says how many packages
    it installs (uv: "Resolved N packages", pip: "Installing collected packages: a, b")."""
    import re

    def on_line(line: str) -> None:
        m = re.match(r"Resolved (\d+) packages? ", line) if installer == "uv" else None
        if m:
            on_count(int(m.group(1)))
        elif installer == "pip" and line.startswith("Installing collected packages: "):
            on_count(len(line.split(": ", 1)[1].split(", ")))
    return on_line


@contextlib.contextmanager
def env_lock(path: str, announce: Optional[Callable[[str], None]] = None,
             stopping: Optional[Callable[[], bool]] = None):
    """While held, this process alone checks, makes or registers the environment at ``path``: a second process that
    would make the same one (another run_all.py or test session in this checkout) waits, then finds it made, instead
    of removing it under the first one's installer (which then installed into the base interpreter).  An advisory
    lock (``fcntl.flock``) on ``<path>.lock``, released when the holder ends, however it ends.  ``announce`` hears
    one line when it has to wait; ``stopping`` (polled while waiting) ends the wait with an EnvError.  Where the
    lock file cannot be written (a read-only environments directory, where nothing can be made either) or the
    filesystem has no locks, it does not lock."""
    import fcntl
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if announce is not None:
                shown = os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path
                announce("waiting for another process that is making %s (it holds %s.lock)" % (shown, shown))
            while True:
                if stopping is not None and stopping():
                    raise EnvError("stopped while waiting for another process that is making %s" % path)
                time.sleep(0.2)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    continue
        except OSError:             # a filesystem without locks (some network mounts): made as before, unlocked
            pass
        yield
    finally:
        os.close(fd)


def _require_venv(path: str) -> None:
    """Refuses to install into ``path`` unless it is still a virtual environment: without its ``pyvenv.cfg`` its
    ``bin/python`` is the base interpreter, and uv or pip would install there."""
    if not os.path.isfile(os.path.join(path, "pyvenv.cfg")):
        raise EnvError("%s is not a virtual environment (no pyvenv.cfg: removed while it was being made?); nothing "
                       "was installed into the interpreter it points to" % path)


def create_venv(path: str, requirements: str, base_python: str, stamp: dict, log_path: str,
                pip: str = "pip", wheelhouse: Optional[str] = None, uv: Optional[str] = None,
                progress: Optional[Callable[[str], None]] = None, uv_from_pins: bool = False) -> str:
    """(Re)create a virtual environment at ``path`` with ``requirements`` installed; stamp it last.  Returns the
    installer that made it: "uv" or "pip".

    ``pip`` is the requirement pip is upgraded to first (old interpreters need a bound: the newest
    pip a local wheel directory offers may not support them).  ``wheelhouse``: install from that
    directory only, no index, with pip (runner/envs/wheelhouse.py).  ``uv``: the uv to install with (default: the
    one beside this interpreter); ``uv_from_pins``: first install envs/runner.txt's uv into the new environment
    with pip, and use that one (the runner's environment).  ``progress`` hears a line when the installer says
    how many packages it installs.  uv that fails is followed by pip, unless DS2_INSTALLER=uv.
    """
    say = progress or (lambda message: None)
    why_pip = uv_excluded(wheelhouse)
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if why_pip is None:
        try:
            if uv_from_pins:
                uv, pip_python = _pip_installs_uv(path, base_python, log_path), env_python(path)
            else:
                uv, pip_python = uv or uv_executable(), sys.executable
                if not uv:
                    raise _NoUv("no uv beside %s" % sys.executable)
            options, why = pip_options(pip_python)
            if options is None:
                raise _NoUv(why)
            uv_args, uv_env, why = uv_arguments(options)
            if uv_args is None:
                raise _NoUv(why)
            _install_with_uv(path, requirements, base_python, log_path, pip, uv, uv_args, uv_env, say,
                             fresh=not uv_from_pins)
            write_stamp(path, stamp)
            return "uv"
        except _NoUv as e:
            why_pip = str(e)
            if os.environ.get(INSTALLER_VAR) == "uv":
                raise EnvError("%s=uv, but uv cannot make %s: %s" % (INSTALLER_VAR, path, e))
        except EnvError as e:
            if os.environ.get(INSTALLER_VAR) == "uv":
                raise
            why_pip = "uv failed: %s" % e
            say("uv failed; pip installs instead (log: %s)" % log_path)
        shutil.rmtree(path, ignore_errors=True)
    with open(log_path, "a") as log:
        log.write("\n# pip installs this environment: %s\n" % why_pip)
    _install_with_pip(path, requirements, base_python, log_path, pip, wheelhouse, say)
    write_stamp(path, stamp)
    return "pip"


def _no_cache_env() -> Tuple[dict, List[str]]:
    """The environment for an old pip, and its flag: the pip a new venv starts with can be old (18.1 on Python
    3.6) and misreads PIP_NO_CACHE_DIR=1 as a cache path, so it gets the flag instead of the variable."""
    env = dict(os.environ)
    return env, ["--no-cache-dir"] if env.pop("PIP_NO_CACHE_DIR", None) not in (None, "", "0", "false") else []


def _pip_installs_uv(path: str, base_python: str, log_path: str) -> str:
    """A venv at ``path`` (with pip, as pip's route makes it) with envs/runner.txt's uv installed by pip; that uv."""
    requirement = uv_requirement()
    if not requirement:
        raise _NoUv("envs/runner.txt pins no uv")
    _make_venv(path, base_python, log_path, with_pip=True)
    env, no_cache = _no_cache_env()
    _require_venv(path)
    run_logged([env_python(path), "-m", "pip", "install"] + no_cache + [requirement], log_path,
               "pip install %s" % requirement, env=env)
    return os.path.join(os.path.dirname(env_python(path)), "uv")


def _make_venv(path: str, base_python: str, log_path: str, with_pip: bool) -> None:
    if os.path.abspath(base_python) == os.path.abspath(sys.executable) and sys.prefix == sys.base_prefix:
        venv.EnvBuilder(with_pip=with_pip).create(path)
    else:
        run_logged([base_python, "-m", "venv"] + ([] if with_pip else ["--without-pip"]) + [path], log_path,
                   "creating a virtual environment with %s" % base_python)


def _install_with_pip(path: str, requirements: str, base_python: str, log_path: str, pip: str,
                      wheelhouse: Optional[str], say: Callable[[str], None]) -> None:
    offline = ["--no-index", "--find-links", wheelhouse] if wheelhouse else []
    _make_venv(path, base_python, log_path, with_pip=True)
    py = env_python(path)
    env, no_cache = _no_cache_env()
    _require_venv(path)
    run_logged([py, "-m", "pip", "install", "--upgrade"] + no_cache + offline + [pip], log_path,
               "upgrading pip in %s" % path, env=env)
    run_logged([py, "-m", "pip", "install"] + offline + ["-r", requirements], log_path,
               "pip install -r %s" % os.path.relpath(requirements, ROOT),
               on_line=count_installs("pip", lambda n: say("pip installs %d packages" % n)))


def _install_with_uv(path: str, requirements: str, base_python: str, log_path: str, pip: str, uv: str,
                     uv_args: List[str], uv_env: dict, say: Callable[[str], None], fresh: bool = True) -> None:
    """What :func:`_install_with_pip` makes, with uv: a venv without pip and the setuptools ``venv`` would have
    put there (``fresh``; else the venv at ``path`` as it is), then ``pip`` (upgraded) and the pins in one
    ``uv pip install``, compiled to bytecode as pip compiles them (``--compile-bytecode``: uv's default leaves it to
    each module's first import, and where ``PYTHONDONTWRITEBYTECODE`` is set, every process compiles again what it
    imports: each notebook's kernel took 1.3-1.5x as long)."""
    py = env_python(path)
    env = dict(os.environ, **uv_env)
    seed = []
    if fresh:
        _make_venv(path, base_python, log_path, with_pip=False)
        seed = bundled_seed(base_python)
    _require_venv(path)
    # Each uv command asks the interpreter afresh (any --refresh-package does) which environment it is: uv caches
    # that answer per path of bin/python, and its key is not changed by the venv made again there, so one answer
    # of a moment when the path was no venv (its pyvenv.cfg gone: bin/python is then the base interpreter) sent
    # every later install at that path into the base interpreter (seen with uv 0.13.9, envs/runner.txt's).
    if seed:        # by name from its directory, so that it is recorded as installed from an index, as pip's is
        wheel = os.path.basename(seed[0])
        name, version = wheel.split("-")[:2]
        requirement = "%s==%s" % (name, version)
        run_logged([uv, "pip", "install", "--no-config", "--python", py, "--refresh-package", name, "--no-index",
                    "--no-deps", "--find-links", os.path.dirname(seed[0]), requirement], log_path,
                   "uv pip install %s" % requirement, env=env)
    # uv compiles with the environment's interpreter, through an API Python 3.7 added: Python 3.6 compiles itself
    uv_compiles = _runs_ok([py, "-c", "import py_compile; py_compile.PycInvalidationMode"])
    pip_name = pip.split("=")[0].split("<")[0].split(">")[0]
    run_logged([uv, "pip", "install", "--no-config", "--python", py, "--refresh-package", pip_name]
               + (["--compile-bytecode"] if uv_compiles else [])
               + uv_args + ["--upgrade-package", pip_name, pip, "-r", requirements],
               log_path, "uv pip install -r %s" % os.path.relpath(requirements, ROOT), env=env,
               on_line=count_installs("uv", lambda n: say("uv installs %d packages" % n)))
    if not uv_compiles:
        try:      # only speed is at stake: a package that does not compile stays as it is
            run_logged([py, "-c", "import compileall, sysconfig; compileall.compile_dir("
                        "sysconfig.get_path('purelib'), quiet=1, workers=0)"], log_path,
                       "compiling the packages of %s to bytecode" % path, env=env)
        except EnvError as e:
            with open(log_path, "a") as log:
                log.write("# not compiled to bytecode: %s\n" % e)


def _runs_ok(argv: List[str]) -> bool:
    try:
        return subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def runner_dir() -> str:
    return os.path.join(ENVS_DIR, "runner")


def ensure_runner_env(announce=print, wheelhouse: Optional[str] = None) -> str:
    """The runner environment's Python, created from envs/runner.txt if missing or outdated (from
    ``wheelhouse`` only, when given: checked first, WheelhouseError naming what it lacks)."""
    path = runner_dir()
    stamp = {"requirements": file_digest(RUNNER_REQUIREMENTS)}

    def ready():
        return read_stamp(path) == stamp and os.path.exists(env_python(path))
    if ready():
        return env_python(path)
    with env_lock(path, announce):          # a second run_all.py started meanwhile waits here, then finds it made
        if not ready():
            base = getattr(sys, "_base_executable", None) or sys.executable
            if wheelhouse:
                from runner.envs import wheelhouse as wh
                wh.require_wheels(wheelhouse, RUNNER_REQUIREMENTS, "%d.%d" % sys.version_info[:2],
                                  "the runner's environment")
            announce("Creating the runner environment %s from envs/runner.txt (once; %s)..."
                     % (path, "with pip" if uv_excluded(wheelhouse) else "with uv, installed first by pip"))
            os.makedirs(ENVS_DIR, exist_ok=True)
            create_venv(path, RUNNER_REQUIREMENTS, base, stamp, os.path.join(ENVS_DIR, "runner.log"),
                        wheelhouse=wheelhouse, uv_from_pins=True)
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
            from runner.envs.use_installed import read_pins
            pin = read_pins(RUNNER_REQUIREMENTS, "%d.%d" % sys.version_info[:2]).get(dist)
            return ("DS2_RUNNER=current: %s cannot import %s (%s: %s); reinstall it with: %s -m pip install "
                    "--force-reinstall '%s%s'" % (sys.executable, module, type(e).__name__,
                                                  " ".join(str(e).split())[:200], sys.executable, dist,
                                                  "==" + pin if pin else ""))
    return None


def reexec_in_runner(argv, parse=None) -> None:
    """Re-execute ``argv`` (arguments after the interpreter) inside the runner environment; with
    ``DS2_RUNNER=current``, check instead that the current interpreter has what the runner imports (one line
    naming what it lacks and how to install it, exit status 2).  ``parse``: the command's own parse of its
    arguments (standard library only), called before the runner's environment is made or entered, so that a bad
    option is one line and nothing is built."""
    prog = "python -m tests" if argv[:2] == ["-m", "tests"] else os.path.basename(argv[0])
    from runner.validate import environment_errors, refuse  # standard library only, like this module
    errors = environment_errors(names=("DS2_RUNNER", "DS2_ENVS_DIR", "DS2_WHEELHOUSE"))
    for i, arg in enumerate(argv):          # read below before argparse is in charge: an empty one is not "here"
        value = arg.split("=", 1)[1] if arg.startswith("--wheelhouse=") else \
            argv[i + 1] if arg == "--wheelhouse" and i + 1 < len(argv) else None
        if value is not None and not value.strip():
            errors.append("argument --wheelhouse: %r is empty: an empty value names no directory (it is not "
                          "'here')" % value)
    problem = installer_problem()
    if problem:
        errors.append(problem)
    if errors:
        sys.exit(refuse(prog, errors[0]))
    if os.environ.get("DS2_RUNNER") == "current":
        from runner.envs.use_installed import runner_problem  # standard library only, like this module
        problem = runner_problem(tests=prog == "python -m tests") or import_problem()
        if problem:
            sys.exit(refuse(prog, problem))
        return
    if in_runner_env():
        return
    if parse is not None:
        parse(list(argv[1:]))                  # a bad option: one line, exit status 2, nothing made
    previous = interrupt.install()
    try:
        from runner.envs.wheelhouse import from_argv
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
