"""Shared fixtures and the two tiers.  The notebook tests run ``run_all.py --preset smoke`` once per session, for
every row of record (or the comma-separated ones in ``DS2_TEST_FRAMEWORKS``), into a temporary results
directory, and then assert on the records it wrote.

Two tiers: ``python -m tests`` runs every test not marked ``full``; ``python -m tests --full`` adds the heavy
ones (the variant rows, bf16, data-parallel equivalence on every engine, every pair of the migration matrix).
Without ``--full`` the ``full`` tests are deselected and the summary says how many.  Every test of the default
tier is held to ``TEST_LIMIT_S`` (tests/test_tier.py, which runs last)."""
import argparse
import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common import results  # noqa: E402

#: OpenMP's threads wait asleep, not spinning, in every process the tiers start (papermill's kernels inherit it).
#: The tiers run processes side by side on 2 cores (the smoke run's two halves; the runs made ahead at idle priority;
#: a test's own), and a spinning thread holds the core that the thread it waits for needs. Measured on a 2-core AMD
#: EPYC (Zen 2, AVX2 only), PyTorch's smoke notebook, training seconds: 0.81 alone; beside one busy thread 44.3 by
#: default, 1.28 passive; beside a busy thread at idle priority 1.9 to 2.3, 1.45 passive. The smoke run's halves and
#: CNTK took 360 s by default, 206 s passive. What a user sets is kept; run_all.py itself leaves the default (one
#: notebook at a time, where spinning is OpenMP's fastest: 0.81 against 1.07 s alone).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

#: a test of the default tier may take at most this long (its own setup, call and teardown; the shared
#: session and module fixtures it is the first to use are reported apart: they serve many tests)
TEST_LIMIT_S = 300.0
FULL_HINT = "python -m tests --full"


# ---- how close the rows must be: the measured spread on a CPU in fp32, with a margin ----------------------------
#: the first loss against the NumPy float64 reference: measured 5.9e-9 to 1.25e-7 over the eight rows (2026-11-25,
#: Intel Xeon and AMD EPYC). The notebooks' own check stays at the spec's 1e-4 (common/spec.py LOSS_RTOL), which
#: must also hold on GPUs; the test holds the CPU to what it measures. A BatchNorm epsilon of 1e-3 instead of 1e-5
#: moves the first loss by 1.0e-5: caught here, not by 1e-4.
FIRST_LOSS_RTOL = 1e-6
#: the first K training steps (warm-up, then the timed pass) of every row against PyTorch's: measured at most
#: 1.7e-7 (every row, smoke, 2026-11-25); a learning rate 0.7x or no momentum moves step 2 or 3 by far more.
K_STEPS = 10
TRAJECTORY_RTOL = 1e-5
#: a variant against its row of record over the first K steps. Variants that run the same kernels in another
#: schedule (an unrolled scan, a static-shape MXNet graph) agree to the last bits (measured 0.0); compiled ones
#: fuse and reorder floating-point work: PyTorch's Inductor measured 4.9e-5 (cpu preset, full width, 2026-11-23),
#: and XLA under TensorFlow is held to the same. JAX's hoisted input projection computes x_t W of every t in one
#: large product instead of T/4 small ones, another blocking of the same sums: measured 1.2e-7 (smoke, 2026-11-26);
#: bidir2 hoists the same way, batches both directions' h U and sums dL/dU in one product: measured 1.3e-7 (smoke,
#: 2026-11-27).
VARIANT_RTOL = {"jax+unroll": 1e-6, "jax+hoist": 1e-5, "jax+bidir2": 1e-5, "mxnet+static": 1e-6,
                "pytorch+compile": 1e-4, "tensorflow+xla": 1e-4, "keras-tensorflow+xla": 1e-4}
#: PyTorch's bidir2 (cuBLAS products, summed in another order than nn.RNN's) measured 7.2e-8 (smoke, 2-core Xeon);
#: graphs runs on a GPU only: its CPU stand-in (tests/test_pytorch_variants.py) measured 0.0, and a GPU's run-to-run
#: differences are held to the rows' own 1e-5; so is JAX's graphs (the same program, its loops in CUDA graphs), never
#: run on a CPU.
VARIANT_RTOL.update({"pytorch+bidir2": 1e-6, "pytorch+graphs": 1e-5, "pytorch+bidir2+graphs": 1e-5,
                     "jax+graphs": 1e-5})


def variant_rtol(target: str) -> float:
    """How far ``target``'s first K losses may be from its row of record's (one number per variant, used by
    every test that compares a variant with its row)."""
    return VARIANT_RTOL[target]


# ---- the tiers -----------------------------------------------------------------------------------------------
def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", default=False,
                     help="also run the tests marked full (heavy: variants, bf16, every data-parallel engine, "
                          "the whole migration matrix)")


def full_tier(config=None) -> bool:
    """Whether this session runs the ``full`` tests too (``--full``)."""
    config = config or _CONFIG.get("config")
    return bool(config and config.getoption("--full"))


