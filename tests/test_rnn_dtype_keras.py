"""In which dtype the Keras 3 notebook's RNN runs: probed in SimpleRNNCell's steps, not inferred from the logits.

Section 6 of notebooks/Keras3_DS2.ipynb wraps ``SimpleRNNCell.call`` during one training-mode forward of the check
batch and records the dtypes of each step's input, state and output; it stops when they are not the dtype policy's
compute dtype, and the record carries ``options.rnn_dtype``.

The unit test runs the notebook's own cells (model, loss, check, probe) on the torch backend (eager: no compiling) on
the smoke model: float32 under the float32 policy, bfloat16 under ``mixed_bfloat16``, and the probe's stop for the
float32 model once the policy asks for bfloat16. The records are the session's smoke run (fp32, every backend) and, in the full
tier, its bf16 runs."""

import pytest

from tests.conftest import env_interpreter, harness_result, ok_record, selected_targets

KERAS_ROWS = [t for t in ("keras-jax", "keras-torch", "keras-tensorflow") if t in selected_targets()]
pytestmark = pytest.mark.skipif(not KERAS_ROWS, reason="no Keras row among DS2_TEST_FRAMEWORKS")

NOTEBOOK = "notebooks/Keras3_DS2.ipynb"

#: runs in the PyTorch environment with Keras on torch: sections 4 and 6 of the notebook on the smoke model (the check's
#: reference loss stubbed and its run left out: the probe is under test), the probe for a float32 model, for the same
#: model once the policy is mixed_bfloat16, and for a model built under mixed_bfloat16; prints RESULT <json>
HARNESS = r'''
import json, os, sys
sys.path.insert(0, os.getcwd())
os.environ["KERAS_BACKEND"] = "torch"
import keras
from keras import layers, ops
from common.data import DeepMarkIterator
from common.spec import get_preset

cells = [c for c in json.load(open(sys.argv[1]))["cells"] if c["cell_type"] == "code"]
source = lambda c: c["source"] if isinstance(c["source"], str) else "".join(c["source"])
tagged = lambda tag: [source(c) for c in cells if tag in c["metadata"].get("tags", [])]
P = get_preset("smoke")
cfg = P.config


class Stub:
    ds2_loss = staticmethod(lambda *args: 65.5)


g = {"keras": keras, "layers": layers, "ops": ops, "cfg": cfg, "state": None, "reference": Stub,
     "train_data": DeepMarkIterator(P.batch_size, P.scale, 0, lengths=P.lengths, n_freq=cfg.n_freq)}
(model_code,) = [c for c in tagged("rosetta:model") if "def build_model" in c]
exec(model_code, g)
for code in tagged("rosetta:loss"):
    exec(code, g)
(probe,) = tagged("precision-probe")
check = tagged("rosetta:check")[0]
exec(check[:check.index("\nfirst_loss = ")], g)                          # check_batch, first_batch_loss
original, out = layers.SimpleRNNCell.call, {}
for name, policy, build in (("fp32", "float32", True), ("mismatch", "mixed_bfloat16", False),
                            ("bf16", "mixed_bfloat16", True)):
    keras.config.set_dtype_policy(policy)
    if build:
        g["model"] = g["build_model"]()
    g["precision"] = name
    try:
        exec(probe, g)
        out[name] = g["rnn_dtype"]
    except RuntimeError as e:
        out[name] = "stopped: %s" % e
    assert layers.SimpleRNNCell.call is original                     # the probe put the class's call back
print("RESULT " + json.dumps(out))
'''


@pytest.mark.skipif("keras-torch" not in KERAS_ROWS, reason="keras-torch is not among DS2_TEST_FRAMEWORKS")
def test_the_probe_reads_the_cells_dtypes_and_stops_on_a_mismatch(smoke, tmp_path):
    out = harness_result(env_interpreter(smoke, "keras-torch"), HARNESS, tmp_path, NOTEBOOK)
    assert out["fp32"] == "float32" and out["bf16"] == "bfloat16", out
    assert out["mismatch"].startswith("stopped: the RNN's steps ran in float32, not the dtype policy's compute dtype "
                                      "bfloat16"), out


@pytest.mark.parametrize("target", KERAS_ROWS)
def test_fp32_record_says_the_rnn_ran_in_float32(smoke, target):
    options = ok_record(smoke, target, "fp32")["options"]
    assert options["rnn_dtype"] == "float32" and options["dtype_policy"] == "float32", options


@pytest.mark.full
@pytest.mark.parametrize("target", KERAS_ROWS)
def test_bf16_record_says_the_rnn_ran_in_bfloat16(smoke_bf16, target):
    options = ok_record(smoke_bf16, target, "bf16")["options"]
    assert options["rnn_dtype"] == "bfloat16" and options["dtype_policy"] == "mixed_bfloat16", options
