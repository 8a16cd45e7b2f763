"""Data-parallel foundation: sharding of the shared iterator, the launcher's world
variables, the loss rule that keeps W workers equal to one, the equivalence check, and the launcher
itself -- run on a standard-library fixture notebook (tests/fixtures/dp_fixture.ipynb) in this
interpreter, and through torchrun with gloo when the PyTorch environment exists.  No DS2 notebook runs."""
import json
import os
import signal
import subprocess
import sys
import time

import nbformat
import numpy as np
import pytest

from common import parallel, results
from common.data import Batch, DeepMarkIterator, shard_bounds, shard_sizes
from common.spec import get_preset
from runner.dp import launch
from runner.run import execute
from runner.dp import launchers
from runner.dp import supervisor
from runner.envs.bootstrap import ENVS_DIR, env_python
from runner.run.targets import ALL_TARGETS, Target
from tests.conftest import ROOT, run_all, selected_targets

FIXTURE = "../tests/fixtures/dp_fixture.ipynb"      # relative to notebooks/, as Target expects


# ---- sharding ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, world", [(8, 2), (7, 2), (5, 3), (3, 4), (1, 2), (0, 3), (32, 8), (13, 5)])
def test_shards_are_contiguous_cover_the_batch_and_differ_by_at_most_one(n, world):
    bounds = [shard_bounds(n, r, world) for r in range(world)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))          # contiguous, in rank order
    sizes = shard_sizes(n, world)
    assert sizes == [len(part) for part in np.array_split(np.arange(n), world)]   # numpy's rule
    assert sum(sizes) == n and max(sizes) - min(sizes) <= 1


def test_batch_shard_slices_features_and_labels_and_keeps_the_rest():
    it = DeepMarkIterator(batch_size=7, scale=1, seed=3)
    for batch in it:
        for world in (1, 2, 3, 8):
            shards = [batch.shard(r, world) for r in range(world)]
            assert np.array_equal(np.concatenate([s.features for s in shards]), batch.features)
            assert np.array_equal(np.concatenate([s.labels for s in shards]), batch.labels)
            for s in shards:
                assert (s.frames, s.seconds, s.index) == (batch.frames, batch.seconds, batch.index)
                assert s.global_size == batch.batch_size and s.global_batch_size == batch.batch_size
                assert s.features.base is not None and not s.features.flags.writeable   # views of the pool
                assert s.features.shape[1:] == batch.features.shape[1:]
                assert s.labels.shape[1:] == batch.labels.shape[1:]
    assert batch.global_batch_size is None and batch.global_size == batch.batch_size   # a whole batch


def test_empty_shard_when_there_are_more_workers_than_utterances():
    batch = DeepMarkIterator(batch_size=8, scale=1, seed=0).batch(0)        # 3 utterances of 1 s
    shards = [batch.shard(r, 5) for r in range(5)]
    assert [s.batch_size for s in shards] == [1, 1, 1, 0, 0]
    empty = shards[4]
    assert empty.empty and empty.features.shape == (0, 100, 161) and empty.labels.shape == (0, 7)
    assert empty.audio_seconds == 0 and empty.global_size == 3


@pytest.mark.parametrize("n, rank, world", [(4, 2, 2), (4, -1, 2), (4, 0, 0), (-1, 0, 2), (4, 0, True)])
def test_bad_shard_arguments_raise(n, rank, world):
    with pytest.raises(ValueError):
        shard_bounds(n, rank, world)


def test_every_workers_checksum_is_the_global_one():
    """Workers iterate the global iterator and shard inside the step: the checksum is the global pass's."""
    single = DeepMarkIterator(batch_size=8, scale=1, seed=0)
    for _ in single:
        pass
    for rank in range(2):
        worker = DeepMarkIterator(batch_size=8, scale=1, seed=0)
        seen = [b.shard(rank, 2) for b in worker]
        assert worker.checksum == single.checksum == single.expected_checksum()
        assert sum(s.batch_size for s in seen) == sum(shard_sizes(b.batch_size, 2)[rank] for b in single)


def test_shard_stats():
    stats = DeepMarkIterator(batch_size=8, scale=1, seed=0).shard_stats(2)
    assert stats == {"world_size": 2, "batches": 21, "uneven_batches": 8, "batches_with_empty_shards": 2,
                     "max_shard": 4}


