"""Environments without a package registry: ``--wheelhouse DIR`` and ``--prepare-wheelhouse DIR``.

On a machine that reaches a registry, ``python run_all.py --prepare-wheelhouse DIR --frameworks ... --device
cuda`` downloads into DIR every wheel those rows' environments and the runner's own need (``pip download
--only-binary=:all:`` of their pins, and the pip each environment upgrades to), for the Python version and
platform the wheels are for (``--wheelhouse-python``, ``--wheelhouse-platform``; default: this machine's), and
prints the total size.  Carry DIR to the machine without one: ``python run_all.py --wheelhouse DIR`` (or
``DS2_WHEELHOUSE=DIR``) makes every environment with ``pip install --no-index --find-links DIR``.

Before anything is made, :func:`missing` asks pip, offline, whether DIR resolves each environment's pins
(``pip install --dry-run``): a wheel it lacks is one line naming it, exit status 2, never a pip traceback.

Standard library only (the runner's environment is made from a wheelhouse too).
"""
import os
import re
import subprocess
import sys
import tempfile
from typing import List, Optional

from runner.base import ROOT, EnvError, WheelhouseError

ENV_VAR = "DS2_WHEELHOUSE"


def from_argv(argv: List[str]) -> Optional[str]:
    """``--wheelhouse DIR`` (or ``--wheelhouse=DIR``) in ``argv``, else ``DS2_WHEELHOUSE``; absolute, or None.
    Read before the runner's environment exists (argparse is not yet in charge)."""
    for i, arg in enumerate(argv):
        if arg == "--wheelhouse" and i + 1 < len(argv):
            return os.path.abspath(argv[i + 1])
        if arg.startswith("--wheelhouse="):
            return os.path.abspath(arg.split("=", 1)[1])
    value = os.environ.get(ENV_VAR)
    return os.path.abspath(value) if value else None


def _unfound(output: str) -> Optional[str]:
    """The requirement pip could not find, from its output ("No matching distribution found for X==1")."""
    for pattern in (r"No matching distribution found for (\S+)", r"satisfies the requirement (\S+)"):
        m = re.search(pattern, output or "")
        if m:
            return m.group(1)
    return None


def lacks_message(wheelhouse: str, requirement: str, python_version: str, what: str) -> str:
    return ("--wheelhouse %s lacks %s (Python %s, %s): on a machine with a registry, add it with python run_all.py "
            "--prepare-wheelhouse %s ... (the same --frameworks and --device)" % (wheelhouse, requirement,
                                                                               python_version, what, wheelhouse))


def missing(wheelhouse: str, requirements: str, python_version: str, pip_spec: str = "pip",
            python: str = sys.executable) -> Optional[str]:
    """The first requirement of ``requirements`` (or ``pip_spec``) the wheelhouse cannot satisfy for Python
    ``python_version`` on this platform, asked of pip offline (``--dry-run``); None when it has them all."""
    if not os.path.isdir(wheelhouse):
        return "the directory itself (%s does not exist)" % wheelhouse
    python_version = ".".join(python_version.split(".")[:2])
    with tempfile.TemporaryDirectory() as target:
        cmd = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--no-index",
               "--find-links", wheelhouse, "--only-binary=:all:", "--python-version", python_version,
               "--target", target, "-r", requirements, pip_spec]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                              env=dict(os.environ, PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull))
    if proc.returncode == 0:
        return None
    return _unfound(proc.stdout) or "a wheel pip would not name (%s)" % (proc.stdout.strip().splitlines() or
                                                                       ["no output"])[-1]


def require_wheels(wheelhouse: str, requirements: str, python_version: str, what: str, pip_spec: str = "pip") -> None:
    """Raise WheelhouseError with :func:`lacks_message` when the wheelhouse lacks something ``requirements``
    needs."""
    lack = missing(wheelhouse, requirements, python_version, pip_spec)
    if lack:
        raise WheelhouseError(lacks_message(wheelhouse, lack, python_version, what))


def download(directory: str, requirements: str, python_version: str, platforms: List[str], pip_spec: str = "pip",
             python: str = sys.executable, announce=print) -> None:
    """``pip download`` of ``requirements`` and ``pip_spec`` into ``directory``: wheels only, for Python
    ``python_version`` and ``platforms`` (none: this machine's).  Raises EnvError with one line."""
    cmd = [python, "-m", "pip", "download", "--dest", directory, "--only-binary=:all:", "--python-version",
           python_version, "--quiet", "-r", requirements, pip_spec]
    for platform in platforms:
        cmd += ["--platform", platform]
    announce("  %s (Python %s%s)" % (os.path.relpath(requirements, ROOT), python_version,
                                    ", " + ", ".join(platforms) if platforms else ""))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    if proc.returncode != 0:
        lack = _unfound(proc.stdout)
        raise EnvError("pip download of %s for Python %s%s: %s" % (
            os.path.relpath(requirements, ROOT), python_version, " on " + ", ".join(platforms) if platforms else "",
            "no wheel of %s" % lack if lack else (proc.stdout.strip().splitlines() or ["failed"])[-1]))


def total_bytes(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory)
               if os.path.isfile(os.path.join(directory, n)))


def shown_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return "%d B" % n if unit == "B" else "%.1f %s" % (n, unit)
        n /= 1024.0
