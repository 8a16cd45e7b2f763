"""The Keras 3 notebook: its export and its data-parallel code on the JAX backend.

* keras-jax, smoke preset: ``--batch-size 8`` (one worker), then ``--workers 2 --batch-size 4`` (2 x 4) into the
  same results directory: the first 10 losses within 1e-5 relative, the same data checksum, the parameter
  summaries (``checks.equivalence``, as tests/test_dp_equivalence_cntk_mxnet.py checks CNTK and MXNet).
* the single-worker run's export: its checks passed; the ``.keras`` file it wrote opens on the **torch** backend
  (``keras.saving.load_model`` in the PyTorch environment, no notebook code) with the same inference logits; its
  canonical ``.npz`` loaded back with ``init_weights`` passes section 6's check from the loaded state; a broken
  file stops the notebook at section 5 with one ``WeightsError`` line.
* keras-torch and keras-tensorflow train in one process only: run_all.py skips them with ``--workers`` before
  anything starts (tests/test_run_all.py), and the notebook stops in section 2, before Keras, with one line that says
  why it does not offer it and what to use instead (the settings cell alone, tests/test_notebook_refusals.py).

``DS2_TEST_FRAMEWORKS`` selects the targets (tests/conftest.py); a target not selected is not run.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from common import parallel
from common.data import DeepMarkIterator
from common.spec import get_preset
from common.weights import load_weights, save_weights
from runner.dp import launch
from runner.envs import framework_envs
from runner.envs.bootstrap import env_python
from runner.run.targets import ALL_TARGETS
from runner.envs.definitions import ENVS
from tests.conftest import assert_trains_like, ROOT, run_all, RunAll, selected_targets, two_worker_record

SELECTED = selected_targets()
needs_keras_jax = pytest.mark.skipif("keras-jax" not in SELECTED, reason="keras-jax not selected (DS2_TEST_FRAMEWORKS)")


@pytest.fixture(scope="module")
def single(tmp_path_factory, smoke):
    """keras-jax on the smoke preset with the global batch 8, one worker (its results directory and record):
    the session's smoke run, copied (not run twice)."""
    results_dir = tmp_path_factory.mktemp("keras_dp")
    one = RunAll.reuse(smoke, "keras-jax", results_dir)
    rec = one.record("keras-jax")
    if rec["status"] == "skipped":
        pytest.skip("keras-jax: %s" % rec["error"])
    assert rec["status"] == "ok", rec["error"]
    return one, rec


@pytest.mark.full
@needs_keras_jax
def test_keras_jax_two_workers_equal_one_worker_with_the_global_batch(single):
    assert "workers" in launch.notebook_parameter_names(ALL_TARGETS["keras-jax"].notebook_path)
    one, single_rec = single
    assert "distributed" not in single_rec                   # the single-worker record is the plain one
    assert single_rec["checks"]["param_summary"]["count"] > 0

    two = run_all(["--preset", "smoke", "--device", "cpu", "--frameworks", "keras-jax", "--workers", "2",
                   "--batch-size", "4", "--timeout", "900"], one.results_dir)
    rec = two_worker_record(two, "keras-jax")
    d = rec["distributed"]
    assert d["launcher"] == "jax" and "DataParallel" in d["backend"] and "gloo" in d["backend"], d
    assert d["notebook_world_size"] == 2 and d["per_worker_batch"] == 4 and d["global_batch"] == 8
    assert d["replicated_batches"] == 2                       # the smoke pass's batches of odd size (3 and 1)
    assert rec["batch_size"] == single_rec["batch_size"] == 8

    eq = assert_trains_like(rec, single_rec)   # tests/conftest.py: the checks every data-parallel test shares
    assert eq["param_rel_diff"] is not None and eq["param_rel_diff"] <= parallel.PARAM_RTOL, eq  # moving stats included
    assert rec["export"]["inference"]["ok"] and rec["export"]["native"]["ok"] and rec["export"]["train_loss"]["ok"]
    assert "Data-parallel: W workers against one" in two.markdown()


@needs_keras_jax
def test_keras_jax_export_checks_passed(single):
    one, rec = single
    ex = rec["export"]
    assert ex["inference"]["ok"] and ex["inference"]["logits_max_rel"] <= 1e-4
    assert ex["native"]["ok"] and ex["native"]["path"].endswith(".keras")
    assert ex["train_loss"]["ok"]
    rv = ex["running_variance"]     # Keras keeps the biased batch variance: measured, it is not the canonical one
    assert rv["max_rel_to_biased_update"] < 1e-4 < rv["max_rel_to_canonical_unbiased_update"], rv


def _export_files(results_dir, rec):
    """The export's files: beside the record's export path (the session smoke run's weights directory)."""
    path = rec["export"]["path"]
    path = path if os.path.isabs(path) else os.path.join(ROOT, path)
    stem = os.path.splitext(path)[0]
    return stem + ".npz", stem + ".logits.npy", stem + ".native.keras"