# ---- the loss rule: sum / global batch, gradients summed, is exactly one worker -------------------------
def test_loss_over_the_global_batch_and_summed_gradients_equal_one_worker_for_uneven_shards():
    """A model whose per-utterance loss is l_i = (x_i . w - y_i)^2: W workers with shares of 3, 2 and 0
    utterances reproduce the single worker's loss and gradient of the mean loss; the mean of per-worker
    means does not."""
    rng = np.random.default_rng(0)
    x, y, w = rng.normal(size=(5, 4)), rng.normal(size=5), rng.normal(size=4)
    n = len(y)

    def loss_and_grad(xs, ys, scale):
        r = xs @ w - ys
        return float((r ** 2).sum() * scale), 2 * (r[:, None] * xs).sum(axis=0) * scale

    full_loss, full_grad = loss_and_grad(x, y, 1.0 / n)
    for world, engine in ((2, "sum"), (3, "sum"), (7, "sum"), (3, "mean")):
        parts = [loss_and_grad(x[a:b], y[a:b], parallel.local_loss_scale(n, world, engine))
                 for a, b in (shard_bounds(n, r, world) for r in range(world))]
        combine = (lambda v: sum(v)) if engine == "sum" else (lambda v: sum(v) / world)    # DDP averages
        assert combine([p[0] for p in parts]) == pytest.approx(full_loss, rel=1e-12)
        np.testing.assert_allclose(combine([p[1] for p in parts]), full_grad, rtol=1e-12)
    means = [loss_and_grad(x[a:b], y[a:b], 1.0 / (b - a))[0] for a, b in (shard_bounds(n, r, 2) for r in range(2))]
    assert abs(np.mean(means) - full_loss) > 1e-3 * abs(full_loss)


def test_local_loss_scale():
    assert parallel.local_loss_scale(8, 2) == 1 / 8
    assert parallel.local_loss_scale(8, 2, "mean") == 2 / 8
    with pytest.raises(ValueError):
        parallel.local_loss_scale(8, 2, "max")


# ---- who am I: the launchers' variables ---------------------------------------------------------------
@pytest.mark.parametrize("env, expected", [
    ({}, (0, 1, 0, "single")),
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}, (1, 4, 1, "RANK")),
    ({"DS2_PROCESS_ID": "2", "DS2_NUM_PROCESSES": "3"}, (2, 3, 2, "DS2_PROCESS_ID")),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1"},
     (1, 2, 1, "OMPI_COMM_WORLD_RANK")),
    ({"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:2", "c:3"]}, "task": {"type": "worker", "index": 2}})},
     (2, 3, 2, "TF_CONFIG")),
])
def test_world_from_env(env, expected):
    assert tuple(parallel.world_from_env(env)) == expected


@pytest.mark.parametrize("env", [{"RANK": "2", "WORLD_SIZE": "2"}, {"RANK": "0"}, {"RANK": "x", "WORLD_SIZE": "2"},
                                 {"TF_CONFIG": "{}"}])
def test_world_from_env_rejects_nonsense(env):
    with pytest.raises(ValueError):
        parallel.world_from_env(env)


# ---- the equivalence check --------------------------------------------------------------------------------
def _rec(losses, world=1, batch=16, checksum="c", params=None):
    rec = results.new_record("pytorch", "PyTorch", "torch.nn", preset="smoke", batch_size=batch, scale=1, seed=0,
                             precision="fp32", data={"checksum": checksum},
                             losses={"warmup": list(losses[:4]), "train": list(losses[4:])},
                             distributed={"world_size": world} if world > 1 else {})
    if params:
        rec["checks"]["param_summary"] = params
    return rec


def test_equivalence_passes_within_1e5_and_fails_beyond():
    base = list(np.linspace(3.0, 2.0, 12))
    ps = parallel.param_summary({"a": np.arange(6.0), "b": -np.ones(3)})
    single = _rec(base, params=ps)
    near = _rec([v * (1 + 3e-6) for v in base], world=2, params=dict(ps, sum_sq=ps["sum_sq"] * (1 + 2e-6)))
    eq = parallel.equivalence(near, single)
    assert eq["ok"] and eq["steps_compared"] == 10 and eq["loss_rel_diff"] == pytest.approx(3e-6, rel=1e-3)
    assert eq["param_rel_diff"] == pytest.approx(2e-6, rel=1e-3) and eq["checksum_equal"]
    drifted = _rec(base, world=2, params=dict(ps, sum_sq=ps["sum_sq"] * (1 + 3e-4)))
    eq = parallel.equivalence(drifted, single)     # the epoch's parameters have their own, wider tolerance
    assert not eq["ok"] and eq["rel_diff"] == 0.0 and "parameter summaries differ by 3.00e-04 > 1e-04" in eq["error"]
    far = _rec(base[:9] + [base[9] * 1.001] + base[10:], world=2)
    eq = parallel.equivalence(far, single)
    assert not eq["ok"] and "1.00e-03 > 1e-05" in eq["error"] and eq["param_rel_diff"] is None
    assert not parallel.equivalence(_rec(base, world=2, checksum="other"), single)["ok"]
    other = parallel.equivalence(_rec(base, world=2, batch=8), single)
    assert not other["ok"] and "batch_size differs" in other["error"]


