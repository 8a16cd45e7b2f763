"""Frameworks as they are installed: ``--use-installed ENV=PYTHON`` and ``DS2_RUNNER=current``.

Cloud GPU images (Deep Learning AMIs, NGC containers, Colab, Kaggle, a cluster's modules) come with a
CUDA-matched PyTorch, JAX or TensorFlow; air-gapped machines reach no registry.  There a row's kernel runs in
the given interpreter as it is: no virtual environment is made and pip is never called.

**The preflight** asks the interpreter (one short process, no framework imported) which of the packages in the
environment's pins (``envs/<env>-<device>.txt``; ``keras`` only for the Keras rows) it has, and their
versions.  It prints them beside the pins, each difference marked.  A package that is missing, or a framework
older than :data:`OLDEST` (the oldest version this project has run the notebook with), is one line naming it
and the command that installs it, and exit status 2, before anything runs.  The records of such a row carry
``as_is: true`` and the versions that ran (``run.installed``); results.md marks the row.

``DS2_RUNNER=current`` runs ``run_all.py`` (and ``python -m tests``) in the current interpreter instead of
``.venvs/runner``; :func:`runner_problem` is its preflight, on the pins of ``envs/runner.txt``.

Standard library only: the runner's own preflight runs before anything is known to be installed.
"""
import hashlib
import json
import os
import re
import subprocess
import sys
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

from runner.base import ROOT

from runner.base import EnvError
from runner.validate import assignments      # standard library only


#: the oldest version of each framework the notebooks are known to run with (docs/gpus.md, "Three routes"): PyTorch's
#: runs through --use-installed in tests/test_installed.py (--full); the others are the pins every test session
#: runs (JAX's: on Python 3.11).  Older: refused.
OLDEST = OrderedDict([("torch", "2.9.1"), ("jax", "0.10.2"), ("flax", "0.12.8"), ("optax", "0.2.8"),
                      ("keras", "3.15.1"), ("tensorflow", "2.21.0"), ("mxnet", "1.9.1"), ("cntk", "2.7")])
#: a pin's distribution -> the distributions that provide the same module on an installed machine
ALTERNATIVES = {"tensorflow-cpu": ("tensorflow-cpu", "tensorflow", "tf-nightly"),
                "tensorflow": ("tensorflow", "tensorflow-cpu"),
                "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
                "mxnet": ("mxnet", "mxnet-cu112", "mxnet-cu118", "mxnet-mkl"),
                "mxnet-cu112": ("mxnet-cu112", "mxnet"),
                "cntk": ("cntk", "cntk-gpu"), "cntk-gpu": ("cntk-gpu", "cntk"),
                "jax": ("jax",), "torch": ("torch",)}
#: a pin's distribution -> the module the notebook imports (default: the name, lower case, '-' -> '_')
MODULES = {"tensorflow-cpu": "tensorflow", "mxnet-cu112": "mxnet", "cntk-gpu": "cntk", "Pygments": "pygments",
           "beautifulsoup4": "bs4", "jupyter-client": "jupyter_client", "protobuf": "google.protobuf"}
#: what the oldest-version rule calls each framework distribution
FRAMEWORK_OF = {"tensorflow-cpu": "tensorflow", "mxnet-cu112": "mxnet", "cntk-gpu": "cntk"}
#: pins that are not what the notebook imports: the runner's metapackage, and what only the tests use; uv (the
#: installer: pip makes the environments where it is missing)
NOT_IMPORTED = {"jupyter", "uv"}
#: what only the ONNX exit (section 11b) imports: an interpreter as installed that lacks one still runs the row, and
#: the record's ``onnx`` section says "skipped" and which package was missing (common/onnx_check.not_installed)
ONNX_ONLY = ("onnx", "onnxscript", "onnxruntime", "jax2onnx", "tf2onnx")

#: run in the installed interpreter (Python 3.6 and newer): {distribution: [version or None, module found]}
PROBE = r'''
import json, sys
try:
    from importlib.metadata import version as _version, PackageNotFoundError as _Missing
except ImportError:                                   # Python < 3.8
    import pkg_resources
    _Missing = pkg_resources.DistributionNotFound
    def _version(name):
        return pkg_resources.get_distribution(name).version
import importlib.util
wanted = json.loads(sys.argv[1])
out = {"python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable, "packages": {}}
for name, (dists, module) in wanted.items():
    found = None
    for d in dists:
        try:
            found = [d, _version(d)]
            break
        except _Missing:
            pass
    try:
        has_module = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        has_module = False
    out["packages"][name] = {"dist": found[0] if found else None, "version": found[1] if found else None,
                             "module": has_module}
print(json.dumps(out))
'''


