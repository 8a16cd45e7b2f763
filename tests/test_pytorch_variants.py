"""The PyTorch notebook's speed variants beside its row of record, checked on the CPU.

- ``pytorch+bidir2``: each bd layer's two directions in one batched recurrence (``BatchedBiRNN``, section 4). Its
  math is held to ``nn.RNN`` in float64 (outputs and every gradient), its first K training steps to the row of
  record's, and section 6's probe must name the products it runs.
- ``pytorch+graphs``: the training step replayed from CUDA graphs (``GraphedTrainStep``, section 7). A CPU cannot
  capture: the notebook refuses the variant in one line in section 2 and ``run_all.py`` lists the row as not run
  with the reason (``runner/run/targets.py``). What is not CUDA-specific — the static buffers, one entry per batch
  shape, the eager first step of a shape, the eager CTC between the two replays, the captured step's
  ``zero_grad``/``backward``/``step`` — runs here through a stand-in for the capture that records a function and
  re-runs it at each replay (defined in this test only: the notebook has no capture but CUDA's, so no record says
  "graphs" for a run that did not capture). Its first K losses must equal the row's.
- ``pytorch+bidir2+graphs``: the two together (the batched recurrence inside the graphs), GPU-only as ``graphs``;
  through the same stand-in its first K losses must equal the row's.

The unit tests run the notebook's own cells in the PyTorch environment (the session's smoke run provides its
interpreter), on the smoke model, without running the notebook; the records of both rows come from the session's
smoke run in the full tier (tests/conftest.py), where tests/test_notebooks.py also holds every variant to its row.
"""
import ast
import json
import os

import numpy as np
import pytest

from runner.run.targets import ALL_TARGETS, variants_of
from tests.conftest import K_STEPS, ROOT, env_interpreter, full_targets, harness_result, selected_targets, variant_rtol

pytestmark = pytest.mark.skipif("pytorch" not in selected_targets(),
                                reason="pytorch is not among DS2_TEST_FRAMEWORKS")

NOTEBOOK = "notebooks/PyTorch_DS2.ipynb"
#: the harness's training steps: 3 shapes' first steps, then 4 replays (the notebook's own first K steps are the
#: smoke records', compared in the full tier)
STEPS = 7
VARIANT_TAGS = {"bidir2": "variant-bidir2", "graphs": "variant-graphs"}


def cells():
    with open(os.path.join(ROOT, NOTEBOOK)) as f:
        return json.load(f)["cells"]


def tagged(tag):
    return ["".join(c["source"]) for c in cells() if tag in c.get("metadata", {}).get("tags", [])]


def test_the_notebook_declares_the_runners_variants():
    (settings,) = tagged("rosetta:settings")
    declared = [ast.literal_eval(node.value) for node in ast.parse(settings).body if isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "VARIANTS" for t in node.targets)]
    runner = {t.parameters["variant"] for t in variants_of("pytorch")}
    assert set(declared[0]) == {""} | runner == {"", "compile", "graphs", "bidir2", "bidir2+graphs"}


def test_variant_code_stays_out_of_the_translation():
    """The translation (cells tagged ``translation``, extracted into docs/translations/ds2_pytorch.py) is the row of
    record's code: the new variants live in their own cells, tagged for the tests, not for the translation."""
    translation = "\n".join(tagged("translation"))
    for name in ("BatchedBiRNN", "BiRNNRecurrence", "batch_the_directions", "GraphedTrainStep", "CUDAGraph",
                 '"graphs"', '"bidir2"'):
        assert name not in translation, name
    for tag in VARIANT_TAGS.values():
        found = [c for c in cells() if tag in c.get("metadata", {}).get("tags", [])]
        assert found and all(c["cell_type"] == "code" and "translation" not in c["metadata"]["tags"]
                             and not any(t.startswith("rosetta:") for t in c["metadata"]["tags"]) for c in found), tag


def test_intro_is_short_and_links_the_spec():
    (intro,) = tagged("rosetta:intro")
    assert len(intro.splitlines()) <= 10, intro
    assert "../docs/benchmark.md#the-model" in intro and "1. Environment" in intro


