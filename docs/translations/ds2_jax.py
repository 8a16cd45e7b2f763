"""DS2 in JAX (Flax NNX): the model, its canonical weights, the CTC loss and one training step.

Generated from notebooks/JAX_Flax_DS2.ipynb (its cells tagged `translation`) by
`python -m runner.rosetta --extract jax`: edit the notebook, not this file. Needs the framework and NumPy only.

    python docs/translations/ds2_jax.py WEIGHTS.npz                   # or DS2_WEIGHTS=WEIGHTS.npz
    python docs/translations/ds2_jax.py                               # no file: random canonical initial weights
    DS2_WIDTH=smoke python docs/translations/ds2_jax.py WEIGHTS.npz   # the smoke width

Importing it runs nothing. A canonical weights file is what every notebook exports after its timed epoch
(results/weights/<record>.npz): the same names and layouts for every framework, so any notebook's file loads here.
tests/test_translation.py runs this file on a smoke run's export and holds its loss to the NumPy reference's.
"""

import os
import sys
from dataclasses import dataclass
from typing import Dict, Tuple

import operator

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

compute_dtype = jnp.float32                           # bfloat16 for precision bf16


# %% The DS2 configuration: common/spec.py's, the full model's values, and the sizes derived from them
@dataclass(frozen=True)
class DS2Config:
    """Every number of the DS2 model, its loss and its optimizer.

    Frameworks differ in conventions (BatchNorm momentum, padding, RNN layouts); the
    values here are in the spec's convention and each notebook translates them.
    """

    # input
    n_freq: int = 161                   # spectrogram bins (frequency axis)
    # convolutions, axes (frequency, time)
    conv_channels: int = 32
    conv1_kernel: Tuple[int, int] = (5, 20)
    conv1_stride: Tuple[int, int] = (2, 2)
    conv1_padding: Tuple[int, int] = (0, 9)   # symmetric: none in frequency, 9 per side in time
    conv2_kernel: Tuple[int, int] = (5, 10)
    conv2_stride: Tuple[int, int] = (1, 2)
    conv2_padding: Tuple[int, int] = (0, 4)
    # recurrent stack
    rnn_layers: int = 7
    rnn_hidden: int = 1760
    # fully connected layer and output
    fc_hidden: int = 1760
    n_classes: int = 29                 # blank + 28 symbols
    blank: int = 0                      # CTC blank index
    clip: float = 20.0                  # clipped ReLU: min(max(x, 0), clip)
    # BatchNorm: running = (1 - momentum) * running + momentum * batch  (PyTorch convention)
    bn_eps: float = 1e-5
    bn_momentum: float = 0.1
    # optimizer: SGD with classical momentum, no Nesterov, no weight decay, no clipping
    lr: float = 1e-4
    momentum: float = 0.9

    def conv_out(self, size: int, kernel: int, stride: int, pad: int) -> int:
        """Output length of a convolution with symmetric padding ``pad``."""
        return (size + 2 * pad - kernel) // stride + 1

    @property
    def freq_after_conv1(self) -> int:
        return self.conv_out(self.n_freq, self.conv1_kernel[0], self.conv1_stride[0], self.conv1_padding[0])

    @property
    def freq_after_conv2(self) -> int:
        return self.conv_out(self.freq_after_conv1, self.conv2_kernel[0], self.conv2_stride[0], self.conv2_padding[0])

    @property
    def rnn_input_width(self) -> int:
        """Width of the sequence fed to the first bd layer: channels x frequency (2400)."""
        return self.conv_channels * self.freq_after_conv2

    @property
    def time_stride(self) -> int:
        """Total time subsampling of the two convolutions (4)."""
        return self.conv1_stride[1] * self.conv2_stride[1]

    def time_after_conv1(self, frames: int) -> int:
        return self.conv_out(frames, self.conv1_kernel[1], self.conv1_stride[1], self.conv1_padding[1])

    def output_length(self, frames: int) -> int:
        """Number of output (CTC) steps for an utterance of ``frames`` frames (T/4)."""
        t1 = self.time_after_conv1(frames)
        return self.conv_out(t1, self.conv2_kernel[1], self.conv2_stride[1], self.conv2_padding[1])

    def rnn_input_widths(self) -> Tuple[int, ...]:
        """Input width of each bd layer."""
        return (self.rnn_input_width,) + (self.rnn_hidden,) * (self.rnn_layers - 1)

    def param_shapes(self) -> Dict[str, Tuple[int, ...]]:
        """The canonical parameter names and shapes (the project's interchange format)."""
        c, h = self.conv_channels, self.rnn_hidden
        shapes = {
            "conv1.weight": (c, 1) + tuple(self.conv1_kernel),
            "conv1.bn.gamma": (c,), "conv1.bn.beta": (c,),
            "conv2.weight": (c, c) + tuple(self.conv2_kernel),
            "conv2.bn.gamma": (c,), "conv2.bn.beta": (c,),
        }
        for i, width in enumerate(self.rnn_input_widths(), start=1):
            shapes["bd%d.bn.gamma" % i] = (width,)
            shapes["bd%d.bn.beta" % i] = (width,)
            for d in ("fwd", "bwd"):
                shapes["bd%d.%s.W" % (i, d)] = (h, width)
                shapes["bd%d.%s.U" % (i, d)] = (h, h)
                shapes["bd%d.%s.b" % (i, d)] = (h,)
        shapes.update({
            "fc.bn.gamma": (h,), "fc.bn.beta": (h,),
            "fc.W": (self.fc_hidden, h), "fc.b": (self.fc_hidden,),
            "out.W": (self.n_classes, self.fc_hidden), "out.b": (self.n_classes,),
        })
        return shapes

    def bn_names(self) -> Tuple[str, ...]:
        """The BatchNorm layers, in model order: conv1.bn, conv2.bn, bd{i}.bn, fc.bn."""
        return ("conv1.bn", "conv2.bn") + tuple("bd%d.bn" % i for i in range(1, self.rnn_layers + 1)) + ("fc.bn",)

    def running_stat_shapes(self) -> Dict[str, Tuple[int, ...]]:
        """The BatchNorm running statistics of the canonical format: ``<bn>.mean`` and ``<bn>.var``.

        Not trainable (not in :attr:`param_count`).  Initialised 0 and 1 and updated in training mode as
        ``r = (1 - bn_momentum) * r + bn_momentum * batch``, where the batch variance is the **unbiased**
        one (n / (n - 1) times the biased variance that normalises the batch, n = the number of values per
        feature: N x F x T' for the convolutions, N x T/4 for the sequences) -- PyTorch's and cuDNN's
        convention.  Keras, Flax and MXNet store the biased one instead (the README's migration notes say
        what each framework stores and how large the difference is).
        """
        widths = [self.conv_channels, self.conv_channels] + list(self.rnn_input_widths()) + [self.rnn_hidden]
        shapes = {}
        for name, width in zip(self.bn_names(), widths):
            shapes[name + ".mean"] = (width,)
            shapes[name + ".var"] = (width,)
        return shapes

    def state_shapes(self) -> Dict[str, Tuple[int, ...]]:
        """Everything a trained model holds in the canonical format: parameters and running statistics."""
        shapes = dict(self.param_shapes())
        shapes.update(self.running_stat_shapes())
        return shapes