def test_first_losses_are_warmup_first():
    assert list(parallel.first_losses(_rec(list(range(12))), 6)) == [0, 1, 2, 3, 4, 5]


# ---- the notebook side: the parameters cell decides; the script is the notebook -------------------------
def test_targets_without_a_workers_parameter_are_detected_from_the_notebook():
    fixture = Target("fixture", "Fixture", FIXTURE, "pytorch")
    assert "workers" in launch.notebook_parameter_names(fixture.notebook_path)
    assert launch.no_dp_reason(fixture, launchers.LAUNCHERS["python"]) is None
    for target in ALL_TARGETS.values():
        assert launchers.launcher_for(target) is not None, target.name
        has = "workers" in launch.notebook_parameter_names(target.notebook_path)
        reason = launch.no_dp_reason(target)
        assert (reason is None) == (has and launchers.one_process_reason(target) is None), target.name
        if not has:
            assert "has no data-parallel code yet" in reason
        elif reason is not None:        # a row whose notebook trains in one process only (test_notebook_refusals.py)
            assert reason == launchers.one_process_reason(target), target.name


def test_export_script_injects_papermill_parameters(tmp_path):
    fixture = Target("fixture", "Fixture", FIXTURE, "pytorch")
    script = str(tmp_path / "x.py")
    launch.export_script(fixture.notebook_path, {"workers": 3, "mode": "ok"}, script, "header line")
    text = open(script).read()
    assert text.startswith("# header line\n")
    assert "workers = 1" in text and "workers = 3" in text        # the defaults, then papermill's cell
    assert text.index("workers = 1") < text.index("workers = 3")
    compile(text, script, "exec")


def test_launcher_table_names_every_target_and_what_ran():
    table = launchers.launcher_table_markdown()
    assert table in open(os.path.join(ROOT, "docs", "data-parallel.md")).read(), \
        "docs/data-parallel.md's launcher table is out of date (runner.dp.launch.launcher_table_markdown())"
    for name in ("torchrun", "tf_config", "jax", "mpiexec", "single", "python"):
        assert "| %s |" % name in table
    assert "not run here" not in table and table.count("Several hosts (`--hosts`): ") == 7


# ---- the launcher, on the standard-library fixture notebook ---------------------------------------------
def _fixture_run(tmp_path, workers=2, timeout=120, python=sys.executable, launcher="python", **parameters):
    target = Target("fixture", "Fixture (stdlib)", FIXTURE, "pytorch", parameters=parameters)
    opts = execute.RunOptions(get_preset("smoke").with_overrides(batch_size=4), "fp32", 0, "cpu", str(tmp_path),
                              timeout=timeout)
    return launch.run_target(target, opts, workers, python=python, launcher=launchers.LAUNCHERS[launcher],
                                  grace=2), target, opts


def _single_worker_record(tmp_path, target, opts):
    """The fixture with one worker and the global batch, run as its exported script."""
    gopts = launch._global_opts(opts, 2)
    path = os.path.join(str(tmp_path), "records", execute.record_stem(target, gopts) + ".json")
    script = str(tmp_path / "single.py")
    launch.export_script(target.notebook_path, dict(execute.notebook_parameters(target, gopts, path),
                                                         workers=1), script)
    subprocess.run([sys.executable, script], cwd=os.path.dirname(target.notebook_path), check=True,
                   stdout=subprocess.DEVNULL)
    return results.read_record(path)


