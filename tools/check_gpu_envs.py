#!/usr/bin/env python3
"""Developer check of the GPU environments, on any Linux machine (no GPU needed; NOT run in CI:
together they download and unpack ~25 GB).

For every CUDA build in runner/envs/gpu_preflight.py (BUILDS) it builds the environment from its pins, the
way run_all.py does, into DEST/<env>-cuda-<build> (default ~/ds2-gpu-envs, outside the repository),
then runs ``ldd`` over every shared library in it with the library path the Jupyter kernel gets
(runner/run/targets.py kernel_env), and reports every library that cannot be found -- apart from the
NVIDIA driver's own (libcuda.so.1, libnvidia-ml.so.1, ...), which only a GPU machine has, and those a library names
without an RPATH to them but that lie in the environment (listed apart: the module that loads such a
library loads them first).

    python tools/check_gpu_envs.py [--dest DIR] [--only pytorch/cu130,jax] [--python cntk=/path/python3.6]
                                   [--no-build] [--json FILE]

Every option is checked before anything is built (one line, exit status 2): --only names known environments
and builds, each once; --python names an environment of theirs, once, and an interpreter that runs; --dest lies
outside the repository; --json is a new file in a folder that exists, or a results file this tool wrote (never a
directory, a file git tracks or any other file), and is written whole (a temporary file renamed over it).

To see what a user gets from the public registry rather than a local wheel store, run it with
``PIP_CONFIG_FILE=/dev/null`` and without ``PIP_FIND_LINKS``.  Exit status: 0 when every environment
built and nothing but the driver is missing, 1 otherwise.  Standard library only.
"""
import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from runner.envs import gpu_preflight  # noqa: E402
from runner.envs import definitions  # noqa: E402
from runner.base import EnvError  # noqa: E402
from runner.envs.bootstrap import create_venv, env_python, file_digest, read_stamp  # noqa: E402
from runner.validate import (OneLineParser, first_repeated, non_empty, python3_error,  # noqa: E402
                             repeated_error, result_file_error, unwritable_dir)

#: libraries the NVIDIA driver installs (never in a wheel): missing on a machine without the driver
DRIVER_LIBRARIES = ("libcuda.so*", "libnvidia-*.so*", "libcudadebugger.so*", "libnvcuvid.so*", "libnvoptix.so*")


#: Modules a notebook never loads, per environment, and why: libraries missing only for them are listed apart.
UNUSED_MODULES = {
    "cntk": (("Cntk.DelayLoadedExtensions-2.7.so", "Cntk.Deserializers.Image-2.7.so", "libopencv_imgcodecs.so.3.1",
              "Cntk.BinaryConvolution-2.7.so"),
             "CNTK's image reader with its OpenCV codecs (JPEG, PNG, TIFF, JasPer) and its Halide binary-convolution "
             "plugin; the DS2 notebook feeds arrays and uses neither"),
}


def is_driver_library(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in DRIVER_LIBRARIES)


def shared_libraries(venv: str):
    """Every regular ELF shared library (``*.so``, ``*.so.N``) under ``venv``."""
    for dirpath, _, files in os.walk(venv):
        for f in files:
            if not re.search(r"\.so(\.\d+)*$", f):
                continue
            path = os.path.join(dirpath, f)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as fh:
                if fh.read(4) != b"\x7fELF":
                    continue
            yield path


def kernel_library_path(env, venv: str) -> str:
    """LD_LIBRARY_PATH as the kernel gets it (``${LD_LIBRARY_PATH}`` expanded from this process)."""
    extra = env.kernel_env(venv) if env.kernel_env else {}
    value = extra.get("LD_LIBRARY_PATH", os.environ.get("LD_LIBRARY_PATH", ""))
    return value.replace("${LD_LIBRARY_PATH}", os.environ.get("LD_LIBRARY_PATH", "")).strip(os.pathsep)