#: common/spec.py's smoke width (SMOKE_MODEL): the same model, narrower
SMOKE = dict(conv_channels=4, rnn_layers=2, rnn_hidden=32, fc_hidden=32)
cfg = DS2Config(**SMOKE) if os.environ.get("DS2_WIDTH") == "smoke" else DS2Config()


# %% Canonical weights: the .npz every notebook exports (section 11: results/weights/<record>.npz), float32
# arrays under cfg.state_shapes()'s names in the layouts of common/weights.py, the same for every framework
def read_weights(path, config=cfg):
    """{canonical name: float32 array} from a canonical .npz, every name of ``config``'s state with its shape."""
    with np.load(path) as f:
        state = {name: f[name] for name in f.files}
    for name, shape in config.state_shapes().items():
        found = state[name].shape if name in state else "missing"
        if found != tuple(shape):
            raise ValueError("%s: %s is %s, this model's is %s (a smoke run's weights need DS2_WIDTH=smoke)"
                             % (path, name, found, tuple(shape)))
    return state


#: common/weights.py: random initial weights in the canonical format (no file given)
def fan_in(name: str, shape) -> int:
    """Fan-in of a weight: every axis but the first (out) one."""
    n = 1
    for d in shape[1:]:
        n *= d
    return n


def canonical_weights(config: DS2Config, seed: int = 0) -> Dict[str, np.ndarray]:
    """The initial weights of the whole model as a dict of float32 arrays (canonical names)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    weights = {}
    for name, shape in config.param_shapes().items():
        kind = name.rsplit(".", 1)[1]
        if kind == "gamma":
            value = np.ones(shape)
        elif kind in ("beta", "b"):
            value = np.zeros(shape)
        else:  # "weight" (conv kernel), "W" (input/dense matrix), "U" (recurrent matrix)
            bound = 1.0 / np.sqrt(fan_in(name, shape))
            value = rng.uniform(-bound, bound, size=shape)
        weights[name] = np.ascontiguousarray(value, dtype=np.float32)
    return weights


def canonical_state(config: DS2Config, seed: int = 0) -> Dict[str, np.ndarray]:
    """The canonical weights plus the BatchNorm running statistics (``<bn>.mean`` 0, ``<bn>.var`` 1):
    the whole canonical format, as an exported model holds it."""
    state = canonical_weights(config, seed)
    for name, shape in config.running_stat_shapes().items():
        state[name] = (np.zeros if name.endswith(".mean") else np.ones)(shape, dtype=np.float32)
    return state


# %% JAX_Flax_DS2.ipynb cell 12 (rosetta:data)
def to_device(batch):
    """Features and labels of a batch as arrays on the default device (host -> device copy).

    Without a device argument `jax.device_put` leaves them uncommitted, like the model's parameters.
    (Inputs committed with `jax.device_put(x, dev)` would commit the parameters after the first step,
    which changes the compiled step's signature: the first shape would be compiled a second time.)"""
    return jax.device_put(batch.features), jax.device_put(batch.labels)


def to_host(x):
    """A device array as NumPy."""
    return np.asarray(x)


# %% JAX_Flax_DS2.ipynb cell 14 (rosetta:model)
def clipped_relu(clip):
    """min(max(x, 0), clip) as a layer."""
    return lambda x: jnp.clip(x, 0.0, clip)


def batch_norm(num_features, cfg, dtype, rngs):
    # Flax's momentum weights the old running statistics: 1 - 0.1 = 0.9.
    return nnx.BatchNorm(num_features, momentum=1.0 - cfg.bn_momentum, epsilon=cfg.bn_eps, dtype=dtype, rngs=rngs)


def conv_block(in_channels, cfg, kernel, stride, padding, dtype, rngs):
    return nnx.Sequential(
        nnx.Conv(in_channels, cfg.conv_channels, kernel, strides=stride, padding=[(p, p) for p in padding],
                 use_bias=False, dtype=dtype, rngs=rngs),
        batch_norm(cfg.conv_channels, cfg, dtype, rngs),
        clipped_relu(cfg.clip),
    )


class BatchRNN(nnx.Module):
    """One bd layer: sequence-wise BatchNorm -> bidirectional ReLU RNN -> directions summed, clipped."""

    def __init__(self, in_features, cfg, dtype, rngs):
        def direction():
            return nnx.RNN(nnx.SimpleCell(in_features, cfg.rnn_hidden, activation_fn=nnx.relu, dtype=dtype, rngs=rngs))

        self.bn = batch_norm(in_features, cfg, dtype, rngs)
        self.rnn = nnx.Bidirectional(direction(), direction(), merge_fn=operator.add)   # a scan each way
        self.clip = clipped_relu(cfg.clip)
        self.hidden, self.dtype = cfg.rnn_hidden, dtype

    def __call__(self, x):                                # x: (N, T, in)
        # h_0 = 0 in the compute dtype (the cells' own zero carry has the parameters' float32,
        # which a bfloat16 scan cannot carry)
        h0 = jnp.zeros((x.shape[0], self.hidden), self.dtype)
        x = self.rnn(self.bn(x), initial_carry=(h0, h0))  # a scan each way, summed
        return self.clip(x)                               # (N, T, H)


class DeepSpeech2(nnx.Module):
    """dtype: the compute dtype of every layer (float32, or bfloat16 for mixed precision); the
    parameters are float32 either way (param_dtype's default)."""

    def __init__(self, cfg, dtype, rngs):
        c = cfg
        self.conv1 = conv_block(1, c, c.conv1_kernel, c.conv1_stride, c.conv1_padding, dtype, rngs)
        self.conv2 = conv_block(c.conv_channels, c, c.conv2_kernel, c.conv2_stride, c.conv2_padding, dtype, rngs)
        self.rnns = nnx.Sequential(*[BatchRNN(width, c, dtype, rngs) for width in c.rnn_input_widths()])
        self.fc = nnx.Sequential(
            batch_norm(c.rnn_hidden, c, dtype, rngs),
            nnx.Linear(c.rnn_hidden, c.fc_hidden, dtype=dtype, rngs=rngs),
            clipped_relu(c.clip),
        )
        self.out = nnx.Linear(c.fc_hidden, c.n_classes, dtype=dtype, rngs=rngs)

    def __call__(self, x):                                # x: (N, T, 161) spectrograms
        x = x.transpose(0, 2, 1)[..., None]               # (N, 161, T, 1): H = frequency, W = time
        x = self.conv2(self.conv1(x))                     # (N, 75, T/4, 32)
        n, f, t, c = x.shape
        x = x.transpose(0, 2, 3, 1).reshape(n, t, c * f)  # (N, T/4, 2400), feature index c * 75 + f
        x = self.rnns(x)                                  # (N, T/4, 1760)
        return self.out(self.fc(x))                       # (N, T/4, 29) logits


# %% JAX_Flax_DS2.ipynb cell 21 (rosetta:weights)
CONV = (2, 3, 1, 0)        # canonical (out, in, freq, time) -> Flax (freq, time, in, out)
DENSE = (1, 0)             # canonical (out, in) -> Flax (in, out)


def canonical_variables(model):
    """Canonical name -> (the model's nnx.Variable, the transpose from the canonical layout to Flax's, or None)."""
    table = {}

    def batch_norm(bn, name):
        table.update({name + ".gamma": (bn.scale, None), name + ".beta": (bn.bias, None),
                      name + ".mean": (bn.mean, None), name + ".var": (bn.var, None)})

    for i, block in ((1, model.conv1), (2, model.conv2)):
        table["conv%d.weight" % i] = (block.layers[0].kernel, CONV)
        batch_norm(block.layers[1], "conv%d.bn" % i)
    for i, layer in enumerate(model.rnns.layers, start=1):
        batch_norm(layer.bn, "bd%d.bn" % i)
        for direction, rnn in (("fwd", layer.rnn.forward_rnn), ("bwd", layer.rnn.backward_rnn)):
            table["bd%d.%s.W" % (i, direction)] = (rnn.cell.dense_i.kernel, DENSE)
            table["bd%d.%s.b" % (i, direction)] = (rnn.cell.dense_i.bias, None)
            table["bd%d.%s.U" % (i, direction)] = (rnn.cell.dense_h.kernel, DENSE)
    batch_norm(model.fc.layers[0], "fc.bn")
    table["fc.W"], table["fc.b"] = (model.fc.layers[1].kernel, DENSE), (model.fc.layers[1].bias, None)
    table["out.W"], table["out.b"] = (model.out.kernel, DENSE), (model.out.bias, None)
    return table


def load_canonical(model, state):
    """Copy the canonical state (parameters and running statistics, {name: array}) into the model's variables."""
    table = canonical_variables(model)
    assert sorted(table) == sorted(cfg.state_shapes()), "the table must cover the canonical state exactly"
    for name, (variable, axes) in table.items():
        value = state[name] if axes is None else state[name].transpose(axes)
        assert variable.shape == value.shape, (name, variable.shape, value.shape)
        variable[...] = jnp.asarray(value)


# %% JAX_Flax_DS2.ipynb cell 24 (rosetta:loss)
def ds2_loss(logits, labels):
    """CTC summed over the batch, divided by the batch size (mean per utterance). Labels past an utterance's length
    are 0, the blank, which no label is (the real task's batches, section 12b): optax reads the lengths from the
    paddings."""
    logits = logits.astype(jnp.float32)
    logit_paddings = jnp.zeros(logits.shape[:2])   # no padding: every utterance has T/4 steps
    label_paddings = (labels == cfg.blank).astype(jnp.float32)   # 1 past each label's length
    return optax.ctc_loss(logits, logit_paddings, labels, label_paddings, blank_id=cfg.blank).mean()


# %% JAX_Flax_DS2.ipynb cell 29 (rosetta:optimizer)
def sgd(model):
    """SGD with classical momentum (no Nesterov, no weight decay) over the model's parameters."""
    return nnx.Optimizer(model, optax.sgd(cfg.lr, momentum=cfg.momentum), wrt=nnx.Param)


@nnx.jit
def train_step_jit(model, optimizer, features, labels):
    def loss_fn(model):
        return ds2_loss(model(features), labels)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def make_train_step(model, optimizer):
    """train_step(batch): one compiled step -- forward, CTC, backward and the update; returns the loss, computed
    before the update."""
    def train_step(batch):
        return train_step_jit(model, optimizer, *to_device(batch))   # host -> device copy, timed
    return train_step


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
            sys.exit("%s: %s" % (os.path.basename(sys.argv[0]), e))
        print("weights:", path)
    else:
        state = canonical_state(cfg, seed=0)
        print("weights: none given (argv[1] or DS2_WEIGHTS): RANDOM canonical initial weights, seed 0, untrained")
    model = DeepSpeech2(cfg, compute_dtype, nnx.Rngs(0))
    load_canonical(model, state)
    train_step = make_train_step(model, sgd(model))
    rng = np.random.RandomState(0)
    batch = Batch(rng.standard_normal((2, 200, cfg.n_freq)).astype(np.float32),
                  rng.randint(1, cfg.n_classes, size=(2, 10)).astype(np.int32))
    out = train_step(batch)
    print("one training step, loss %.6f" % float(out))
