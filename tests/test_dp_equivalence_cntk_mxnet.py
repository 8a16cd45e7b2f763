"""The CNTK and MXNet notebooks' data-parallel code, run by ``run_all.py --workers 2`` on the
smoke preset, trains exactly like one worker with the global batch: the first 10 losses within 1e-5
relative and the same data checksum (``checks.equivalence``, computed by the runner when the
single-worker record with the global batch is in the same results directory).

The reference is the session smoke run of each target (``--batch-size 8``, one worker), copied; then ``--workers 2 --batch-size 4``
(2 x 4), into one temporary results directory.  A target whose environment is missing (no CNTK
interpreter) is skipped, as in tests/test_notebooks.py; ``DS2_TEST_FRAMEWORKS`` selects targets."""

import pytest

from common import parallel
from runner.dp import launch
from runner.dp import supervisor
from runner.run.targets import ALL_TARGETS
from tests.conftest import (assert_trains_like, recheck_first_losses, run_all, RunAll, selected_targets,
                            two_worker_record)

DP_TARGETS = [t for t in ("cntk", "mxnet") if t in selected_targets()]
#: what each target's record must name: its launcher and a word of its backend
EXPECTED = {"cntk": ("mpiexec", "MPI"), "mxnet": ("single", "kvstore")}


@pytest.mark.full
@pytest.mark.parametrize("target", DP_TARGETS)
def test_two_workers_equal_one_worker_with_the_global_batch(tmp_path, target, smoke):
    if target == "cntk" and not supervisor._which("mpiexec"):
        pytest.skip("no mpiexec (apt-get install openmpi-bin)")
    assert "workers" in launch.notebook_parameter_names(ALL_TARGETS[target].notebook_path)
    one = RunAll.reuse(smoke, target, tmp_path)             # the session's 1 x 8 run is the reference
    single = one.record(target)
    if single["status"] == "skipped":
        pytest.skip("%s: %s" % (target, single["error"]))
    assert single["status"] == "ok", single["error"]
    assert "distributed" not in single                      # the single-worker record is the plain one

    two = run_all(["--preset", "smoke", "--frameworks", target, "--workers", "2", "--batch-size", "4",
                   "--timeout", "900"], tmp_path)
    rec = two_worker_record(two, target)
    d = rec["distributed"]
    launcher, backend = EXPECTED[target]
    assert d["launcher"] == launcher and backend in d["backend"], d
    assert d["notebook_world_size"] == 2 and d["per_worker_batch"] == 4 and d["global_batch"] == 8
    assert rec["batch_size"] == single["batch_size"] == 8

    eq = assert_trains_like(rec, single)   # tests/conftest.py: the checks every data-parallel test shares
    assert rec["checks"]["checksum"]["ok"]
    assert "Data-parallel: W workers against one" in two.markdown()


# ---- MXNet dist_sync: W processes and a parameter server ---------------------------------------------------------
def _mode_record(run, mode):
    recs = [r for r in run.records.get("mxnet", []) if (r.get("distributed") or {}).get("mxnet_dp") == mode]
    assert len(recs) == 1, run.output
    return recs[0]


