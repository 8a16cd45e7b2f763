"""Issue #15 for PyTorch: the notebook's data-parallel code (torchrun, DDP on gloo, the all-reduce BatchNorm
stand-in on a CPU), run by ``run_all.py --workers 2`` on the smoke preset, trains exactly like one worker
with the global batch -- the first 10 losses within 1e-5 relative, the trained parameters' summaries too,
the same data checksum (``checks.equivalence``, computed by the runner from the single-worker record with the
global batch in the same results directory).  Both records also carry the export of issue #12.

The single-worker run (``--batch-size 8``) comes first, then ``--workers 2 --batch-size 4`` (2 x 4), into one
temporary results directory.  The smoke epoch has batches that 2 does not divide and batches of one
utterance, so the run covers uneven shares and empty ones (a worker that runs the model on 0 utterances
and still joins every collective).  Selected by ``DS2_TEST_FRAMEWORKS`` (pytorch)."""

import os

import numpy as np
import pytest

from common import parallel
from common.weights import load_state
from runner import distributed
from runner.targets import ALL_TARGETS
from tests.conftest import ROOT, run_all, selected_targets

pytestmark = pytest.mark.skipif("pytorch" not in selected_targets(),
                                reason="pytorch is not among DS2_TEST_FRAMEWORKS")


def check_export(rec, results_dir):
    """The record's export section (issue #12): its checks passed and its files exist and load."""
    ex = rec["export"]
    assert ex["inference"]["ok"] and ex["native"]["ok"] and ex["train_loss"]["ok"], ex
    assert ex["inference"]["logits_max_rel"] <= 1e-4 and ex["train_loss"]["rel_diff"] <= 1e-4, ex
    assert ex["native"]["logits_max_abs"] <= 1e-5 and ex["native"]["format"].startswith("torch.save"), ex
    weights = os.path.join(ROOT, ex["path"]) if not os.path.isabs(ex["path"]) else ex["path"]
    assert os.path.dirname(weights) == os.path.join(results_dir, "weights")
    from common.spec import get_preset
    state = load_state(weights, get_preset("smoke").config)    # every canonical name and shape, float32
    assert ex["tensors"] == len(state)
    summary = parallel.param_summary(state)
    assert summary == pytest.approx(rec["checks"]["param_summary"], rel=1e-12)
    logits = np.load(os.path.splitext(weights)[0] + ".logits.npy")
    assert logits.ndim == 3 and logits.shape[2] == 29 and np.all(np.isfinite(logits))


def test_pytorch_two_workers_equal_one_worker_with_the_global_batch(tmp_path):
    assert "workers" in distributed.notebook_parameter_names(ALL_TARGETS["pytorch"].notebook_path)
    common_args = ["--preset", "smoke", "--frameworks", "pytorch", "--device", "cpu", "--timeout", "900"]
    one = run_all(common_args + ["--batch-size", "8"], tmp_path)
    single = one.record("pytorch")
    assert single["status"] == "ok", single["error"]
    assert "distributed" not in single                      # the single-worker record is the plain one
    check_export(single, str(tmp_path))

    two = run_all(common_args + ["--workers", "2", "--batch-size", "4"], tmp_path)
    recs = [r for r in two.records["pytorch"] if (r.get("distributed") or {}).get("world_size") == 2]
    assert len(recs) == 1, two.output
    rec = recs[0]
    assert rec["status"] == "ok", rec["error"]
    assert two.returncode == 0, two.output
    d = rec["distributed"]
    assert d["launcher"] == "torchrun" and d["backend"] == "gloo", d
    assert d["notebook_world_size"] == 2 and d["per_worker_batch"] == 4 and d["global_batch"] == 8
    assert d["sync_batchnorm"].startswith("AllReduceBatchNorm"), d
    assert rec["batch_size"] == single["batch_size"] == 8
    # not vacuous: the epoch has uneven shares and empty ones
    assert d["shard_stats"]["uneven_batches"] > 0 and d["shard_stats"]["batches_with_empty_shards"] > 0, d

    eq = rec["checks"]["equivalence"]
    assert eq["ok"] is True, eq
    assert eq["steps_compared"] == parallel.EQUIVALENCE_STEPS == 10
    assert eq["loss_rel_diff"] <= 1e-5 and eq["rel_diff"] <= 1e-5, eq
    assert eq["param_rel_diff"] is not None and eq["param_rel_diff"] <= 1e-5 and eq["param_count_equal"], eq
    assert eq["checksum_equal"] and rec["data"]["checksum"] == single["data"]["checksum"]
    assert rec["checks"]["checksum"]["ok"]
    # the same comparison, recomputed from the two records (not only the runner's word for it)
    again = parallel.equivalence(rec, single)
    assert again["ok"] and again["loss_rel_diff"] == pytest.approx(eq["loss_rel_diff"], abs=1e-15)
    # the losses move (training happened), and both records trained the whole epoch
    first = parallel.first_losses(rec)
    assert len(set(first.round(3))) > 5
    assert len(rec["losses"]["train"]) == len(single["losses"]["train"]) == rec["timing"]["steps"]
    # rank 0's export: the same checks, and the same exported state as one worker's to rounding
    check_export(rec, str(tmp_path))
    assert rec["export"]["path"] != single["export"]["path"]
    assert "Data-parallel: W workers against one" in two.markdown()