def test_two_workers_rank0_writes_the_record_the_runner_completes_it(tmp_path, tag):
    rec, target, opts = _fixture_run(tmp_path)
    assert rec["status"] == "ok", rec["error"]
    d = rec["distributed"]
    assert (d["world_size"], d["launcher"], d["per_worker_batch"], d["global_batch"], d["backend"]) == \
        (2, "python", 4, 8, "files")
    assert d["shard_stats"]["batches_with_empty_shards"] == 1      # smoke at global batch 8 has a 1-utterance batch
    assert rec["batch_size"] == 8 and rec["checks"]["checksum"]["ok"]
    assert rec["checks"]["equivalence"]["ok"] is None and "--batch-size 8" in rec["checks"]["equivalence"]["note"]
    stem = "fixture_smoke_fp32_bs8_cpu_w2"
    assert os.path.exists(tmp_path / "records" / (stem + ".json"))
    run = rec["run"]
    assert run["script"].endswith(".staging/%s.py" % stem) and run["executed_notebook"] == run["script"]
    for r, log in enumerate(run["logs"]):
        text = open(os.path.join(ROOT, log)).read()
        assert "rank %d of 2 (RANK)" % r in text and "step 6/6" in text
    assert run["ranks"] == {r: {"status": "ok", "exit_code": 0, "error": None, "pid": run["ranks"][r]["pid"],
                                "host": os.uname()[1]} for r in ("0", "1")}
    assert not os.path.exists(tmp_path / ".staging" / (stem + ".json"))

    # the single-worker run with the global batch: then the W-worker run is checked against it
    single = _single_worker_record(tmp_path, target, opts)
    assert single["distributed"]["world_size"] == 1
    rec, _, _ = _fixture_run(tmp_path)
    eq = rec["checks"]["equivalence"]
    assert rec["status"] == "ok" and eq["ok"] is True and eq["steps_compared"] == 10, eq
    assert eq["loss_rel_diff"] < 1e-12 and eq["param_rel_diff"] < 1e-12 and eq["checksum_equal"]

    # results.md: the table of record says "2 workers", the data-parallel section compares with one worker
    from runner.report import render
    text = render.render(str(tmp_path), "cmd", None, str(tmp_path / "results.md"))
    assert "## Data-parallel: W workers against one" in text and "standard library / 2 workers" in text
    row = [l for l in text.splitlines() if l.startswith("| fixture fp32 | ok | 2 | 1 | python | files | 4 / 8 |")]
    assert len(row) == 1 and row[0].endswith("| pass |"), text


def test_a_failing_worker_is_a_failed_row_naming_its_rank(tmp_path, tag):
    t0 = time.time()
    rec, _, _ = _fixture_run(tmp_path, mode="fail", fail_rank=1)
    assert rec["status"] == "failed"
    assert rec["error"] == "rank 1 failed: ValueError: boom from rank 1 at step 2"
    assert rec["run"]["ranks"]["1"]["status"] == "failed" and rec["run"]["ranks"]["0"]["status"] == "running"
    assert rec["distributed"]["world_size"] == 2 and rec["batch_size"] == 8
    assert time.time() - t0 < 60          # rank 0, blocked in the "all-reduce", was killed, not waited for
    assert "ValueError: boom" in open(os.path.join(ROOT, rec["run"]["logs"][1])).read()


def test_a_worker_that_exits_without_a_python_error_is_named(tmp_path, tag):
    rec, _, _ = _fixture_run(tmp_path, mode="exit", fail_rank=0)
    assert rec["status"] == "failed" and rec["error"].startswith("rank 0 died (exit status 3): "), rec["error"]


def test_a_hanging_worker_is_killed_at_the_timeout(tmp_path, tag):
    t0 = time.time()
    rec, _, _ = _fixture_run(tmp_path, timeout=4, mode="hang", fail_rank=1)
    assert rec["status"] == "failed"
    assert rec["error"].startswith("timed out after 4 s (ranks still running: 0, 1)"), rec["error"]
    assert time.time() - t0 < 40


