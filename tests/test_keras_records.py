"""The Keras 3 rows' records (and the TensorFlow notebook's xla variant): the matmul precision each backend
reports, the forward timing bounded by its budget on the smoke preset, and what XLA compiled (the JAX backend's
counts; TensorFlow XLA's persistent cache on a CPU).

The record tests read the session's smoke run (tests/conftest.py); the variants' tests run in the full tier.
"""
import pytest

from common.data import DeepMarkIterator
from common.spec import get_preset
from tests.conftest import full_targets, ok_record as ok, selected_targets

SMOKE = get_preset("smoke")
NAMES = selected_targets()
KERAS = [t for t in NAMES if t.startswith("keras")]

#: what each backend reports after the notebook's fp32 switches (section 2), read back from the backend
FP32_MATMUL = {
    "jax": {"jax_default_matmul_precision": "float32"},
    "torch": {"torch.backends.cuda.matmul.fp32_precision": "ieee", "torch.backends.cudnn.conv.fp32_precision": "ieee",
              "torch.backends.cudnn.rnn.fp32_precision": "ieee",
              "torch.backends.mkldnn.matmul.fp32_precision": "none",        # "none": the parent's default, IEEE
              "torch.get_float32_matmul_precision()": "highest"},
    "tensorflow": {"tf.config.experimental.tensor_float_32_execution_enabled()": False},
}


def smoke_iterator():
    return DeepMarkIterator(SMOKE.batch_size, SMOKE.scale, 0, lengths=SMOKE.lengths,
                            n_freq=SMOKE.config.n_freq, n_classes=SMOKE.config.n_classes)


@pytest.mark.parametrize("target", full_targets(KERAS))
def test_keras_record_says_the_matmul_precision_its_backend_reports(smoke, target):
    rec = ok(smoke, target)
    assert rec["precision"] == "fp32"
    assert rec["options"]["matmul_precision"] == FP32_MATMUL[rec["options"]["backend"]]


@pytest.mark.parametrize("target", full_targets(KERAS))
def test_keras_forward_timing_is_bounded_by_time_on_smoke(smoke, target):
    """Every length timed at least once and at most forward_repeats times, under the smoke preset's budget."""
    rec = ok(smoke, target)
    t = rec["timing"]
    assert t["forward_budget_s"] == rec["options"]["forward_budget_s"] == 2.0
    assert set(t["forward_counts"]) == set(t["forward_ms"]) == {str(s) for s in SMOKE.lengths}
    assert all(1 <= n <= SMOKE.forward_repeats for n in t["forward_counts"].values()), t["forward_counts"]
    assert t["forward_repeats"] == SMOKE.forward_repeats


@pytest.mark.skipif("keras-jax" not in NAMES, reason="the keras-jax target is not selected")
def test_keras_jax_counts_what_xla_compiled(smoke):
    """Every shape's step is compiled (or loaded from the persistent cache) in the warm-up, the timed pass compiles
    nothing, each forward length is one program, and every program went through the cache (a hit or a miss)."""
    xla = ok(smoke, "keras-jax")["options"]["xla_compilations"]
    assert xla["warmup"] >= len(smoke_iterator().shapes()) and xla["epoch"] == 0, xla
    assert xla["forward"] == len(SMOKE.lengths), xla
    assert xla["compiles"] == xla["cache_hits"] + xla["cache_misses"] > 0, xla
    assert xla["cache_dir"] and "ds2-rosetta" in xla["cache_dir"], xla


@pytest.mark.parametrize("target", full_targets([t for t in NAMES if t in ("keras-tensorflow+xla", "tensorflow+xla")]))
def test_tensorflow_xla_keeps_its_programs_in_the_persistent_cache_on_a_cpu(smoke, target):
    """The smoke run is on the CPU: XLA's persistent cache is on, and the warm-up's programs are in it (compiled
    and written now, or loaded from an earlier run: at most one file per shape written)."""
    cache = ok(smoke, target)["options"]["xla_cache"]
    assert cache["dir"] and "tensorflow-xla" in cache["dir"] and cache["why_off"] is None, cache
    assert 0 <= cache["warmup_written"] <= len(smoke_iterator().shapes()), cache
    assert 0 <= cache["forward_written"] <= len(SMOKE.lengths), cache
    assert cache["files"] >= len(smoke_iterator().shapes()), cache
