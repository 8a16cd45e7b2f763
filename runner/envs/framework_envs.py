"""One isolated virtual environment and Jupyter kernel per framework.

``.venvs/<env>-<cpu|cuda>`` holds the framework's pinned packages (``envs/<env>-<cpu|cuda>.txt``)
and ipykernel; its kernel ``ds2-<env>-<cpu|cuda>`` is registered in the runner environment, so
papermill (and Jupyter started from the runner environment) find it.  An environment is built
once and rebuilt only when its pins or its interpreter change.
"""
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from typing import Callable, List, Optional, Tuple

from common.results import atomic_write_text

from runner.envs import bootstrap
from runner.envs.bootstrap import (ENVS_DIR, STAMP, create_venv, env_lock, env_python, file_digest, read_stamp,
                                   run_logged)
from runner.base import ROOT, EnvError
from runner import interrupt
from runner.envs import gpu_preflight
from runner.envs.gpu_preflight import Build
from runner.envs.definitions import Env


def default_python() -> str:
    """The interpreter environments are made from: the one behind the runner environment."""
    return getattr(sys, "_base_executable", None) or sys.executable


def _suffix(python: Optional[str]) -> str:
    if not python:
        return ""
    return "-" + hashlib.sha256(os.path.realpath(python).encode()).hexdigest()[:8]


def _variant(env: Env, device: str, build: Optional[Build]) -> str:
    """'-cu126' for a GPU build of an environment that has several (runner/envs/gpu_preflight.py), else ''."""
    if device == "cuda" and build is not None and len(gpu_preflight.builds(env.name)) > 1:
        return "-" + build.name
    return ""


def env_path(env: Env, device: str, python: Optional[str] = None, build: Optional[Build] = None) -> str:
    return os.path.join(ENVS_DIR, "%s-%s%s%s" % (env.name, device, _variant(env, device, build), _suffix(python)))


def kernel_name(env: Env, device: str, python: Optional[str] = None, build: Optional[Build] = None) -> str:
    return "ds2-%s-%s%s%s" % (env.name, device, _variant(env, device, build), _suffix(python))


def kernels_prefix() -> str:
    """Where kernels are registered: the runner environment's prefix (``share/jupyter/kernels``)."""
    return sys.prefix


def python_version(python: str) -> str:
    try:
        out = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise EnvError("cannot run the interpreter %s: %s" % (python, e))
    if out.returncode != 0:
        raise EnvError("the interpreter %s does not run: %s" % (python, (out.stderr.strip().splitlines() or ["?"])[-1]))
    return out.stdout.strip()


def status(env: Env, device: str, python: Optional[str] = None, build: Optional[Build] = None) -> str:
    """"ready", "outdated" (pins changed) or "missing"."""
    path = env_path(env, device, python, build)
    if not os.path.exists(env_python(path)):
        return "missing"
    stamp = read_stamp(path)
    req = env.requirements(device, build)
    if not os.path.exists(req) or stamp.get("requirements") != file_digest(req):
        return "outdated"
    return "ready"


def _stamp(env: Env, device: str, python: Optional[str], build: Optional[Build]) -> Tuple[str, str, str, str, dict]:
    """(interpreter, pins file, environment path, Python version, stamp) of the environment, after every check
    that can refuse it (EnvError with one line) -- what :func:`ensure` compares with the environment's stamp."""
    if env.needs_python and not python:
        raise EnvError(env.needs_python)
    base = python or default_python()
    if python and not os.path.exists(python):
        raise EnvError("interpreter %s for %s not found" % (python, env.name))
    req = env.requirements(device, build)
    if not os.path.exists(req):
        raise EnvError("no pins for %s on %s: %s is missing" % (env.name, device, os.path.relpath(req, ROOT)))
    if env.needs:
        reason = env.needs()
        if reason:
            raise EnvError(reason)
    path = env_path(env, device, python, build)
    version = python_version(base)
    problem = env.python_problem(version)
    if problem:
        raise EnvError("%s; %s is Python %s%s" % (problem, base, version, "" if python else
                                                 ": give it one with --python %s=PATH" % env.name))
    stamp = {"requirements": file_digest(req), "python": os.path.realpath(base), "python_version": version}
    if device == "cuda" and build is not None:
        stamp["gpu_build"] = {"build": build.name, "package": build.package, "cuda": build.cuda,
                              "pins": os.path.relpath(req, ROOT)}
    return base, req, path, version, stamp