_CONFIG = {}


def pytest_configure(config):
    _CONFIG["config"] = config
    config.pluginmanager.register(DURATIONS, "ds2-durations")
    problem = selection_error(os.environ.get("DS2_TEST_FRAMEWORKS"))
    if problem:                         # a typo would select nothing, and every row's test would skip
        raise pytest.UsageError(problem)


def selection_error(value):
    """Why ``DS2_TEST_FRAMEWORKS`` (unset: every row) cannot select the tests' rows, or None: ``all`` or a comma list
    of rows, each once (run_all.py's --frameworks)."""
    if value is None:
        return None
    from runner import validate
    from runner.run.targets import ALL_TARGETS
    try:
        validate.comma_list(list(ALL_TARGETS), "framework", everything=list(ALL_TARGETS))(value)
    except argparse.ArgumentTypeError as e:
        return "DS2_TEST_FRAMEWORKS=%s: %s (unset: every row)" % (value, e)
    return None


def pytest_collection_modifyitems(config, items):
    if not full_tier(config):
        heavy = [item for item in items if item.get_closest_marker("full")]
        if heavy:
            config.hook.pytest_deselected(items=heavy)
            items[:] = [item for item in items if not item.get_closest_marker("full")]
            DURATIONS.deselected = len(heavy)
    items[:] = session_order(items)


def session_order(items):
    """``items`` in the order they run: the modules whose tests use the runs made ahead (:class:`LanesAhead`) after
    the others, each module whole (its module fixtures are made once) and in its own order; then the tests marked
    ``last``."""
    def module(item):
        return item.nodeid.split("::")[0]
    ahead = ("lane_runs",) + tuple(AFTER_SMOKE)
    later = set(module(item) for item in items if any(f in getattr(item, "fixturenames", ()) for f in ahead))
    rest = [item for item in items if not item.get_closest_marker("last")]
    return [item for item in rest if module(item) not in later] + [item for item in rest if module(item) in later] \
        + [item for item in items if item.get_closest_marker("last")]


def pytest_terminal_summary(terminalreporter):
    if DURATIONS.deselected:
        terminalreporter.write_line("%d heavy tests (marked full) were not run: `%s` runs them"
                                    % (DURATIONS.deselected, FULL_HINT))
    shared = sorted(((name, s) for name, s in DURATIONS.shared.items() if s >= 1), key=lambda kv: -kv[1])
    if shared:
        terminalreporter.write_line("shared fixtures (set up once, used by many tests): " + ", ".join(
            "%s %.0f s" % (name, s) for name, s in shared))


def full_targets(names):
    """``names`` as pytest parameters, a variant target marked ``full``: its rows run in the full tier only."""
    from runner.run.targets import VARIANTS
    return [pytest.param(n, marks=pytest.mark.full) if n in VARIANTS else n for n in names]


def file_tree(path):
    """Every directory under ``path``, and every file with its size and modification time (a directory's own time
    is left out: the write test of a path makes and removes a temporary directory, which leaves nothing); links are
    not followed.  What the refusal tests compare before and after a command."""
    out = {}
    for root, dirs, files in os.walk(str(path)):
        for name in dirs:
            out[os.path.relpath(os.path.join(root, name), str(path))] = "dir"
        for name in files:
            st = os.lstat(os.path.join(root, name))
            out[os.path.relpath(os.path.join(root, name), str(path))] = (st.st_size, st.st_mtime_ns)
    return out


def assert_refused(command, args, prog, words, cwd, env, seconds):
    """Run ``command + args`` and check it was refused as bad input: exit status 2, one stderr line
    ``PROG: error: ...`` holding every one of ``words``, nothing on stdout, within ``seconds`` (what the refusal
    tests share; each checks what the command may have written)."""
    t0 = time.time()
    proc = subprocess.run(command + list(args), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=120)
    elapsed = time.time() - t0
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith(prog + ": error: "), proc.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert proc.stdout == "", proc.stdout
    assert elapsed < seconds, "a refusal took %.1f s" % elapsed


class Durations:
    """Each test's own seconds (setup + call + teardown, less the set-up of session, package and module fixtures
    it was the first to use; those are counted in ``shared``, by fixture)."""

    def __init__(self):
        self.tests, self.shared, self.full, self.deselected = {}, {}, set(), 0
        self._shared_in_setup, self._nested = 0.0, []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if fixturedef.scope not in ("session", "package", "module"):
            yield
            return
        self._nested.append(0.0)          # the set-up time of the shared fixtures this one uses
        t0 = time.monotonic()
        yield
        took = time.monotonic() - t0
        inner = self._nested.pop()
        if self._nested:
            self._nested[-1] += took
        else:                             # outermost: the test's setup phase includes it
            self._shared_in_setup += took
        key = fixturedef.argname if fixturedef.scope == "session" else "%s (%s)" % (
            fixturedef.argname, os.path.basename(str(request.node.fspath)))
        self.shared[key] = self.shared.get(key, 0.0) + took - inner

    def pytest_runtest_setup(self, item):
        self._shared_in_setup = 0.0
        if item.get_closest_marker("full"):
            self.full.add(item.nodeid)

    def pytest_runtest_logreport(self, report):
        took = report.duration
        if report.when == "setup":
            took = max(0.0, took - self._shared_in_setup)
        self.tests[report.nodeid] = self.tests.get(report.nodeid, 0.0) + took

    def over_limit(self, limit=None):
        """[(nodeid, seconds)] of the tests not marked ``full`` that took longer than ``limit``."""
        limit = TEST_LIMIT_S if limit is None else limit
        return sorted(((n, s) for n, s in self.tests.items() if s > limit and n not in self.full),
                      key=lambda kv: -kv[1])


