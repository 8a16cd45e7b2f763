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
from typing import Optional

from common.results import atomic_write_text

from .bootstrap import ENVS_DIR, ROOT, STAMP, EnvError, create_venv, env_python, file_digest, read_stamp, run_logged
from . import preflight
from .preflight import Build
from .targets import Env


def default_python() -> str:
    """The interpreter environments are made from: the one behind the runner environment."""
    return getattr(sys, "_base_executable", None) or sys.executable


def _suffix(python: Optional[str]) -> str:
    if not python:
        return ""
    return "-" + hashlib.sha256(os.path.realpath(python).encode()).hexdigest()[:8]


def _variant(env: Env, device: str, build: Optional[Build]) -> str:
    """'-cu126' for a GPU build of an environment that has several (runner/preflight.py), else ''."""
    if device == "cuda" and build is not None and len(preflight.builds(env.name)) > 1:
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


def ensure(env: Env, device: str, python: Optional[str] = None, announce=print, build: Optional[Build] = None,
           wheelhouse: Optional[str] = None) -> str:
    """Create (if needed) the environment and register its kernel; returns the kernel name.

    ``python`` is an interpreter to build it from (default: the runner's base interpreter); ``build``
    the CUDA build chosen by runner/preflight.py (its own pins and environment, ``<env>-cuda-<build>``);
    ``wheelhouse`` a directory to install from with no index (runner/wheelhouse.py).
    Raises :class:`EnvError` with a one-line reason when it cannot be made.
    """
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
    log = os.path.join(ENVS_DIR, "%s.log" % os.path.basename(path))
    fresh = read_stamp(path) != stamp or not os.path.exists(env_python(path))
    if fresh:
        announce("Creating environment %s (Python %s, %s); log: %s"
                 % (os.path.relpath(path, ROOT), version, os.path.relpath(req, ROOT), log))
        os.makedirs(ENVS_DIR, exist_ok=True)
        if os.path.exists(log):
            os.remove(log)
        if wheelhouse:
            from . import wheelhouse as wh
            wh.check(wheelhouse, req, version, "environment %s" % env.name, pip_spec=env.pip)
        create_venv(path, req, base, stamp, log, pip=env.pip, wheelhouse=wheelhouse)
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
    run_logged([py, "-m", "ipykernel", "install", "--prefix", kernels_prefix(), "--name", name,
                "--display-name", "DS2 %s (Python %s)" % (env.label, version)],
               log, "registering the Jupyter kernel %s" % name, env=dict(os.environ, **extra))
    spec_file = os.path.join(kernels_prefix(), "share", "jupyter", "kernels", name, "kernel.json")
    with open(spec_file) as f:
        spec = json.load(f)
    spec["argv"][0] = py                               # this environment's interpreter, never a shim
    spec["env"] = dict(spec.get("env", {}), PYTHONNOUSERSITE="1", **extra)
    atomic_write_text(spec_file, json.dumps(spec, indent=1))