def missing_libraries(path: str, library_path: str):
    """Sonames ``ldd`` reports as not found for ``path``."""
    proc = subprocess.run(["ldd", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          env=dict(os.environ, LD_LIBRARY_PATH=library_path))
    return sorted(set(re.findall(r"^\s*(\S+) => not found", proc.stdout, flags=re.M)))


def du(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def build_env(env, build, dest: str, python: str, log) -> str:
    """Create (or reuse, when its pins did not change) the environment of ``build``; returns its path."""
    venv = os.path.join(dest, "%s-cuda-%s" % (env.name, build.name))
    req = env.requirements("cuda", build)
    stamp = {"requirements": file_digest(req), "python": os.path.realpath(python)}
    if read_stamp(venv) == stamp and os.path.exists(env_python(venv)):
        log("  reusing %s" % venv)
        return venv
    log("  building %s from %s (log: %s.log)" % (venv, os.path.relpath(req, ROOT), venv))
    os.makedirs(dest, exist_ok=True)
    if os.path.exists(venv + ".log"):
        os.remove(venv + ".log")
    create_venv(venv, req, python, stamp, venv + ".log", pip=env.pip)
    return venv


def prepare_cntk(venv: str) -> str:
    """The OpenMPI soname links run_all.py makes for CNTK (without importing CNTK, which needs the driver)."""
    missing = definitions.cntk_needs()
    if missing:
        return missing
    directory = definitions.cntk_mpi_dir(venv)
    os.makedirs(directory, exist_ok=True)
    for old, lib in definitions.cntk_mpi_libraries().items():
        link = os.path.join(directory, old)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(lib, link)
    return ""


def check(env, build, dest: str, python: str, no_build: bool, log) -> dict:
    result = {"env": env.name, "build": build.name, "package": build.package,
              "pins": "envs/" + build.pins, "built": False}
    t0 = time.time()
    try:
        if no_build:
            venv = os.path.join(dest, "%s-cuda-%s" % (env.name, build.name))
            if not read_stamp(venv) or not os.path.exists(env_python(venv)):   # the stamp is written last
                raise EnvError("not built, or its build failed (run without --no-build)")
        else:
            venv = build_env(env, build, dest, python, log)
    except EnvError as e:
        result["error"] = str(e)
        return result
    result.update(built=True, path=venv, build_s=round(time.time() - t0), size_gb=round(du(venv) / 1e9, 2))
    if env.name == "cntk":
        result["system_prerequisite_missing"] = prepare_cntk(venv) or None
    library_path = kernel_library_path(env, venv)
    libs = list(shared_libraries(venv))
    with ThreadPoolExecutor(max_workers=2) as pool:
        found = list(pool.map(lambda p: (p, missing_libraries(p, library_path)), libs))
    needed_by = {}
    for path, names in found:
        for name in names:
            needed_by.setdefault(name, []).append(os.path.relpath(path, venv))
    # A library can name a sibling it has no RPATH to (auditwheel's *.libs, NVIDIA's cusolverMg -> cublas,
    # triton's plugins -> libtriton): ldd on it alone misses the sibling, but at run time the module that
    # loads it has loaded the sibling first, through its own RPATH.  Listed apart: in the environment.
    in_env = {os.path.basename(p) for p in libs}

    def cut(users):
        users = sorted(users)
        return users[:5] + (["... %d more" % (len(users) - 5)] if len(users) > 5 else [])

    unused, why_unused = UNUSED_MODULES.get(env.name, ((), ""))
    result["libraries_checked"] = len(libs)
    result["library_path"] = library_path
    result["driver_libraries_missing"] = sorted(n for n in needed_by if is_driver_library(n))
    rest = {n: v for n, v in needed_by.items() if not is_driver_library(n)}
    # libpythonX.Y.so: loaded by the environment's interpreter before any extension module
    result["interpreter_library"] = sorted(n for n in rest if n.startswith("libpython"))
    rest = {n: v for n, v in rest.items() if not n.startswith("libpython")}
    result["in_environment_not_on_path"] = {n: cut(v) for n, v in sorted(rest.items()) if n in in_env}
    rest = {n: v for n, v in rest.items() if n not in in_env}
    only_unused = {n: v for n, v in rest.items() if all(os.path.basename(u) in unused for u in v)}
    result["only_for_unused_modules"] = {"why": why_unused, "libraries": {n: cut(v) for n, v in sorted(only_unused.items())}} \
        if only_unused else {}
    result["missing"] = {n: cut(v) for n, v in sorted(rest.items()) if n not in only_unused}
    return result


def only_choices():
    """What --only accepts: each environment with GPU builds, and each ENV/BUILD."""
    return [name for env, builds in gpu_preflight.BUILDS.items() for name in [env] + ["%s/%s" % (env, b.name)
                                                                                  for b in builds]]


def written_here(path: str) -> bool:
    """Whether ``path`` is empty or holds what --json writes: a JSON list of results, each with env and built."""
    try:
        with open(path) as f:
            text = f.read()
        data = json.loads(text) if text.strip() else []
    except (OSError, ValueError):
        return False
    return isinstance(data, list) and all(isinstance(r, dict) and "env" in r and "built" in r for r in data)


def errors_of(args, pythons_given):
    """Every refusal of the options, in order (the first is the one line printed); nothing is built or written."""
    errors = []
    choices = only_choices()
    unknown = [o for o in args.only if o not in choices]
    if unknown:
        errors.append("--only %s: unknown environment or build; choose from: %s" % (unknown[0], ", ".join(choices)))
    twice = first_repeated(args.only)
    if twice is not None:
        errors.append("--only names %s twice; name each once" % twice)
    errors.append(repeated_error("--python", pythons_given))
    for env, path in pythons_given:
        if env not in gpu_preflight.BUILDS:
            errors.append("--python %s=%s: unknown environment %s; choose from: %s"
                          % (env, path, env, ", ".join(gpu_preflight.BUILDS)))
        else:
            errors.append(python3_error("--python %s=%s" % (env, path), path))
    dest = os.path.abspath(args.dest)
    if os.path.commonpath([dest, ROOT]) == ROOT:
        errors.append("--dest must lie outside the repository (the environments weigh ~25 GB)")
    elif args.no_build and not os.path.isdir(dest):
        errors.append("--dest %s: no such directory (--no-build checks the environments built there)" % dest)
    elif not args.no_build:
        why = unwritable_dir(dest)
        errors.append("--dest %s %s" % (dest, why) if why else None)
    if args.json is not None:
        errors.append(result_file_error("--json", args.json, written_here))
    return [e for e in errors if e]


def only_list(text: str):
    """One --only value: ENV or ENV/BUILD, comma-separated, no empty item."""
    items = [t.strip() for t in text.split(",")]
    if not any(items) or "" in items:
        raise argparse.ArgumentTypeError("%r: expected ENV or ENV/BUILD, comma-separated (no empty item)" % text)
    return items


def build_parser():
    p = OneLineParser(prog="tools/check_gpu_envs.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--dest", type=non_empty("directory"), default=os.path.expanduser("~/ds2-gpu-envs"),
                   help="where the environments go: outside the repository (with --no-build: a directory that exists)")
    p.add_argument("--only", type=only_list, action="append", default=[], metavar="ENV[/BUILD][,...]",
                   help="comma-separated ENV or ENV/BUILD, repeatable, each named once (default: every GPU build): "
                        "%s" % ", ".join(only_choices()))
    p.add_argument("--python", action="append", default=[], metavar="ENV=PATH",
                   help="interpreter to build ENV from (cntk needs a shared-library CPython 3.6); one per ENV")
    p.add_argument("--no-build", action="store_true", help="only check environments already built in --dest")
    p.add_argument("--json", type=non_empty("file"), default=None, metavar="FILE",
                   help="also write the results as JSON to FILE, whole or not at all: a new file in a folder that "
                        "exists, or one this tool wrote before; never a directory, a file git tracks or any other "
                        "file")
    return p


def write_json(path: str, results) -> None:
    """``results`` into ``path`` whole: a temporary file in its folder, then renamed over it."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".check_gpu_envs-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(results, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def main(argv=None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    args.only = [o for items in args.only for o in items]
    bad = [item for item in args.python if "=" not in item or not all(item.partition("=")[::2])]
    if bad:
        p.error("--python %r: expected ENV=PATH" % bad[0])
    args.python = [tuple(item.split("=", 1)) for item in args.python]
    errors = errors_of(args, args.python)
    if errors:
        p.error(errors[0])
    pythons = dict(args.python)
    only = args.only
    dest = os.path.abspath(args.dest)

    def log(msg):
        print(msg, flush=True)

    results = []
    for env_name, builds in gpu_preflight.BUILDS.items():
        env = definitions.ENVS[env_name]
        for build in builds:
            key = "%s/%s" % (env_name, build.name)
            if only and env_name not in only and key not in only:
                continue
            log("== %s (%s)" % (key, build.package))
            python = pythons.get(env_name) or (None if env.needs_python else sys.executable)
            if python is None:
                res = {"env": env_name, "build": build.name, "built": False,
                       "error": "no interpreter: pass --python %s=PATH" % env_name}
            else:
                res = check(env, build, dest, python, args.no_build, log)
            results.append(res)
            log(summary(res))
    if args.json:
        try:
            write_json(args.json, results)
        except OSError as e:
            print("%s: error: --json %s could not be written: %s" % (p.prog, args.json, e.strerror or e),
                  file=sys.stderr)
            return 1
    bad = [r for r in results if not r["built"] or r.get("missing")]
    log("\n%d environment(s) checked: %d built with nothing missing but the driver, %d with problems"
        % (len(results), len(results) - len(bad), len(bad)))
    return 1 if bad else 0


def summary(r: dict) -> str:
    if not r["built"]:
        return "  FAILED to build: %s" % r.get("error")
    lines = ["  built: %.1f GB in %d s; %d shared libraries checked with LD_LIBRARY_PATH=%s"
             % (r["size_gb"], r["build_s"], r["libraries_checked"], r["library_path"] or "(none)")]
    lines.append("  missing, the driver's own (expected without a GPU): %s"
                 % (", ".join(r["driver_libraries_missing"]) or "none"))
    if r.get("system_prerequisite_missing"):
        lines.append("  system prerequisite missing: %s" % r["system_prerequisite_missing"])
    if r.get("interpreter_library"):
        lines.append("  the interpreter's own (loaded by python first): %s" % ", ".join(r["interpreter_library"]))
    if r.get("only_for_unused_modules"):
        lines.append("  missing only for modules the notebook never loads (%s): %s"
                     % (r["only_for_unused_modules"]["why"], ", ".join(r["only_for_unused_modules"]["libraries"])))
    for name, users in r.get("in_environment_not_on_path", {}).items():
        lines.append("  in the environment, not on ldd's path (loaded by its parent first): %s (needed by %s)"
                     % (name, ", ".join(users)))
    if r["missing"]:
        for name, users in r["missing"].items():
            lines.append("  MISSING %s (needed by %s)" % (name, ", ".join(users)))
    else:
        lines.append("  nothing else missing")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
