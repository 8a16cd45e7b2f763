"""The translation, lifted out of each notebook: its model, the canonical weights' loading, the CTC loss and one
training step as one standalone .py file.

Every notebook tags the cells that define the model, its canonical weights' name map, the loss and one training step
(and the small cell that converts a batch to the framework) with the cell tag ``translation``; those cells only
define (classes, functions, constants): the notebook builds the model, loads the weights, checks and times in its
untagged cells. ``python -m runner.rosetta --extract NAME`` writes the cells, in notebook order, to
``docs/translations/ds2_<name>.py`` between a generated preamble and a ``__main__`` block:

- the framework's and NumPy's imports, nothing from ``common/``, and the few single-process CPU fp32 settings the
  cells read (the notebook's settings cell computes them there);
- the DS2 configuration as a ``@dataclass`` (``common/spec.py``'s own fields, the full model's values as defaults,
  its smoke width with ``DS2_WIDTH=smoke``) with the derived sizes the cells use and the canonical state's names and
  shapes;
- reading a canonical weights file (the ``.npz`` each notebook exports, ``common/exports.py``), and
  ``common/weights.py``'s random canonical initial state for a run without one;

and the ``__main__`` block: build the model, load the weights (a path from argv or ``DS2_WEIGHTS``), take one step on
a random batch, print the loss. Importing the file runs nothing. The cells are the notebook's own text: there is one
copy of the model code, in the notebook. One file per notebook: ``ds2_keras.py`` serves the three Keras 3 rows, its
backend picked by ``KERAS_BACKEND``.
"""
import inspect
import json
import os
from collections import OrderedDict
from dataclasses import fields
from typing import Dict, List

from common.spec import FULL_MODEL, SMOKE_MODEL, DS2Config

from runner.base import ROOT
from runner.run.targets import TARGETS

TAG = "translation"
OUTPUT_DIR = os.path.join(ROOT, "docs", "translations")

#: the members of DS2Config the files carry, copied from common/spec.py's own source: the derived sizes the cells
#: use, and the canonical state's names and shapes (what a weights file holds)
DERIVED = ("conv_out", "freq_after_conv1", "freq_after_conv2", "rnn_input_width", "time_stride", "time_after_conv1",
           "output_length", "rnn_input_widths", "param_shapes", "bn_names", "running_stat_shapes", "state_shapes")

