"""DS2 in MXNet (Gluon): the model, its canonical weights, the CTC loss and one training step.

Generated from notebooks/MXNet_DS2.ipynb (its cells tagged `translation`) by
`python -m runner.rosetta --extract mxnet`: edit the notebook, not this file. Needs the framework and NumPy only.

    python docs/translations/ds2_mxnet.py WEIGHTS.npz                   # or DS2_WEIGHTS=WEIGHTS.npz
    python docs/translations/ds2_mxnet.py                               # no file: random canonical initial weights
    DS2_WIDTH=smoke python docs/translations/ds2_mxnet.py WEIGHTS.npz   # the smoke width

Importing it runs nothing. A canonical weights file is what every notebook exports after its timed epoch
(results/weights/<record>.npz): the same names and layouts for every framework, so any notebook's file loads here.
tests/test_translation.py runs this file on a smoke run's export and holds its loss to the NumPy reference's.
"""

import os
import sys
from dataclasses import dataclass
from typing import Dict, Tuple

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn, rnn

ctx = mx.cpu()                                        # the notebook: mx.gpu(0) when there is a GPU


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


# %% MXNet_DS2.ipynb cell 10 (rosetta:data)
def to_device(batch, ctx=ctx):
    """The features and the CTC targets as NDArrays on a device: (Gluon-numbered labels, canonical k -> k - 1, the
    padding past each label length (0) becoming -1; the label lengths)."""
    return mx.nd.array(batch.features, ctx=ctx), (mx.nd.array(batch.labels - 1, ctx=ctx),
                                                  mx.nd.array(batch.label_lengths, ctx=ctx))


# %% MXNet_DS2.ipynb cell 12 (rosetta:model)
def clipped_relu(cfg):
    return nn.HybridLambda(lambda F, x: F.clip(x, 0.0, cfg.clip))   # min(max(x, 0), 20)


def batch_norm(channels, cfg, axis):
    # MXNet's momentum weights the old running value: 1 - 0.1 = 0.9, its default
    return nn.BatchNorm(axis=axis, momentum=1.0 - cfg.bn_momentum, epsilon=cfg.bn_eps, in_channels=channels)


class BatchRNN(nn.HybridBlock):
    """One bd layer: sequence-wise BatchNorm -> bidirectional ReLU RNN -> directions summed, clipped."""

    def __init__(self, input_size, cfg, norm=batch_norm, **kwargs):
        super().__init__(**kwargs)
        self.hidden, self.clip = cfg.rnn_hidden, cfg.clip
        with self.name_scope():
            self.bn = norm(input_size, cfg, axis=2)
            self.rnn = rnn.RNN(cfg.rnn_hidden, activation="relu", layout="TNC", bidirectional=True,
                               input_size=input_size)

    def hybrid_forward(self, F, x):
        y = self.rnn(self.bn(x))                                    # (T, N, 2H): forward | backward
        forward = F.slice_axis(y, axis=2, begin=0, end=self.hidden)
        backward = F.slice_axis(y, axis=2, begin=self.hidden, end=None)
        return F.clip(forward + backward, 0.0, self.clip)


def conv_block(in_channels, cfg, kernel, stride, padding, norm=batch_norm):
    block = nn.HybridSequential()
    block.add(nn.Conv2D(cfg.conv_channels, kernel, strides=stride, padding=padding, use_bias=False,
                        in_channels=in_channels),                    # NCHW: H = frequency, W = time
              norm(cfg.conv_channels, cfg, axis=1),
              clipped_relu(cfg))
    return block


class DeepSpeech2(nn.HybridBlock):
    def __init__(self, cfg, norm=batch_norm, **kwargs):   # norm(channels, cfg, axis): every BatchNorm layer
        super().__init__(**kwargs)
        self.norm = norm                 # kept: a checkpoint reloads into DeepSpeech2(cfg, net.norm) (section 11)
        with self.name_scope():
            self.conv1 = conv_block(1, cfg, cfg.conv1_kernel, cfg.conv1_stride, cfg.conv1_padding, norm)
            self.conv2 = conv_block(cfg.conv_channels, cfg, cfg.conv2_kernel, cfg.conv2_stride, cfg.conv2_padding,
                                    norm)
            self.rnns = nn.HybridSequential()
            self.rnns.add(*[BatchRNN(width, cfg, norm) for width in cfg.rnn_input_widths()])
            self.fc = nn.HybridSequential()
            self.fc.add(norm(cfg.rnn_hidden, cfg, axis=2),
                        nn.Dense(cfg.fc_hidden, flatten=False, in_units=cfg.rnn_hidden),
                        clipped_relu(cfg))
            self.out = nn.Dense(cfg.n_classes, flatten=False, in_units=cfg.fc_hidden)

    def hybrid_forward(self, F, x):                                 # x: (N, T, 161) spectrograms
        x = F.expand_dims(F.transpose(x, axes=(0, 2, 1)), axis=1)   # (N, 1, 161, T): axes (frequency, time)
        x = self.conv2(self.conv1(x))                               # (N, 32, 75, T/4)
        x = F.reshape(F.transpose(x, axes=(3, 0, 1, 2)), shape=(0, 0, -1))  # (T/4, N, 2400), feature c * 75 + f (-1, not -3: section 11b)
        x = self.rnns(x)                                            # (T/4, N, 1760)
        return self.out(self.fc(x))                                 # (T/4, N, 29) logits


