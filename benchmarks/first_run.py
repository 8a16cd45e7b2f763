"""A new user's first `python run_all.py`, timed part by part: a fresh clone, nothing prebuilt, empty caches.

    python benchmarks/first_run.py [--keep DIR] [--frameworks a,b] [--no-second-run]
                                   [--installer uv|pip|both] [--envs-only]

What it does, in a scratch directory (kept with ``--keep``):

1. ``git clone`` this checkout's HEAD (committed work only, as a user gets it);
2. the environments, as ``python run_all.py`` makes them: the runner's (``runner.envs.bootstrap.ensure_runner_env``), then
   every framework's in one ``python run_all.py --setup-only --device cpu --frameworks ...`` (made all at once,
   runner/envs/framework_envs.py), with empty caches of their own (``PIP_CACHE_DIR``, ``UV_CACHE_DIR``), so every wheel is fetched
   or read again. ``--installer`` picks what installs them (``DS2_INSTALLER``): uv (default), pip, or both (pip's
   environments first, then uv's, each in its own ``DS2_ENVS_DIR`` with its own empty caches; the runs use uv's);
3. ``python run_all.py`` (the CPU default: the ``smoke`` preset, every row), the first run;
4. ``python run_all.py`` again, the warm second run (environments and caches in place).

``--envs-only`` stops after step 2. It prints one table: the runner's environment, each framework environment (the
seconds it took, from ``run_all.py``'s "ready in" lines, which overlap: they are made all at once), all framework
environments together, each notebook's wall time (the records' ``run.wall_s``) and each run's total, in seconds; with
``--installer both`` pip's and uv's side by side and their ratio. This is a benchmark, not a test: run it alone on an
idle machine (other load slows the 2-core machine several times over), and compare parts of one run rather than
absolute times of two.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from runner import validate  # noqa: E402  (standard library only)
from runner.run.targets import ALL_TARGETS, TARGETS  # noqa: E402  (framework-free)

ENVS = ("pytorch", "tensorflow", "mxnet", "cntk", "jax")


def timed(argv, cwd, env, log):
    """Run ``argv`` (its output appended to ``log``); (its wall seconds, its output). A failure stops the
    benchmark."""
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True)
    took = time.monotonic() - start
    with open(log, "a") as out:
        out.write("\n$ %s\n%s" % (" ".join(argv), proc.stdout))
    if proc.returncode != 0:
        sys.exit("first_run.py: %s exited %d after %.0f s; see %s" % (" ".join(argv), proc.returncode, took, log))
    return took, proc.stdout


def environments(installer, clone, work, env, python, names, log):
    """[(part, seconds)] of making the runner's and ``names``' environments with ``installer`` in a directory and
    with caches of their own."""
    env = dict(env, DS2_INSTALLER=installer, DS2_ENVS_DIR=os.path.join(work, "venvs-" + installer),
               PIP_CACHE_DIR=os.path.join(work, "cache-" + installer, "pip"),
               UV_CACHE_DIR=os.path.join(work, "cache-" + installer, "uv"))
    rows = [("environment: runner", timed(
        [python, "-c", "from runner.envs.bootstrap import ensure_runner_env; ensure_runner_env()"], clone, env, log)[0])]
    took, out = timed([python, "run_all.py", "--setup-only", "--device", "cpu", "--frameworks", ",".join(names)],
                      clone, env, log)
    ready = dict(re.findall(r"^environment \d+/\d+: (\S+?)-cpu\S*: ready in (\d+) s", out, flags=re.M))
    rows += [("  environment: %s (made alongside others)" % n, float(ready[n]) if n in ready else None)
             for n in names]
    rows.append(("environments of the frameworks, all", took))
    return rows, env


def notebook_times(results_dir):
    """target -> the notebook's wall seconds, from the records a run wrote."""
    out = {}
    for path in sorted(glob.glob(os.path.join(results_dir, "records", "*.json"))):
        with open(path) as f:
            rec = json.load(f)
        out[rec["target"]] = (rec.get("run") or {}).get("wall_s")
    return out


