"""The JAX/Flax and Keras 3 notebooks: their parameters, and the records of their variants.

The record tests run for the selected targets (tests/conftest.py: every row of record and variant, or
those of ``DS2_TEST_FRAMEWORKS``, e.g. ``DS2_TEST_FRAMEWORKS=jax python -m tests -k notebook_parameters_jax_keras``).
"""
import numpy as np
import pytest

from common.envinfo import gpus
from common.spec import get_preset
from tests.conftest import K_STEPS, full_targets, ok_record as ok, selected_targets, variant_rtol
from tests.notebook_cells import parameters

SMOKE = get_preset("smoke")
NAMES = selected_targets()

#: variant target -> (row of record, what its options must say)
VARIANTS = {
    "jax+unroll": ("jax", {"variant": "unroll"}),
    "jax+hoist": ("jax", {"variant": "hoist", "scan_unroll": 1}),
    "jax+bidir2": ("jax", {"variant": "bidir2", "scan_unroll": 1}),
    "keras-tensorflow+xla": ("keras-tensorflow", {"variant": "xla", "jit_compile": True}),
}


@pytest.mark.parametrize("name", ["JAX_Flax_DS2.ipynb", "Keras3_DS2.ipynb"])
def test_parameters_name_the_row_of_record_by_default(name):
    p = parameters(name)
    assert p["variant"] == "" and p["profile"] is False and p["forward_repeats"] is None
    assert "jit_compile" not in p          # Keras: `variant` is the one switch
    if name.startswith("JAX"):
        assert p["unroll"] is None


@pytest.mark.parametrize("target", full_targets([t for t in NAMES if t in ("jax", "keras-jax", "keras-torch",
                                                                          "keras-tensorflow") or t in VARIANTS]))
def test_record_has_the_peak_and_the_variant(smoke, target):
    rec = ok(smoke, target)
    flops = rec["flops"]
    assert set(flops["peak_matmul"]) == {"square", "input", "recurrent"}
    assert flops["peak_matmul"]["square"]["shape"] == [SMOKE.peak_square] * 3
    assert flops["peak_matmul_per_s"] > 0 and flops["achieved_per_s"] > 0
    assert flops["efficiency"] == pytest.approx(flops["achieved_per_s"] / flops["peak_matmul_per_s"])
    assert rec["timing"]["forward_repeats"] == SMOKE.forward_repeats
    if target in VARIANTS:
        assert rec["variant"] and rec["row_of_record"] == VARIANTS[target][0]
        for key, value in VARIANTS[target][1].items():
            assert rec["options"][key] == value, (key, rec["options"])
    else:
        assert rec["variant"] == "" and rec["options"]["variant"] == ""
    if target.startswith("keras"):                         # the training step's own first loss, checked too
        assert rec["checks"]["step_loss"]["ok"] and rec["checks"]["step_loss"]["rel_diff"] <= 1e-4
    fast = "--xla_backend_optimization_level=0"          # smoke on a CPU: XLA compiles with LLVM's optimisation off
    if target.startswith("jax") or target == "keras-jax":
        assert fast in rec["options"]["xla_flags"], rec["options"]["xla_flags"]
    elif target.startswith("keras"):
        assert fast not in str(rec["options"]["xla_flags"]), rec["options"]["xla_flags"]   # JAX's flag alone
    if (target.startswith("jax") or target == "keras-jax") and not gpus():
        assert rec["options"]["xla_autotune"] is None      # XLA's autotuning results: a GPU's (section 2)
    if target.startswith("jax"):
        xla = rec["options"]["xla_compilations"]
        assert xla["epoch"] == 0, xla                      # the timed pass compiles nothing
        unroll = rec["options"]["scan_unroll"]
        assert unroll > 1 if target == "jax+unroll" else unroll == 1, unroll


@pytest.mark.full
@pytest.mark.parametrize("target", [t for t in NAMES if t in VARIANTS and VARIANTS[t][0] in NAMES])
def test_variant_trains_like_its_row_of_record(smoke, target):
    """The variant changes how the step runs, not what it computes: its first losses are the row's."""
    mine, row = ok(smoke, target), ok(smoke, VARIANTS[target][0])
    a = np.array(mine["losses"]["warmup"] + mine["losses"]["train"])[:K_STEPS]
    b = np.array(row["losses"]["warmup"] + row["losses"]["train"])[:K_STEPS]
    assert len(a) == len(b) == K_STEPS
    assert (np.abs(a - b) / np.abs(b)).max() <= variant_rtol(target), (a.tolist(), b.tolist())
