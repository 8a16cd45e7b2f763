"""The JAX notebook's variant ``hoist`` (row ``jax+hoist``): the bd layers' input projection x_t W + b of every time
step as one matrix product before the scan, the scan left with h U. Its variant ``bidir2`` (row ``jax+bidir2``): the
same hoisting, then both directions in one scan, their h U one batched product per step, and dL/dU after it (a
jax.custom_vjp). Same model code, parameters and loss as the row of record (section 4 of
notebooks/JAX_Flax_DS2.ipynb).  And its variant ``graphs`` (row ``jax+graphs``, a CUDA GPU only): section 2's
settings cell, which adds the flag that puts the scans' loops in XLA's command buffers before JAX starts, and
refuses the variant without a GPU, run here without JAX (tests/notebook_cells.py).

In the default tier, for hoist and bidir2:

- the notebook's own cells (model, variant, names) in the JAX environment on the smoke model, without running the
  notebook: the three models have the same state (names and shapes); bd1's forward and backward give the same
  value and gradients, and their compiled program says where the input products are -- inside the scan's ``while``
  bodies in the row of record (XLA does not hoist them by itself), outside them in ``hoist`` and ``bidir2`` -- how
  many loops there are: ``bidir2`` has half the row of record's (one scan per layer, forward and gradient) -- and
  where dL/dU is summed: inside the gradient's loop, step by step, in the row of record and ``hoist`` (autodiff of
  the scan), after it in ``bidir2`` (its ``jax.custom_vjp``).

In the full tier, a smoke run of each (the session's smoke run, which has every variant) against the row of record's:
the first-loss check, the first 10 losses within ``variant_rtol``, every shape compiled ahead of time in the warm-up
and nothing in the timed pass; tests/test_notebooks.py, tests/test_notebook_parameters_jax_keras.py and
tests/test_onnx.py hold both to what they hold every variant to."""

import types

import numpy as np
import pytest

from common import compile_cache
from runner.run.targets import ALL_TARGETS
from tests.conftest import (FIRST_LOSS_RTOL, K_STEPS, env_interpreter, harness_result, ok_record as ok,
                            selected_targets, variant_rtol)
from tests.notebook_cells import Touched, settings_until_framework

pytestmark = pytest.mark.skipif("jax" not in selected_targets(), reason="jax is not among DS2_TEST_FRAMEWORKS")

NOTEBOOK = "notebooks/JAX_Flax_DS2.ipynb"
def first_losses(rec):
    return np.array((rec["losses"]["warmup"] + rec["losses"]["train"])[:K_STEPS])


#: what each variant's record says of the recurrence: (a word of its description, its directions' option)
SAYS = {"jax+hoist": ("hoisted", "two scans"), "jax+bidir2": ("one scan", "one scan")}


@pytest.mark.full     # as every variant's run: the default tier checks the layers cell by cell (below)
@pytest.mark.parametrize("target", sorted(SAYS))
def test_hoisted_variants_train_like_the_row_of_record(smoke, target):
    rec, row = ok(smoke, target), ok(smoke, "jax")
    word, directions = SAYS[target]
    assert rec["row_of_record"] == "jax" and word in rec["variant"], rec["variant"]
    options = rec["options"]
    assert options["variant"] == target.split("+")[1] and options["scan_unroll"] == 1, options
    assert options["input_projection"].startswith("hoisted") and options["directions"].startswith(directions), options
    assert row["options"]["input_projection"].startswith("in the scan"), row["options"]
    assert row["options"]["directions"].startswith("two scans"), row["options"]
    assert rec["checks"]["loss"]["ok"] and rec["checks"]["loss"]["rel_diff"] <= FIRST_LOSS_RTOL, rec["checks"]["loss"]
    assert rec["checks"]["loss"]["framework"] == pytest.approx(row["checks"]["loss"]["framework"],
                                                               rel=variant_rtol(target))
    mine, theirs = first_losses(rec), first_losses(row)
    assert len(mine) == len(theirs) == K_STEPS and len(set(theirs.round(3))) > 5
    rel = np.abs(mine - theirs) / np.abs(theirs)
    assert rel.max() <= variant_rtol(target), (rel.max(), mine.tolist(), theirs.tolist())
    assert rec["data"]["checksum"] == row["data"]["checksum"]
    xla = options["xla_compilations"]                    # the ahead-of-time warm-up works for the variant too
    assert xla["warmup"] == row["options"]["xla_compilations"]["warmup"] > 0 and xla["epoch"] == 0, xla


