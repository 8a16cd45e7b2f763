"""A hard stop never leaves a worker behind: every data-parallel launcher, every signal sequence.

``run_all.py --preset smoke --workers 2 --batch-size 4`` runs in a session of its own (as a terminal's job),
and once both workers have passed the first-loss check (their engine is initialised: JAX's preemption
notifier, which catches SIGTERM, is installed by then) it gets one of:

* SIGINT to its process group (Ctrl-C in a terminal);
* SIGTERM to its process group (``timeout``, a CI runner, a job scheduler);
* SIGINT, then SIGTERM one second later, during the clean-up (a scheduler that gives up waiting);
* SIGKILL to run_all.py alone (the OOM killer).

Then, for each launcher (torchrun, TF_CONFIG processes, jax.distributed, mpiexec, MXNet's ps-lite
dist_sync): no process of the run (every one carries the test's marker variable) is left 10 s after
run_all.py exits; every record in the results directory is whole JSON and no ``*.partial`` file is left;
where run_all.py survives the signal long enough (a single signal), the target's record is failed with the
signal's reason and results.md is regenerated; after a SIGKILL, the next run writes the row's record (prepared
when it started) and removes what the run left in ``.staging/`` and in its temporary folder.  The default tier
runs JAX with the double signal and with SIGKILL (torchrun's Ctrl-C: tests/test_distributed.py); ``--full`` runs
the whole matrix.  Set ``DS2_FAULT_TABLE=FILE`` to get a line per case
(launcher, sequence, processes left, seconds to clean) appended to FILE."""
import glob
import json
import os
import signal
import subprocess
import sys
import time

import nbformat
import pytest

from common import processes, results
from runner import interrupt
from runner.dp import supervisor
from runner.run import staging
from tests.conftest import ROOT, dead_runners_claim

#: launcher -> (target, extra run_all.py options)
LAUNCHERS = {"torchrun": ("pytorch", []), "tf_config": ("tensorflow", []), "jax": ("jax", []),
             "mpiexec": ("cntk", []), "dist_sync": ("mxnet", ["--mxnet-dp", "dist_sync"])}
#: sequence -> [(seconds after the previous signal, signal, to the process group or run_all.py alone)]
SEQUENCES = {"SIGINT": [(0, signal.SIGINT, "group")],
             "SIGTERM": [(0, signal.SIGTERM, "group")],
             "SIGINT then SIGTERM": [(0, signal.SIGINT, "group"), (1.0, signal.SIGTERM, "group")],
             "SIGKILL": [(0, signal.SIGKILL, "runner")]}
DEFAULT_TIER = {("jax", "SIGINT then SIGTERM"), ("jax", "SIGKILL")}
STARTUP_S = 600      # environment check, the workers' imports, engine start and the first-loss check
LEFT_S = 10          # the bound: no process of the run 10 s after run_all.py exits
EXIT_S = 60          # run_all.py's own exit after the last signal (its clean-up waits 5 s at most per step)


def cases():
    for launcher in LAUNCHERS:
        for sequence in SEQUENCES:
            marks = () if (launcher, sequence) in DEFAULT_TIER else (pytest.mark.full,)
            yield pytest.param(launcher, sequence, marks=marks, id="%s-%s" % (launcher, sequence.replace(" ", "_")))


def _start(results_dir, target, extra, out, tmpdir):
    cmd = [sys.executable, os.path.join(ROOT, "run_all.py"), "--preset", "smoke", "--device", "cpu", "--frameworks",
           target, "--workers", "2", "--batch-size", "4", "--timeout", "900", "--no-progress",
           "--results-dir", results_dir] + extra
    return subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, TMPDIR=tmpdir))     # what a killed run leaves stays in the test's


def _wait_for_training(proc, results_dir, output):
    """Until both workers' logs show the first-loss check; skips when the row is skipped (no CNTK interpreter,
    no mpiexec)."""
    deadline = time.time() + STARTUP_S
    while time.time() < deadline:
        logs = sorted(glob.glob(os.path.join(results_dir, "logs", "*_w2*.rank[01].log")))
        if len(logs) == 2 and all("first-batch loss" in open(p, errors="replace").read() for p in logs):
            return
        if proc.poll() is not None:
            recs = results.read_records(os.path.join(results_dir, "records")) \
                if os.path.isdir(os.path.join(results_dir, "records")) else []
            if recs and recs[0]["status"] == "skipped":
                pytest.skip(recs[0]["error"])
            pytest.fail("run_all.py ended (%s) before both workers trained:\n%s" % (proc.returncode,
                                                                                   open(output).read()[-3000:]))
        time.sleep(0.2)
    proc.kill()
    pytest.fail("the workers did not reach the first-loss check within %d s" % STARTUP_S)


