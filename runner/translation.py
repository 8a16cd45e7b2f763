"""The translation, lifted out of each notebook: its model, CTC loss and training step as one standalone .py file.

Every notebook tags the cells that hold the model, the loss and one training step (and the small cell that converts
a batch to the framework) with the cell tag ``translation``. ``python -m runner.rosetta --extract ROW`` writes those
cells, in notebook order, to ``docs/translations/ds2_<row>.py`` under a generated preamble:

- the framework's and NumPy's imports, nothing from ``common/``;
- the DS2 configuration as literal values (``common/spec.py``'s full model, or its smoke width with
  ``DS2_WIDTH=smoke``), with the few derived sizes the cells use;
- the single-process, CPU, fp32 values of the notebook settings the cells read (the notebook's settings cell
  computes them there);

and a ``__main__`` block that takes one step on a random batch. The cells are the notebook's own text: there is
one copy of the model code, in the notebook. Rows are run_all.py's rows of record (``runner/targets.py``); the
Keras 3 notebook gives three, one per backend.
"""
import inspect
import json
import os
import textwrap
from collections import OrderedDict
from dataclasses import fields
from typing import Dict, List

from common.spec import FULL_MODEL, SMOKE_MODEL, DS2Config

from .bootstrap import ROOT
from .targets import TARGETS

TAG = "translation"
OUTPUT_DIR = os.path.join(ROOT, "docs", "translations")

#: the derived sizes of DS2Config that the cells use, copied into the file from common/spec.py's own source
DERIVED = ("conv_out", "freq_after_conv1", "freq_after_conv2", "rnn_input_width", "time_stride", "time_after_conv1",
           "output_length", "rnn_input_widths")

#: per row: the imports and the notebook settings its cells read (single process, CPU, fp32), and how to read the
#: loss off what ``train_step`` returns
ROWS = OrderedDict([
    ("pytorch", {
        "preamble": '''import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

variant = ""                                          # eager torch.nn, the row of record
dev, dtype = torch.device("cpu"), torch.float32       # the notebook: cuda when there is a GPU; fp64 for the control
autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=False)   # on for precision bf16
''',
        "loss": "float(out)"}),
    ("tensorflow", {
        "preamble": '''import keras
import numpy as np
import tensorflow as tf
from keras import layers

jit_compile = False                                   # True: the xla variant
''',
        "loss": "float(out[0])"}),
    ("mxnet", {
        "preamble": '''import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn, rnn

ctx = mx.cpu()                                        # the notebook: mx.gpu(0) when there is a GPU
''',
        "after_model": "net.hybridize(static_alloc=True)   # the notebook does this after loading the weights",
        "loss": "float(out.asscalar())"}),
    ("jax", {
        "preamble": '''import operator

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

seed = 0                                              # the weights' seed (the notebook loads the canonical ones)
scan_unroll = 1                                       # the unroll variant: 2
compute_dtype = jnp.float32                           # bfloat16 for precision bf16
''',
        "loss": "float(out)"}),
])


def _cntk_preamble() -> str:
    """CNTK's cells also read the frames per second, the mean output frames of a minibatch (the notebook's
    iterator; here its value for the full model's deepmark preset and for smoke) and common/labels.py's CTC label
    encoding (copied here from its source)."""
    from common import labels
    from common.data import DeepMarkIterator
    from common.spec import FRAMES_PER_SECOND, get_preset
    frames = {}
    for width, preset in (("full", "deepmark"), ("smoke", "smoke")):
        P = get_preset(preset)
        data = DeepMarkIterator(P.batch_size, P.scale, 0, n_freq=P.config.n_freq, n_classes=P.config.n_classes,
                                lengths=P.lengths)
        frames[width] = data.audio_seconds * P.config.output_length(FRAMES_PER_SECOND) / len(data)
    return '''import math

import cntk as C
import numpy as np

dev = C.device.cpu()                                  # the notebook: a GPU when CNTK sees one
C.device.try_set_default_device(dev)
on_gpu = fused = False                                # fused: optimized_rnnstack (cuDNN), GPU only
FRAMES_PER_SECOND = %d
#: the mean output frames of a minibatch, from the notebook's iterator (deepmark preset; smoke)
frames_per_minibatch = %r[os.environ.get("DS2_WIDTH", "full")]


%s''' % (FRAMES_PER_SECOND, frames, inspect.getsource(labels.frame_labels).rstrip())


ROWS["cntk"] = {"preamble": _cntk_preamble, "loss": "float(out)"}
for _backend in ("jax", "tensorflow", "torch"):
    ROWS["keras-" + _backend] = {
        "preamble": ('backend = "%s"' % _backend).ljust(54) + '''# jax | tensorflow | torch: the notebook's parameter
os.environ["KERAS_BACKEND"] = backend                 # read once, at the first import of keras
import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers, ops  # noqa: E402

jit_compile = "auto"                                  # the backend's default; True: the xla variant (TensorFlow)
''',
        "loss": "float(out)"}

ROWS = OrderedDict((row, ROWS[row]) for row in TARGETS if row in ROWS)     # run_all.py's order


def rows() -> List[str]:
    return list(ROWS)