#: per file: the run_all.py rows it serves, its title, the imports and notebook settings its cells read (single
#: process, CPU, fp32), how ``__main__`` builds the model, loads ``state`` into it and makes ``train_step``, and how
#: to read the loss off what ``train_step`` returns
ROWS = OrderedDict([
    ("pytorch", {
        "targets": ["pytorch"],
        "preamble": '''import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

dev, dtype = torch.device("cpu"), torch.float32       # the notebook: cuda when there is a GPU; fp64 for the control
autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=False)   # on for precision bf16
''',
        "build": '''model = DeepSpeech2(cfg).to(dev, dtype)
load_canonical(model, state)
train_step = make_train_step(model, sgd(model))''',
        "loss": "float(out)"}),
    ("tensorflow", {
        "targets": ["tensorflow"],
        "preamble": '''import keras
import numpy as np
import tensorflow as tf
from keras import layers
''',
        "build": '''model = deepspeech2(cfg)
load_canonical(model, state)
train_step = make_train_step(model, sgd(model))''',
        "loss": "float(out[0])"}),
    ("mxnet", {
        "targets": ["mxnet"],
        "preamble": '''import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn, rnn

ctx = mx.cpu()                                        # the notebook: mx.gpu(0) when there is a GPU
''',
        "build": '''net = DeepSpeech2(cfg)
net.initialize(ctx=ctx)
load_canonical(net, state)
net.hybridize(static_alloc=True)                    # one cached graph per input shape
train_step = make_train_step(net, sgd(net))''',
        "loss": "float(out.asscalar())"}),
    ("jax", {
        "targets": ["jax"],
        "preamble": '''import operator

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

compute_dtype = jnp.float32                           # bfloat16 for precision bf16
''',
        "build": '''model = DeepSpeech2(cfg, compute_dtype, nnx.Rngs(0))
load_canonical(model, state)
train_step = make_train_step(model, sgd(model))''',
        "loss": "float(out)"}),
    ("keras", {
        "targets": ["keras-jax", "keras-torch", "keras-tensorflow"],
        "label": "Keras 3 (any backend)",
        "preamble": '''os.environ.setdefault("KERAS_BACKEND", "jax")   # jax | tensorflow | torch: read when keras is imported
import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers, ops  # noqa: E402
''',
        "build": '''model = build_model()
load_canonical(model, state)
compile_for_training(model)
train_step = make_train_step(model)''',
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

fused = False                                         # optimized_rnnstack (cuDNN): the notebook's choice on a GPU
FRAMES_PER_SECOND = %d
#: the mean output frames of a minibatch, from the notebook's iterator (deepmark preset; smoke)
frames_per_minibatch = %r[os.environ.get("DS2_WIDTH", "full")]


%s''' % (FRAMES_PER_SECOND, frames, inspect.getsource(labels.frame_labels).rstrip())


ROWS["cntk"] = {"targets": ["cntk"], "preamble": _cntk_preamble,
                "build": '''model = DeepSpeech2(features, labels)
load_canonical(model, state)
loss = ds2_loss(model, labels)
train_step = make_train_step(model, loss, sgd(model.parameters))''',
                "loss": "float(out)"}
ROWS = OrderedDict((name, ROWS[name]) for name in [r.split("-")[0] for r in TARGETS] if name in ROWS)   # as run_all


def rows() -> List[str]:
    """The translations' names: pytorch, tensorflow, ..., keras (one per notebook)."""
    return list(ROWS)


def targets_of(name: str) -> List[str]:
    """The run_all.py rows that translation ``name`` serves (keras: its three backends)."""
    return list(ROWS[name]["targets"])


def name_of(target: str) -> str:
    """The translation that serves the run_all.py row ``target``."""
    return next(name for name in ROWS if target in ROWS[name]["targets"])


def notebook_of(name: str) -> str:
    return TARGETS[ROWS[name]["targets"][0]].notebook_path


def label_of(name: str) -> str:
    return ROWS[name].get("label") or TARGETS[ROWS[name]["targets"][0]].label


def output_path(name: str) -> str:
    """docs/translations/ds2_<name>.py (a file named jax.py or mxnet.py would shadow its framework when run)."""
    return os.path.join(OUTPUT_DIR, "ds2_%s.py" % name.replace("-", "_"))


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


def _smoke_values() -> str:
    """``dict(conv_channels=4, ...)``: the smoke width's values that differ from the full model's."""
    diff = ["%s=%r" % (f.name, getattr(SMOKE_MODEL, f.name)) for f in fields(DS2Config)
            if getattr(SMOKE_MODEL, f.name) != getattr(FULL_MODEL, f.name)]
    return "dict(%s)" % ", ".join(diff)


def config_source() -> str:
    """The DS2 configuration as a dataclass: common/spec.py's own fields (the full model's values as defaults) and
    the members the files use (its own code), then ``cfg``, at the smoke width with ``DS2_WIDTH=smoke``."""
    source = inspect.getsource(DS2Config)
    fields_part = source.split("    # ---- derived", 1)[0].rstrip()
    methods = []
    for name in DERIVED:
        member = inspect.getattr_static(DS2Config, name)
        methods.append(inspect.getsource(member.fget if isinstance(member, property) else member).rstrip())
    return "\n".join([
        "# %% The DS2 configuration: common/spec.py's, the full model's values, and the sizes derived from them",
        fields_part,
        "",
        "\n\n".join(methods),
        "",
        "",
        "#: common/spec.py's smoke width (SMOKE_MODEL): the same model, narrower",
        "SMOKE = %s" % _smoke_values(),
        "cfg = DS2Config(**SMOKE) if os.environ.get(\"DS2_WIDTH\") == \"smoke\" else DS2Config()",
    ])


def weights_source() -> str:
    """Reading a canonical weights file, and common/weights.py's canonical initial state (its own code)."""
    from common import weights
    return "\n".join([
        "# %% Canonical weights: the .npz every notebook exports (section 11: results/weights/<record>.npz), float32",
        "# arrays under cfg.state_shapes()'s names in the layouts of common/weights.py, the same for every framework",
        '''def read_weights(path, config=cfg):
    """{canonical name: float32 array} from a canonical .npz, every name of ``config``'s state with its shape."""
    with np.load(path) as f:
        state = {name: f[name] for name in f.files}
    for name, shape in config.state_shapes().items():
        found = state[name].shape if name in state else "missing"
        if found != tuple(shape):
            raise ValueError("%s: %s is %s, this model's is %s (a smoke run's weights need DS2_WIDTH=smoke)"
                             % (path, name, found, tuple(shape)))
    return state''',
        "",
        "",
        "#: common/weights.py: random initial weights in the canonical format (no file given)",
        inspect.getsource(weights.fan_in).rstrip(),
        "",
        "",
        inspect.getsource(weights.canonical_weights).rstrip(),
        "",
        "",
        inspect.getsource(weights.canonical_state).rstrip(),
    ])


MAIN = '''

if __name__ == "__main__":      # build, load the weights, one step on a random batch (2 utterances, 2 s, 10 labels)
    class Batch:
        """A batch as common/data.py's iterator yields it: features (N, T, 161), labels (N, L) in 1..28, every
        label's length L."""

        def __init__(self, features, labels):
            self.features, self.labels = features, labels
            self.batch_size, self.frames = features.shape[0], features.shape[1]
            self.label_lengths = np.full(features.shape[0], labels.shape[1], np.int32)

    path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DS2_WEIGHTS")
    if path:
        try:
            state = read_weights(path)
        except (OSError, ValueError) as e:
            sys.exit("%%s: %%s" %% (os.path.basename(sys.argv[0]), e))
        print("weights:", path)
    else:
        state = canonical_state(cfg, seed=0)
        print("weights: none given (argv[1] or DS2_WEIGHTS): RANDOM canonical initial weights, seed 0, untrained")
%s
    rng = np.random.RandomState(0)
    batch = Batch(rng.standard_normal((2, 200, cfg.n_freq)).astype(np.float32),
                  rng.randint(1, cfg.n_classes, size=(2, 10)).astype(np.int32))
    out = train_step(batch)
    print("one training step, loss %%.6f" %% %s)
'''


def render(name: str) -> str:
    """The standalone file of ``name``: header, preamble, configuration, weights file, the notebook's translation
    cells, ``__main__``."""
    spec = ROWS[name]
    path = notebook_of(name)
    rel = os.path.relpath(path, ROOT)
    cells = translation_cells(path)
    if not cells:
        raise ValueError("%s has no cell tagged %r" % (rel, TAG))
    out = os.path.relpath(output_path(name), ROOT)
    commands = [("python %s WEIGHTS.npz" % out, "or DS2_WEIGHTS=WEIGHTS.npz"),
                ("python %s" % out, "no file: random canonical initial weights"),
                ("DS2_WIDTH=smoke python %s WEIGHTS.npz" % out, "the smoke width")]
    if name == "keras":
        commands.append(("KERAS_BACKEND=torch python %s WEIGHTS.npz" % out, "jax (default) | tensorflow | torch"))
    width = max(len(c) for c, _ in commands)
    usage = ["%s   # %s" % (c.ljust(width), why) for c, why in commands]
    header = '''"""DS2 in %s: the model, its canonical weights, the CTC loss and one training step.

Generated from %s (its cells tagged `translation`) by
`python -m runner.rosetta --extract %s`: edit the notebook, not this file. Needs the framework and NumPy only.

    %s

Importing it runs nothing. A canonical weights file is what every notebook exports after its timed epoch
(results/weights/<record>.npz): the same names and layouts for every framework, so any notebook's file loads here.
tests/test_translation.py runs this file on a smoke run's export and holds its loss to the NumPy reference's.
"""
''' % (label_of(name), rel, name, "\n    ".join(usage))
    preamble = spec["preamble"]() if callable(spec["preamble"]) else spec["preamble"]
    parts = [header, "import os\nimport sys\nfrom dataclasses import dataclass\nfrom typing import Dict, Tuple", "",
             preamble.strip("\n"), "", "", config_source(), "", "", weights_source(), ""]
    for cell in cells:
        parts += ["", "# %%%% %s cell %d (%s)" % (os.path.basename(path), cell["index"], ", ".join(cell["tags"])),
                  cell["source"], ""]
    build = "\n".join("    " + line for line in spec["build"].splitlines())
    return "\n".join(parts).rstrip("\n") + "\n" + MAIN % (build, spec["loss"])


def render_all() -> Dict[str, str]:
    return OrderedDict((output_path(r), render(r)) for r in ROWS if os.path.exists(notebook_of(r)))
