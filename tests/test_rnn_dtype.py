"""In which dtype the PyTorch notebook's RNN runs: probed, not inferred from the logits.

Autocast's cuDNN RNN computes in float16 whatever dtype autocast was given, and the logits' dtype cannot show it
(the last linear layers give bfloat16 back). The notebook's section 6 therefore probes the RNN below autocast (a
``TorchDispatchMode`` switched on inside each ``nn.RNN``) and its record carries ``options.rnn_kernel``,
``options.rnn_dtype`` and ``options.precision_note`` (None when the RNN ran in the dtype the precision promises).
Under bf16 the notebook's ``BatchRNN`` runs ``nn.RNN`` on bfloat16 copies of its fp32 parameters, autocast off.

On a CPU ``aten.rnn_relu`` is composite: the probe names its matrix products, ``aten.addmm``. The records are the
session's smoke runs (fp32, the float64 control) and a bf16 run of the pytorch row (in the full tier the session's
bf16 run of every row, which includes it). The unit test runs the notebook's own cells (model, probe) in the
PyTorch environment on the smoke model, without running the notebook."""
import json

import pytest

from tests.conftest import env_interpreter, full_targets, full_tier, harness_result, lane_run, selected_targets

pytestmark = pytest.mark.skipif("pytorch" not in selected_targets(),
                                reason="pytorch is not among DS2_TEST_FRAMEWORKS")

NOTEBOOK = "notebooks/PyTorch_DS2.ipynb"


@pytest.fixture(scope="module")
def bf16(request, lane_runs):
    """The pytorch row in bf16: in the full tier the session's bf16 run (every row with a CPU bf16 path), else a
    run of this row alone, its training only (a CPU without bf16 instructions, such as an AVX2-only AMD EPYC, takes
    minutes over the forward-only timing in bf16), made in tests/conftest.py's lanes beside the learning short
    run."""
    if full_tier():
        return request.getfixturevalue("smoke_bf16")
    return lane_run(lane_runs, "pytorch_bf16")          # made beside the learning short run (tests/conftest.py)


def ok_record(run, target, precision):
    rec = run.record(target, precision)
    assert rec["status"] == "ok", "%s %s failed: %s" % (target, precision, rec["error"])
    return rec


def assert_rnn(rec, dtype):
    options = rec["options"]
    assert options["rnn_dtype"] == dtype, options
    assert options["rnn_kernel"] == "aten.addmm", options      # a CPU: the products of the composite aten.rnn_relu
    assert options["precision_note"] is None, options


@pytest.mark.parametrize("target", full_targets(["pytorch", "pytorch+compile"]))
def test_fp32_record_says_the_rnn_ran_in_float32(smoke, target):
    assert_rnn(ok_record(smoke, target, "fp32"), "float32")


def test_bf16_record_says_the_rnn_ran_in_bfloat16(bf16):
    rec = ok_record(bf16, "pytorch", "bf16")
    assert_rnn(rec, "bfloat16")
    assert rec["options"]["autocast_bf16"] is True
    assert rec["checks"]["loss"]["ok"], rec["checks"]["loss"]


def test_fp64_control_record_says_the_rnn_ran_in_float64(smoke_fp64):
    assert_rnn(ok_record(smoke_fp64, "pytorch", "fp64"), "float64")


