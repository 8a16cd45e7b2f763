"""Every framework notebook, executed by run_all.py on the CPU with the smoke preset: its record
must be complete and correct, and its first training losses must agree with PyTorch's."""
import json
import math
import os

import numpy as np
import pytest

from common import reference
from common.data import DeepMarkIterator
from common.spec import get_preset
from common.weights import canonical_weights
from common.flops import pass_flops
from common.spec import LOSS_RTOL
from runner.run.targets import TARGETS, VARIANTS
from tests.conftest import (FIRST_LOSS_RTOL, K_STEPS, TRAJECTORY_RTOL, bf16_cpu_targets, full_targets, ok_record,
                            selected_targets, variant_rtol)

SMOKE = get_preset("smoke")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NAMES = [t for t in selected_targets() if t in TARGETS]              # rows of record
VARIANT_NAMES = [t for t in selected_targets() if t in VARIANTS]


@pytest.fixture(scope="module")
def iterator():
    return DeepMarkIterator(SMOKE.batch_size, SMOKE.scale, seed=0, lengths=SMOKE.lengths)


@pytest.fixture(scope="module")
def first_reference_loss(iterator):
    b = iterator.batch(0)
    return reference.ds2_loss(canonical_weights(SMOKE.config, 0), b.features, b.labels, SMOKE.config)


@pytest.mark.parametrize("target", NAMES)
def test_record_is_complete_and_correct(smoke, target, iterator, first_reference_loss):
    rec = ok_record(smoke, target)
    assert (rec["preset"], rec["batch_size"], rec["scale"], rec["seed"]) == ("smoke", 8, 1, 0)
    assert rec["config"] == json.loads(json.dumps(SMOKE.config.to_dict()))
    # correctness checks
    loss = rec["checks"]["loss"]    # the notebook's own check holds 1e-4 (GPUs too); on this CPU it is far closer
    assert loss["ok"] and loss["rtol"] == 1e-4 and loss["rel_diff"] <= FIRST_LOSS_RTOL, loss
    assert loss["reference"] == pytest.approx(first_reference_loss, rel=1e-12)
    params = rec["checks"]["params"]
    extra = SMOKE.config.extra_rnn_biases if params["extra_rnn_biases"] else 0
    assert params["ok"] and params["count"] == SMOKE.config.param_count + extra
    assert rec["data"]["checksum"] == iterator.expected_checksum() == rec["checks"]["checksum"]["expected"]
    # timings: positive and consistent
    t = rec["timing"]
    assert t["steps"] == len(iterator) and t["utterances"] == iterator.utterances
    assert t["audio_seconds"] == iterator.audio_seconds
    assert t["train_s"] > 0 and t["warmup_s"] > 0
    assert t["audio_s_per_s"] == pytest.approx(t["audio_seconds"] / t["train_s"], rel=1e-9)
    assert t["utterances_per_s"] == pytest.approx(t["utterances"] / t["train_s"], rel=1e-9)
    assert t["warmup_steps"] == len(iterator.shapes())
    assert 0 < t["step_ms_median"] <= t["step_ms_p90"]
    assert sorted(t["per_length"], key=int) == [str(s) for s in SMOKE.lengths]
    assert sum(p["steps"] for p in t["per_length"].values()) == len(iterator)
    assert sorted(t["forward_ms"], key=int) == [str(s) for s in SMOKE.lengths]
    assert all(t["forward_ms"][str(s)] > 0 for s in SMOKE.lengths)
    assert t["projected_epoch_s"] is None       # a pass over 4 of the 15 lengths projects no DeepMark epoch
    assert rec["data"]["lengths"] == list(SMOKE.lengths)
    # losses: the first warm-up step is the checked batch from the canonical weights
    losses = rec["losses"]
    assert len(losses["train"]) == len(iterator) and all(math.isfinite(v) for v in losses["train"])
    assert losses["warmup"][0] == pytest.approx(first_reference_loss, rel=FIRST_LOSS_RTOL)
    assert losses["first"] == losses["train"][0] and losses["last"] == losses["train"][-1]
    # provenance
    assert rec["versions"]["framework"] and rec["device"]["type"] == "cpu"
    assert rec["run"]["command"].startswith("python run_all.py") and rec["run"]["git_commit"]
    assert os.path.exists(os.path.join(ROOT, rec["run"]["executed_notebook"])) or \
        os.path.exists(os.path.join(smoke.results_dir, "notebooks", os.path.basename(rec["run"]["executed_notebook"])))