class InstalledError(EnvError):
    """The interpreter cannot run the row as it is; the message is one line."""


def version_tuple(text: Optional[str]) -> Tuple[int, ...]:
    """(2, 11, 0) of "2.11.0+cu130", (2, 7) of "2.7.post2": the leading numbers."""
    m = re.match(r"\d+(?:\.\d+)*", text or "")
    return tuple(int(x) for x in m.group(0).split(".")) if m else ()


def _marker_holds(marker: str, python: str) -> bool:
    """A pin's environment marker, for the one kind the pins use: python_version compared with a string."""
    m = re.match(r'\s*python_version\s*(<=|>=|==|!=|<|>)\s*["\']([\d.]+)["\']\s*$', marker)
    if not m:
        return True
    have, want = version_tuple(python)[:2], version_tuple(m.group(2))
    return {"<": have < want, "<=": have <= want, ">": have > want, ">=": have >= want, "==": have == want,
            "!=": have != want}[m.group(1)]


def read_pins(path: str, python: Optional[str]) -> "OrderedDict[str, str]":
    """{distribution: pinned version} of a requirements file, for an interpreter of version ``python``
    (extras dropped, markers evaluated, options such as --extra-index-url skipped)."""
    pins = OrderedDict()
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line or line.startswith("-"):
                continue
            spec, _, marker = line.partition(";")
            if marker and python is not None and not _marker_holds(marker, python):
                continue
            m = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*==\s*([^\s;]+)", spec)
            if m:
                pins[m.group(1)] = m.group(2)
    return pins