#: runs in the JAX environment: the notebook's section-4 cells (model, variants, names) on the smoke model, then bd1's
#: forward and backward compiled in either variant; prints RESULT <json>
HARNESS = r'''
import json, os, re, sys
sys.path.insert(0, os.getcwd())
import operator
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from common.spec import get_preset

jax.config.update("jax_default_matmul_precision", "float32")
cells = [c for c in json.load(open(sys.argv[1]))["cells"] if c["cell_type"] == "code"]


P = get_preset("smoke")
cfg = P.config
g = {"jax": jax, "jnp": jnp, "nnx": nnx, "operator": operator, "cfg": cfg,
     "compute_dtype": jnp.float32, "seed": 0, "variant": "", "scan_unroll": 1}
for source in [c["source"] for c in cells if "rosetta:model" in c["metadata"].get("tags", [])]:   # section 4
    exec("".join(source), g)
assert {"BatchRNN", "HoistedBidirectional", "BatchedBidirectional", "build_model"} <= set(g), sorted(g)
x = jax.random.normal(jax.random.key(0), (8, 25, cfg.rnn_input_width))   # bd1's input: 8 utterances of 1 s


@nnx.jit
def step(layer, x):
    """bd1's forward and backward on its own (the rest of the model has no scan)."""
    return nnx.value_and_grad(lambda layer: (layer(x) ** 2).mean())(layer)


def products(hlo):
    """Every dot of the compiled program: (its result's and operands' shapes, whether it is in a while loop's body)."""
    shapes, comp_of, calls, bodies, dots, comp = {}, {}, {}, [], [], None
    for line in hlo.splitlines():
        m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if m and " = " not in line:
            comp = m.group(1)
            continue
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+)(.*)", line)
        if not m:
            continue
        name, shape, rest = m.groups()
        shapes[name], comp_of[name] = shape, comp
        calls.setdefault(comp, set()).update(re.findall(r"(?:calls|body|condition|to_apply)=%([\w.\-]+)", rest))
        bodies += re.findall(r"body=%([\w.\-]+)", rest)
        dot = re.search(r" dot\(([^)]*)\)", rest)
        if dot:
            dots.append([name] + re.findall(r"%([\w.\-]+)", dot.group(1)))
    in_loops, todo = set(), list(bodies)
    while todo:
        c = todo.pop()
        if c not in in_loops:
            in_loops.add(c)
            todo += list(calls.get(c, ()))
    return [([shapes.get(n, "") for n in d], comp_of[d[0]] in in_loops) for d in dots]


def input_products(hlo, width):
    """(dots touching `width` in a while loop's body, such dots elsewhere), by their result and operand shapes."""
    touching = [in_loop for dot, in_loop in products(hlo) if any(re.search(r"[\[,]%d[\],]" % width, s) for s in dot)]
    return [t for t in touching if t], [t for t in touching if not t]


def weight_gradient_products_in_loops(hlo, hidden):
    """Dots in a loop's body whose result is an (H, H) matrix, or a stack of them: dL/dU summed step by step."""
    square = r"\[(\d+,)?%d,%d\]" % (hidden, hidden)
    return sum(in_loop and bool(re.search(square, dot[0])) for dot, in_loop in products(hlo))


out = {}
for variant in ("", "hoist", "bidir2"):
    g["variant"] = variant
    model = g["build_model"](nnx.Rngs(0))
    layer = model.rnns.layers[0]
    loss, grads = step(layer, x)
    hlo = step.lower(layer, x).compile().as_text()
    inside, outside = input_products(hlo, cfg.rnn_input_width)
    out[variant or "row"] = {
        "layer": type(layer.rnn).__name__, "loss": float(loss),
        "grads": {".".join(map(str, k)): np.asarray(v[...]).tolist() for k, v in nnx.to_flat_state(grads)},
        "state": sorted("%s %s" % (".".join(map(str, k)), v.shape) for k, v in nnx.to_flat_state(nnx.state(model))),
        "input_dots_in_loops": len(inside), "input_dots_outside": len(outside),
        "loops": len(re.findall(r" while\(", hlo)),
        "weight_dots_in_loops": weight_gradient_products_in_loops(hlo, cfg.rnn_hidden),
        "scopes": sorted(s for s in ("batchnorm", "rnn", "rnn_input", "rnn_recurrence") if "/%s/" % s in hlo
                         or "(%s)" % s in hlo)}
print("RESULT " + json.dumps(out))
'''