DRIVER = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)   # as in a terminal, even when the tests run in a
sys.path.insert(0, %(root)r)                                # shell's background job, which ignores SIGINT
from common.spec import get_preset
from runner.dp import launch, launchers
from runner.run import execute
from runner.run.targets import Target
target = Target("fixture", "Fixture", %(fixture)r, "pytorch", parameters=dict(mode="hang", collective=%(collective)r))
opts = execute.RunOptions(get_preset("smoke").with_overrides(batch_size=4), "fp32", 0, "cpu", %(results)r, timeout=300)
launch.run_target(target, opts, 2, python=%(python)r, launcher=launchers.LAUNCHERS[%(launcher)r], grace=2)
"""


def _ctrl_c(tmp_path, tag, python, launcher, collective):
    """Start a runner in its own process group, wait until both workers run, press Ctrl-C (SIGINT to the group)."""
    code = DRIVER % dict(root=ROOT, fixture=FIXTURE, results=str(tmp_path), python=python, launcher=launcher,
                         collective=collective)
    driver = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, start_new_session=True)
    logs = [str(tmp_path / "logs" / ("fixture_smoke_fp32_bs8_cpu_w2.rank%d.log" % r)) for r in range(2)]
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if all(os.path.exists(p) and "global batch 8" in open(p).read() for p in logs):
                break
            assert driver.poll() is None, driver.stdout.read()
            time.sleep(0.2)
        else:
            pytest.fail("the workers did not start")
        time.sleep(0.5)
        running = supervisor.marked_processes(tag, name="DS2_TEST_TAG")
        assert len(running) >= 3, running         # the runner and its workers (and torchrun): the scan sees them
        os.killpg(driver.pid, signal.SIGINT)      # Ctrl-C in a terminal: SIGINT to the foreground group
        out, _ = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert "KeyboardInterrupt" in out and "failed: interrupted by the user" in out, out
    rec = results.read_record(str(tmp_path / "records" / "fixture_smoke_fp32_bs8_cpu_w2.json"))
    assert rec["status"] == "failed" and rec["error"] == "interrupted by the user"


def test_ctrl_c_leaves_no_worker(tmp_path, tag):
    _ctrl_c(tmp_path, tag, sys.executable, "python", "files")


# ---- launch() with a plain script: mpiexec, Python 3.6 (CNTK's interpreter), a runner killed outright ----
SCRIPT = """
import os, sys, tempfile, time
sys.path.insert(0, %(root)r)
from common.parallel import world_from_env
from common.data import DeepMarkIterator
w = world_from_env()
shard = DeepMarkIterator(8, 1, 0).batch(4).shard(w.rank, w.world_size)
print("rank %%d of %%d via %%s: %%d utterances, Python %%s" %% (w.rank, w.world_size, w.source, shard.batch_size,
                                                         sys.version.split()[0]))
print("temporary folder", tempfile.mkdtemp(prefix="left-by-rank%%d-" %% w.rank), flush=True)  # one it leaves behind
if os.environ.get("FAIL_RANK") == str(w.rank):
    deadline = time.time() + 30                  # fail once every rank made its folder: its launch then stops the
    while time.time() < deadline and len([n for n in os.listdir(tempfile.gettempdir())   # others, deterministically
                                          if n.startswith("left-by-rank")]) < w.world_size:   # after they wrote it
        time.sleep(0.05)
    raise RuntimeError("boom from rank %%d" %% w.rank)
if os.environ.get("SLEEP") and os.environ.get("SLEEP_RANK", str(w.rank)) == str(w.rank):
    time.sleep(float(os.environ["SLEEP"]))
if os.environ.get("LINGER"):
    import threading
    threading.Thread(target=time.sleep, args=(600,)).start()     # a non-daemon thread: the process cannot exit
def rank0_ok():                                                     # (rank 0 may not have written its file yet)
    try:
        return '"ok"' in open("status.rank0.status.json").read()
    except OSError:
        return False
def abort_at_exit():                                                # dies in teardown, after dp_worker wrote "ok"
    while os.environ.get("AFTER_RANK0") and not rank0_ok():
        time.sleep(0.05)                                              # (deterministic: rank 0 finished first)
    sys.stderr.write("terminate called without an active exception\\n")
    os.abort()
if os.environ.get("ABORT_AT_EXIT") == str(w.rank):
    import atexit
    atexit.register(abort_at_exit)