@needs_keras_jax
def test_the_jax_runs_keras_file_opens_on_the_torch_backend(single):
    """The migration between backends: the .keras file written on JAX, loaded by keras.saving.load_model in the
    PyTorch environment (no notebook code), gives the same inference logits."""
    one, rec = single
    _, logits_path, native = _export_files(one.results_dir, rec)
    python = env_python(framework_envs.env_path(ENVS["pytorch"], "cpu"))
    if not os.path.exists(python):
        pytest.skip("no PyTorch environment at %s" % python)
    script = "\n".join([
        "import os, sys, json; os.environ['KERAS_BACKEND'] = 'torch'; sys.path.insert(0, %r)" % ROOT,
        "import numpy as np, keras",
        "from common.data import DeepMarkIterator; from common.spec import get_preset",
        "P = get_preset('smoke').with_overrides(batch_size=8)",
        "batch = DeepMarkIterator(P.batch_size, P.scale, 0, lengths=P.lengths, n_freq=P.config.n_freq, "
        "n_classes=P.config.n_classes).batch(0)",
        "model = keras.saving.load_model(%r, compile=False)" % native,
        "logits = np.asarray(model.predict_on_batch(batch.features), np.float32).transpose(1, 0, 2)",
        "print(json.dumps({'backend': keras.backend.backend(), 'logits': logits.tolist()}))"])
    out = subprocess.run([python, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         universal_newlines=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["backend"] == "torch"
    expected = np.load(logits_path)
    theirs = np.asarray(got["logits"])
    assert theirs.shape == expected.shape
    assert np.max(np.abs(theirs - expected)) <= 1e-5 * max(1.0, np.max(np.abs(expected))), \
        np.max(np.abs(theirs - expected))


def _papermill(tmp_path, init_weights):
    kernel = framework_envs.kernel_name(ENVS["jax"], "cpu")
    out = tmp_path / "out.ipynb"
    cmd = [sys.executable, "-m", "papermill", ALL_TARGETS["keras-jax"].notebook_path, str(out), "-k", kernel,
           "-p", "preset", "smoke", "-p", "device", "cpu", "-p", "batch_size", "8", "-p", "backend", "jax",
           "-p", "target", "keras-jax", "-p", "init_weights", init_weights,
           "-p", "result_path", str(tmp_path / "records" / "keras-jax_roundtrip.json"),
           "--cwd", os.path.join(ROOT, "notebooks")]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True), out


@needs_keras_jax
def test_a_broken_canonical_file_stops_at_section_5_with_one_line(single, tmp_path):
    one, rec = single
    npz, _, _ = _export_files(one.results_dir, rec)
    state = load_weights(npz)
    del state["bd1.bn.var"]
    broken = str(tmp_path / "broken.npz")
    save_weights(broken, state)
    proc, out = _papermill(tmp_path, broken)
    assert proc.returncode != 0
    import nbformat
    nb = nbformat.read(str(out), as_version=4)
    errors = [(c.metadata.get("tags", []), o) for c in nb.cells if c.cell_type == "code"
              for o in c.get("outputs", []) if o.output_type == "error"]
    assert len(errors) == 1
    tags, error = errors[0]
    assert "rosetta:weights" in tags and error["ename"] == "WeightsError", (tags, error["ename"])
    assert "lacks bd1.bn.var" in error["evalue"] and "\n" not in error["evalue"]
    assert not os.path.exists(str(tmp_path / "records" / "keras-jax_roundtrip.json"))


def test_keras_jax_preset_batches_the_dp_test_relies_on():
    """The smoke pass with the global batch 8 has batches that 2 does not divide (fed whole by both processes)
    and full ones (sharded): the two-worker test covers both paths."""
    P = get_preset("smoke").with_overrides(batch_size=8)
    it = DeepMarkIterator(P.batch_size, P.scale, 0, lengths=P.lengths, n_freq=P.config.n_freq,
                          n_classes=P.config.n_classes)
    stats = it.shard_stats(2)
    assert stats["uneven_batches"] == 2 and 0 < stats["uneven_batches"] < stats["batches"]


@pytest.mark.full     # a whole notebook run; the default tier loads Keras's export into PyTorch and PyTorch's into
@needs_keras_jax      # Keras (tests/test_export_records.py, the migration's hub pairs)
def test_the_export_loads_back_with_init_weights(single, tmp_path):
    """Round trip Keras -> canonical -> Keras: section 6's first loss is the reference's from the loaded state
    (moving statistics included), and the new export's inference check passes."""
    one, rec = single
    npz, _, _ = _export_files(one.results_dir, rec)
    proc, _ = _papermill(tmp_path, npz)
    assert proc.returncode == 0, proc.stdout[-3000:]
    with open(str(tmp_path / "records" / "keras-jax_roundtrip.json")) as f:
        again = json.load(f)
    assert again["export"]["init_weights"] == npz
    assert again["checks"]["loss"]["ok"] and again["checks"]["loss"]["rel_diff"] <= 1e-4
    assert again["export"]["inference"]["ok"] and again["export"]["native"]["ok"]
    # it started from the trained state, not from canonical_state: another reference loss than the first run's
    assert abs(again["checks"]["loss"]["reference"] / rec["checks"]["loss"]["reference"] - 1) > 1e-4