def _send(proc, sequence):
    for delay, sig, to in SEQUENCES[sequence]:
        time.sleep(delay)
        try:
            if to == "group":
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
        except ProcessLookupError:     # it had already exited (the clean-up was over before the second signal)
            pass


@pytest.mark.parametrize("launcher, sequence", list(cases()))
def test_no_process_outlives_a_stopped_run(tmp_path, tag, launcher, sequence):
    target, extra = LAUNCHERS[launcher]
    results_dir = str(tmp_path / "results")
    output = str(tmp_path / "run_all.out")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    with open(output, "w") as out:
        proc = _start(results_dir, target, extra, out, str(tmpdir))
    try:
        _wait_for_training(proc, results_dir, output)
        running = supervisor.marked_processes(tag, name="DS2_TEST_TAG")
        assert len(running) >= 3, running            # run_all.py and its 2 workers (and a launcher) carry the marker
        _send(proc, sequence)
        t0 = time.time()
        proc.wait(timeout=EXIT_S)
        exited = time.time()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # 1. no process of the run is left 10 s after run_all.py exits
    left = supervisor.marked_processes(tag, name="DS2_TEST_TAG")
    while left and time.time() - exited < LEFT_S:
        time.sleep(0.1)
        left = supervisor.marked_processes(tag, name="DS2_TEST_TAG")
    clean_s = time.time() - t0
    leftovers = [(pid, open("/proc/%d/cmdline" % pid, "rb").read().replace(b"\0", b" ")[:200]) for pid in left
                 if os.path.exists("/proc/%d" % pid)]
    table = os.environ.get("DS2_FAULT_TABLE")
    if table:
        with open(table, "a") as f:
            f.write("| %s | %s | %d | %.1f | %s |\n" % (launcher, sequence, len(left), clean_s, proc.returncode))
    text = open(output).read()
    assert not left, "%s, %s: %d processes outlived run_all.py by %d s: %s\n%s" % (
        launcher, sequence, len(left), LEFT_S, leftovers, text[-2000:])
    # the workers' temporary folder went with them (on a second signal, once they got SIGKILL), unless SIGKILL left
    # run_all.py no time to remove it
    launch_tmp = [n for n in os.listdir(str(tmpdir)) if n.startswith("ds2-dp-")]
    assert launch_tmp == [] or sequence == "SIGKILL", launch_tmp
    # 2. no half-written record, no partial file
    partial = [p for p in glob.glob(os.path.join(results_dir, "**", "*"), recursive=True) if ".partial" in p]
    assert not partial, partial
    records = glob.glob(os.path.join(results_dir, "records", "*.json"))
    for path in records:
        with open(path) as f:
            json.load(f)
    # 3. the exit status, and where run_all.py survived the signal: the record and results.md say why
    first = SEQUENCES[sequence][0][1]
    if sequence == "SIGKILL":
        assert proc.returncode == -signal.SIGKILL
        assert not results.read_records(os.path.join(results_dir, "records")), "a killed runner wrote a record"
        # the next run writes the row's prepared record and removes what the killed run left in .staging/ (rank
        # files, its owner) and in its temporary folder
        written = staging.recover(results_dir)
        recs = results.read_records(os.path.join(results_dir, "records"))
        assert len(written) == 1 and [(r["status"], r["distributed"]["world_size"]) for r in recs] == [("failed", 2)]
        assert recs[0]["error"].startswith("the runner (pid %d) ended while this row ran" % proc.pid), recs[0]
        stage = os.path.join(results_dir, ".staging")
        transient = [n for n in os.listdir(stage) if not n.endswith(".py")] if os.path.isdir(stage) else []
        assert not transient, transient
        for prefix in ("ds2-dp-", "ds2-kernel-", "ds2-install-"):
            interrupt.remove_stale_folders(prefix, str(tmpdir))
        assert os.listdir(str(tmpdir)) == [], os.listdir(str(tmpdir))
        return
    assert proc.returncode == 128 + first, (proc.returncode, text[-2000:])
    if len(SEQUENCES[sequence]) == 1:
        reason = "%s (%s)" % ({signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}[first],
                              signal.Signals(first).name)
        recs = results.read_records(os.path.join(results_dir, "records"))
        assert [(r["status"], r["error"]) for r in recs] == [("failed", reason)], recs
        with open(os.path.join(results_dir, "results.md")) as f:
            assert "failed: %s" % reason in f.read()
    else:
        assert "again during the clean-up; stopped at once" in text or "regenerated" in text, text[-2000:]