"""


@pytest.fixture
def env_of(smoke):
    """``env_of(target)``: the interpreter of ``target``'s CPU environment, looked up after the session's smoke
    run built the selected targets' environments (a fresh machine has none when the tests are collected). The
    test is skipped, with the reason, when the target is not selected or its row says why it could not run."""
    def python_of(target):
        if target not in selected_targets():
            pytest.skip("the %s target is not selected (DS2_TEST_FRAMEWORKS)" % target)
        rec = smoke.record(target)
        if rec["status"] == "skipped":
            pytest.skip("%s: %s" % (target, rec["error"]))
        prefix = ALL_TARGETS[target].env + "-cpu"
        found = [env_python(os.path.join(ENVS_DIR, d)) for d in sorted(os.listdir(ENVS_DIR)) if d.startswith(prefix)]
        found = [p for p in found if os.path.exists(p)]
        assert found, "the smoke run of %s was %s, but no %s* environment is in %s" % (
            target, rec["status"], prefix, ENVS_DIR)
        return found[0]
    return python_of


def _launch(tmp_path, launcher, python=sys.executable, timeout=60, linger=supervisor.LINGER_S, **env):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT % {"root": ROOT})
    res = supervisor.launch(launchers.LAUNCHERS[launcher], python, str(script), 2, str(tmp_path / "log"),
                             str(tmp_path / "status"), cwd=str(tmp_path), timeout=timeout,
                             env=dict(os.environ, **env), grace=2, linger=linger)
    logs = [(tmp_path / ("log.rank%d.log" % r)).read_text() for r in range(2)]
    return res, logs


@pytest.mark.parametrize("launcher", ["python", "torchrun", "mpiexec"])
def test_a_launch_leaves_nothing_in_the_temporary_folder(tmp_path, tag, env_of, launcher):
    """Every process of a launch on this host gets a temporary folder of the launch's own, removed when the launch
    ends, with what the ranks left there and what their launcher did (torchrun: a `torchelastic_*` folder of logs
    per run, left behind before; OpenMPI: its session folder), whether the run succeeded or failed."""
    if launcher == "mpiexec" and not supervisor._which("mpiexec"):
        pytest.skip("no mpiexec (apt-get install openmpi-bin)")
    python = env_of("pytorch") if launcher == "torchrun" else sys.executable
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    for fail in ("", "1"):
        res, logs = _launch(tmp_path, launcher, python=python, TMPDIR=str(tmp), FAIL_RANK=fail)
        assert res.ok == (not fail), res.reason
        for r, log in enumerate(logs):           # each rank's folder was in the launch's, under the caller's TMPDIR
            left = log.split("temporary folder ")[1].split()[0]
            assert os.path.basename(left).startswith("left-by-rank%d-" % r), log
            assert os.path.dirname(os.path.dirname(left)) == str(tmp), left
            assert os.path.basename(os.path.dirname(left)).startswith("ds2-dp-"), left
        assert os.listdir(str(tmp)) == [], "a launch left %s in its temporary folder" % os.listdir(str(tmp))


@pytest.mark.skipif(not supervisor._which("mpiexec"), reason="no mpiexec (apt-get install openmpi-bin)")
def test_mpiexec_launcher(tmp_path, tag):
    res, logs = _launch(tmp_path, "mpiexec")
    assert res.ok and res.returncodes == [0], res.reason
    assert "mpiexec --allow-run-as-root --oversubscribe -n 2" in res.commands[0]
    for r, log in enumerate(logs):
        assert "rank %d of 2 via OMPI_COMM_WORLD_RANK: %d utterances" % (r, [2, 1][r]) in log
    res, _ = _launch(tmp_path, "mpiexec", FAIL_RANK="1")
    assert not res.ok and res.reason == "rank 1 failed: RuntimeError: boom from rank 1"


def test_processes_that_linger_after_every_rank_finished_are_stopped(tmp_path, tag):
    t0 = time.time()
    res, _ = _launch(tmp_path, "python", linger=2, LINGER="1")
    assert res.ok, res.reason
    assert time.time() - t0 < 30 and all(c is not None and c < 0 for c in res.returncodes)   # stopped by a signal


@pytest.mark.parametrize("launcher", ["python", "torchrun", "mpiexec"])
def test_a_rank_that_dies_at_exit_after_reporting_ok_is_named_and_the_run_counts(tmp_path, tag, env_of, launcher):
    """gloo was seen (CI, and 6 in 240 runs here) to abort a rank's interpreter shutdown after the rank's work
    was done: the run counts, and the record can say which rank died and how (per-rank launchers: the runner
    sees it; torchrun and mpiexec: their logs name it)."""
    if launcher == "mpiexec" and not supervisor._which("mpiexec"):
        pytest.skip("no mpiexec (apt-get install openmpi-bin)")
    python = env_of("pytorch") if launcher == "torchrun" else sys.executable
    res, _ = _launch(tmp_path, launcher, python=python, ABORT_AT_EXIT="1", AFTER_RANK0="1")
    assert res.ok, res.reason
    assert res.teardown == "rank 1 died at exit (killed by SIGABRT): terminate called without an active exception"
    # the rank that died first had finished; the other had not: the reason blames the one that died
    res, _ = _launch(tmp_path, launcher, python=python, ABORT_AT_EXIT="1", SLEEP="30", SLEEP_RANK="0")
    assert not res.ok and res.teardown is None
    assert res.reason == ("rank 1 died at exit (killed by SIGABRT) after reporting ok, and rank 0 was stopped before "
                          "it finished: terminate called without an active exception"), res.reason


def test_worker_and_sharding_run_on_python36(tmp_path, tag, env_of):
    res, logs = _launch(tmp_path, "python", python=env_of("cntk"))
    assert res.ok, res.reason
    assert "rank 1 of 2 via RANK: 1 utterances, Python 3.6" in logs[1]


def test_a_runner_killed_outright_takes_its_workers_along(tmp_path, tag):
    """SIGKILL leaves the runner no time to clean up: the workers' parent-death signal (SIGTERM) ends them."""
    code = ("import os, sys; sys.path.insert(0, %r)\n"
            "from runner.dp import launchers, supervisor\n"
            "open(%r, 'w').write('x')\n"
            "supervisor.launch(launchers.LAUNCHERS['python'], sys.executable, %r, 2, %r, %r, cwd=%r)\n"
            % (ROOT, str(tmp_path / "started"), str(tmp_path / "script.py"), str(tmp_path / "log"),
               str(tmp_path / "status"), str(tmp_path)))
    (tmp_path / "script.py").write_text(SCRIPT % {"root": ROOT})
    runner = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, SLEEP="300", TMPDIR=str(tmp_path)))
    deadline = time.time() + 60
    while len(supervisor.marked_processes(tag, name="DS2_TEST_TAG")) < 3 and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(1)
    assert len(supervisor.marked_processes(tag, name="DS2_TEST_TAG")) == 3    # the runner and 2 workers
    runner.kill()
    runner.wait()
    deadline = time.time() + 20
    while supervisor.marked_processes(tag, name="DS2_TEST_TAG") and time.time() < deadline:
        time.sleep(0.2)
    assert not supervisor.marked_processes(tag, name="DS2_TEST_TAG"), "workers outlived a runner killed outright"


