"""DS2 in Keras 3 (any backend): the model, its canonical weights, the CTC loss and one training step.

Generated from notebooks/Keras3_DS2.ipynb (its cells tagged `translation`) by
`python -m runner.rosetta --extract keras`: edit the notebook, not this file. Needs the framework and NumPy only.

    python docs/translations/ds2_keras.py WEIGHTS.npz                       # or DS2_WEIGHTS=WEIGHTS.npz
    python docs/translations/ds2_keras.py                                   # no file: random canonical initial weights
    DS2_WIDTH=smoke python docs/translations/ds2_keras.py WEIGHTS.npz       # the smoke width
    KERAS_BACKEND=torch python docs/translations/ds2_keras.py WEIGHTS.npz   # jax (default) | tensorflow | torch

Importing it runs nothing. A canonical weights file is what every notebook exports after its timed epoch
(results/weights/<record>.npz): the same names and layouts for every framework, so any notebook's file loads here.
tests/test_translation.py runs this file on a smoke run's export and holds its loss to the NumPy reference's.
"""

import os
import sys
from dataclasses import dataclass
from typing import Dict, Tuple

os.environ.setdefault("KERAS_BACKEND", "jax")   # jax | tensorflow | torch: read when keras is imported
import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers, ops  # noqa: E402


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


# %% Keras3_DS2.ipynb cell 11 (rosetta:model)
bn_momentum = 1.0 - cfg.bn_momentum      # Keras weights the old statistics: 0.9


def conv_block(i, kernel, stride, padding):
    """Zero padding in time, 'valid' Conv2D without bias, BatchNorm, clipped ReLU (axes: time, freq)."""
    (k_freq, k_time), (s_freq, s_time), (p_freq, p_time) = kernel, stride, padding
    return [
        layers.ZeroPadding2D(((p_time, p_time), (p_freq, p_freq)), name="conv%d_pad" % i),
        layers.Conv2D(cfg.conv_channels, (k_time, k_freq), strides=(s_time, s_freq), padding="valid",
                      use_bias=False, name="conv%d" % i),
        layers.BatchNormalization(momentum=bn_momentum, epsilon=cfg.bn_eps, name="conv%d_bn" % i),
        layers.ReLU(max_value=cfg.clip, name="conv%d_clip" % i),   # clipped ReLU: min(max(x, 0), 20)
    ]


def BatchRNN(i):
    """One bd layer: sequence-wise BatchNorm -> bidirectional ReLU RNN, directions summed -> clipped."""
    return [
        layers.BatchNormalization(momentum=bn_momentum, epsilon=cfg.bn_eps, name="bd%d_bn" % i),
        layers.Bidirectional(layers.SimpleRNN(cfg.rnn_hidden, activation="relu", return_sequences=True),
                             merge_mode="sum", name="bd%d" % i),
        layers.ReLU(max_value=cfg.clip, name="bd%d_clip" % i),
    ]


def build_model():
    """The DS2 model as a keras.Sequential (section 11 builds a second one to reload the checkpoint)."""
    return keras.Sequential(
        [keras.Input(shape=(None, cfg.n_freq)),                              # (N, T, 161) spectrograms
         layers.Reshape((-1, cfg.n_freq, 1), name="to_image")]                # (N, T, 161, 1): (time, freq)
        + conv_block(1, cfg.conv1_kernel, cfg.conv1_stride, cfg.conv1_padding)
        + conv_block(2, cfg.conv2_kernel, cfg.conv2_stride, cfg.conv2_padding)  # (N, T/4, 75, 32)
        + [layers.Reshape((-1, cfg.rnn_input_width), name="to_sequence")]     # (N, T/4, 2400): f * 32 + c
        + [layer for i in range(1, cfg.rnn_layers + 1) for layer in BatchRNN(i)]
        + [layers.BatchNormalization(momentum=bn_momentum, epsilon=cfg.bn_eps, name="fc_bn"),
           layers.Dense(cfg.fc_hidden, name="fc"),
           layers.ReLU(max_value=cfg.clip, name="fc_clip"),
           layers.Dense(cfg.n_classes, name="out")],                          # (N, T/4, 29) logits
        name="deepspeech2")