@pytest.mark.full
@pytest.mark.skipif("mxnet" not in selected_targets(), reason="the mxnet target is not selected")
def test_mxnet_dist_sync_equals_one_process_with_each_workers_own_batchnorm_statistics(tmp_path):
    """``--mxnet-dp dist_sync`` (2 worker processes, a ps-lite scheduler and server, kvstore 'dist_sync', each worker
    its own BatchNorm statistics: MXNet 1.9 cannot synchronise them across processes) against ``--mxnet-dp local``
    (one process, 2 devices, kvstore 'device', plain BatchNorm per device): the same computation, so the first 10
    losses and the trained parameters (running statistics included) agree within 1e-5."""
    common = ["--preset", "smoke", "--frameworks", "mxnet", "--workers", "2", "--batch-size", "4", "--timeout", "900"]
    local_run = run_all(common + ["--mxnet-dp", "local"], tmp_path)
    local = _mode_record(local_run, "local")
    if local["status"] == "skipped":
        pytest.skip("mxnet: %s" % local["error"])
    assert local["status"] == "ok", local["error"]
    d = local["distributed"]
    assert d["launcher"] == "single" and d["kvstore"] == "device" and d["batchnorm_statistics"] == "per_worker"
    assert local["checks"]["equivalence"]["ok"] is None          # no reference of its own ...
    loss = local["checks"]["loss"]                                # ... but its first loss is checked: the NumPy
    assert loss["ok"] and loss["rel_diff"] <= 1e-4                # reference with each share's statistics
    shares = local["checks"]["loss_per_share"]                    # (smoke's first batch, 3 utterances, is given
    assert shares["ok"] and shares["batch_size"] % 2 == 0         # whole to both devices: a split batch too)
    assert local["export"]["inference"]["ok"] and local["export"]["native"]["ok"]

    dist_run = run_all(common + ["--mxnet-dp", "dist_sync"], tmp_path)
    rec = _mode_record(dist_run, "dist_sync")
    assert rec["status"] == "ok", rec["error"]
    assert dist_run.returncode == 0, dist_run.output
    d = rec["distributed"]
    assert d["launcher"] == "mxnet_dist_sync" and "dist_sync" in d["backend"] and d["kvstore"] == "dist_sync"
    assert d["batchnorm_statistics"] == "per_worker" and "cannot synchronise" in d["sync_batchnorm"]
    assert d["notebook_world_size"] == 2 and d["per_worker_batch"] == 4 and d["global_batch"] == 8
    assert len(rec["run"]["logs"]) == 2 and sorted(rec["run"]["ranks"]) == ["0", "1"]
    assert rec["checks"]["loss"]["ok"] and rec["checks"]["loss"]["reference"] == pytest.approx(loss["reference"])
    assert rec["checks"]["loss_per_share"]["ok"]
    assert rec["checks"]["loss_per_share"]["reference"] == pytest.approx(shares["reference"])

    eq = rec["checks"]["equivalence"]
    assert eq["ok"] is True, eq
    assert eq["reference"].endswith("_w2_localbn.json") and eq["reference_world_size"] == 2
    assert eq["steps_compared"] == parallel.EQUIVALENCE_STEPS == 10 and eq["loss_rel_diff"] <= 1e-5
    assert eq["param_rel_diff"] is not None and eq["param_rel_diff"] <= parallel.PARAM_RTOL
    first = recheck_first_losses(rec, local, eq)
    assert len(set(first.round(3))) > 5
    assert len(rec["losses"]["train"]) == len(local["losses"]["train"]) == rec["timing"]["steps"]
    assert rec["export"]["inference"]["ok"] and rec["export"]["train_loss"]["ok"]
    assert "mxnet fp32 (dist_sync)" in dist_run.markdown()


# ---- MXNet bf16 on two devices: the native checkpoint reloads into the class the run trained ----------------------
@pytest.mark.full
@pytest.mark.skipif("mxnet" not in selected_targets(), reason="the mxnet target is not selected")
def test_mxnet_bf16_on_two_devices_reloads_its_native_checkpoint_exactly(tmp_path):
    """amp keeps SyncBatchNorm in fp32 (its FP32_FUNCS) where it runs BatchNorm in bfloat16: a checkpoint of the
    two-device model reloaded into the plain BatchNorm model gave logits 1e-3 apart (a failed row); reloaded into the
    model with the BatchNorm the run trained, they are the same.  On a CPU without AVX-512 the runner starts nothing
    (MXNet's bf16 needs it), and the test is skipped with the runner's line."""
    run = run_all(["--preset", "smoke", "--frameworks", "mxnet", "--workers", "2", "--batch-size", "4",
                   "--precision", "bf16", "--timeout", "900"], tmp_path)
    if not run.records.get("mxnet") and "no selected row can run on this machine" in run.output:
        pytest.skip(run.output.strip().splitlines()[-1])
    rec = two_worker_record(run, "mxnet")
    assert rec["distributed"]["batchnorm_statistics"] == "global", rec["distributed"]
    native = rec["export"]["native"]
    assert native["ok"] and native["logits_max_abs"] == 0.0, native