# ---- torchrun + gloo, end to end (the PyTorch environment) ---------------------------------------------
def test_torchrun_gloo_all_reduce_end_to_end(tmp_path, tag, env_of):
    rec, target, opts = _fixture_run(tmp_path, python=env_of("pytorch"), launcher="torchrun", collective="gloo")
    assert rec["status"] == "ok", rec["error"]
    assert rec["distributed"]["backend"] == "gloo" and rec["distributed"]["launcher"] == "torchrun"
    assert "torchrun --standalone --nnodes 1 --nproc_per_node 2" in rec["run"]["launch_commands"][0]
    single = _single_worker_record(tmp_path, target, opts)      # W=1 sums with files: the same numbers
    eq = parallel.equivalence(rec, single)
    assert eq["ok"] and eq["loss_rel_diff"] < 1e-12, eq


def test_ddp_with_uneven_and_empty_shards_equals_one_process(tmp_path, tag, env_of):
    """The loss rule with a real engine: DDP (gloo), float64, conv -> all-reduced BatchNorm -> linear,
    global batches of 5, 3, 1, 4 (rank 1's shares 2, 1, 0, 2): losses, parameters and BatchNorm running
    statistics equal one process on whole batches to rounding."""
    out = tmp_path / "ddp.json"
    res = supervisor.launch(launchers.LAUNCHERS["torchrun"], env_of("pytorch"),
                             os.path.join(ROOT, "tests", "fixtures", "ddp_uneven.py"), 2, str(tmp_path / "log"),
                             str(tmp_path / "status"), cwd=str(tmp_path), timeout=300,
                             env=dict(os.environ, DDP_UNEVEN_OUT=str(out)), grace=2)
    assert res.ok, res.reason
    r = json.loads(out.read_text())
    assert r["shard_sizes"] == [3, 2, 1, 2]
    assert "rank 1 of 2" in (tmp_path / "log.rank1.log").read_text()
    np.testing.assert_allclose(r["losses"], r["single"]["losses"], rtol=1e-12)
    for name, value in r["params"].items():
        np.testing.assert_allclose(value, r["single"]["params"][name], rtol=1e-12, atol=1e-14, err_msg=name)