#: runs in the PyTorch environment: the notebook's model, features_of and probe cells (the probe cell's definitions
#: only, not the statements that run it) on the smoke model; prints RESULT <json>
HARNESS = r'''
import ast, json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from torch import nn
from common.data import DeepMarkIterator
from common.spec import get_preset

cells = [c for c in json.load(open(sys.argv[1]))["cells"] if c["cell_type"] == "code"]


def cell(tag, text):
    sources = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells
               if tag in c["metadata"].get("tags", [])]
    found = [s for s in sources if text in s]
    assert len(found) == 1, (tag, text, len(found))
    return found[0]


P = get_preset("smoke")
g = {"torch": torch, "nn": nn, "cfg": P.config, "dev": torch.device("cpu"), "dtype": torch.float32, "variant": ""}
exec(cell("rosetta:model", "class BatchRNN"), g)
g["model"] = g["DeepSpeech2"](g["cfg"]).to(g["dev"], g["dtype"])      # as the notebook's next (untagged) cell builds it
exec(cell("rosetta:data", "def features_of"), g)
probe = ast.parse(cell("precision-probe", "class RNNProbe"))
probe.body = [s for s in probe.body if isinstance(s, (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef))
              or isinstance(s, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in s.targets)]
exec(compile(probe, "the probe cell", "exec"), g)
batch = DeepMarkIterator(P.batch_size, P.scale, 0, lengths=P.lengths, n_freq=P.config.n_freq,
                         n_classes=P.config.n_classes).batch(0)
out = {}
for case, enabled, bf16 in (("fp32", False, True), ("bf16", True, True), ("bf16, autocast's RNN", True, False)):
    g["autocast"] = torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)
    g["BatchRNN"].bf16 = bf16
    out[case] = {op: sorted(dtypes) for op, dtypes in g["rnn_kernels"](batch).items()}
g["BatchRNN"].bf16 = True
with g["RNNProbe"]() as probe:                         # on, but no nn.RNN running: records nothing
    nn.Linear(4, 4)(torch.randn(2, 4))
out["outside an nn.RNN"] = probe.kernels
model, rnn = g["model"], g["model"].rnns[0].rnn
with torch.autocast("cpu", dtype=torch.bfloat16):
    logits = model(g["features_of"](batch))
logits.float().sum().backward()
out["master weights"] = {"logits": str(logits.dtype), "weight": str(rnn.weight_hh_l0.dtype),
                         "grad": str(rnn.weight_hh_l0.grad.dtype), "grad_nonzero": bool(rnn.weight_hh_l0.grad.any()),
                         "bias_hh_grad": rnn.bias_hh_l0.grad is None}
cases = [({"aten._cudnn_rnn": {"float16"}}, "bf16"), ({"aten._cudnn_rnn": {"bfloat16"}}, "bf16"),
         ({"aten._cudnn_rnn": {"float32"}, "aten.addmm": {"float32"}}, "tf32"), ({"aten.addmm": {"float32"}}, "bf16"),
         ({"aten.addmm": {"bfloat16", "float32"}}, "bf16"), ({"aten.addmm": {"float64"}}, "fp64"),
         ({"aten.mm": {"float32"}, "aten.addmm": {"float32"}}, "fp32")]
out["rnn_precision"] = [g["rnn_precision"](kernels, precision) for kernels, precision in cases]
print("RESULT " + json.dumps(out))
'''


def test_the_probe_sees_the_rnn_below_autocast(smoke, tmp_path):
    """The notebook's probe and its report, on the CPU: fp32 -> float32 products; bf16 -> bfloat16 (the notebook's
    bf16 RNN, and also autocast's own RNN on a CPU, where autocast casts each product to bfloat16: it is cuDNN's
    autocast kernel that computes in float16); nothing outside an nn.RNN; bf16 training keeps fp32 parameters with
    fp32 gradients; what a GPU's fp16 RNN, a mix of dtypes or the control would report."""
    out = harness_result(env_interpreter(smoke, "pytorch"), HARNESS, tmp_path, NOTEBOOK)
    print(json.dumps(out, indent=1))
    assert out["fp32"] == {"aten.addmm": ["float32"]}
    assert out["bf16"] == {"aten.addmm": ["bfloat16"]}
    assert out["bf16, autocast's RNN"] == {"aten.addmm": ["bfloat16"]}
    assert out["outside an nn.RNN"] == {}
    assert out["master weights"] == {"logits": "torch.bfloat16", "weight": "torch.float32", "grad": "torch.float32",
                                     "grad_nonzero": True, "bias_hh_grad": True}
    assert out["rnn_precision"] == [
        ["aten._cudnn_rnn", "float16", "RNN fp16 (bf16 requested)"],
        ["aten._cudnn_rnn", "bfloat16", None],
        ["aten._cudnn_rnn", "float32", None],            # a fused kernel is named alone
        ["aten.addmm", "float32", "RNN fp32 (bf16 requested)"],
        ["aten.addmm", "bfloat16+float32", "RNN bf16+fp32 (bf16 requested)"],
        ["aten.addmm", "float64", None],
        ["aten.addmm, aten.mm", "float32", None],
    ]