def main(argv=None):
    p = validate.OneLineParser(prog="first_run.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--keep", metavar="DIR", type=validate.non_empty("directory"),
                   help="work in DIR (created, or empty; kept afterwards) instead of a temporary one")
    p.add_argument("--frameworks", type=validate.comma_list(list(ALL_TARGETS), "framework", everything=list(TARGETS)),
                   help="run_all.py --frameworks for the two runs (default: every row)")
    p.add_argument("--no-second-run", action="store_true", help="skip the warm second run")
    p.add_argument("--installer", choices=["uv", "pip", "both"], default="uv",
                   help="what installs the environments (DS2_INSTALLER); both: pip's, then uv's (default: uv)")
    p.add_argument("--envs-only", action="store_true", help="stop after the environments")
    args = p.parse_args(argv)
    if args.keep:
        work = os.path.abspath(args.keep)
        why = validate.unwritable_dir(work)                 # a file, or a folder that cannot be made or written
        if why:
            p.error("--keep %s %s" % (work, why))
        if os.path.isdir(work) and os.listdir(work):
            p.error("--keep %s exists and is not empty" % work)
        os.makedirs(work, exist_ok=True)
    else:
        work = tempfile.mkdtemp(prefix="ds2-first-run-")
    clone, log = os.path.join(work, "clone"), os.path.join(work, "first_run.log")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DS2_", "VIRTUAL_ENV", "UV_"))}
    env.update(XDG_CACHE_HOME=os.path.join(work, "cache"))
    cntk = subprocess.run([sys.executable, "-m", "runner.envs.cntk_python"], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, universal_newlines=True)
    if cntk.returncode == 0 and cntk.stdout.strip():
        env["DS2_CNTK_PYTHON"] = cntk.stdout.strip().splitlines()[-1]
    names = [n for n in ENVS if n != "cntk" or "DS2_CNTK_PYTHON" in env]
    python = sys.executable if sys.prefix == sys.base_prefix else getattr(sys, "_base_executable", sys.executable)
    installers = ["pip", "uv"] if args.installer == "both" else [args.installer]
    columns = {}                     # installer -> [(part, seconds)]
    rows = []                        # the runs: [(part, seconds)]
    try:
        rows.append(("git clone", timed(["git", "clone", "-q", ROOT, clone], work, env, log)[0]))
        run_env = env
        for installer in installers:
            columns[installer], run_env = environments(installer, clone, work, env, python, names, log)
        if not args.envs_only:
            select = ["--frameworks", ",".join(args.frameworks)] if args.frameworks else []
            runs = [("first run", "first")] + ([] if args.no_second_run else [("second run (warm)", "second")])
            for label, name in runs:
                results = os.path.join(work, "results-" + name)
                total = timed([python, "run_all.py", "--device", "cpu", "--no-progress", "--results-dir", results]
                              + select, clone, run_env, log)[0]
                rows += [("  notebook: %s (%s)" % (target, name), s) for target, s in notebook_times(results).items()]
                rows.append(("python run_all.py, " + label, total))
    finally:
        report(rows, columns, log)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def report(rows, columns, log):
    def cell(seconds):
        return "-" if seconds is None else "%.0f" % seconds
    installers = list(columns)
    print("%-48s %s" % ("part", " ".join("%8s" % ("%s, s" % i) for i in installers)
                        + ("    pip/uv" if len(installers) == 2 else "")))
    print("%-48s %s" % (rows[0][0], "%8s" % cell(rows[0][1])) if rows else "")
    parts = [part for part, _ in next(iter(columns.values()))] if columns else []
    totals = {}
    for i, part in enumerate(parts):
        values = [columns[inst][i][1] if i < len(columns[inst]) else None for inst in installers]
        ratio = ("    %5.1fx" % (values[0] / values[1]) if len(values) == 2 and values[0] and values[1] else "")
        print("%-48s %s%s" % (part, " ".join("%8s" % cell(v) for v in values), ratio))
    for inst in installers:
        totals[inst] = sum(s for part, s in columns[inst] if not part.startswith("  ") and s)
    if totals:
        values = [totals[i] for i in installers]
        ratio = "    %5.1fx" % (values[0] / values[1]) if len(values) == 2 and values[1] else ""
        print("%-48s %s%s" % ("environments, all (runner included)", " ".join("%8.0f" % v for v in values), ratio))
    for name, seconds in rows[1:]:
        print("%-48s %8s" % (name, cell(seconds)))
    first = dict(rows).get("python run_all.py, first run")
    if first is not None and totals:
        print("%-48s %8.0f" % ("first run with its environments (%s)" % installers[-1], totals[installers[-1]] + first))
    print("(log: %s)" % log)


if __name__ == "__main__":
    main()