def test_graphs_is_gpu_only_in_the_runner_and_bidir2_runs_on_a_cpu():
    graphs, bidir2 = ALL_TARGETS["pytorch+graphs"], ALL_TARGETS["pytorch+bidir2"]
    both = ALL_TARGETS["pytorch+bidir2+graphs"]
    assert graphs.variant_of == bidir2.variant_of == both.variant_of == "pytorch"
    for target in (graphs, both):
        for precision in ("fp32", "bf16", "tf32"):
            why = target.cpu_precision_reason(precision)
            assert why == target.gpu_only and "CUDA GPU" in why and "\n" not in why, why
            assert "variant %s needs" % target.parameters["variant"] in why, why
    assert bidir2.cpu_precision_reason("fp32") is None and bidir2.cpu_precision_reason("bf16") is None
    assert ALL_TARGETS["pytorch+compile"].gpu_only is None


#: runs in the PyTorch environment: the notebook's cells on the smoke model; prints RESULT <json>
HARNESS = r'''
import ast, contextlib, io, json, os, sys
sys.path.insert(0, os.getcwd())
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from common import parallel
from common.checks import check_param_count
from common.data import DeepMarkIterator
from common.spec import check_precision, check_skip, get_preset
from common.weights import canonical_state, load_state

K = int(sys.argv[2])
cells = [c for c in json.load(open(sys.argv[1]))["cells"] if c["cell_type"] == "code"]


def source(c):
    return "".join(c["source"]) if isinstance(c["source"], list) else c["source"]


def cell(tag, text=""):
    found = [source(c) for c in cells if tag in c["metadata"].get("tags", []) and text in source(c)]
    assert len(found) == 1, (tag, text, len(found))
    return found[0]


def definitions(source):
    """A cell's imports, classes, functions and constants, not the statements that run it."""
    tree = ast.parse(source)
    tree.body = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef))
                 or isinstance(s, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in s.targets)]
    return compile(tree, "definitions", "exec")


P = get_preset("smoke")
data = DeepMarkIterator(P.batch_size, P.scale, 0, lengths=P.lengths, n_freq=P.config.n_freq,
                        n_classes=P.config.n_classes)


def notebook(variant, precision="fp32"):
    """The notebook's sections 3-7 on the CPU: the model loaded with the canonical state, `variant`'s cells run."""
    torch.manual_seed(0)
    g = {"torch": torch, "nn": nn, "F": F, "np": np, "cfg": P.config, "dev": torch.device("cpu"),
         "dtype": torch.float32, "variant": variant, "precision": precision, "seed": 0, "init_weights": None,
         "canonical_state": canonical_state, "load_state": load_state, "check_param_count": check_param_count,
         "autocast": torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")}
    run = ("rosetta:model", "variant-bidir2", "rosetta:weights", "rosetta:loss", "rosetta:optimizer")
    with contextlib.redirect_stdout(io.StringIO()):
        exec(cell("rosetta:data", "def features_of"), g)
        for c in cells:                                    # sections 4-7 in notebook order
            if set(run) & set(c["metadata"].get("tags", [])):
                exec(source(c), g)
    exec(definitions(cell("variant-graphs", "class GraphedTrainStep")), g)   # its CUDA set-up: not on a CPU
    exec(definitions(cell("precision-probe")), g)
    return g


#: the steps: the short batch shapes (1 and 2 s), twice, then the first again: a shape's first step, then replays
SHORT = [b for b in data.warmup_batches() if b.seconds <= 2]
STEPS = (SHORT * 3)[:K]


def first_losses(g):
    return [float(g["train_step"](b)) for b in STEPS]


out = {}
# 1. BatchedBiRNN against nn.RNN in float64: outputs, final states and every gradient (a second bias too)
g = notebook("")
torch.manual_seed(1)
ref = nn.RNN(6, 5, nonlinearity="relu", bidirectional=True).double()
with torch.no_grad():
    for p in ref.parameters():
        p.add_(0.2)                                        # most units active: the chains carry gradient
var = nn.RNN(6, 5, nonlinearity="relu", bidirectional=True).double()
var.load_state_dict(ref.state_dict())
var.__class__ = g["BatchedBiRNN"]
x = torch.randn(11, 3, 6, dtype=torch.float64, requires_grad=True)
x2 = x.detach().clone().requires_grad_(True)
(y, h), (y2, h2) = ref(x), var(x2)
gy = torch.randn_like(y)
(y * gy).sum().backward()
(y2 * gy).sum().backward()
out["float64"] = {"y": (y - y2).abs().max().item(), "h_n": (h - h2).abs().max().item(),
                  "grad_x": (x.grad - x2.grad).abs().max().item(),
                  "grads": max((a.grad - b.grad).abs().max().item() for a, b in zip(ref.parameters(),
                                                                                      var.parameters())),
                  "active": (y > 0).double().mean().item(), "state_dict": list(var.state_dict()) == list(ref.state_dict())}
out["gradcheck"] = torch.autograd.gradcheck(
    g["BiRNNRecurrence"].apply, (torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True),
                                 torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True),
                                 (0.3 * torch.randn(2, 4, 4, dtype=torch.float64)).requires_grad_(),
                                 torch.randn(2, 4, dtype=torch.float64, requires_grad=True)))

# 2. the first K steps: the row of record, bidir2, and graphs through the CPU stand-in for the capture
row = notebook("")
out["row"] = first_losses(row)
bidir2 = notebook("bidir2")
out["bidir2"] = first_losses(bidir2)
out["bidir2_layers"] = sorted({type(layer.rnn).__name__ for layer in bidir2["model"].rnns})
out["bidir2_params"] = max((a - b).abs().max().item() / max(a.abs().max().item(), 1e-30)
                           for a, b in zip(row["model"].state_dict().values(), bidir2["model"].state_dict().values())
                           if a.is_floating_point())
out["bidir2_probe"] = {op: sorted(d) for op, d in bidir2["rnn_kernels"](data.batch(0)).items()}   # moves BN stats


def stand_in_capture(fn):
    """Not a CUDA graph: records fn and re-runs it at every replay (a capture runs nothing either); its outputs
    are those of the last replay, where a graph's are the tensors its replays write."""
    outputs = {}
    return (lambda: outputs.update(fn())), outputs


graphs = notebook("graphs")
graphs["train_step"] = step = graphs["GraphedTrainStep"](graphs["train_step"], stand_in_capture, graphs["autocast"])
out["graphs"] = first_losses(graphs)
out["graphs_book"] = {"shapes": len(step.graphs), "replays": step.replays, "captured_at": step.captured_at,
                      "steps": step.steps, "short_shapes": len(SHORT)}
out["graphs_params"] = max((a - b).abs().max().item() for a, b in zip(row["model"].state_dict().values(),
                                                                        graphs["model"].state_dict().values()))
both = notebook("bidir2+graphs")
both["train_step"] = step = both["GraphedTrainStep"](both["train_step"], stand_in_capture, both["autocast"])
out["both"] = first_losses(both)
out["both_layers"] = sorted({type(layer.rnn).__name__ for layer in both["model"].rnns})
out["both_book"] = {"shapes": len(step.graphs), "replays": step.replays, "captured_at": step.captured_at}

# 3. bf16: the bidir2 recurrence runs in bfloat16 (BatchRNN's copies), the probe says so
out["bidir2_bf16_probe"] = {op: sorted(d) for op, d in notebook("bidir2", "bf16")["rnn_kernels"](data.batch(0)).items()}

# 4. section 2 refuses graphs on a CPU, in one line, before any data or model
for variant in ("graphs", "bidir2+graphs"):
    for device in ("cpu", "auto"):
        g = {}
        with contextlib.redirect_stdout(io.StringIO()):
            exec(cell("rosetta:environment").replace('os.path.abspath("..")', "os.getcwd()"), g)
        exec(cell("parameters"), g)
        g.update(variant=variant, device=device)
        try:
            exec(cell("rosetta:settings"), g)
            out["refusal_%s_%s" % (variant, device)] = None
        except ValueError as e:
            out["refusal_%s_%s" % (variant, device)] = str(e)
            out["refused_before_data_%s_%s" % (variant, device)] = "train_data" not in g and "model" not in g
print("RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def harness(smoke, tmp_path_factory):
    """The harness's results (one run of the PyTorch environment for every unit test below)."""
    out = harness_result(env_interpreter(smoke, "pytorch"), HARNESS, tmp_path_factory.mktemp("pytorch_variants"),
                         NOTEBOOK, STEPS)
    print(json.dumps(out, indent=1))
    return out


def test_batched_directions_are_nn_rnn_in_float64(harness):
    f64 = harness["float64"]
    assert f64["state_dict"] and 0.3 < f64["active"] < 1.0, f64     # the same names; the ReLUs do cut
    assert max(f64["y"], f64["h_n"], f64["grad_x"], f64["grads"]) <= 1e-12, f64
    assert harness["gradcheck"] is True


def relative(a, b, k=K_STEPS):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape == (k,)
    return float(np.max(np.abs(a - b) / np.abs(b)))


def test_bidir2_trains_like_the_row_of_record(harness):
    assert harness["bidir2_layers"] == ["BatchedBiRNN"]
    assert len(set(np.round(harness["row"], 3))) == STEPS            # the losses move: not a vacuous comparison
    assert relative(harness["bidir2"], harness["row"], STEPS) <= variant_rtol("pytorch+bidir2")
    assert harness["bidir2_params"] <= 1e-4                          # after K steps, relative to each tensor's scale


def test_the_probe_names_the_batched_products(harness):
    assert harness["bidir2_probe"] == {"aten.addmm": ["float32"], "aten.baddbmm_": ["float32"]}
    assert harness["bidir2_bf16_probe"] == {"aten.addmm": ["bfloat16"], "aten.baddbmm_": ["bfloat16"]}


def test_graphs_bookkeeping_trains_like_the_row_of_record(harness):
    """The smoke data's three short batch shapes (1 s x 3, 2 s x 8, 2 s x 2), stepped in turn: the first three
    steps are eager first steps (each followed by a capture), the next ones replay."""
    book = harness["graphs_book"]
    assert book["short_shapes"] == book["shapes"] == 3 and book["captured_at"] == [1, 2, 3], book
    assert book["steps"] == STEPS and book["replays"] == STEPS - 3, book
    assert relative(harness["graphs"], harness["row"], STEPS) <= variant_rtol("pytorch+graphs")
    assert harness["graphs_params"] <= 1e-5, harness["graphs_params"]


def test_bidir2_in_the_graphs_trains_like_the_row_of_record(harness):
    """bidir2+graphs: the batched recurrence in every layer, stepped through the graphs' bookkeeping (the CPU
    stand-in for the capture), equals the row's first steps."""
    assert harness["both_layers"] == ["BatchedBiRNN"]
    assert harness["both_book"] == {"shapes": 3, "replays": STEPS - 3, "captured_at": [1, 2, 3]}, harness["both_book"]
    assert relative(harness["both"], harness["row"], STEPS) <= variant_rtol("pytorch+bidir2+graphs")


def test_the_notebook_refuses_graphs_on_a_cpu_in_one_line(harness):
    for variant in ("graphs", "bidir2+graphs"):
        for device in ("cpu", "auto"):
            message = harness["refusal_%s_%s" % (variant, device)]
            assert message and "\n" not in message and "CUDA GPU" in message and "%r" % variant in message, message
            assert harness["refused_before_data_%s_%s" % (variant, device)]


# ---- the records of the session's smoke run (full tier: the variant rows run there) --------------------------------
@pytest.mark.parametrize("target", full_targets(["pytorch+bidir2"]))
def test_bidir2_record_says_what_ran(smoke, target):
    rec, row = smoke.record(target), smoke.record("pytorch")
    assert rec["status"] == row["status"] == "ok", (rec["error"], row["error"])
    options = rec["options"]
    assert rec["variant"] == "both RNN directions in one batched recurrence" and rec["row_of_record"] == "pytorch"
    assert options["variant"] == "bidir2" and options["rnn"].startswith("BatchedBiRNN")
    assert options["rnn_kernel"] == "aten.addmm, aten.baddbmm_" and options["rnn_dtype"] == "float32"
    assert options["cuda_graphs"] is None and row["options"]["rnn"] == "nn.RNN"
    mine = (rec["losses"]["warmup"] + rec["losses"]["train"])[:K_STEPS]
    theirs = (row["losses"]["warmup"] + row["losses"]["train"])[:K_STEPS]
    assert relative(mine, theirs) <= variant_rtol(target)


@pytest.mark.parametrize("target", full_targets(["pytorch+graphs", "pytorch+bidir2+graphs"]))
def test_graphs_row_is_listed_as_not_run_on_a_cpu(smoke, target):
    rec = smoke.record(target)
    assert rec["status"] == "skipped" and rec["error"] == ALL_TARGETS[target].gpu_only, rec["error"]
    assert target in smoke.markdown()
