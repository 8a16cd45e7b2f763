"""The latency-aware roofline (common/roofline.py): the bound of a tiny case counted by hand, its monotonicity in
t_step, the share, the split of the FLOPs against common/flops.py, the review's fp32 figure from its stated inputs,
and benchmarks/rnn_latency.py --smoke run with the PyTorch CPU environment."""
import ast
import json
import os
import subprocess
import time

import pytest

from common import flops, roofline
from common.data import DeepMarkIterator
from common.spec import FULL_MODEL, SMOKE_MODEL, DS2Config
from tests.conftest import ROOT

#: 2 conv filters, 1 bd layer of 4 units, fc 4, 3 classes: small enough to count by hand
TINY = DS2Config(conv_channels=2, rnn_layers=1, rnn_hidden=4, fc_hidden=4, n_classes=3)
TORCH_PYTHON = os.path.join(ROOT, ".venvs", "pytorch-cpu", "bin", "python")


def test_the_bound_of_a_tiny_case_equals_the_count_by_hand():
    # One 1-s utterance (100 frames): conv1 50 x 79 x 2 x (5 x 20) = 790,000 MACs; conv2 25 x 75 x 2 x (2 x 5 x 10)
    # = 375,000; bd1 input 25 x 2 x 150 x 4 = 30,000 (2 x 75 = 150 inputs); bd1 recurrent 25 x 2 x 4 x 4 = 800;
    # fc 25 x 4 x 4 = 400; out 25 x 4 x 3 = 300: 1,196,500 MACs, 6 x that = 7,179,000 training FLOPs, of which
    # 2 (forward, backward) x 2 FLOPs x 800 = 3,200 sequential.  A 2-s utterance holds twice each.
    one = roofline.train_flops_split(TINY, 1, batch_size=1)
    assert (one["total"], one["sequential"], one["parallel"]) == (7179000.0, 3200.0, 7175800.0)
    assert roofline.dependent_steps(TINY, 1) == 2 * 1 * 25
    assert roofline.dependent_steps(TINY, 2) == 2 * 1 * 50
    # batches: two 1-s utterances, one 2-s utterance; t_step 1 ms, 1 GFLOP/s, 0.5 s fixed per batch
    bound = roofline.epoch_bound(TINY, [(1, 2), (2, 1)], t_step_s=1e-3, gemm_flops_per_s=1e9, fixed_s=0.5)
    parallel = 2 * 7175800 + 2 * 7175800
    assert bound["batches"] == 2 and bound["audio_seconds"] == 4.0
    assert bound["fixed_s"] == pytest.approx(1.0)
    assert bound["parallel_s"] == pytest.approx(parallel / 1e9)
    assert bound["sequential_s"] == pytest.approx((50 + 100) * 1e-3)
    assert bound["time_s"] == pytest.approx(1.0 + 0.0287032 + 0.15)
    assert bound["audio_s_per_s"] == pytest.approx(4.0 / 1.1787032)
    one_batch = roofline.batch_bound_s(TINY, 2, 1, 1e-3, 1e9, 0.5)
    assert one_batch == pytest.approx(0.5 + 7175800 * 2 / 1e9 + 0.1)


def test_the_split_is_common_flops_sequential_share():
    for config in (FULL_MODEL, SMOKE_MODEL, TINY):
        for seconds in (1, 8, 15):
            split = roofline.train_flops_split(config, seconds, batch_size=3)
            assert split["total"] == config.train_flops(seconds * 100, 3)
            assert split["sequential"] / split["total"] == pytest.approx(
                flops.sequential_share(config, seconds * 100), rel=1e-12)


def test_the_bound_falls_as_t_step_grows_and_rises_with_the_gemm_rate():
    batches = roofline.deepmark_batches(32, 64)
    rates = [roofline.epoch_bound(FULL_MODEL, batches, t, 50e12, 8e-3)["audio_s_per_s"]
             for t in (0.0, 5e-6, 10e-6, 20e-6, 40e-6)]
    assert all(a > b for a, b in zip(rates, rates[1:]))
    assert (roofline.epoch_bound(FULL_MODEL, batches, 10e-6, 400e12)["audio_s_per_s"]
            > roofline.epoch_bound(FULL_MODEL, batches, 10e-6, 50e12)["audio_s_per_s"])


def test_share_is_measured_over_bound():
    bound = roofline.epoch_bound(FULL_MODEL, [(8, 32)], 10e-6, 50e12, 8e-3, measured=1319.0)
    assert bound["share"] == pytest.approx(1319.0 / bound["audio_s_per_s"])
    assert roofline.share(1319.0, bound) == bound["share"]
    assert roofline.share(500.0, 2000.0) == 0.25
    with pytest.raises(ValueError):
        roofline.share(500.0, 0.0)
    with pytest.raises(ValueError):
        roofline.epoch_bound(FULL_MODEL, [(8, 32)], 10e-6, 0.0)
    with pytest.raises(ValueError):
        roofline.epoch_bound(FULL_MODEL, [(8, 0)], 10e-6, 50e12)          # nothing but empty batches