def trajectory(rec):
    return np.array(rec["losses"]["warmup"] + rec["losses"]["train"], dtype=np.float64)[:K_STEPS]


@pytest.mark.parametrize("target", [t for t in NAMES if t != "pytorch"])
def test_first_steps_agree_with_pytorch(smoke, target):
    if "pytorch" not in selected_targets():
        pytest.skip("the pytorch target, the comparison's reference, is not selected (DS2_TEST_FRAMEWORKS)")
    rec = ok_record(smoke, target)
    torch_rec = ok_record(smoke, "pytorch")
    mine, theirs = trajectory(rec), trajectory(torch_rec)
    assert len(mine) == len(theirs) == K_STEPS
    rel = np.abs(mine - theirs) / np.abs(theirs)
    assert rel.max() <= TRAJECTORY_RTOL, "step losses differ from PyTorch's by up to %.2e: %s vs %s" % (
        rel.max(), mine.round(4).tolist(), theirs.round(4).tolist())


def test_results_table_has_a_row_per_run(smoke):
    md = smoke.markdown()
    table = md.split("## Table of record")[1].split("\n## ")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| Framework")]
    assert len(rows) == sum(len(v) for v in smoke.records.values())
    assert "Generated by `python run_all.py" in md


@pytest.mark.skipif("jax" not in NAMES, reason="the jax target is not selected")
def test_jax_compiles_each_shape_once_in_the_warmup(smoke, iterator):
    """XLA compiles the training step once per batch shape, all in the warm-up: the timed pass compiles nothing."""
    xla = ok_record(smoke, "jax")["options"]["xla_compilations"]
    assert xla["warmup"] == len(iterator.shapes()) and xla["epoch"] == 0, xla


# ---- the FLOP accounting and the measured peak ---------------------------------------------------------
@pytest.mark.parametrize("target", full_targets(NAMES + VARIANT_NAMES))
def test_record_has_flops_and_a_measured_peak(smoke, target, iterator):
    rec = ok_record(smoke, target)
    f = rec["flops"]
    assert f["train"] == pytest.approx(pass_flops(SMOKE.config, iterator)["total"], rel=1e-12)
    assert f["achieved_per_s"] == pytest.approx(f["train"] / rec["timing"]["train_s"], rel=1e-9)
    peak = f["peak_matmul"]
    assert [peak[k]["shape"] for k in ("square", "input", "recurrent")] == [
        [1024, 1024, 1024], [200 * 8, SMOKE.config.rnn_input_width, 32], [8, 32, 32]]
    assert all(peak[k]["flops_per_s"] > 0 for k in peak)
    assert f["peak_matmul_per_s"] == peak["square"]["flops_per_s"]
    # the square product's measurements lasted about the preset's time (the iterations are set from one synchronised
    # product: a product of microseconds runs faster unsynchronised in the loop, so only a large one is held to it)
    square = peak["square"]
    seconds = 2.0 * np.prod(square["shape"]) * square["iterations"] / square["flops_per_s"]
    assert seconds >= 0.3 * SMOKE.peak_time_s, (square, seconds)
    assert 0 < f["efficiency"] < 1.2
    assert f["theoretical_peak"]["label"] == "theoretical"
    assert rec["timing"]["forward_repeats"] == SMOKE.forward_repeats


@pytest.mark.parametrize("notebook", sorted(n for n in os.listdir(os.path.join(ROOT, "notebooks"))
                                      if n.endswith("_DS2.ipynb")))
def test_every_notebook_times_its_peak_for_the_presets_time(notebook):
    """The peak's measurements last the preset's ``peak_time_s`` (0.05 s at smoke, 0.2 s on the real presets)."""
    with open(os.path.join(ROOT, "notebooks", notebook)) as f:
        cells = [c for c in json.load(f)["cells"] if "rosetta:peak" in c["metadata"].get("tags", [])]
    source = "".join(cells[0]["source"]) if len(cells) == 1 else ""
    assert "min_time_s=P.peak_time_s)" in source and source.count("measure_matmul_peak(") == 1, notebook


# ---- where the time goes: every notebook's profile of one step ----------------------------------------------
#: the rows whose profiler sees one compiled program without per-kernel events on a CPU (XLA under TensorFlow)
WHOLE_STEP = {"tensorflow+xla", "keras-tensorflow+xla"}
#: the parts each profile must find besides the RNN; CNTK times each block of the model on its own inputs by hand,
#: a block with its BatchNorm and clip (so no 'batchnorm' part), and the CTC criterion (the notebook's section 12)
#: PyTorch's torch.compile fuses BatchNorm (and the clips) into Inductor's compiled graphs, which the profile
#: lists as 'other' ("## Call CompiledFxGraph ...")
PARTS = {"cntk": {"convolution", "fc", "ctc"}, "pytorch+compile": {"convolution", "ctc"}}