DURATIONS = Durations()


class RunAll:
    """The outcome of one run_all.py invocation: exit status, output, records by target."""

    #: the run_all.py processes running now, from any thread (stop_all ends them)
    running = set()

    def __init__(self, args, results_dir, _run=True, env=None):
        self.results_dir = str(results_dir)
        self.returncode, self.output = 0, ""
        if _run:
            with subprocess.Popen(self.command(args, self.results_dir), cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, universal_newlines=True, env=env) as proc:
                RunAll.running.add(proc)
                try:
                    self.output = proc.communicate()[0]
                except BaseException:
                    proc.kill()
                    raise
                finally:
                    RunAll.running.discard(proc)
            self.returncode = proc.returncode
            print(self.output)  # shown by pytest when a test fails
        self._load()

    @classmethod
    def stop_all(cls, grace=30.0):
        """SIGTERM to every run_all.py running now (it stops its notebooks and workers), SIGKILL to any still
        there ``grace`` s later."""
        procs = list(cls.running)
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()

    @staticmethod
    def command(args, results_dir):
        """The run_all.py command line of ``args`` into ``results_dir``."""
        return [sys.executable, os.path.join(ROOT, "run_all.py"), "--results-dir", str(results_dir),
                "--no-progress"] + list(args)

    @classmethod
    def side_by_side(cls, arg_lists, results_dir, **lanes):
        """Several run_all.py at once into ``results_dir``, one per ``args`` of ``arg_lists``: their outcomes, in
        the order given (each loaded when it ends).  ``lanes``: :meth:`in_lanes`' options."""
        return [lane[0] for lane in cls.in_lanes([[(args, results_dir)] for args in arg_lists], **lanes)]

    @classmethod
    def in_lanes(cls, lanes, env=None, idle=False, tids=None):
        """Lanes side by side, each a list of ``(args, results_dir)`` run one after another: their outcomes, lane by
        lane, in the order given.  ``env``: the processes' environment (None: this one's); ``idle``: each lane at
        idle priority (:func:`idle_priority`); ``tids``: a list the lanes' thread ids are appended to."""
        import threading
        outcomes = [[] for _ in lanes]

        def run(lane, out):
            if tids is not None:
                tids.append(threading.get_native_id())
            if idle:
                idle_priority()
            for args, results_dir in lane:
                out.append(cls(args, results_dir, env=env))
        threads = [threading.Thread(target=run, args=(lane, out)) for lane, out in zip(lanes, outcomes) if lane]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return outcomes

    @classmethod
    def reuse(cls, run, target, results_dir, precision="fp32"):
        """``run``'s record of ``target`` (e.g. the session's smoke run: batch 8, one worker) copied into
        ``results_dir``, as the outcome of a run there: the single-worker reference a data-parallel test
        compares with is the session's run, not a second run of the same notebook.  Its export files stay
        where the record says (absolute paths)."""
        import shutil
        src = os.path.join(run.results_dir, "records")
        dst = os.path.join(str(results_dir), "records")
        os.makedirs(dst, exist_ok=True)
        for name in sorted(os.listdir(src)):
            if name.endswith(".json"):
                rec = results.read_record(os.path.join(src, name))
                if rec.get("target") == target and rec.get("precision") == precision \
                        and not (rec.get("distributed") or {}).get("world_size"):
                    shutil.copy(os.path.join(src, name), os.path.join(dst, name))
        out = cls([], results_dir, _run=False)
        out.output = run.output
        return out

    def _load(self):
        records_dir = os.path.join(self.results_dir, "records")
        self.records = {}
        if os.path.isdir(records_dir):
            for rec in results.read_records(records_dir):
                self.records.setdefault(rec["target"], []).append(rec)

    def record(self, target, precision="fp32"):
        recs = [r for r in self.records.get(target, []) if r.get("precision") == precision]
        assert len(recs) == 1, "expected one %s %s record, found %d\n%s" % (target, precision, len(recs), self.output)
        return recs[0]

    def markdown(self):
        with open(os.path.join(self.results_dir, "results.md")) as f:
            return f.read()


