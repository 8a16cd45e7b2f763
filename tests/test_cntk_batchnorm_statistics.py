"""CNTK: what CNTK's BatchNormalization stores as running statistics, measured on the notebook itself.

The notebook's code cells from the first through ``rosetta:check`` (the smoke model loaded from the canonical
state), then its optimizer cell, then ONE training step on the check batch from the canonical state.  The running
statistics read back by the notebook's own ``export_canonical`` are compared with the NumPy reference's update
rule (``common.reference.update_running_stats`` with the batch statistics of that batch at the canonical weights):

* the convolutions' hand-written BatchNorm follows the spec's rule exactly: ``r = 0.9 r + 0.1 batch``, unbiased;
* CNTK's own layer (the sequence-wise BatchNorms, ``normalization_time_constant=tau``) weights the batch by
  ``f = 1 - exp(-n / tau)`` for a minibatch of ``n`` frames -- not 0.1 unless ``n`` is the mean -- and keeps the
  UNBIASED batch variance (the canonical convention): measured, with both alternatives shown to be further off;
* the check cell's training-mode pass left the loaded statistics as they were (0 and 1).

And what ``run_all.py --migrate`` runs (the code cells through ``rosetta:check``, then ``rosetta:export``): a
canonical file with running statistics that are not 0 and 1 goes in and comes out bit-identical, checked in
inference mode; a file that lacks a name stops the notebook in section 5 with one ``WeightsError`` line.

Runs the notebook in the CNTK kernel that the session's smoke run used (skipped only when that run skipped the
row, with its reason).  About a minute on 2 cores, most of it CNTK's start."""
import json
import os
import subprocess
import sys

import nbformat
import numpy as np
import pytest

from common.spec import get_preset
from common.weights import canonical_state, load_weights, save_weights
from tests.conftest import ROOT

NOTEBOOK = os.path.join(ROOT, "notebooks", "CNTK_DS2.ipynb")

MEASURE = r'''
import json as _json
_sizes = []
_batch_norm = reference.batch_norm


def _spy(x, gamma, beta, feature_axis, eps, running=None, stats=None):   # samples per feature of each BatchNorm
    if stats is not None:
        _sizes.append(x.size // x.shape[feature_axis])
    return _batch_norm(x, gamma, beta, feature_axis, eps, running, stats)


reference.batch_norm = _spy
_stats = {}
reference.forward(state, check_batch.features, cfg, training=True, batch_stats=_stats)
reference.batch_norm = _batch_norm
_before = export_canonical(model)
train_step(check_batch)
_after = export_canonical(model)
_frames = check_batch.batch_size * cfg.output_length(check_batch.frames)
_out = {"frames": _frames, "time_constant": bn_time_constant, "f": 1.0 - math.exp(-_frames / bn_time_constant),
        "momentum": cfg.bn_momentum, "bn": {}}
for (_name, (_mean, _unbiased)), _k in zip(_stats.items(), _sizes):
    _out["bn"][_name] = {"samples": _k, "batch_mean": _mean.tolist(), "batch_var_unbiased": _unbiased.tolist(),
                         "before_mean": _before[_name + ".mean"].tolist(), "before_var": _before[_name + ".var"].tolist(),
                         "after_mean": _after[_name + ".mean"].tolist(), "after_var": _after[_name + ".var"].tolist(),
                         "state_mean": state[_name + ".mean"].tolist(), "state_var": state[_name + ".var"].tolist()}
with open(OUT_PATH, "w") as _f:
    _json.dump(_out, _f)
'''


@pytest.fixture(scope="module")
def kernel(smoke):
    """The CNTK kernel the session's smoke run used (runner/envs/framework_envs.py names it): skipped with the runner's reason
    when that run skipped the row, and it must exist when the row ran."""
    from runner.envs import framework_envs
    from runner.envs.definitions import ENVS
    rec = smoke.record("cntk")
    if rec["status"] == "skipped":
        pytest.skip("cntk: %s" % rec["error"])
    name = framework_envs.kernel_name(ENVS["cntk"], "cpu", rec["run"].get("interpreter"))
    assert os.path.isdir(os.path.join(framework_envs.kernels_prefix(), "share", "jupyter", "kernels", name)), name
    return name


def trimmed_notebook(out_path):
    """The notebook's code cells from the first through rosetta:check, its optimizer cells (the step's definition and
    the cell that builds it), and the measurement."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    tags = [c.metadata.get("tags", []) for c in code]
    check = next(i for i, t in enumerate(tags) if "rosetta:check" in t)
    optimizer = [c for c, t in zip(code, tags) if "rosetta:optimizer" in t]
    cells = code[:check + 1] + optimizer + [nbformat.v4.new_code_cell("OUT_PATH = %r\n" % out_path + MEASURE)]
    nb.cells = cells
    return nb


def migration_notebook():
    """What run_all.py --migrate runs: the code cells through rosetta:check, then rosetta:export."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    tags = [c.metadata.get("tags", []) for c in code]
    check = next(i for i, t in enumerate(tags) if "rosetta:check" in t)
    nb.cells = code[:check + 1] + [next(c for c, t in zip(code, tags) if "rosetta:export" in t)]
    return nb


