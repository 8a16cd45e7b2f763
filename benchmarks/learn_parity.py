"""Parity of the real task across rows: the PyTorch row over several seeds (its seed-to-seed spread), the other rows
over one, then the "Learns a real task" section of results.md, whose parity table flags every row whose CER at equal
steps lies outside PyTorch's spread (runner/report/learning.py).

    python benchmarks/learn_parity.py                                  # learn preset: pytorch x 3 seeds, all rows
    python benchmarks/learn_parity.py --preset learn-smoke --rows jax --seeds 0,1,2 --results-dir /tmp/parity

Each seed changes the canonical initial weights and the order of the training batches (the corpus stays the
committed one); the other rows run seed 0, so each meets PyTorch's seed-0 run from the same start on the same
batches.  Runs go two at a time (``--parallel``), each a ``run_all.py`` of its own into one results directory, with one
OpenMP thread each unless ``OMP_NUM_THREADS`` says otherwise (two PyTorch processes of two threads on two cores
stall each other); the page is written at the end.  On a shared machine the seconds are not comparable across runs: the parity check reads
CER at equal steps, not seconds.
"""
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common.spec import LEARN_PRESETS  # noqa: E402
from runner import validate  # noqa: E402  (standard library only)
from runner.run.targets import TARGETS  # noqa: E402


def seed_list(text: str):
    """--seeds: comma-separated seeds (runner/validate.py's range), each once, at least two (the spread)."""
    items = [t.strip() for t in text.split(",")]
    if "" in items:
        raise argparse.ArgumentTypeError("%r has an empty item; expected seeds such as 0,1,2" % text)
    seeds = [validate.seed(t) for t in items]
    twice = validate.first_repeated(seeds)
    if twice is not None:
        raise argparse.ArgumentTypeError("%r names seed %d twice; name each once" % (text, twice))
    if len(seeds) < 2:
        raise argparse.ArgumentTypeError("%r: the spread needs at least 2 seeds" % text)
    return seeds


def row_list(text: str):
    """--rows: comma-separated rows of record other than pytorch, each once; '' for none."""
    if not text.strip():
        return []
    others = [t for t in TARGETS if t != "pytorch"]
    return validate.comma_list(others, "row")(text)


def main(argv=None) -> int:
    p = validate.OneLineParser(prog="learn_parity.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="learn", choices=sorted(LEARN_PRESETS))
    p.add_argument("--seeds", type=seed_list, default="0,1,2",
                   help="PyTorch's seeds, comma-separated, each once, at least 2 (default 0,1,2)")
    p.add_argument("--rows", type=row_list, default=",".join(t for t in TARGETS if t != "pytorch"),
                   help="the other rows, seed 0 each, each once (default: every other row of record); '' for none")
    p.add_argument("--parallel", type=validate.positive_int, default=2,
                   help="run_all.py processes at once, at least 1 (default 2)")
    p.add_argument("--results-dir", type=validate.non_empty("directory"),
                   default=os.path.join(ROOT, "results", "learn_parity"))
    p.add_argument("--timeout", type=validate.seconds, default=3600,
                   help="seconds a notebook cell may run, 1 to %d (default 3600)" % validate.MAX_TIMEOUT_S)
    args = p.parse_args(argv)
    problem = validate.results_dir_error("--results-dir", args.results_dir)
    if problem:
        p.error(problem)
    seeds, rows = args.seeds, args.rows
    jobs = [("pytorch", s) for s in seeds] + [(r, 0) for r in rows]
    os.makedirs(args.results_dir, exist_ok=True)
    logs = os.path.join(args.results_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    from common import learn
    t0 = time.time()
    learn.open_corpus(args.preset)                    # once, before the rows start
    print("corpus ready in %.0f s" % (time.time() - t0), flush=True)
    running, failed = [], 0
    while jobs or running:
        while jobs and len(running) < args.parallel:
            target, seed = jobs.pop(0)
            log = open(os.path.join(logs, "%s_seed%d.log" % (target, seed)), "w")
            cmd = [sys.executable, os.path.join(ROOT, "run_all.py"), "--preset", args.preset, "--device", "cpu",
                   "--frameworks", target, "--seed", str(seed), "--results-dir", args.results_dir,
                   "--timeout", str(args.timeout), "--no-progress"]
            env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))   # one core each
            running.append((target, seed, subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                                           env=env),
                            log, time.time()))
            print("started %s seed %d" % (target, seed), flush=True)
        time.sleep(2)
        for job in list(running):
            target, seed, proc, log, started = job
            if proc.poll() is not None:
                log.close()
                running.remove(job)
                failed += proc.returncode != 0
                print("%s seed %d: exit %d after %.0f s" % (target, seed, proc.returncode, time.time() - started),
                      flush=True)
    from runner.report import render
    from runner.report import learning
    output = os.path.join(args.results_dir, "results.md")
    render.write(args.results_dir, output, "python benchmarks/learn_parity.py " + " ".join(argv or sys.argv[1:]),
                 None)
    from common import results
    records = [r for r in results.scan_records(os.path.join(args.results_dir, "records"))[0]
               if learning.is_learning(r)]
    rows_, note = learning.parity(records)
    print("Parity: " + note)
    for r in rows_:
        print("  %-28s against %-18s outside the spread at %d of %d steps (largest deviation %.2f x the spread): %s"
              % (r["Row"], r["Against"], r["Outside the spread"], r["Steps compared"],
                 r["Largest deviation / spread"], r["Parity"]))
    print("results: %s" % output)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
