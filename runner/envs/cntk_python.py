"""Which CPython 3.6 builds the CNTK environment: one answer for run_all.py and .ci/run.

CNTK 2.7 runs only on CPython 3.6 built as a shared library (``Py_ENABLE_SHARED``).  The interpreter
is, in this order:

1. ``--cntk-python PATH`` (run_all.py), then the environment variable ``DS2_CNTK_PYTHON``: given
   explicitly, it must be such an interpreter -- a bad one is an error, not a fallback;
2. otherwise the first suitable one found in the usual places: ``python3.6`` on PATH, pyenv's
   ``$PYENV_ROOT/versions/3.6*/bin/python3.6`` (``~/.pyenv`` without PYENV_ROOT), and conda's
   environments (those named like ``cntk36`` first) and base installs under ``~/miniconda3``,
   ``~/anaconda3``, ``~/miniforge3``, ``~/mambaforge``, ``/opt/conda`` and next to ``$CONDA_PREFIX``.

Every candidate is run once to ask for its version, build and real executable (a pyenv shim
resolves to the interpreter behind it).  Standard library only, and Python 3.6 compatible: CI calls
it with the system ``python3`` before any environment exists::

    python3 -m runner.envs.cntk_python          # prints the interpreter's path; exit 1 when none, 2 when
                                           # DS2_CNTK_PYTHON names an unsuitable one; why, on stderr
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys

ENV_VAR = "DS2_CNTK_PYTHON"
VERSION = (3, 6)
PROBE = ("import json, platform, sys, sysconfig; print(json.dumps({'version': platform.python_version(), "
         "'implementation': platform.python_implementation(), 'executable': sys.executable, "
         "'shared': bool(sysconfig.get_config_var('Py_ENABLE_SHARED'))}))")
HOW_TO_GET_ONE = ("conda create -n cntk36 python=3.6, or PYTHON_CONFIGURE_OPTS=--enable-shared pyenv install 3.6.15")


class Candidate(object):
    """One interpreter looked at: where it came from and, after :func:`check`, why it is unsuitable."""

    def __init__(self, path, source):
        self.path = path                # as found or given
        self.source = source            # why it was looked at: "--cntk-python", "pyenv", ...
        self.executable = None          # the interpreter's own sys.executable, once it ran
        self.version = None
        self.reason = None              # None: suitable

    @property
    def ok(self):
        return self.executable is not None and self.reason is None

    def __repr__(self):
        return "Candidate(%r, %r, reason=%r)" % (self.path, self.source, self.reason)


def probe_interpreter(path, timeout=60):
    """Run ``path`` once; returns (facts, None) or (None, one-line reason it cannot be used)."""
    if not os.path.exists(path):
        return None, "not found"
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        return None, "not an executable file"
    try:
        proc = subprocess.run([path, "-E", "-c", PROBE], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "did not answer within %d s" % timeout
    except OSError as e:
        return None, "cannot run it: %s" % (e.strerror or e)
    if proc.returncode != 0:
        return None, "does not run as a Python interpreter (exit status %d%s)" % (
            proc.returncode, ": " + error_line(proc.stderr) if proc.stderr.strip() else "")
    try:
        facts = json.loads(proc.stdout.strip().splitlines()[-1])
        facts["version"], facts["executable"]
    except (ValueError, IndexError, KeyError, TypeError):
        return None, "does not run as a Python interpreter (unexpected answer %r)" % proc.stdout.strip()[:80]
    return facts, None


def error_line(text):
    """The line of an error output that says what went wrong (a traceback's last, a shell's first)."""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    hits = [l for l in lines if "rror" in l or "not found" in l]
    return (hits[-1] if hits else lines[0])[:200]


def version_tuple(version):
    return tuple(int(x) for x in re.findall(r"\d+", version)[:2])


def check_interpreter(path, source):
    """A :class:`Candidate` for ``path``, run and judged."""
    cand = Candidate(os.path.abspath(os.path.expanduser(path)), source)
    facts, reason = probe_interpreter(cand.path)
    if facts is None:
        cand.reason = reason
        return cand
    cand.version = facts["version"]
    cand.executable = facts["executable"] or cand.path
    if facts.get("implementation", "CPython") != "CPython":
        cand.reason = "is %s %s, not CPython" % (facts["implementation"], cand.version)
    elif version_tuple(cand.version) != VERSION:
        cand.reason = "is Python %s; CNTK 2.7 needs 3.6" % cand.version
    elif not facts.get("shared"):
        cand.reason = ("is Python %s built without --enable-shared (Py_ENABLE_SHARED=0); CNTK needs a "
                       "shared-library build" % cand.version)
    return cand


def _sorted_versions(paths):
    """Newest version first (3.6.15 before 3.6.9)."""
    def key(p):
        return [int(n) for n in re.findall(r"\d+", p)]
    return sorted(paths, key=key, reverse=True)


def search_locations(environ=None, home=None):
    """[(path, source)] of the places looked at, in order, whether or not they exist (globs expanded)."""
    environ = os.environ if environ is None else environ
    home = home or environ.get("HOME") or os.path.expanduser("~")
    found = []
    on_path = shutil.which("python3.6", path=environ.get("PATH", os.defpath))
    if on_path:
        found.append((on_path, "python3.6 on PATH"))
    pyenv = environ.get("PYENV_ROOT") or os.path.join(home, ".pyenv")
    for p in _sorted_versions(glob.glob(os.path.join(pyenv, "versions", "3.6*", "bin", "python3.6"))):
        found.append((p, "pyenv (%s)" % os.path.join(pyenv, "versions")))
    roots = [os.path.join(home, d) for d in ("miniconda3", "anaconda3", "miniforge3", "mambaforge")] + ["/opt/conda"]
    prefix = environ.get("CONDA_PREFIX")
    if prefix:
        roots.insert(0, prefix)
        roots.insert(1, os.path.dirname(os.path.dirname(prefix)))   # .../envs/<name> -> the conda root
    conda = []
    for root in roots:
        envs = glob.glob(os.path.join(root, "envs", "*", "bin", "python3.6"))
        # environments named like cntk36 first, then the others, then the root's own interpreter
        envs.sort(key=lambda p: ("cntk" not in p.split(os.sep)[-3].lower(), p))
        conda += [(p, "conda environment %s" % p.split(os.sep)[-3]) for p in envs]
        base = os.path.join(root, "bin", "python3.6")
        if os.path.exists(base):
            conda.append((base, "conda (%s)" % root))
    return found + conda


class Discovery(object):
    """The outcome: the interpreter taken (or None), how it was chosen, and what was rejected."""

    def __init__(self, chosen, rejected, given):
        self.chosen = chosen            # a suitable Candidate, or None
        self.rejected = rejected        # [Candidate], each with its reason
        self.given = given              # the explicit Candidate (--cntk-python or DS2_CNTK_PYTHON), or None

    @property
    def path(self):
        return self.chosen.executable if self.chosen else None

    @property
    def error(self):
        """A given interpreter that cannot be used: one line, or None."""
        if self.given is not None and not self.given.ok:
            return "%s %s %s" % (self.given.source, self.given.path, self.given.reason)
        return None

    def lines(self):
        """What a run says about it: the interpreter taken and why, and why others were rejected."""
        if self.chosen:
            where = self.chosen.path if self.chosen.path == self.chosen.executable else "%s -> %s" % (
                self.chosen.path, self.chosen.executable)
            out = ["CNTK interpreter: %s (Python %s, shared library; from %s)" % (where, self.chosen.version,
                                                                                self.chosen.source)]
        elif self.given is not None:
            out = ["CNTK interpreter: none: %s" % self.error]
        else:
            out = ["CNTK interpreter: none found (looked for python3.6 on PATH, pyenv's versions/3.6*, conda "
                   "environments; get one with: %s)" % HOW_TO_GET_ONE]
        out += ["  rejected %s (%s): %s" % (c.path, c.source, c.reason) for c in self.rejected]
        return out


def discover(explicit=None, environ=None, home=None):
    """Find the CNTK interpreter: ``explicit`` (--cntk-python), then DS2_CNTK_PYTHON, then the search."""
    environ = os.environ if environ is None else environ
    for path, source in ((explicit, "--cntk-python"), (environ.get(ENV_VAR), ENV_VAR)):
        if path:
            cand = check_interpreter(path, source)
            return Discovery(cand if cand.ok else None, [], cand)
    rejected, seen = [], set()
    for path, source in search_locations(environ, home):
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        cand = check_interpreter(path, source)
        if cand.ok:
            return Discovery(cand, rejected, None)
        rejected.append(cand)
    return Discovery(None, rejected, None)


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(prog="python3 -m runner.envs.cntk_python",
                                description="Print the CPython 3.6 (shared library) that builds the CNTK environment.")
    p.add_argument("path", nargs="?", help="check this interpreter instead of DS2_CNTK_PYTHON and the search")
    p.add_argument("-q", "--quiet", action="store_true", help="no explanation on stderr")
    args = p.parse_args(argv)
    found = discover(args.path)
    if not args.quiet:
        for line in found.lines():
            print(line, file=sys.stderr)
    if found.chosen:
        print(found.path)
        return 0
    return 2 if found.given is not None else 1


if __name__ == "__main__":
    sys.exit(main())