def test_a_dead_runners_rows_get_their_prepared_record_and_a_live_ones_are_left_alone(tmp_path):
    """runner/run/staging.py: a row claimed by a runner that no longer runs gets the failed record prepared when it
    started (with the part of its notebook that ran), and its transient files go; a live runner's stay."""
    results_dir = tmp_path / "results"
    stage = results_dir / ".staging"
    notebooks = results_dir / "notebooks"
    notebooks.mkdir(parents=True)
    for stem in ("dead_w2", "live_w2", "reused_w2", "elsewhere_w2"):
        staging.claim(str(stage), stem, lambda status, reason: results.failed_record(
            "jax", status, reason, framework="JAX", run={"finished": "x"}))
        for name in (".json", ".rank0.status.json", ".rank1.status.json", ".py", ".json.123.partial"):
            (stage / (stem + name)).write_text("x")
    dead = dead_runners_claim(str(stage / "dead_w2.owner"))
    (stage / "reused_w2.owner").write_text("%d 1\n" % os.getpid())    # a pid reused by another process (no host)
    other_host = "0" * 8 if processes.host_id() != "0" * 8 else "1" * 8
    (stage / "elsewhere_w2.owner").write_text("%d - %s\n" % (dead, other_host))    # not judged from here
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("1")]
    nbformat.write(nb, str(notebooks / "dead_w2.partial.ipynb"))
    written = staging.recover(str(results_dir))
    assert sorted(os.path.basename(p) for p in written) == ["dead_w2.json", "reused_w2.json"]
    rec = results.read_record(str(results_dir / "records" / "dead_w2.json"))
    assert rec["status"] == "failed" and rec["error"] == staging.killed_reason(os.getpid())   # the claimer's pid
    assert rec["run"]["finished"] is None and rec["run"]["found_by_the_next_run"]
    assert rec["run"]["executed_notebook"] == os.path.relpath(str(notebooks / "dead_w2.ipynb"), ROOT)
    assert sorted(os.listdir(str(notebooks))) == ["dead_w2.ipynb"]                         # the part that ran
    left = sorted(os.listdir(str(stage)))
    assert [n for n in left if not n.startswith(("live_w2", "elsewhere_w2"))] == ["dead_w2.py", "reused_w2.py"], left
    for stem in ("live_w2", "elsewhere_w2"):
        assert all(stem + n in left for n in (".owner", ".killed.json", ".json")), left
        staging.release(str(stage), stem)              # the run ends: only its script stays
    assert sorted(os.listdir(str(stage))) == ["dead_w2.py", "elsewhere_w2.py", "live_w2.py", "reused_w2.py"]


def test_a_worker_stops_itself_once_its_runner_is_gone(tmp_path):
    """runner/dp/worker.py's watch: a worker whose runner died kills itself within about a second, even one whose parent
    is alive (torchrun, mpiexec) and that ignores SIGTERM (as JAX's preemption notifier makes it)."""
    runner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    code = ("import signal, sys, time; sys.path.insert(0, %r)\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "from runner.dp import worker; from common.processes import runner_alive\n"
            "worker.watch_runner(runner_alive)\n"
            "print('watching', flush=True); time.sleep(60)\n" % ROOT)
    env = dict(os.environ, DS2_RUNNER_PID=str(runner.pid),
               DS2_RUNNER_START=processes.process_start_time(runner.pid) or "")
    worker = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True)
    try:
        assert worker.stdout.readline().strip() == "watching"
        time.sleep(1.0)
        assert worker.poll() is None                   # the runner lives: the worker goes on
        runner.kill()
        runner.wait()
        t0 = time.time()
        worker.wait(timeout=20)
        assert time.time() - t0 < 10                   # within a few of its checks, not at the end of its 60-s sleep
        assert worker.returncode == -signal.SIGKILL
        assert "the runner (pid %d) is gone" % runner.pid in worker.stderr.read()
    finally:
        for p in (runner, worker):
            if p.poll() is None:
                p.kill()
                p.wait()