def ensure(env: Env, device: str, python: Optional[str] = None, announce=print, build: Optional[Build] = None,
           wheelhouse: Optional[str] = None) -> str:
    """Create (if needed) the environment and register its kernel; returns the kernel name.

    ``python`` is an interpreter to build it from (default: the runner's base interpreter); ``build``
    the CUDA build chosen by runner/envs/gpu_preflight.py (its own pins and environment, ``<env>-cuda-<build>``);
    ``wheelhouse`` a directory to install from with no index (runner/envs/wheelhouse.py).  An environment that
    :func:`start_ahead` is making already is waited for.
    Raises :class:`EnvError` with a one-line reason when it cannot be made.
    """
    job = _ahead.get(_key(env, device, python, build, wheelhouse))
    if job is not None:
        return job.result(announce)
    return _ensure(env, device, python, announce, build, wheelhouse)


def _ensure(env: Env, device: str, python: Optional[str], announce, build: Optional[Build],
            wheelhouse: Optional[str], progress: Optional[Callable[[str], None]] = None,
            creating: Optional[Callable[[str, str], str]] = None) -> str:
    base, req, path, version, stamp = _stamp(env, device, python, build)
    # another process making the same environment (a second run_all.py in this checkout) is waited for
    with env_lock(path, announce, _stopping.is_set):
        log = os.path.join(ENVS_DIR, "%s.log" % os.path.basename(path))
        fresh = read_stamp(path) != stamp or not os.path.exists(env_python(path))
        if fresh:
            details = "Python %s, %s, %s" % (version, os.path.relpath(req, ROOT), installer_for(wheelhouse))
            announce(creating(details, log) if creating else "Creating environment %s (%s); log: %s"
                     % (os.path.relpath(path, ROOT), details, log))
            os.makedirs(ENVS_DIR, exist_ok=True)
            if os.path.exists(log):
                os.remove(log)
            if wheelhouse:
                from runner.envs import wheelhouse as wh
                wh.require_wheels(wheelhouse, req, version, "environment %s" % env.name, pip_spec=env.pip)
            if progress is None:
                create_venv(path, req, base, stamp, log, pip=env.pip, wheelhouse=wheelhouse)
            else:
                create_venv(path, req, base, stamp, log, pip=env.pip, wheelhouse=wheelhouse, progress=progress)
            if env.post_create:
                try:
                    env.post_create(path)
                except BaseException:
                    os.remove(os.path.join(path, STAMP))   # not ready: rebuilt next time
                    raise
        name = kernel_name(env, device, python, build)
        spec_file = os.path.join(kernels_prefix(), "share", "jupyter", "kernels", name, "kernel.json")
        if fresh or not os.path.exists(spec_file) or not _kernel_env_current(env, path, spec_file):
            register_kernel(env, path, name, version, log)
        return name


def installer_for(wheelhouse: Optional[str]) -> str:
    """What an environment made now is installed with, as its announcement says it: "uv" or "pip" (and why)."""
    why = bootstrap.uv_excluded(wheelhouse)
    if why:
        return "pip: %s" % why
    if not bootstrap.uv_executable():
        return "pip: no uv installed beside %s" % sys.executable
    return "uv"


# ---- environments made ahead of the rows that need them -------------------------------------------------------
def _key(env: Env, device: str, python: Optional[str], build: Optional[Build], wheelhouse: Optional[str]) -> tuple:
    return env.name, device, python, build.name if build is not None else None, wheelhouse