@pytest.mark.parametrize("target", full_targets(NAMES + VARIANT_NAMES))
def test_profile_puts_the_step_in_the_models_parts(smoke, target):
    """The smoke run (with --profile) profiles one step of the 8-s batch in every notebook: the framework's profiler
    output, reduced by the notebook's rules, must find the model's parts, not leave the step in 'other'."""
    p = ok_record(smoke, target)["profile"]
    assert p and p["tool"], "%s wrote no profile" % target
    assert p["batch"]["seconds"] == 8 and p["step_s"] > 0 and p["profiled_s"] > 0
    shares = p["shares"]
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-9)
    assert sum(p["seconds"].values()) == pytest.approx(p["profiled_s"], rel=1e-9)
    if target in WHOLE_STEP:
        assert shares["other"] == 1.0 and "XLA program" in p["largest_other"][0][0]
        return
    rnn = shares["rnn"] + shares["rnn_input"] + shares["rnn_recurrence"]
    parts = PARTS.get(target, {"convolution", "batchnorm", "ctc"})
    assert rnn > 0 and all(shares[c] > 0 for c in parts), (target, parts, dict(shares))
    assert shares["other"] < 0.5, (target, dict(shares), p["largest_other"])


# ---- each framework's fastest variant: its own row, the same checks ---------------------------------------
@pytest.mark.parametrize("target", full_targets(VARIANT_NAMES))
def test_variant_passes_the_checks_and_trains_like_its_row_of_record(smoke, target):
    variant = VARIANTS[target]
    rec, row = ok_record(smoke, target), ok_record(smoke, variant.variant_of)
    assert rec["row_of_record"] == variant.variant_of and row["row_of_record"] == variant.variant_of
    assert rec["variant"] and row["variant"] == ""
    assert rec["options"]["variant"] == variant.parameters["variant"] and row["options"]["variant"] == ""
    assert rec["checks"]["loss"]["ok"] and rec["checks"]["loss"]["rel_diff"] <= FIRST_LOSS_RTOL
    mine, theirs = trajectory(rec), trajectory(row)
    rel = np.abs(mine - theirs) / np.abs(theirs)
    assert rel.max() <= variant_rtol(target), "%s's first losses differ from %s's by %.2e" % (
        target, row["target"], rel.max())


# ---- bf16 on a CPU: the mixed-precision code of every notebook runs in CI -----------------------------------
@pytest.mark.full          # its own smoke run of every bf16 row
@pytest.mark.parametrize("target", bf16_cpu_targets())
def test_bf16_runs_on_a_cpu_and_passes_its_first_loss_check(smoke_bf16, target, first_reference_loss):
    rec = ok_record(smoke_bf16, target, "bf16")
    loss = rec["checks"]["loss"]
    assert rec["precision"] == "bf16" and loss["precision"] == "bf16"
    assert loss["ok"] and loss["rtol"] == LOSS_RTOL["bf16"] and loss["rel_diff"] <= LOSS_RTOL["bf16"]
    assert loss["reference"] == pytest.approx(first_reference_loss, rel=1e-12)
    assert rec["flops"]["peak_matmul"]["square"]["flops_per_s"] > 0


def test_the_profiles_leave_nothing_in_the_temporary_directory(smoke):
    """Section 12's profilers write their traces into a temporary directory (the smoke run's TMPDIR): each notebook
    removes its own once read."""
    temporary = os.path.join(smoke.results_dir, "tmp")
    assert os.path.isdir(temporary), "the smoke run had no TMPDIR of its own"
    left = sorted(n for n in os.listdir(temporary) if "profile" in n)
    assert not left, "profile traces left behind: %s" % left


@pytest.mark.parametrize("path", sorted(os.path.join("notebooks", n) for n in os.listdir(os.path.join(ROOT, "notebooks"))
                                        if n.endswith(".ipynb")))
def test_every_notebook_is_valid_nbformat_without_outputs(path):
    """nbformat's schema (a code cell needs its outputs and execution count: an exported notebook, a data-parallel
    worker's script, is made from it) and the committed form: no outputs, no execution counts."""
    import nbformat
    nb = nbformat.read(os.path.join(ROOT, path), as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code), path
