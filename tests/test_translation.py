"""The translation lifts out of each notebook (runner/translation.py, ``python -m runner.rosetta --extract``).

Each row's committed ``docs/translations/ds2_<row>.py`` is run in its framework's environment (the kernel's
interpreter under .venvs/) at the smoke width: its cells build the model, the notebook's own section-5 cell loads
the canonical initial weights (common/weights.py canonical_state) right after the model cell, as in the notebook,
and the file's ``train_step`` takes the first batch of the shared iterator (common/data.py). Its loss -- computed
before the update, from the canonical weights, with training-mode BatchNorm -- must match the NumPy reference
(common/reference.py) within the notebooks' own first-loss tolerance (common/checks.py check_loss, fp32).
The files must be current (what ``--extract`` writes now) and import nothing from ``common/``.
"""
import json
import os
import re
import subprocess

import pytest

from runner import translation
from runner.targets import ENVS, TARGETS
from tests.conftest import ROOT, env_interpreter, selected_targets

#: runs in the framework's interpreter: argv = translation file, notebook, expression of the loss in ``out``
HARNESS = r'''
import json, os, re, sys
root = os.getcwd()
sys.path.insert(0, root)
path, notebook, loss_expr = sys.argv[1:4]
os.environ["DS2_WIDTH"] = "smoke"
from dataclasses import fields

with open(notebook) as f:
    cells = json.load(f)["cells"]
weights = ["".join(c["source"]) for c in cells if "rosetta:weights" in c.get("metadata", {}).get("tags", [])]
assert len(weights) == 1, "one rosetta:weights cell"
with open(path) as f:
    text = f.read()
starts = [m.start() for m in re.finditer(r"(?m)^# %% ", text)] + [len(text)]
g = {"__name__": "ds2_translation", "__file__": path}
ran_weights = False
for a, b in zip([0] + starts[:-1], starts):
    chunk = "\n" * text[:a].count("\n") + text[a:b]          # the file's own line numbers in tracebacks
    exec(compile(chunk, path, "exec"), g)
    if a == 0:                                                 # header, imports, configuration
        assert "common" not in sys.modules, "the translation imports common/"
        from common import reference
        from common.checks import check_loss, check_param_count
        from common.data import DeepMarkIterator
        from common.spec import SMOKE_MODEL, get_preset
        from common.weights import canonical_state, load_state
        cfg = g["cfg"]
        assert all(getattr(cfg, f.name) == getattr(SMOKE_MODEL, f.name) for f in fields(SMOKE_MODEL))
        assert cfg.rnn_input_widths() == SMOKE_MODEL.rnn_input_widths()
    if "rosetta:model" in text[a:b].split("\n", 1)[0]:         # the notebook's section 5, as in the notebook
        g.update(canonical_state=canonical_state, load_state=load_state, check_param_count=check_param_count,
                 init_weights=None, seed=0, workers=1, hybridize=False, static_shape=False)
        g["cfg"] = SMOKE_MODEL
        exec(compile(weights[0], notebook + " (rosetta:weights)", "exec"), g)
        g["cfg"] = cfg
        ran_weights = True
assert ran_weights, "no rosetta:model cell in the translation"
P = get_preset("smoke")
batch = DeepMarkIterator(P.batch_size, P.scale, 0, n_freq=SMOKE_MODEL.n_freq, n_classes=SMOKE_MODEL.n_classes).batch(0)
out = g["train_step"](batch)
loss = eval(loss_expr, {"out": out})
ref = reference.ds2_loss(canonical_state(SMOKE_MODEL, 0), batch.features, batch.labels, SMOKE_MODEL)
print("RESULT " + json.dumps(check_loss(loss, ref, "fp32")))
'''


@pytest.mark.parametrize("row", translation.rows())
def test_translation_is_current_and_standalone(row):
    path = translation.output_path(row)
    with open(path) as f:
        text = f.read()
    assert text == translation.render(row), "run: python -m runner.rosetta --extract %s" % row
    imports = re.findall(r"(?m)^\s*(?:from|import)\s+([\w.]+)", text)
    assert not [m for m in imports if m.split(".")[0] == "common"], imports
    cells = translation.translation_cells(translation.notebook_of(row))
    assert {"rosetta:model", "rosetta:loss", "rosetta:optimizer"} <= {t for c in cells for t in c["tags"]}


@pytest.mark.parametrize("row", translation.rows())
def test_translation_takes_the_first_step_like_the_reference(row, tmp_path, smoke):
    if row not in selected_targets():
        pytest.skip("%s is not among DS2_TEST_FRAMEWORKS" % row)
    target = TARGETS[row]
    python = env_interpreter(smoke, row)      # the environment the session's smoke run used
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu",
               TF_CPP_MIN_LOG_LEVEL="2")
    venv = os.path.dirname(os.path.dirname(python))
    if ENVS[target.env].kernel_env:
        env.update(ENVS[target.env].kernel_env(venv))
    harness = tmp_path / "harness.py"
    harness.write_text(HARNESS)
    proc = subprocess.run([python, str(harness), translation.output_path(row), translation.notebook_of(row),
                           translation.ROWS[row]["loss"]], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith("RESULT ")][-1][7:])
    print(row, result)
    assert result["ok"] and result["rel_diff"] <= result["rtol"], result