def ok_record(run, target, precision="fp32"):
    """``run``'s record of ``target``: the test is skipped with the runner's reason when the row was skipped, and
    fails with its error when it failed."""
    rec = run.record(target, precision)
    if rec["status"] == "skipped":
        pytest.skip("%s: %s" % (target, rec["error"]))
    assert rec["status"] == "ok", "%s failed: %s" % (target, rec["error"])
    return rec


def no_cntk_python_anywhere(home):
    """An environment in which runner.envs.cntk_python finds no interpreter: an empty home, no pyenv or
    conda, and a PATH with only the runner's interpreter and the system's directories."""
    os.makedirs(str(home), exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("DS2_CNTK_PYTHON", "CONDA_PREFIX")}
    env.update(HOME=str(home), PYENV_ROOT=os.path.join(str(home), ".pyenv"),
               PATH=os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin"]))
    return env


def env_interpreter(run, target):
    """The interpreter of the CPU environment in which ``run`` (a RunAll, e.g. the session's smoke run) ran
    ``target``, where the runner puts it (runner/envs/framework_envs.py, DS2_ENVS_DIR honoured).  A row the run skipped is
    skipped with the runner's reason; a row that ran must have its environment there."""
    from runner.envs import framework_envs
    from runner.envs.bootstrap import env_python
    from runner.run.targets import ALL_TARGETS
    from runner.envs.definitions import ENVS
    rec = run.record(target)
    if rec["status"] == "skipped":
        pytest.skip("%s: %s" % (target, rec["error"]))
    env = ENVS[ALL_TARGETS[target].env]
    python = env_python(framework_envs.env_path(env, "cpu", rec["run"].get("interpreter")))
    assert os.path.exists(python), "%s ran (%s) but its environment's interpreter %s is missing" % (
        target, rec["status"], python)
    return python


def cpu_env(row):
    """(environment folder, interpreter) of ``row``'s CPU environment where the runner puts it (DS2_ENVS_DIR
    honoured), made by ``run_all.py --setup-only`` when it is not there yet (a test file run before any test made
    it: ``--full -m full``, or the file alone, on a fresh clone).  Where the runner cannot make it, the test fails
    with the runner's last line, or is skipped with it where the environment needs an interpreter nobody named (CNTK's
    Python 3.6 without DS2_CNTK_PYTHON, which ``.ci/run`` sets)."""
    import glob
    from runner.envs import framework_envs
    from runner.envs.bootstrap import env_python
    from runner.envs.definitions import ENVS
    from runner.run.targets import TARGETS
    env = ENVS[TARGETS[row].env]
    pattern = framework_envs.env_path(env, "cpu") + "*"

    def found():
        return [p for p in sorted(glob.glob(pattern)) if os.path.exists(env_python(p))]
    paths = found()
    if not paths:
        made = subprocess.run([sys.executable, os.path.join(ROOT, "run_all.py"), "--setup-only", "--device", "cpu",
                               "--frameworks", row, "--no-progress"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, universal_newlines=True, timeout=1200)
        paths = found()
        if not paths:
            why = "%s: run_all.py --setup-only made no environment %s (exit status %d): %s" % (
                row, pattern, made.returncode, (made.stdout.strip().splitlines() or ["?"])[-1])
            if env.needs_python and not os.environ.get("DS2_CNTK_PYTHON"):
                pytest.skip(why)
            pytest.fail(why)
    return paths[0], env_python(paths[0])


def dead_runners_claim(owner: str) -> int:
    """Rewrite a row's ``.staging/<stem>.owner`` (runner/run/staging.py) as a runner of this host that no longer runs
    would have left it; returns that runner's pid."""
    from common import processes
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()                                        # a pid that no longer runs
    with open(owner, "w") as f:
        f.write("%d %s %s\n" % (dead.pid, processes.process_start_time(dead.pid) or "-", processes.host_id()))
    return dead.pid


def harness_result(python, source, directory, *args, timeout=600):
    """Run ``source`` (a harness script: a notebook's cells in a framework's environment) with ``python`` from the
    repository root, ``args`` after its path; the JSON of the last line it prints that starts with ``RESULT ``.  The
    test fails with the end of its output when it exits non-zero."""
    path = os.path.join(str(directory), "harness.py")
    with open(path, "w") as f:
        f.write(source)
    proc = subprocess.run([python, path] + [str(a) for a in args], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("RESULT ")][-1][7:])


def run_all(args, results_dir):
    return RunAll(args, results_dir)


def selected_targets():
    """The targets the notebook tests run: every row of record and every variant, or the comma-separated
    ones in DS2_TEST_FRAMEWORKS (a row of record named there brings its variants along)."""
    from runner.run.targets import ALL_TARGETS, TARGETS, variants_of
    selected = os.environ.get("DS2_TEST_FRAMEWORKS", "all")
    names = list(TARGETS) if selected == "all" else [t for t in selected.split(",") if t]
    names += [v.name for n in list(names) for v in variants_of(n) if v.name not in names]
    return [n for n in ALL_TARGETS if n in names]


def bf16_cpu_targets():
    """The selected rows, variants included, that run bf16 on a CPU (runner/run/targets.py: cpu_precisions): a
    variant's bf16 code differs from its row's (pytorch+bidir2's recurrence, keras-tensorflow+xla's XLA)."""
    from runner.run.targets import ALL_TARGETS
    return [n for n in selected_targets() if ALL_TARGETS[n].cpu_precision_reason("bf16") is None]


def smoke_args(targets, *options):
    """run_all.py's arguments for ``targets`` on the smoke preset on the CPU, with ``options``."""
    return ["--preset", "smoke", "--device", "cpu", "--frameworks", ",".join(targets)] + list(options) + [
        "--timeout", "3600"]


def smoke_run(tmp_path_factory, name, targets, *options):
    """One run_all.py of ``targets`` on the smoke preset on the CPU, with ``options``, in a new directory."""
    return run_all(smoke_args(targets, *options), tmp_path_factory.mktemp(name))


def learn_corpus(preset):
    """A learn preset's corpus, built on first use: (corpus, None), or (None, why not) where the engines are missing."""
    from common import corpus as C
    from common import learn
    try:
        C.check_engines()
    except C.EngineError as e:
        return None, "the corpus engines are missing (.ci/run installs them): %s" % e
    return learn.open_corpus(preset, progress=False), None


#: the shared smoke run's rows in two halves of about equal time on 2 cores, the two XLA rows one after the other in
#: one half (side by side, their compilations held each other back: on a 2-core Zen 2 EPYC the halves and CNTK took
#: 162 s so, 206 s with JAX and Keras on JAX in different halves) ...
SMOKE_HALVES = (("jax", "keras-jax", "mxnet", "keras-torch"), ("pytorch", "tensorflow", "keras-tensorflow"))
#: ... and the rows run after them, alone: CNTK's profile times each block of the model on its own and the whole
#: step, and calls the difference 'other' (no profiler of its own); another process's load would show up there
SMOKE_ALONE = ("cntk",)


def smoke_run_in_two(tmp_path_factory, name, targets, *options):
    """:func:`smoke_run`, as two run_all.py processes side by side into one results directory (half the rows
    each: a notebook's kernel start, imports and single-threaded steps overlap the other's work), then the rows that
    run alone (:data:`SMOKE_ALONE`), then results.md written again from every record, as run_all.py writes it (its
    command: one run_all.py of every row).  Smoke checks correctness; no test compares its speeds across rows."""
    from runner.report import render
    halves = [[t for t in targets if t in h] for h in SMOKE_HALVES]
    halves[1] += [t for t in targets if not any(t in h for h in SMOKE_HALVES + (SMOKE_ALONE,))]
    halves = [h for h in halves if h]
    alone = [t for t in targets if t in SMOKE_ALONE]
    if len(halves) < 2:
        return smoke_run(tmp_path_factory, name, targets, *options)
    results_dir = str(tmp_path_factory.mktemp(name))
    commands = [smoke_args(h, *options) for h in halves + ([alone] if alone else [])]
    temporary = os.path.join(results_dir, "tmp")      # the runs' TMPDIR: what they leave there, tests can see
    os.makedirs(temporary)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", temporary)
        runs = RunAll.side_by_side(commands[:2], results_dir)
        if alone:                                    # then the rows that run alone
            runs.append(RunAll(commands[2], results_dir))
    out = RunAll([], results_dir, _run=False)
    out.returncode = max(r.returncode for r in runs)
    out.output = "\n".join(r.output for r in runs)
    render.write(results_dir, os.path.join(results_dir, "results.md"),
                 "python run_all.py " + " ".join(RunAll.command(smoke_args(targets, *options), results_dir)[2:]), None)
    return out


@pytest.fixture(scope="session")
def smoke(tmp_path_factory):
    """Every selected row of record (and, with ``--full``, every variant), fp32, smoke preset, on the CPU: one
    run_all.py, with ``--profile`` (every notebook's section 12, which comes after the export: the profiled steps
    change neither the export nor the record's losses that the data-parallel and export tests compare against).
    The variants' tests are marked ``full``, so the default tier runs the rows of record only."""
    from runner.run.targets import TARGETS
    names = [n for n in selected_targets() if full_tier() or n in TARGETS]
    run = None
    try:
        run = smoke_run_in_two(tmp_path_factory, "smoke", names, "--profile")
    finally:
        LANES_AHEAD.smoke_made(run)             # what waits for it (AFTER_SMOKE) starts, or gives up
    return run


# ---- the runs made in two lanes: the learning short run, the float64 control, the bf16 run -------------------
#: the learning short run's rows (tests/test_learning_rows.py): an eager row and an XLA row in the default tier,
#: MXNet too with --full
LEARN_SHORT_ROWS = ("pytorch", "jax", "mxnet")
LEARN_SHORT_FULL_ONLY = ("mxnet",)
#: rows whose short run is mostly XLA compiling on one core: each gets a lane of its own
LEARN_XLA_ROWS = ("jax",)


def learn_short_rows():
    return [t for t in LEARN_SHORT_ROWS if t in selected_targets() and (full_tier() or t not in LEARN_SHORT_FULL_ONLY)]


def _fixtures_in_use(session):
    used = set()
    for item in session.items:
        used.update(getattr(item, "fixturenames", ()))
    return used


def _lane_jobs(used, tmp_path_factory):
    """The runs of :func:`lane_runs` that the tests in use (``used``: their fixtures) need: ``([(name, results dir,
    run_all.py args, the learning row or None)], {name: why it is not made})``."""
    jobs, out = [], {}
    if "short" in used:
        rows = learn_short_rows()
        if not rows:
            out["short"] = "none of %s is selected (DS2_TEST_FRAMEWORKS)" % ", ".join(LEARN_SHORT_ROWS)
        else:
            d = tmp_path_factory.mktemp("learn_smoke")
            jobs += [("short", d, ["--preset", "learn-smoke", "--device", "cpu", "--frameworks", t,
                                   "--timeout", "900"], t) for t in rows]
    if "smoke_fp64" in used:
        if "pytorch" not in selected_targets():
            out["smoke_fp64"] = "the pytorch target is not selected"
        else:
            jobs.append(("smoke_fp64", tmp_path_factory.mktemp("smoke_fp64"),
                         smoke_args(["pytorch"], "--precision", "fp64"), None))
    if "bf16" in used and not full_tier():         # tests/test_rnn_dtype.py's: PyTorch alone, its training only
        if "pytorch" not in selected_targets():
            out["pytorch_bf16"] = "the pytorch target is not selected"
        else:
            jobs.append(("pytorch_bf16", tmp_path_factory.mktemp("rnn_dtype_bf16"),
                         smoke_args(["pytorch"], "--precision", "bf16", "--skip", "forward,onnx"), None))
    if "smoke_bf16" in used:
        names = bf16_cpu_targets()
        if not names:
            out["smoke_bf16"] = "no selected target runs bf16 on a CPU"
        else:
            jobs.append(("smoke_bf16", tmp_path_factory.mktemp("smoke_bf16"),
                         smoke_args(names, "--precision", "bf16"), None))
    return jobs, out


def _make_lane_runs(jobs, out, idle=False, tids=None, env=None):
    """``jobs`` (:func:`_lane_jobs`) run in two lanes, one OpenMP thread per process: ``out`` with a RunAll for each
    name.  The learning corpus is built first (off the notebooks' clocks).  ``idle``, ``tids``: RunAll.in_lanes';
    ``env``: the processes' environment (default: this process's now)."""
    if any(j[0] == "short" for j in jobs):
        corpus, why = learn_corpus("learn-smoke")
        if corpus is None:
            out["short"] = why
            jobs = [j for j in jobs if j[0] != "short"]
    xla = [j for j in jobs if j[3] in LEARN_XLA_ROWS]
    rest = [j for j in jobs if j not in xla]
    lanes = [xla, rest] if xla else [rest[:1], rest[1:]]
    outcomes = RunAll.in_lanes([[(args, d) for _, d, args, _ in lane] for lane in lanes],
                               env=dict(os.environ if env is None else env, OMP_NUM_THREADS="1"), idle=idle,
                               tids=tids)
    done = {}
    for lane, runs in zip(lanes, outcomes):
        for (name, _, _, _), run in zip(lane, runs):
            done.setdefault(name, []).append(run)
    for name, runs in done.items():
        merged = RunAll([], runs[0].results_dir, _run=False)
        merged.output = "\n".join(r.output for r in runs)
        merged.returncode = max(r.returncode for r in runs)
        out[name] = merged
    return out


def idle_priority():
    """This thread, and every process it starts from now on, at Linux's idle priority (SCHED_IDLE): it runs only
    on a core that nothing else wants.  False where the system has none (then nothing changed)."""
    if not hasattr(os, "SCHED_IDLE"):
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))      # 0: the calling thread
    except OSError:
        return False
    return True