def papermill(nb, tmp, kernel, *params):
    nb_in, nb_out = str(tmp / "in.ipynb"), str(tmp / "out.ipynb")
    nbformat.write(nb, nb_in)
    args = ["-p", "preset", "smoke", "-p", "device", "cpu", "-p", "result_path", str(tmp / "records" / "r.json")]
    for name, value in params:
        args += ["-p", name, value]
    proc = subprocess.run([sys.executable, "-m", "papermill", nb_in, nb_out, "-k", kernel] + args
                          + ["--cwd", os.path.join(ROOT, "notebooks")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=900)
    return proc, nbformat.read(nb_out, as_version=4) if os.path.exists(nb_out) else None


@pytest.fixture(scope="module")
def measured(tmp_path_factory, kernel):
    tmp = tmp_path_factory.mktemp("cntk_bn")
    out = str(tmp / "bn.json")
    proc, _ = papermill(trimmed_notebook(out), tmp, kernel)
    assert proc.returncode == 0, proc.stdout[-3000:]
    with open(out) as f:
        return json.load(f)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def rule(d, m, unbiased=True):
    """(mean, var) after one update with weight m on the batch, from the loaded state."""
    k = d["samples"]
    var = np.asarray(d["batch_var_unbiased"]) * (1.0 if unbiased else (k - 1.0) / k)
    return ((1 - m) * np.asarray(d["state_mean"]) + m * np.asarray(d["batch_mean"]),
            (1 - m) * np.asarray(d["state_var"]) + m * var)


#: every BatchNorm of the smoke model: the measurement must hold each (a loop over fewer would check less)
BN_NAMES = set(get_preset("smoke").config.bn_names())


def test_check_cell_leaves_the_loaded_running_statistics(measured):
    assert set(measured["bn"]) == BN_NAMES, sorted(measured["bn"])
    for name, d in measured["bn"].items():
        assert d["before_mean"] == d["state_mean"] and d["before_var"] == d["state_var"], name


def test_hand_written_conv_batchnorm_follows_the_canonical_rule(measured):
    for name in ("conv1.bn", "conv2.bn"):
        d = measured["bn"][name]
        mean, var = rule(d, measured["momentum"])
        assert rel(d["after_mean"], mean) < 1e-5 and rel(d["after_var"], var) < 1e-5, name


def test_cntk_batchnormalization_weights_by_its_time_constant_and_keeps_the_unbiased_variance(measured):
    f, m = measured["f"], measured["momentum"]
    print("frames %d, time constant %.1f: weight f = %.5f instead of %.1f"
          % (measured["frames"], measured["time_constant"], f, m))
    assert abs(f - m) > 1e-3                       # the check batch is not of the mean size: the two rules differ
    sequence_wise = [name for name in measured["bn"] if not name.startswith("conv")]
    assert sorted(sequence_wise) == sorted(n for n in BN_NAMES if not n.startswith("conv")), sequence_wise
    for name, d in measured["bn"].items():
        if name.startswith("conv"):
            continue
        mean_f, var_f = rule(d, f)
        _, var_biased = rule(d, f, unbiased=False)
        mean_m, var_m = rule(d, m)
        got = (rel(d["after_mean"], mean_f), rel(d["after_var"], var_f))
        print("%s: vs f-rule unbiased %.1e / %.1e; biased variance %.1e; canonical momentum 0.1: mean %.1e, var %.1e"
              % (name, got[0], got[1], rel(d["after_var"], var_biased), rel(d["after_mean"], mean_m),
                 rel(d["after_var"], var_m)))
        assert got[0] < 1e-5 and got[1] < 1e-5, name
        assert rel(d["after_var"], var_biased) > 10 * got[1], name           # the biased variance is further off
        assert rel(d["after_mean"], mean_m) > 1e-3, name                    # and so is momentum 0.1


def test_migration_cells_round_trip_a_canonical_file_bit_for_bit(tmp_path, kernel):
    cfg = get_preset("smoke").config
    state = canonical_state(cfg, 3)
    rng = np.random.RandomState(3)                    # running statistics that are not the initial 0 and 1
    for name in cfg.running_stat_shapes():
        state[name] = (rng.uniform(-0.2, 0.2, state[name].shape) if name.endswith(".mean")
                       else rng.uniform(0.5, 2.0, state[name].shape)).astype(np.float32)
    source = str(tmp_path / "source.npz")
    save_weights(source, state)
    proc, _ = papermill(migration_notebook(), tmp_path, kernel, ("init_weights", source))
    assert proc.returncode == 0, proc.stdout[-3000:]
    exported = load_weights(str(tmp_path / "weights" / "r.npz"))
    assert sorted(exported) == sorted(state)
    for name in state:
        assert np.array_equal(exported[name], state[name]), name
    with open(str(tmp_path / "weights" / "r.export.json")) as f:
        info = json.load(f)
    assert info["init_weights"] == source and info["inference"]["ok"] and info["native"]["ok"]
    assert info["inference"]["logits_max_rel"] < 1e-5 and info["native"]["logits_max_abs"] == 0.0


def test_a_file_without_a_canonical_name_stops_in_section_5_with_one_line(tmp_path, kernel):
    cfg = get_preset("smoke").config
    state = canonical_state(cfg, 0)
    del state["bd1.bn.var"]
    broken = str(tmp_path / "broken.npz")
    save_weights(broken, state)
    proc, nb = papermill(migration_notebook(), tmp_path, kernel, ("init_weights", broken))
    assert proc.returncode != 0
    errors = [(c, o) for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert len(errors) == 1
    cell, error = errors[0]
    assert "rosetta:weights" in cell.metadata.get("tags", [])
    assert error["ename"] == "WeightsError"
    assert error["evalue"] == "weights file %s lacks bd1.bn.var (1 canonical names missing)" % broken
    assert not os.path.exists(str(tmp_path / "weights" / "r.npz"))
