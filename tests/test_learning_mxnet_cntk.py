"""The real task's labels in MXNet and CNTK (their notebooks' section 12b): every utterance of a batch has its own label
length, and each framework's CTC takes it -- Gluon's ``CTCLoss`` through ``label_lengths``, CNTK's
``forward_backward`` through per-frame labels, each utterance's cut to its length (``common.labels.frame_labels``).

The loss of a batch whose labels are padded past their lengths (as ``common.corpus`` makes them: 0, up to
``T/4 - 5``) must equal the NumPy reference's, computed utterance by utterance on the unpadded labels. The check runs
the notebook's own cells (its translation, ``runner/rosetta/extract.py``, rendered from the notebook as it is now) in the
framework's environment at the smoke width; an environment that is not there is made first
(``tests.conftest.cpu_env``).
"""
import json
import os
import subprocess

import numpy as np
import pytest

from common import reference
from common.spec import SMOKE_MODEL
from common.weights import canonical_state
from runner.rosetta import extract
from runner.envs.definitions import ENVS
from runner.run.targets import TARGETS

from .conftest import FIRST_LOSS_RTOL, cpu_env, selected_targets


# ---- the notebooks' CTC on padded labels against the NumPy reference ------------------------------------------------
#: runs in the framework's interpreter: argv = the translation rendered from the notebook, the batch (.npz); prints
#: one JSON line, the batch's mean training-mode loss (and MXNet's per-utterance losses)
HARNESS = r'''
import json, runpy, sys, warnings
from collections import namedtuple
warnings.filterwarnings("ignore")
import numpy as np
path, data = sys.argv[1:3]
g = runpy.run_path(path, run_name="ds2_translation")
cfg, state = g["cfg"], g["canonical_state"](g["cfg"], 0)
z = np.load(data)
Batch = namedtuple("Batch", "features labels label_lengths frames batch_size")
batch = Batch(z["features"], z["labels"], z["label_lengths"], z["features"].shape[1], z["features"].shape[0])
other = batch._replace(labels=np.where(z["labels"] == 0, 5, z["labels"]).astype(np.int32))   # another padding
if "to_device" in g:                                                   # MXNet
    net = g["DeepSpeech2"](cfg)
    net.initialize(ctx=g["ctx"])
    g["load_canonical"](net, state)

    def losses(b):
        x, targets = g["to_device"](b)
        with g["autograd"].train_mode():
            return g["ds2_loss"](net(x), targets).asnumpy()
    out = {"mean": float(losses(batch).mean()), "losses": losses(batch).tolist(),
           "other_padding": float(losses(other).mean())}
else:                                                                  # CNTK
    model = g["DeepSpeech2"](g["features"], g["labels"])
    g["load_canonical"](model, state)
    loss = g["ds2_loss"](model, g["labels"])

    def mean_loss(b):
        _, values = loss.forward(g["minibatch"](b), outputs=[loss.output], keep_for_backward=[loss.output])
        return float(values[loss.output])
    out = {"mean": mean_loss(batch), "other_padding": mean_loss(other)}
print("RESULT " + json.dumps(out))
'''


def padded_batch():
    """4 utterances of 120 frames (30 output frames), labels of 20, 12, 5 and 1 symbols padded with 0 to 25."""
    rng = np.random.RandomState(7)
    lengths = np.array([20, 12, 5, 1], np.int32)
    labels = np.zeros((4, 25), np.int32)
    for n, length in enumerate(lengths):
        labels[n, :length] = rng.randint(1, SMOKE_MODEL.n_classes, size=length)
    features = rng.standard_normal((4, 120, SMOKE_MODEL.n_freq)).astype(np.float32)
    return features, labels, lengths


def reference_losses(features, labels, lengths):
    state = canonical_state(SMOKE_MODEL, 0)
    logits = reference.forward(state, features, SMOKE_MODEL, training=True)       # (T/4, N, 29)
    return [float(reference.ctc_loss(logits[:, n:n + 1], labels[n:n + 1, :length], blank=SMOKE_MODEL.blank)[0])
            for n, length in enumerate(lengths)]


@pytest.mark.parametrize("row", ["mxnet", "cntk"])
def test_ctc_with_label_lengths_matches_the_reference(row, tmp_path):
    if row not in selected_targets():
        pytest.skip("%s is not among DS2_TEST_FRAMEWORKS" % row)
    venv, python = cpu_env(row)
    source = tmp_path / ("ds2_%s.py" % row)
    source.write_text(extract.render(extract.name_of(row)))
    features, labels, lengths = padded_batch()
    np.savez(str(tmp_path / "batch.npz"), features=features, labels=labels, label_lengths=lengths)
    harness = tmp_path / "harness.py"
    harness.write_text(HARNESS)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", CUDA_VISIBLE_DEVICES="", DS2_WIDTH="smoke")
    if ENVS[TARGETS[row].env].kernel_env:
        env.update(ENVS[TARGETS[row].env].kernel_env(venv))
    proc = subprocess.run([python, str(harness), str(source), str(tmp_path / "batch.npz")], cwd=str(tmp_path),
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    result = json.loads(proc.stdout.split("RESULT ")[-1])
    ref = reference_losses(features, labels, lengths)
    print(row, json.dumps({"loss": result["mean"], "reference": float(np.mean(ref))}))
    assert result["mean"] == pytest.approx(float(np.mean(ref)), rel=FIRST_LOSS_RTOL)
    if "losses" in result:
        assert result["losses"] == pytest.approx(ref, rel=FIRST_LOSS_RTOL)
    # the lengths are read, not the padding: padded with a symbol (5) instead of 0, the loss is the same
    assert result["other_padding"] == pytest.approx(result["mean"], rel=1e-6)