def idle_undoable():
    """Whether this process may put a thread at idle priority and back to the normal one (Linux lets root, or a
    RLIMIT_NICE that allows nice 0, leave SCHED_IDLE): tried on a thread of its own."""
    import threading
    out = []

    def attempt():
        try:
            out.append(idle_priority() and os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0)) is None)
        except OSError:
            out.append(False)
    t = threading.Thread(target=attempt)
    t.start()
    t.join()
    return out == [True]


def normal_priority(pids, tids=()):
    """Every thread of the processes ``pids`` and of their descendants, and the threads ``tids`` of this process,
    back at the normal priority (SCHED_OTHER); what has ended meanwhile is passed over."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    children.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    todo, seen, threads = list(pids), set(), list(tids)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo += children.get(pid, [])
            try:
                threads += [int(t) for t in os.listdir("/proc/%d/task" % pid)]
            except OSError:
                pass
    for tid in threads:
        try:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            pass


#: runs a test module has made ahead once the session's smoke run exists: ``{fixture name: make(smoke, **lanes)}``,
#: ``lanes`` being RunAll.in_lanes' options (tests/test_export_records.py registers its migration)
AFTER_SMOKE = {}


class LanesAhead:
    """:func:`lane_runs`, then the runs of :data:`AFTER_SMOKE` that the selected tests use, made in the background at
    idle priority once the smoke run exists (:func:`lane_runs` from the first test where the session makes none, or
    when a test asks for them): the smoke run's two halves keep both cores busy; after them, the runs take only the
    CPU time the tests leave (most tests keep one of two cores busy), and
    the modules that read them run after the others (:func:`session_order`).  Their processes get the environment of
    the session's start (a test's variables, such as ``tag``'s marker, are not theirs).  A test that asks for one
    before it is made puts every process and thread of the background back at the normal priority and waits
    (another program's load would otherwise hold them back).  Where a thread cannot leave the idle priority (no
    SCHED_IDLE, or a user whose RLIMIT_NICE forbids it), nothing is made ahead: each fixture makes its runs when
    first asked."""

    def __init__(self):
        import threading
        self.thread, self.tids, self.made, self.done = None, [], {}, {}
        self.smoke, self.smoke_ready, self.stopping = None, threading.Event(), threading.Event()
        self.asked = threading.Event()          # a test asked for a run made ahead: nothing waits any more

    def start(self, jobs, out, after=(), env=None, after_smoke=False):
        """``jobs``, ``out``: :func:`_lane_jobs`'; ``after``: the names of :data:`AFTER_SMOKE` to make; ``env``: their
        processes' environment (one OpenMP thread added), by default this process's now; ``after_smoke``: ``jobs``
        too wait for the smoke run (or for a test to ask for them).  Only where :func:`idle_undoable` (the caller
        asks it first)."""
        import threading
        env = dict(os.environ if env is None else env, OMP_NUM_THREADS="1")
        for name in ("lane_runs",) + tuple(after):
            self.done[name] = threading.Event()

        def smoke_or_stop(or_asked):
            """Waits for the smoke run (or, ``or_asked``, a test asking for a run): False if the session stops first."""
            while not (self.smoke_ready.wait(1) or (or_asked and self.asked.is_set())):
                if self.stopping.is_set():
                    return False
            return True

        def work():
            idle_priority()
            if after_smoke and not smoke_or_stop(or_asked=True):
                self.done["lane_runs"].set()
                return
            self._make("lane_runs", lambda: _make_lane_runs(jobs, out, idle=True, tids=self.tids, env=env))
            for name in after:
                if not smoke_or_stop(or_asked=False):
                    return
                if self.smoke is None or self.stopping.is_set():
                    self.done[name].set()          # no smoke run: the fixture makes (or fails) it itself
                    continue
                self._make(name, lambda: AFTER_SMOKE[name](self.smoke, env=env, idle=True, tids=self.tids))
        self.thread = threading.Thread(target=work, name="runs made ahead", daemon=True)
        self.thread.start()

    def _make(self, name, make):
        try:
            self.made[name] = (make(), None)
        except BaseException as e:                     # handed to the test that asks for it (a skip too)
            self.made[name] = (None, e)
        finally:
            self.done[name].set()

    def smoke_made(self, run):
        """The session's smoke run (None: it was not made)."""
        self.smoke = run
        self.smoke_ready.set()

    def get(self, name="lane_runs"):
        """What was made ahead for ``name``, waiting for it; None when it is not made ahead.  While it is being made,
        every 3 s, the background's threads and processes (a new notebook's too) are put back at the normal
        priority."""
        if name not in self.done:
            return None
        self.asked.set()
        while not self.done[name].wait(timeout=3):
            normal_priority([p.pid for p in list(RunAll.running)], [self.thread.native_id] + self.tids)
        if name not in self.made:
            return None
        value, error = self.made[name]
        if error is not None:
            raise error
        return value

    def stop(self):
        """At the session's end: the runs still going (an interrupted or stopped session) are ended."""
        if self.thread is not None and self.thread.is_alive():
            self.stopping.set()
            RunAll.stop_all()
            self.thread.join(timeout=60)