# %% Keras3_DS2.ipynb cell 14 (rosetta:weights)
channels, freqs = cfg.conv_channels, cfg.freq_after_conv2
to_keras_features = np.arange(channels * freqs).reshape(channels, freqs).T.reshape(-1)  # [f*32+c] = c*75+f


def load_canonical(model, W):
    """Copy the canonical state W (parameters and running statistics, {name: array}) into the model's layers."""
    def batchnorm(layer, name, order=slice(None)):
        bn = model.get_layer(layer)
        for variable, key in ((bn.gamma, "gamma"), (bn.beta, "beta"),
                              (bn.moving_mean, "mean"), (bn.moving_variance, "var")):   # running statistics too
            variable.assign(W["%s.%s" % (name, key)][order])

    for i in (1, 2):
        model.get_layer("conv%d" % i).set_weights([W["conv%d.weight" % i].transpose(3, 2, 1, 0)])
        batchnorm("conv%d_bn" % i, "conv%d.bn" % i)
    for i in range(1, cfg.rnn_layers + 1):
        order = to_keras_features if i == 1 else slice(None)          # bd1 reads the flattened convolutions
        batchnorm("bd%d_bn" % i, "bd%d.bn" % i, order)
        bidirectional = model.get_layer("bd%d" % i)
        for direction, rnn in (("fwd", bidirectional.forward_layer), ("bwd", bidirectional.backward_layer)):
            w, u, b = (W["bd%d.%s.%s" % (i, direction, name)] for name in ("W", "U", "b"))
            rnn.set_weights([w[:, order].T, u.T, b])                    # kernel, recurrent_kernel, bias
    batchnorm("fc_bn", "fc.bn")
    model.get_layer("fc").set_weights([W["fc.W"].T, W["fc.b"]])
    model.get_layer("out").set_weights([W["out.W"].T, W["out.b"]])


# %% Keras3_DS2.ipynb cell 17 (rosetta:loss)
@keras.saving.register_keras_serializable(package="ds2")   # model.save records the compiled loss by this name
class CTCLoss(keras.losses.Loss):
    """CTC per utterance (blank 0); the Loss base class sums over the batch and divides by its size. Labels past an
    utterance's length are 0, the blank, which no label is (the real task's batches, section 12b)."""

    def call(self, labels, logits):
        labels = ops.cast(labels, "int32")                   # Loss.__call__ hands labels over as float32
        n, steps = ops.shape(logits)[0], ops.shape(logits)[1]
        label_lengths = ops.sum(ops.cast(ops.not_equal(labels, cfg.blank), "int32"), axis=1)
        logit_lengths = ops.full((n,), steps, dtype="int32")   # no padding: every utterance has T/4 steps
        return ops.ctc_loss(labels, logits, label_lengths, logit_lengths, mask_index=cfg.blank)


ctc_loss = CTCLoss(name="ctc")


# %% Keras3_DS2.ipynb cell 22 (rosetta:optimizer)
def compile_for_training(model, jit_compile="auto"):
    """SGD with classical momentum (no Nesterov, no weight decay) and the CTC loss, compiled into the model.
    jit_compile: "auto" is the backend's default."""
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=cfg.lr, momentum=cfg.momentum), loss=ctc_loss,
                  jit_compile=jit_compile)


def make_train_step(model):
    """train_step(batch): one step of the compiled model -- forward, CTC, backward and the update; returns the
    batch's loss (computed before the update), a Python float."""
    def train_step(batch):
        return model.train_on_batch(batch.features, batch.labels)
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
    model = build_model()
    load_canonical(model, state)
    compile_for_training(model)
    train_step = make_train_step(model)
    rng = np.random.RandomState(0)
    batch = Batch(rng.standard_normal((2, 200, cfg.n_freq)).astype(np.float32),
                  rng.randint(1, cfg.n_classes, size=(2, 10)).astype(np.int32))
    out = train_step(batch)
    print("one training step, loss %.6f" % float(out))