def notebook_of(row: str) -> str:
    return TARGETS[row].notebook_path


def output_path(row: str) -> str:
    """docs/translations/ds2_<row>.py (a file named jax.py or mxnet.py would shadow its framework when run)."""
    return os.path.join(OUTPUT_DIR, "ds2_%s.py" % row.replace("-", "_"))


def translation_cells(path: str) -> List[dict]:
    """The notebook's cells tagged ``translation``, in order: {"index", "tags", "source"}."""
    with open(path) as f:
        nb = json.load(f)
    out = []
    for i, cell in enumerate(nb["cells"]):
        tags = cell.get("metadata", {}).get("tags", [])
        if TAG in tags:
            if cell["cell_type"] != "code":
                raise ValueError("%s: cell %d is tagged %r but is not code" % (path, i, TAG))
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            out.append({"index": i, "tags": [t for t in tags if t.startswith("rosetta:")], "source": source.strip("\n")})
    return out


def _values(config: DS2Config) -> str:
    """``dict(n_freq=161, ...)``, wrapped to lines of at most 110 characters."""
    text = "dict(%s)," % ", ".join("%s=%r" % (f.name, getattr(config, f.name)) for f in fields(config))
    return "\n".join(textwrap.wrap(text, 110, initial_indent="    ", subsequent_indent="        "))


def config_source() -> str:
    """The DS2 configuration as literal values and the derived sizes the cells use (common/spec.py's own code)."""
    methods = []
    for name in DERIVED:
        member = inspect.getattr_static(DS2Config, name)
        methods.append(inspect.getsource(member.fget if isinstance(member, property) else member).rstrip())
    return "\n".join([
        "from typing import Tuple  # noqa: E402  (the derived sizes' annotations)",
        "",
        "#: common/spec.py's DS2 configuration (FULL_MODEL) and its smoke width (SMOKE_MODEL), as literal values",
        "CONFIGS = {",
        "    \"full\": %s" % _values(FULL_MODEL).lstrip(),
        "    \"smoke\": %s" % _values(SMOKE_MODEL).lstrip(),
        "}",
        "",
        "",
        "class DS2Config:",
        "    \"\"\"Every number of the DS2 model, its loss and its optimizer (common/spec.py), and the sizes derived "
        "from them.\"\"\"",
        "",
        "    def __init__(self, **values):",
        "        self.__dict__.update(values)",
        "",
        "\n\n".join(methods),
        "",
        "",
        "cfg = DS2Config(**CONFIGS[os.environ.get(\"DS2_WIDTH\", \"full\")])",
    ])


MAIN = '''

if __name__ == "__main__":             # one step on a random batch: 2 utterances of 2 s (200 frames), 10 labels
    class Batch:
        def __init__(self, features, labels):
            self.features, self.labels = features, labels
            self.batch_size, self.frames = features.shape[0], features.shape[1]

    rng = np.random.RandomState(0)
    batch = Batch(rng.standard_normal((2, 200, cfg.n_freq)).astype(np.float32),
                  rng.randint(1, cfg.n_classes, size=(2, 10)).astype(np.int32))
    out = train_step(batch)
    print("one training step, loss %%.6f" %% %s)
'''


def render(row: str) -> str:
    """The standalone file of ``row``: header, preamble, configuration, the notebook's translation cells."""
    spec = ROWS[row]
    path = notebook_of(row)
    rel = os.path.relpath(path, ROOT)
    cells = translation_cells(path)
    if not cells:
        raise ValueError("%s has no cell tagged %r" % (rel, TAG))
    header = '''"""DS2 in %s: the model, the CTC loss and one training step.

Lifted out of %s: its cells tagged `translation`, written here by
`python -m runner.rosetta --extract %s`. Do not edit; edit the notebook. Standalone: the framework and NumPy
only. The preamble holds what the notebook's other cells compute: the DS2 configuration (common/spec.py) as
literal values, and the single-process CPU fp32 settings.

    python %s                   # the full model: one step on a random batch
    DS2_WIDTH=smoke python %s   # the same at the smoke width

The notebook then loads the canonical weights (its section 5) and checks the first loss against the NumPy
reference; tests/test_translation.py does the same with this file.
"""
''' % (TARGETS[row].label, rel, row, os.path.relpath(output_path(row), ROOT), os.path.relpath(output_path(row), ROOT))
    preamble = spec["preamble"]() if callable(spec["preamble"]) else spec["preamble"]
    parts = [header, "import os", "", preamble.strip("\n"), "", "", config_source(), ""]
    for cell in cells:
        parts += ["", "# %%%% %s cell %d (%s)" % (os.path.basename(path), cell["index"], ", ".join(cell["tags"])),
                  cell["source"], ""]
        if "rosetta:model" in cell["tags"] and spec.get("after_model"):
            parts += ["", "# %% (not a notebook cell)", spec["after_model"], ""]
    return "\n".join(parts).rstrip("\n") + "\n" + MAIN % spec["loss"]


def render_all() -> Dict[str, str]:
    return OrderedDict((output_path(r), render(r)) for r in ROWS if os.path.exists(notebook_of(r)))