LANES_AHEAD = LanesAhead()


@pytest.fixture(scope="session", autouse=True)
def _lanes_ahead(request, tmp_path_factory):
    """Starts :data:`LANES_AHEAD` when a selected test uses ``lane_runs`` or a run of :data:`AFTER_SMOKE`; ends what
    is left at the session's end."""
    used = _fixtures_in_use(request.session)
    after = tuple(name for name in AFTER_SMOKE if name in used)
    if ("lane_runs" in used or after) and idle_undoable():          # else each fixture makes its runs when asked
        # after the smoke run where the session makes one: its two halves keep both cores busy, and runs beside them,
        # even at idle priority, held its notebooks twice as long (a 2-core Zen 2 EPYC: PyTorch's 45 s to 89 s)
        LANES_AHEAD.start(*_lane_jobs(used, tmp_path_factory), after=after, after_smoke="smoke" in used)
    yield
    LANES_AHEAD.stop()


@pytest.fixture(scope="session")
def lane_runs(request, tmp_path_factory):
    """The learning short run (``short``), the float64 control (``smoke_fp64``) and the bf16 runs (``smoke_bf16``;
    ``pytorch_bf16``, tests/test_rnn_dtype.py's in the default tier), only those the selected tests use.  Each is
    one or more run_all.py into its own results directory; they run in two lanes side by side, one OpenMP thread
    per process (PyTorch's two threads beside a busy process stall at every parallel region): an XLA row's
    learning run (compilations on one core, then its steps) in a lane of its own, everything else one after another
    in the other.  Made ahead, in the background at idle priority, once the smoke run exists (``LanesAhead``).
    Returns ``{name: RunAll or a skip reason}``."""
    ahead = LANES_AHEAD.get("lane_runs")
    if ahead is not None:
        return ahead
    return _make_lane_runs(*_lane_jobs(_fixtures_in_use(request.session), tmp_path_factory))