def test_hoist_and_bidir2_move_the_input_products_out_of_the_loop_and_compute_the_same(smoke, tmp_path):
    out = harness_result(env_interpreter(smoke, "jax"), HARNESS, tmp_path, NOTEBOOK)
    row = out["row"]
    assert row["layer"] == "Bidirectional" and any(".dense_i.kernel" in s for s in row["state"])
    assert (out["hoist"]["layer"], out["bidir2"]["layer"]) == ("HoistedBidirectional", "BatchedBidirectional")
    # the row of record: XLA leaves bd1's input products (x_t W, and the gradients' products with x_t and W) inside
    # the scan's loop, one per time step, and runs a loop per direction forward and another in the gradient
    assert row["input_dots_in_loops"] >= 3 and row["loops"] == 4, row
    # autodiff of the scan sums dL/dU inside the gradient's loop: a product per step and direction
    assert row["weight_dots_in_loops"] >= 2 and out["hoist"]["weight_dots_in_loops"] >= 2, out
    for variant in ("hoist", "bidir2"):
        v = out[variant]
        assert v["state"] == row["state"] and v["loss"] == pytest.approx(row["loss"], rel=1e-6), variant
        assert sorted(v["grads"]) == sorted(row["grads"])
        for name in row["grads"]:
            a, b = np.array(row["grads"][name]), np.array(v["grads"][name])
            assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max() + 1e-12, (variant, name)
        # none inside the loops: the whole sequence's products before and after them
        assert v["input_dots_in_loops"] == 0 and v["input_dots_outside"] >= 3, v
        # the names the profile adds up (notebook section 4) reach the compiled program in each
        assert v["scopes"] == row["scopes"] == ["batchnorm", "rnn", "rnn_input", "rnn_recurrence"], (variant, v, row)
    # hoist keeps a scan per direction; bidir2 runs both directions in one, forward and in the gradient, and takes
    # dL/dU after the gradient's loop (its jax.custom_vjp)
    assert out["hoist"]["loops"] == row["loops"] and out["bidir2"]["loops"] == row["loops"] // 2, out
    assert out["bidir2"]["weight_dots_in_loops"] == 0, out["bidir2"]


# ---- graphs: the scans' loops in XLA's command buffers, on a CUDA GPU only ----------------------------------------
GPU = dict(nvidia_smi_gpus=lambda: [{"name": "NVIDIA H100 80GB HBM3"}], preset="quick",
           jaxlib=types.SimpleNamespace(__version__="0.0.0"))       # a jaxlib without autotuning results here


def test_graphs_sets_the_loop_graphs_flag_before_jax_starts_on_a_gpu():
    """Section 2 adds the flag to XLA_FLAGS before the first question to JAX (where the cell reaches the framework);
    the row of record on the same GPU has no such flag."""
    environ, stop = settings_until_framework("JAX_Flax_DS2.ipynb", variant="graphs", **GPU)
    assert isinstance(stop, Touched) and "jax" in str(stop), repr(stop)
    assert compile_cache.LOOP_GRAPHS_FLAG in environ["XLA_FLAGS"].split()
    environ, stop = settings_until_framework("JAX_Flax_DS2.ipynb", variant="", **GPU)
    assert isinstance(stop, Touched) and compile_cache.COMMAND_BUFFER_FLAG not in environ.get("XLA_FLAGS", "")


@pytest.mark.parametrize("given", [dict(device="cpu"), dict(device="auto", nvidia_smi_gpus=lambda: [])],
                         ids=["device-cpu", "no-gpu"])
def test_graphs_is_refused_without_a_gpu_in_one_line_before_jax_starts(given):
    environ, stop = settings_until_framework("JAX_Flax_DS2.ipynb", variant="graphs", **given)
    assert isinstance(stop, ValueError) and "\n" not in str(stop), repr(stop)
    assert "needs a CUDA GPU" in str(stop) and "command buffers" in str(stop) and environ == {}
    why = ALL_TARGETS["jax+graphs"].cpu_precision_reason("fp32")          # run_all.py lists the row as not run
    assert why == ALL_TARGETS["jax+graphs"].gpu_only and "CUDA GPU" in why and "command buffers" in why
