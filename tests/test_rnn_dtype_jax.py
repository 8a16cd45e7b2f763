"""In which dtype the JAX notebook's RNN runs: probed in the program, not inferred from the logits.

Section 6 of notebooks/JAX_Flax_DS2.ipynb traces the loss's gradient for the check batch's shapes
(``jax.make_jaxpr``) and collects every matrix product inside the RNN's scans with its operands' dtypes and its
precision; it stops when their dtype is not the layers' compute dtype, and the record carries
``options.rnn_dtype`` and ``options.rnn_products``.

The unit test runs the notebook's own cells (model, loss, the check's functional loss, the probe) in the JAX
environment on the smoke model: float32 in fp32, bfloat16 in bf16, 24 products (2 bd layers x 2 directions x 6),
and the probe's stop when a model's dtype is not the one the precision asks for. The records are the session's
smoke run (fp32) and, in the full tier, its bf16 runs."""

import pytest

from common.spec import get_preset
from tests.conftest import env_interpreter, full_targets, harness_result, ok_record, selected_targets

pytestmark = pytest.mark.skipif("jax" not in selected_targets(), reason="jax is not among DS2_TEST_FRAMEWORKS")

NOTEBOOK = "notebooks/JAX_Flax_DS2.ipynb"

#: runs in the JAX environment: sections 4 and 6 of the notebook on the smoke model, then the probe cell for a model
#: of each compute dtype, and once for a float32 model while the run asks for bfloat16; prints RESULT <json>
HARNESS = r'''
import json, operator, os, sys
sys.path.insert(0, os.getcwd())
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from common.data import DeepMarkIterator
from common.spec import get_preset

cells = [c for c in json.load(open(sys.argv[1]))["cells"] if c["cell_type"] == "code"]
source = lambda c: c["source"] if isinstance(c["source"], str) else "".join(c["source"])
tagged = lambda tag: [source(c) for c in cells if tag in c["metadata"].get("tags", [])]
P = get_preset("smoke")
cfg = P.config
g = {"jax": jax, "jnp": jnp, "nnx": nnx, "optax": optax, "operator": operator, "cfg": cfg, "seed": 0,
     "variant": "", "scan_unroll": 1, "compute_dtype": jnp.float32}
for code in tagged("rosetta:model") + tagged("rosetta:loss"):           # sections 4 and 6
    exec(code, g)
check = tagged("rosetta:check")[0]
exec(check[:check.index("\ncheck_batch = ")], g)                        # the check's functional loss, not its run
g["check_batch"] = DeepMarkIterator(P.batch_size, P.scale, 0, lengths=P.lengths, n_freq=cfg.n_freq).batch(0)
(probe,) = tagged("precision-probe")
out = {}
for name, dtype in (("fp32", jnp.float32), ("bf16", jnp.bfloat16)):
    g.update(compute_dtype=dtype, precision=name)
    g["model"] = g["DeepSpeech2"](cfg, dtype, nnx.Rngs(0))
    exec(probe, g)
    out[name] = {"rnn_dtype": g["rnn_dtype"], "count": len(g["rnn_products"]), "precision": g["rnn_precision"]}
g.update(compute_dtype=jnp.bfloat16, precision="bf16")                  # a float32 model where bf16 is asked for
g["model"] = g["DeepSpeech2"](cfg, jnp.float32, nnx.Rngs(0))
try:
    exec(probe, g)
    out["mismatch"] = None
except RuntimeError as e:
    out["mismatch"] = str(e)
print("RESULT " + json.dumps(out))
'''


def test_the_probe_reads_the_rnn_dtype_from_the_program_and_stops_on_a_mismatch(smoke, tmp_path):
    out = harness_result(env_interpreter(smoke, "jax"), HARNESS, tmp_path, NOTEBOOK)
    layers = len(get_preset("smoke").config.rnn_input_widths())
    for name, dtype in (("fp32", "float32"), ("bf16", "bfloat16")):
        assert out[name]["rnn_dtype"] == dtype, out
        assert out[name]["count"] == layers * 2 * 6, out     # per direction: x_t W, h U; four in the gradient
        assert len(out[name]["precision"]) == 1, out
    assert out["mismatch"] and "float32 operands, not the layers' compute dtype bfloat16" in out["mismatch"], out


@pytest.mark.parametrize("target", full_targets(["jax", "jax+unroll", "jax+hoist", "jax+bidir2"]))
def test_fp32_record_says_the_rnn_ran_in_float32(smoke, target):
    options = ok_record(smoke, target, "fp32")["options"]
    assert options["rnn_dtype"] == "float32" and options["compute_dtype"] == "float32", options
    assert options["rnn_products"]["count"] > 0 and options["rnn_products"]["precision"], options


@pytest.mark.full
def test_bf16_record_says_the_rnn_ran_in_bfloat16(smoke_bf16):
    options = ok_record(smoke_bf16, "jax", "bf16")["options"]
    assert options["rnn_dtype"] == "bfloat16" and options["compute_dtype"] == "bfloat16", options