def test_deepmark_batches_follow_the_iterator_and_take_step_like_objects():
    it = DeepMarkIterator(batch_size=8, scale=1, seed=0)
    assert roofline.deepmark_batches(8, 1) == [(b.seconds, b.batch_size) for b in it]
    quick = roofline.deepmark_batches(32, 64)
    assert len(quick) == 200 and sum(s * n for s, n in quick) == 38016
    assert roofline.deepmark_batches(8, 1, lengths=(1, 2)) == [(1, 3), (2, 8), (2, 2)]
    by_objects = roofline.epoch_bound(FULL_MODEL, it, 10e-6, 50e12)
    assert by_objects == roofline.epoch_bound(FULL_MODEL, roofline.deepmark_batches(8, 1), 10e-6, 50e12)


def test_the_review_fp32_library_figure_from_its_stated_inputs():
    # 55 us per forward layer-step x 1/2 (recurrent) / 2 (directions one after the other) = 13.75 us; 8.1 ms per
    # batch; 51.28 TFLOP/s: the quick pass at batch 32 gives the review's 2,560 audio-s/s (held to 1 %).
    assert roofline.t_step_from_layer_step(55e-6) == pytest.approx(13.75e-6)
    fp32 = roofline.review_fp32_library()
    assert fp32["audio_s_per_s"] == pytest.approx(roofline.REVIEW_ESTIMATE["fp32"][0], rel=0.01)
    assert fp32["batches"] == 200 and fp32["audio_seconds"] == 38016
    # the inverse gives the t_step back; the bf16 persistent figure cannot hold with 8.1 ms per batch at 900
    # TFLOP/s (the module's docstring says why)
    batches = roofline.deepmark_batches(32, 64)
    assert roofline.implied_t_step(FULL_MODEL, batches, fp32["audio_s_per_s"], 51.28e12, 8.1e-3) == \
        pytest.approx(13.75e-6)
    assert roofline.implied_t_step(FULL_MODEL, batches, roofline.REVIEW_ESTIMATE["bf16"][1], 900e12, 8.1e-3) < 0
    table = roofline.estimate_table(FULL_MODEL, batches, {"fp32": {
        "library": {"t_step_s": 13.75e-6, "gemm_flops_per_s": 51.28e12, "fixed_s": 8.1e-3},
        "persistent": {"t_step_s": 7.72e-6, "gemm_flops_per_s": 51.28e12, "fixed_s": 8.1e-3}}})
    assert table["fp32"]["library"] == pytest.approx(fp32["audio_s_per_s"])
    assert table["fp32"]["persistent"] == pytest.approx(roofline.REVIEW_ESTIMATE["fp32"][1], rel=0.01)


def test_common_roofline_parses_as_python_3_6():
    with open(os.path.join(ROOT, "common", "roofline.py")) as f:
        ast.parse(f.read(), "roofline.py", feature_version=(3, 6))


def test_rnn_latency_smoke_writes_the_figures(tmp_path):
    if not os.path.exists(TORCH_PYTHON):
        pytest.fail("no PyTorch CPU environment at %s: make it with `python run_all.py --setup-only "
                    "--frameworks pytorch` (benchmarks/rnn_latency.py needs torch)" % TORCH_PYTHON)
    out = tmp_path / "rnn_latency.json"
    start = time.perf_counter()
    proc = subprocess.run([TORCH_PYTHON, os.path.join(ROOT, "benchmarks", "rnn_latency.py"), "--smoke",
                           "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=120)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"]["type"] == "cpu" and report["device"]["name"]
    assert report["versions"]["torch"]
    assert report["sizes"]["smoke"] is True and report["sizes"]["steps"] >= 1
    assert sorted(report["precisions"]) == ["bf16", "fp32", "tf32"]
    for precision, entry in report["precisions"].items():
        assert entry["t_step_s"] > 0, precision
        for key in ("rnn_fwd_s", "rnn_fwd_bwd_s", "rnn_uni_fwd_s"):
            assert entry[key] > 0, (precision, key)
        assert isinstance(entry["directions_overlap"], bool)
        assert entry["rnn_dtype"] in ("float32", "bfloat16", "float16")
        assert entry["gemm_flops_per_s"]["input"] > 0 and entry["gemm_flops_per_s"]["recurrent"] > 0
    assert report["precisions"]["fp32"]["rnn_dtype"] == "float32"
    bf16 = report["precisions"]["bf16"]
    assert (bf16["rnn_dtype"] == "bfloat16") == (bf16["rnn_error"] is None)
    # the report feeds the roofline
    figures = roofline.figures_from_benchmark(report, "fp32")
    bound = roofline.epoch_bound(SMOKE_MODEL, roofline.deepmark_batches(8, 1), **figures)
    assert bound["audio_s_per_s"] > 0
    assert elapsed < 60, "the smoke run took %.0f s" % elapsed