class _Job:
    """One environment being made on a thread of :func:`start_ahead`; its messages wait for the main thread."""

    def __init__(self, env, device, python, build, wheelhouse, number: int, total: int, verbose: bool):
        self.args = (env, device, python, build, wheelhouse)
        self.name = "%s-%s" % (env.name, device)
        self.tag = "environment %d/%d: %s" % (number, total, self.name)
        self.verbose = verbose
        self.done = threading.Event()
        self.kernel, self.error = None, None
        self.started = self.finished = None
        self.packages = None
        self.messages = []              # printed by the main thread (_flush), never while a notebook runs
        self.lock = threading.Lock()

    def say(self, message: str, always: bool = False) -> None:
        if always or self.verbose:
            with self.lock:
                self.messages.append(message)

    def run(self) -> None:
        env, device, python, build, wheelhouse = self.args
        self.started = time.monotonic()
        try:
            self.kernel = _ensure(env, device, python, lambda m: self.say(m, always=True), build, wheelhouse,
                                  progress=self._progress, creating=lambda details, log: "%s: being made (%s); log: %s"
                                  % (self.tag, details, os.path.relpath(log, ROOT)))
            self.say("%s: ready in %.0f s%s" % (self.tag, time.monotonic() - self.started,
                                                " (%d packages)" % self.packages if self.packages else ""))
        except BaseException as e:      # noqa: B902 -- every failure is the rows' reason, given in the main thread
            self.error = e if isinstance(e, EnvError) else EnvError("%s: %s" % (type(e).__name__, e))
            if not _stopping.is_set():
                self.say("%s: failed: %s" % (self.tag, self.error), always=True)
        finally:
            self.finished = time.monotonic()
            self.done.set()

    def _progress(self, message: str) -> None:
        import re
        m = re.search(r"installs (\d+) packages", message)
        if m:
            self.packages = int(m.group(1))
            self.say("%s: installing %s packages%s" % (self.tag, m.group(1), _remaining(self)))
        else:
            self.say("%s: %s" % (self.tag, message))

    def result(self, announce) -> str:
        """Wait for the environment (printing what the jobs say meanwhile); its kernel, or its EnvError."""
        if not self.done.is_set() and self.started is not None:
            self.say("waiting for %s%s" % (self.tag, " (%d packages)" % self.packages if self.packages else ""))
        while not self.done.wait(0.2):          # a signal reaches the main thread between waits
            _flush(announce)
        _flush(announce)
        if self.error is not None:
            raise self.error
        return self.kernel


def _remaining(job: "_Job") -> str:
    others = [j for j in _ahead.values() if j is not job and not j.done.is_set() and j.started is not None]
    queued = [j for j in _ahead.values() if j.started is None]
    parts = (["%d more being made" % len(others)] if others else []) + (["%d queued" % len(queued)] if queued else [])
    return " (%s)" % ", ".join(parts) if parts else ""


_ahead = {}                 # type: Dict[tuple, _Job]
_threads = []               # type: List[threading.Thread]
_stopping = threading.Event()


def _flush(announce) -> None:
    for job in list(_ahead.values()):
        with job.lock:
            messages, job.messages = job.messages, []
        for message in messages:
            announce(message)


#: environments made at once by :func:`start_ahead`: every one a run needs (five on a CPU machine), which beat two and
#: one at a time on the 2-core machine with uv (their downloads and unpacking overlap)
AHEAD_WORKERS = 5