def probe_versions(python: str, names) -> dict:
    """What ``python`` has of the distributions ``names``: its version and {name: {dist, version, module}}."""
    wanted = {n: [list(ALTERNATIVES.get(n, (n,))), MODULES.get(n, n.lower().replace("-", "_"))] for n in names}
    try:
        proc = subprocess.run([python, "-c", PROBE, json.dumps(wanted)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        raise InstalledError("cannot run %s: %s" % (python, e))
    if proc.returncode != 0:
        lines = [l for l in proc.stderr.strip().splitlines() if l.strip()]
        raise InstalledError("%s does not run as a Python interpreter: %s" % (python, lines[-1] if lines else
                                                                          "exit status %d" % proc.returncode))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_versions(python: str, pins: Dict[str, str], what: str, facts: Optional[dict] = None,
          optional=()) -> Tuple[dict, List[str]]:
    """Probe ``python`` for ``pins`` (or take ``facts``, its probe); returns (the probe, the report's lines) or
    raises InstalledError with one line: what is missing and how to install it, or which framework is older
    than :data:`OLDEST`.  A missing package of ``optional`` is a line of the report, not an error."""
    facts = facts or probe_versions(python, list(pins))
    packages = facts["packages"]
    absent = [n for n in pins if not (packages[n]["version"] or packages[n]["module"])]
    missing = [n for n in absent if n not in optional]
    if missing:
        raise InstalledError("%s: %s lacks %s; install %s with: %s -m pip install %s" % (
            what, python, ", ".join(missing), "it" if len(missing) == 1 else "them", python,
            " ".join("'%s==%s'" % (n, pins[n]) for n in missing)))
    lines = ["%s: %s (Python %s), as installed:" % (what, python, facts["python"])]
    for name, pin in pins.items():
        have = packages[name]
        if name in absent:
            lines.append("  %-14s %-16s pin %-10s not installed: the ONNX export is skipped" % (name, "-", pin))
            continue
        version = have["version"] or "(version unknown)"
        framework = FRAMEWORK_OF.get(name, name)
        oldest = OLDEST.get(framework)
        if oldest and have["version"] and version_tuple(have["version"]) < version_tuple(oldest):
            raise InstalledError("%s: %s has %s %s, older than %s, the oldest this project runs; upgrade it with: "
                                 "%s -m pip install '%s==%s'" % (what, python, have["dist"] or name, have["version"],
                                                                 oldest, python, name, pin))
        if not have["version"]:
            mark = "? no version to compare"
        elif version_tuple(have["version"]) != version_tuple(pin):
            mark = "\u2260 differs from the pin"
        elif "+" in have["version"] and "+" not in pin:
            mark = "(the pin's version, build +%s)" % have["version"].split("+", 1)[1]
        else:
            mark = ""
        lines.append(("  %-14s %-16s pin %-10s %s" % (have["dist"] or name, version, pin, mark)).rstrip())
    return facts, lines


def needed_pins(env, device: str, targets, python_version: Optional[str]) -> "OrderedDict[str, str]":
    """The pins the rows ``targets`` need in environment ``env`` (its pins file for ``device``; Keras only for
    the Keras rows), for an interpreter of ``python_version`` (None: every line, markers not evaluated)."""
    pins = read_pins(env.requirements(device), python_version)
    if not any(t.notebook.startswith("Keras") for t in targets):
        pins.pop("keras", None)
    return pins


def check_env(env, device: str, targets, python: str) -> Tuple[dict, List[str]]:
    """The preflight of ``--use-installed ENV=PYTHON`` for the rows ``targets``: (the probe, its report's
    lines), or InstalledError with one line."""
    try:
        facts = probe_versions(python, list(needed_pins(env, device, targets, None)))
    except InstalledError as e:
        raise InstalledError("--use-installed %s=%s: %s" % (env.name, python, e))
    pins = needed_pins(env, device, targets, facts["python"])
    problem = env.python_problem(facts["python"])
    if problem:
        raise InstalledError("--use-installed %s=%s: %s; it is Python %s" % (env.name, python, problem, facts["python"]))
    facts["packages"] = {n: facts["packages"][n] for n in pins}
    return check_versions(python, pins, "--use-installed %s" % env.name, facts, optional=ONNX_ONLY)


def kernel(env, device: str, python: str, facts: dict, prefix: str = sys.prefix) -> str:
    """The Jupyter kernel of ``python`` as it is (registered once per interpreter; nothing is installed)."""
    return register_kernel(env, device, python, facts["python"], prefix)


def record_section(python: str, facts: dict) -> dict:
    """``run.installed`` of a record: the interpreter and the versions of what the preflight found there."""
    return {"python": python, "python_version": facts["python"],
            "packages": OrderedDict((n, p["version"]) for n, p in sorted(facts["packages"].items()))}


def kernel_name(env_name: str, device: str, python: str) -> str:
    digest = hashlib.sha256(os.path.realpath(python).encode()).hexdigest()[:8]
    return "ds2-%s-%s-installed-%s" % (env_name, device, digest)


def register_kernel(env, device: str, python: str, version: str, prefix: str, extra_env=None) -> str:
    """A Jupyter kernel for ``python`` as it is (its ipykernel, its packages), in ``prefix``'s kernels:
    written directly, so nothing is installed and nothing runs in that interpreter."""
    from common.results import atomic_write_text
    name = kernel_name(env.name, device, python)
    directory = os.path.join(prefix, "share", "jupyter", "kernels", name)
    os.makedirs(directory, exist_ok=True)
    spec = {"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "DS2 %s, as installed (Python %s)" % (env.label, version), "language": "python",
            "env": dict(extra_env or {})}
    atomic_write_text(os.path.join(directory, "kernel.json"), json.dumps(spec, indent=1))
    return name


def parse_assignments(text: str) -> List[Tuple[str, str]]:
    """``DS2_USE_INSTALLED``: "pytorch=/usr/bin/python3,jax=/usr/bin/python3" -> [(env, path)]; ValueError with
    one line for an item that is not ENV=PYTHON, an empty one (a comma too many) or an environment named twice."""
    return assignments(text, "PYTHON")


# ---- the runner itself: DS2_RUNNER=current ---------------------------------------------------------------
#: what run_all.py imports from envs/runner.txt; python -m tests needs every pin but the metapackage
RUN_ALL_NEEDS = ("papermill", "nbclient", "nbformat", "ipykernel", "numpy", "pandas", "matplotlib", "tabulate",
                 "tqdm", "mistune", "Pygments")


def runner_problem(tests: bool = False, python: str = sys.executable) -> Optional[str]:
    """Why the current interpreter cannot be the runner (``DS2_RUNNER=current``), in one line, or None."""
    pins = read_pins(os.path.join(ROOT, "envs", "runner.txt"), "%d.%d" % sys.version_info[:2])
    names = [n for n in pins if n not in NOT_IMPORTED and (tests or n in RUN_ALL_NEEDS)]
    try:
        check_versions(python, OrderedDict((n, pins[n]) for n in names), "DS2_RUNNER=current")
    except InstalledError as e:
        return str(e)
    return None