def lane_run(lane_runs, name):
    """``lane_runs``' run ``name``, or the test skipped with the reason it was not made."""
    run = lane_runs.get(name)
    if run is None or isinstance(run, str):
        pytest.skip(run or "%s was not made" % name)
    return run


@pytest.fixture(scope="session")
def smoke_fp64(lane_runs):
    """The float64 control: PyTorch in float64 on the smoke preset (a reference mode, not a row)."""
    return lane_run(lane_runs, "smoke_fp64")


@pytest.fixture(scope="session")
def smoke_bf16(lane_runs):
    """The selected rows of record that have a CPU bfloat16 path, in bf16 (the mixed-precision code of every
    notebook runs in CI although no GPU is here)."""
    return lane_run(lane_runs, "smoke_bf16")


@pytest.fixture
def tag(monkeypatch):
    """A variable every process the test starts inherits (``DS2_TEST_TAG``): afterwards none may carry it."""
    import signal
    import uuid
    from runner.dp import supervisor
    value = uuid.uuid4().hex
    monkeypatch.setenv("DS2_TEST_TAG", value)
    yield value
    left = supervisor.marked_processes(value, name="DS2_TEST_TAG")
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "processes outlived the run: %s" % left


# ---- the checks every data-parallel test shares ------------------------------------------------------------
def two_worker_record(two, target):
    """The one record of ``target`` with world size 2 that the ``--workers 2`` run ``two`` wrote; it is ok and
    the run exited 0."""
    recs = [r for r in two.records[target] if (r.get("distributed") or {}).get("world_size") == 2]
    assert len(recs) == 1, two.output
    rec = recs[0]
    assert rec["status"] == "ok", rec["error"]
    assert two.returncode == 0, two.output
    return rec