def test_torchrun_failing_rank_is_named_and_nothing_survives(tmp_path, tag, env_of):
    rec, _, _ = _fixture_run(tmp_path, python=env_of("pytorch"), launcher="torchrun", collective="gloo",
                             mode="fail", fail_rank=1)
    assert rec["status"] == "failed" and rec["error"] == "rank 1 failed: ValueError: boom from rank 1 at step 2"


def test_torchrun_ctrl_c_leaves_no_worker(tmp_path, tag, env_of):
    _ctrl_c(tmp_path, tag, env_of("pytorch"), "torchrun", "gloo")


def test_single_process_launcher_for_in_process_devices(tmp_path, tag):
    """MXNet's route: one process, W devices; one log, one status, the record says W workers."""
    rec, target, opts = _fixture_run(tmp_path, launcher="single")
    assert rec["status"] == "ok", rec["error"]
    assert rec["distributed"]["world_size"] == 2 and rec["distributed"]["launcher"] == "single"
    assert len(rec["run"]["logs"]) == 1 and list(rec["run"]["ranks"]) == ["0"]
    eq = parallel.equivalence(rec, _single_worker_record(tmp_path, target, opts))
    assert eq["ok"], eq


# ---- the JAX and TF_CONFIG launchers, end to end (their environments) ----------------------------------
@pytest.mark.parametrize("launcher, framework, collective, backend", [
    ("jax", "jax", "jax", "jax.distributed (2 processes)"),
    ("tf_config", "tensorflow", "tf", "MultiWorkerMirroredStrategy (2 replicas)"),
    ("mpiexec", "cntk", "cntk", "cntk mpicommunicator (2 workers)"),
])
def test_jax_tf_config_and_mpiexec_launchers_end_to_end(tmp_path, tag, env_of, launcher, framework, collective,
                                                        backend):
    python = env_of(framework)
    if launcher == "mpiexec" and not supervisor._which("mpiexec"):
        pytest.skip("no mpiexec (apt-get install openmpi-bin)")
    rec, target, opts = _fixture_run(tmp_path, python=python, launcher=launcher, collective=collective)
    assert rec["status"] == "ok", rec["error"]
    assert rec["distributed"]["backend"] == backend and rec["distributed"]["launcher"] == launcher
    eq = parallel.equivalence(rec, _single_worker_record(tmp_path, target, opts))
    assert eq["ok"] and eq["loss_rel_diff"] < 1e-12, eq


# ---- run_all.py --workers --------------------------------------------------------------------------------
def test_a_notebook_without_data_parallel_code_gets_a_skipped_row(tmp_path):
    """Every notebook of the project has a ``workers`` parameter now; a new one without it (here the fixture with
    that parameter taken out) gets a skipped record that says so, under its W-worker name, and nothing runs."""
    nb = nbformat.read(os.path.join(ROOT, "notebooks", FIXTURE), as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    cell.source = "\n".join(line for line in cell.source.splitlines() if not line.startswith("workers"))
    path = tmp_path / "no_dp.ipynb"
    nbformat.write(nb, str(path))
    target = Target("nodp", "NoDP (fixture)", str(path), "pytorch")
    assert "workers" in launch.notebook_parameter_names(os.path.join(ROOT, "notebooks", FIXTURE))
    assert launch.no_dp_reason(target, launchers.LAUNCHERS["python"]) == \
        "the NoDP notebook has no data-parallel code yet (no 'workers' parameter)"
    opts = execute.RunOptions(get_preset("smoke").with_overrides(batch_size=4), "fp32", 0, "cpu", str(tmp_path))
    rec = launch.run_target(target, opts, 2, python=sys.executable, launcher=launchers.LAUNCHERS["python"])
    assert rec["status"] == "skipped" and "no data-parallel code yet" in rec["error"]
    assert rec["distributed"]["world_size"] == 2 and rec["batch_size"] == 8
    assert sorted(os.listdir(tmp_path / "records")) == ["nodp_smoke_fp32_bs8_cpu_w2.json"]   # no log: nothing ran


def test_run_all_workers_must_be_positive():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "run_all.py"), "--workers", "0"], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 2 and proc.stderr.strip() == \
        "run_all.py: error: argument --workers: must be a positive integer, got '0'"
