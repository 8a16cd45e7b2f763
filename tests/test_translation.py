"""The translations lifted out of each notebook (runner/rosetta/extract.py, ``python -m runner.rosetta --extract``). Each
notebook's committed ``docs/translations/ds2_<name>.py`` must be current (what ``--extract`` writes now), import
nothing from ``common/``, and hold only definitions in its notebook cells: importing it runs nothing and prints
nothing. Run as a script in its framework's environment (the kernel's interpreter under .venvs/; the Keras file once
per backend, ``KERAS_BACKEND``: torch in the default tier, jax and tensorflow too with ``--full``) at the smoke width,
on the canonical weights file that the session's smoke run of that row exported (its section 11:
results/weights/<record>.npz, trained for one epoch), its ``__main__`` block builds the model, loads the file, takes
one training step on its random batch and prints the loss: that loss -- before the update, with training-mode
BatchNorm -- must match the NumPy reference's (common/reference.py) from the same file on the same batch within the
first-loss tolerance of the CPU tests (tests/conftest.py FIRST_LOSS_RTOL).
"""
import ast
import json
import os
import re
import subprocess

import numpy as np
import pytest

from runner.rosetta import extract
from runner.envs.definitions import ENVS
from runner.run.targets import TARGETS
from tests.conftest import FIRST_LOSS_RTOL, ROOT, env_interpreter, selected_targets

#: runs in the framework's interpreter: argv = translation file, weights file. Imports the file (nothing may print),
#: then runs it as ``python FILE WEIGHTS`` does
HARNESS = r'''
import contextlib, io, runpy, sys
path, weights = sys.argv[1:3]
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    runpy.run_path(path, run_name="ds2_translation")
assert "common" not in sys.modules, "the translation imports common/"
assert printed.getvalue() == "", "importing the translation printed: %r" % printed.getvalue()[:500]
sys.argv = [path, weights]
runpy.run_path(path, run_name="__main__")
'''

#: names the notebook binds to its model, optimizer and step: a translation cell may define them only in a function
BUILT = {"model", "net", "optimizer", "trainer", "learner", "loss", "train_step", "step_model", "state"}
#: what belongs to the notebook's other cells: variants, profiling, export, checks, printing
NOT_TRANSLATION = re.compile(r"\bvariant\b|\bprofiler?\b|named_scope|\bexports?\.|\bexport_\w+\(|\bcheck_\w+\(|"
                             r"\.summary\(|\bprint\(|\bsync\b")


@pytest.mark.parametrize("name", extract.rows())
def test_translation_is_current_standalone_and_only_defines(name):
    path = extract.output_path(name)
    with open(path) as f:
        text = f.read()
    assert text == extract.render(name), "run: python -m runner.rosetta --extract %s" % name
    imports = re.findall(r"(?m)^\s*(?:from|import)\s+([\w.]+)", text)
    assert not [m for m in imports if m.split(".")[0] == "common"], imports
    cells = extract.translation_cells(extract.notebook_of(name))
    assert {"rosetta:model", "rosetta:weights", "rosetta:loss", "rosetta:optimizer"} <= {
        t for c in cells for t in c["tags"]}
    defined = set()
    for cell in cells:
        found = NOT_TRANSLATION.findall(cell["source"])
        assert not found, "%s cell %d: %s belongs in an untagged cell" % (name, cell["index"], sorted(set(found)))
        for node in ast.parse(cell["source"]).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            bound = {t.id for t in targets if isinstance(t, ast.Name)}
            assert not bound & BUILT, "%s cell %d builds %s at import" % (name, cell["index"], bound & BUILT)
            assert not isinstance(node, (ast.If, ast.For, ast.While, ast.With, ast.Try)), (
                "%s cell %d runs a statement at import (line %d)" % (name, cell["index"], node.lineno))
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
    assert "BatchRNN" in defined, "%s: the bidirectional layer is BatchRNN in every framework" % name
    assert {"load_canonical"} <= defined, name
    assert "def train_step" in text and "__main__" in text


def reference_first_loss(weights):
    """The NumPy reference's loss of the ``__main__`` block's batch (the same seed and shapes) from ``weights``."""
    from common import reference
    from common.spec import SMOKE_MODEL
    from common.weights import load_state
    rng = np.random.RandomState(0)
    features = rng.standard_normal((2, 200, SMOKE_MODEL.n_freq)).astype(np.float32)
    labels = rng.randint(1, SMOKE_MODEL.n_classes, size=(2, 10)).astype(np.int32)
    return reference.ds2_loss(load_state(weights, SMOKE_MODEL), features, labels, SMOKE_MODEL)


#: the rows whose translation runs in the full tier only: Keras's one file runs on the torch backend by default (the
#: quickest); on jax and tensorflow it is the same code, about 10 s each
FULL_TIER_ROWS = ("keras-jax", "keras-tensorflow")


@pytest.mark.parametrize("row", [pytest.param(r, marks=pytest.mark.full) if r in FULL_TIER_ROWS else r
                                 for r in TARGETS if r in sum(map(extract.targets_of, extract.rows()), [])])
def test_translation_loads_an_export_and_takes_the_first_step_like_the_reference(row, tmp_path, smoke):
    if row not in selected_targets():
        pytest.skip("%s is not among DS2_TEST_FRAMEWORKS" % row)
    target = TARGETS[row]
    python = env_interpreter(smoke, row)      # the environment the session's smoke run used
    export = smoke.record(row).get("export") or {}
    weights = export.get("path") and (export["path"] if os.path.isabs(export["path"])
                                      else os.path.join(ROOT, export["path"]))
    assert weights and os.path.exists(weights), "the smoke run of %s exported no weights file: %s" % (row, export)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu",
               TF_CPP_MIN_LOG_LEVEL="2", DS2_WIDTH="smoke")
    env.pop("DS2_WEIGHTS", None)
    venv = os.path.dirname(os.path.dirname(python))
    if ENVS[target.env].kernel_env:
        env.update(ENVS[target.env].kernel_env(venv))
    if "backend" in target.parameters:
        env["KERAS_BACKEND"] = target.parameters["backend"]
    harness = tmp_path / "harness.py"
    harness.write_text(HARNESS)
    path = extract.output_path(extract.name_of(row))
    proc = subprocess.run([python, str(harness), path, weights], cwd=str(tmp_path), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "weights: %s" % weights in proc.stdout, proc.stdout[-2000:]
    found = re.findall(r"(?m)^one training step, loss (\S+)$", proc.stdout)
    assert len(found) == 1, proc.stdout[-2000:]
    loss, ref = float(found[0]), reference_first_loss(weights)
    rel = abs(loss - ref) / abs(ref)
    print(row, json.dumps({"weights": os.path.basename(weights), "loss": loss, "reference": ref, "rel_diff": rel}))
    assert rel <= FIRST_LOSS_RTOL, (loss, ref, rel)