# %% MXNet_DS2.ipynb cell 15 (rosetta:weights)
def bn_pairs(name, bn):
    return [(name + ".gamma", bn.gamma), (name + ".beta", bn.beta),
            (name + ".mean", bn.running_mean), (name + ".var", bn.running_var)]


def canonical_pairs(net):
    """(canonical name, Gluon Parameter) of every tensor of the canonical state, in Gluon's (= the canonical) layout."""
    pairs = []
    for i, block in ((1, net.conv1), (2, net.conv2)):
        conv, bn = block[0], block[1]
        pairs += [("conv%d.weight" % i, conv.weight)] + bn_pairs("conv%d.bn" % i, bn)
    for i, layer in enumerate(net.rnns, start=1):
        pairs += bn_pairs("bd%d.bn" % i, layer.bn)
        for direction, prefix in (("fwd", "l0"), ("bwd", "r0")):
            pairs += [("bd%d.%s.W" % (i, direction), getattr(layer.rnn, prefix + "_i2h_weight")),
                      ("bd%d.%s.U" % (i, direction), getattr(layer.rnn, prefix + "_h2h_weight")),
                      ("bd%d.%s.b" % (i, direction), getattr(layer.rnn, prefix + "_i2h_bias"))]
    pairs += bn_pairs("fc.bn", net.fc[0])
    return pairs + [("fc.W", net.fc[1].weight), ("fc.b", net.fc[1].bias),
                    ("out.W", net.out.weight), ("out.b", net.out.bias)]


def second_rnn_biases(net):
    """(canonical bias name, h2h_bias): each RNN direction's second bias, which the spec does not have."""
    return [("bd%d.%s.b" % (i, direction), getattr(layer.rnn, prefix + "_h2h_bias"))
            for i, layer in enumerate(net.rnns, start=1) for direction, prefix in (("fwd", "l0"), ("bwd", "r0"))]


def load_canonical(net, state):
    """Copy the canonical state (parameters and running statistics, {name: array}) into an initialised `net`."""
    pairs, second = canonical_pairs(net), second_rnn_biases(net)
    assert {name for name, _ in pairs} == set(state) and len(pairs) + len(second) == len(net.collect_params().keys())
    for name, param in pairs:
        param.set_data(mx.nd.array(state[name]))         # on every device
    for _, param in second:
        param.set_data(mx.nd.zeros(param.shape))         # b_ih = b, b_hh = 0, and b_hh is not trained: it would get
        param.grad_req = "null"                          # b_ih's gradient, and the sum would learn twice as fast


# %% MXNet_DS2.ipynb cell 18 (rosetta:loss)
ctc = gluon.loss.CTCLoss(layout="TNC", label_layout="NT")


def ds2_loss(logits, targets):
    """CTC of each utterance (N,); the spec's loss is their mean (sum over the batch / batch size). targets:
    (Gluon labels (N, L), label lengths (N,)), as to_device makes them."""
    labels, label_lengths = targets
    blank_last = mx.nd.concat(logits[:, :, 1:], logits[:, :, :1], dim=2)   # classes 1..28, then blank 0
    return ctc(blank_last, labels, None, label_lengths)                    # every logit length is T/4


# %% MXNet_DS2.ipynb cell 21 (rosetta:optimizer)
def sgd(net):
    """SGD with classical momentum (no Nesterov, no weight decay) over the model's parameters."""
    return gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": cfg.lr, "momentum": cfg.momentum})


def make_train_step(net, trainer):
    """train_step(batch): forward, CTC, backward and `trainer`'s update; returns the batch's mean loss (an NDArray),
    computed before the update."""
    def train_step(batch):
        x, targets = to_device(batch)                     # host -> device copy, timed
        with autograd.record():
            losses = ds2_loss(net(x), targets)            # (N,)
        losses.backward()
        trainer.step(batch.batch_size)                    # gradient / N, then the SGD update (queued)
        return losses.mean()
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
    net = DeepSpeech2(cfg)
    net.initialize(ctx=ctx)
    load_canonical(net, state)
    net.hybridize(static_alloc=True)                    # one cached graph per input shape
    train_step = make_train_step(net, sgd(net))
    rng = np.random.RandomState(0)
    batch = Batch(rng.standard_normal((2, 200, cfg.n_freq)).astype(np.float32),
                  rng.randint(1, cfg.n_classes, size=(2, 10)).astype(np.int32))
    out = train_step(batch)
    print("one training step, loss %.6f" % float(out.asscalar()))