def start_ahead(jobs, announce=print, verbose: bool = True, workers: Optional[int] = None) -> int:
    """Make the environments of ``jobs`` ((env, device, python, build, wheelhouse) in the order the rows need them;
    repeats and current ones skipped) on background threads, ``workers`` at a time, while the caller goes on
    (the first row's notebook runs while the next rows' environments are made); ``workers`` default:
    :data:`AHEAD_WORKERS`.  :func:`ensure` waits for one
    still being made; its messages are printed then, by the caller's thread.  A failed one fails only the rows
    that need it, with its reason.  :func:`stop_ahead` ends them all (every install command included).  Returns
    how many are being made."""
    todo, seen = [], set()
    for env, device, python, build, wheelhouse in jobs:
        key = _key(env, device, python, build, wheelhouse)
        if key in seen or key in _ahead:
            continue
        seen.add(key)
        try:
            _, _, path, _, stamp = _stamp(env, device, python, build)
        except EnvError:
            continue                    # refused before anything is made: the row says why, as without this
        if read_stamp(path) != stamp or not os.path.exists(env_python(path)):
            todo.append((key, (env, device, python, build, wheelhouse)))
    for number, (key, args) in enumerate(todo, 1):
        _ahead[key] = _Job(*args, number=number, total=len(todo), verbose=verbose)
    if not todo:
        return 0
    _stopping.clear()
    interrupt.track_run("environments", _signal_all)
    pending = [_ahead[key] for key, _ in todo]
    lock = threading.Lock()

    def work():
        while not _stopping.is_set():
            with lock:
                if not pending:
                    return
                job = pending.pop(0)
            job.run()

    for _ in range(max(1, min(workers or AHEAD_WORKERS, len(todo)))):
        thread = threading.Thread(target=work, name="ds2-environments", daemon=True)
        thread.start()
        _threads.append(thread)
    return len(todo)


def made_between(start: float, end: float) -> List[str]:
    """The environments (``pytorch-cpu``) :func:`start_ahead` was making at some moment between ``start`` and
    ``end`` (``time.monotonic()``): a notebook that ran then shared the machine with their installs."""
    return [j.name for j in _ahead.values()
            if j.started is not None and j.started < end and (j.finished is None or j.finished > start)]


def _signal_all(sig) -> None:
    """What a second signal does (runner.interrupt.hard_stop): ``sig`` to every install command running now."""
    _stopping.set()
    bootstrap.stop_children(sig, wait_s=0)


def stop_ahead(announce=None) -> None:
    """End every environment still being made (its install commands: SIGTERM, then SIGKILL) and wait for the
    threads; a half-made environment has no stamp and is made again next time.  Idempotent."""
    if not _ahead and not _threads:
        return
    _stopping.set()
    if any(not j.done.is_set() for j in _ahead.values()):
        bootstrap.stop_children()
    for thread in _threads:
        thread.join(timeout=30)
    if announce is not None:
        _flush(announce)
    _threads[:] = []
    _ahead.clear()
    interrupt.untrack_run("environments")
    bootstrap.allow_children()
    _stopping.clear()


def _kernel_env_current(env: Env, path: str, spec_file: str) -> bool:
    """Whether the registered kernel still carries the environment variables its environment asks for
    now (CNTK's library path follows the machine's driver directories, which can change)."""
    if not env.kernel_env:
        return True
    try:
        with open(spec_file) as f:
            have = json.load(f).get("env", {})
    except (OSError, ValueError):
        return False
    return all(have.get(k) == v for k, v in env.kernel_env(path).items())


def register_kernel(env: Env, path: str, name: str, version: str, log: str) -> None:
    py = env_python(path)
    extra = env.kernel_env(path) if env.kernel_env else {}
    # ipykernel stages the spec in a tempfile.mkdtemp() folder and leaves that folder behind, empty: run_logged's
    # temporary folder for the command takes it
    run_logged([py, "-m", "ipykernel", "install", "--prefix", kernels_prefix(), "--name", name,
                "--display-name", "DS2 %s (Python %s)" % (env.label, version)],
               log, "registering the Jupyter kernel %s" % name, env=dict(os.environ, **extra))
    spec_file = os.path.join(kernels_prefix(), "share", "jupyter", "kernels", name, "kernel.json")
    with open(spec_file) as f:
        spec = json.load(f)
    spec["argv"][0] = py                               # this environment's interpreter, never a shim
    spec["env"] = dict(spec.get("env", {}), PYTHONNOUSERSITE="1", **extra)
    atomic_write_text(spec_file, json.dumps(spec, indent=1))