def recheck_first_losses(rec, single, eq):
    """The runner's equivalence, computed again without common.parallel: the first 10 losses of both records
    (warm-up, then the timed pass) straight from the JSON, their largest relative difference equal to the one
    the record reports and within 1e-5.  Returns ``rec``'s 10 losses."""
    import numpy as np
    mine = np.array((rec["losses"]["warmup"] + rec["losses"]["train"])[:10], dtype=np.float64)
    theirs = np.array((single["losses"]["warmup"] + single["losses"]["train"])[:10], dtype=np.float64)
    assert mine.shape == theirs.shape == (10,)
    rel = float(np.max(np.abs(mine - theirs) / np.abs(theirs)))
    assert rel <= 1e-5 and rel == pytest.approx(eq["loss_rel_diff"], abs=1e-15), (rel, eq)
    return mine


def assert_trains_like(rec, single):
    """The W-worker record ``rec`` trains like the single-worker record ``single``: the runner's
    ``checks.equivalence`` passed over the first 10 losses within 1e-5 with the same data checksum, the same
    comparison recomputed from the two records agrees, the losses move (not vacuous) and both trained the
    whole epoch.  Returns the equivalence, for each test's own further checks."""
    from common import parallel
    eq = rec["checks"]["equivalence"]
    assert eq["ok"] is True, eq
    assert eq["steps_compared"] == parallel.EQUIVALENCE_STEPS == 10
    assert eq["loss_rel_diff"] <= 1e-5 and eq["rel_diff"] <= 1e-5, eq
    assert eq["checksum_equal"] and rec["data"]["checksum"] == single["data"]["checksum"]
    first = recheck_first_losses(rec, single, eq)
    assert len(set(first.round(3))) > 5
    assert len(rec["losses"]["train"]) == len(single["losses"]["train"]) == rec["timing"]["steps"]
    return eq
