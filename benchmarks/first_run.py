"""A new user's first `python run_all.py`, timed part by part: a fresh clone, nothing prebuilt, an empty pip cache.

    python benchmarks/first_run.py [--keep DIR] [--frameworks a,b] [--no-second-run]

What it does, in a scratch directory (kept with ``--keep``):

1. ``git clone`` this checkout's HEAD (committed work only, as a user gets it);
2. ``python run_all.py --setup-only --device cpu --frameworks ENV`` once per environment, the runner's
   environment first (with its own ``PIP_CACHE_DIR``, empty, so every wheel is fetched or read again);
3. ``python run_all.py`` (the CPU default: the ``smoke`` preset, every row), the first run;
4. ``python run_all.py`` again, the warm second run (environments and caches in place).

It prints one table: each environment's creation, each notebook's wall time (the records' ``run.wall_s``) and each
run's total, in seconds. This is a benchmark, not a test: run it alone on an idle machine (other load slows the
2-core machine several times over), and compare parts of one run rather than absolute times of two.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENVS = ("pytorch", "tensorflow", "mxnet", "cntk", "jax")


def timed(argv, cwd, env, log):
    """Run ``argv`` (its output appended to ``log``); its wall seconds. A failure stops the benchmark."""
    start = time.monotonic()
    with open(log, "a") as out:
        out.write("\n$ %s\n" % " ".join(argv))
        out.flush()
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    took = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit("first_run.py: %s exited %d after %.0f s; see %s" % (" ".join(argv), proc.returncode, took, log))
    return took


def notebook_times(results_dir):
    """target -> the notebook's wall seconds, from the records a run wrote."""
    out = {}
    for path in sorted(glob.glob(os.path.join(results_dir, "records", "*.json"))):
        with open(path) as f:
            rec = json.load(f)
        out[rec["target"]] = (rec.get("run") or {}).get("wall_s")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keep", metavar="DIR", help="work in DIR (created; kept afterwards) instead of a temporary one")
    p.add_argument("--frameworks", help="run_all.py --frameworks for the two runs (default: every row)")
    p.add_argument("--no-second-run", action="store_true", help="skip the warm second run")
    args = p.parse_args(argv)

    work = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="ds2-first-run-")
    if args.keep:
        if os.path.exists(work) and os.listdir(work):
            p.error("--keep %s exists and is not empty" % work)
        os.makedirs(work, exist_ok=True)
    clone, log = os.path.join(work, "clone"), os.path.join(work, "first_run.log")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DS2_", "VIRTUAL_ENV"))}
    env.update(PIP_CACHE_DIR=os.path.join(work, "pip-cache"), XDG_CACHE_HOME=os.path.join(work, "cache"))
    cntk = subprocess.run([sys.executable, "-m", "runner.cntk_python"], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, universal_newlines=True)
    if cntk.returncode == 0 and cntk.stdout.strip():
        env["DS2_CNTK_PYTHON"] = cntk.stdout.strip().splitlines()[-1]
    python = sys.executable if sys.prefix == sys.base_prefix else getattr(sys, "_base_executable", sys.executable)
    rows = []
    try:
        rows.append(("git clone", timed(["git", "clone", "-q", ROOT, clone], work, env, log)))
        rows.append(("environment: runner", timed(
            [python, "-c", "from runner.bootstrap import ensure_runner_env; ensure_runner_env()"], clone, env, log)))
        for name in ENVS:
            if name == "cntk" and "DS2_CNTK_PYTHON" not in env:
                rows.append(("environment: cntk", None))
                continue
            rows.append(("environment: " + name, timed(
                [python, "run_all.py", "--setup-only", "--device", "cpu", "--frameworks", name, "--no-progress"],
                clone, env, log)))
        select = ["--frameworks", args.frameworks] if args.frameworks else []
        runs = [("first run", "first")] + ([] if args.no_second_run else [("second run (warm)", "second")])
        for label, name in runs:
            results = os.path.join(work, "results-" + name)
            total = timed([python, "run_all.py", "--device", "cpu", "--no-progress", "--results-dir", results]
                          + select, clone, env, log)
            rows += [("  notebook: %s (%s)" % (target, name), s) for target, s in notebook_times(results).items()]
            rows.append(("python run_all.py, " + label, total))
    finally:
        environments = sum(s for n, s in rows if n.startswith("environment") and s)
        print("%-44s %8s" % ("part", "seconds"))
        for name, seconds in rows:
            print("%-44s %8s" % (name, "-" if seconds is None else "%.0f" % seconds))
        print("%-44s %8.0f" % ("environments, all", environments))
        first = dict(rows).get("python run_all.py, first run")
        if first is not None:
            print("%-44s %8.0f" % ("first run with its environments", environments + first))
        print("(log: %s)" % log)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
