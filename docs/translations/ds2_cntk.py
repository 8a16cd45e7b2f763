"""DS2 in CNTK (cntk.layers): the model, its canonical weights, the CTC loss and one training step.

Generated from notebooks/CNTK_DS2.ipynb (its cells tagged `translation`) by
`python -m runner.rosetta --extract cntk`: edit the notebook, not this file. Needs the framework and NumPy only.

    python docs/translations/ds2_cntk.py WEIGHTS.npz                   # or DS2_WEIGHTS=WEIGHTS.npz
    python docs/translations/ds2_cntk.py                               # no file: random canonical initial weights
    DS2_WIDTH=smoke python docs/translations/ds2_cntk.py WEIGHTS.npz   # the smoke width

Importing it runs nothing. A canonical weights file is what every notebook exports after its timed epoch
(results/weights/<record>.npz): the same names and layouts for every framework, so any notebook's file loads here.
tests/test_translation.py runs this file on a smoke run's export and holds its loss to the NumPy reference's.
"""

import os
import sys
from dataclasses import dataclass
from typing import Dict, Tuple

import math

import cntk as C
import numpy as np

fused = False                                         # optimized_rnnstack (cuDNN): the notebook's choice on a GPU
FRAMES_PER_SECOND = 100
#: the mean output frames of a minibatch, from the notebook's iterator (deepmark preset; smoke)
frames_per_minibatch = {'full': 4752.0, 'smoke': 625.0}[os.environ.get("DS2_WIDTH", "full")]


def frame_labels(labels: np.ndarray, n_frames: int, n_classes: int) -> np.ndarray:
    """(N, L) integer labels in 1..n_classes-1 -> (N, n_frames, n_classes) float32 per-frame encoding.

    ``n_frames`` is the number of output (CTC) frames, at least ``L``.
    """
    labels = np.asarray(labels)
    if labels.ndim != 2 or labels.shape[1] < 1:
        raise ValueError("labels must have shape (N, L) with L >= 1, got %r" % (labels.shape,))
    n, length = labels.shape
    if length > n_frames:
        raise ValueError("%d labels do not fit in %d frames" % (length, n_frames))
    if labels.min() < 0 or labels.max() >= n_classes:
        raise ValueError("labels must lie in 0..%d" % (n_classes - 1))
    encoded = np.zeros((n, n_frames, n_classes), dtype=np.float32)
    utterance = np.arange(n)
    encoded[utterance[:, None], np.arange(length), labels] = 2.0     # label i starts in frame i
    encoded[utterance, length:, labels[:, -1]] = 1.0                 # the last label continues to the end
    return encoded


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


# %% CNTK_DS2.ipynb cell 10 (rosetta:data)
features = C.input_variable((C.FreeDimension, cfg.n_freq), name="features")   # one utterance: (T, 161)
labels = C.sequence.input_variable(cfg.n_classes, name="labels")              # T/4 frames of 29


def minibatch(batch):
    """A batch as the network's inputs: features (N, T, 161) and per-frame CTC labels (N, T/4, 29), each
    utterance's labels cut to its label length."""
    frames = cfg.output_length(batch.frames)
    return {features: batch.features,
            labels: np.concatenate([frame_labels(row[None, :length], frames, cfg.n_classes)
                                    for row, length in zip(batch.labels, batch.label_lengths)])}


# %% CNTK_DS2.ipynb cell 13 (rosetta:model)
bn_time_constant = -frames_per_minibatch / math.log(1.0 - cfg.bn_momentum)


def clipped_relu(x):
    return C.clip(x, 0.0, cfg.clip)                      # min(max(x, 0), 20)


bn_training = C.Constant(1.0, name="bn_training")   # the hand-written BatchNorms' mode: 1 training, 0 inference


def normalize(x, mean, variance, count, scale, bias, run_mean, run_variance):
    """The hand-written BatchNorm's two modes. Training (bn_training 1): the batch's mean and biased variance, and
    the running statistics updated as r = 0.9 r + 0.1 batch with the batch's unbiased variance (`count` samples per
    feature), by C.assign after the pass. Inference (bn_training 0): the running statistics (assigned unchanged)."""
    m = cfg.bn_momentum * bn_training
    unbiased = variance * count / (count - 1.0)
    # (C.assign's input must reference its target outside stop_gradient: CNTK 2.7 fails "Cannot find input" otherwise)
    new_mean = C.stop_gradient(C.assign(run_mean, run_mean + m * C.stop_gradient(mean - run_mean)))
    new_variance = C.stop_gradient(C.assign(run_variance, run_variance + m * C.stop_gradient(unbiased - run_variance)))
    # training: 1 x batch + 0 x new (computed all the same, so the assignments run); inference: the running values
    mean = bn_training * mean + (1.0 - bn_training) * new_mean
    variance = bn_training * variance + (1.0 - bn_training) * new_variance
    return (x - mean) / C.sqrt(variance + cfg.bn_eps) * scale + bias


def ConvBatchNorm(channels, name="bn", statistics=None):
    """BatchNorm per channel of a (C, F, T) map, statistics over batch x F x T, with running statistics.
    `statistics(v, shape, with_count=False)`: the mean of v over the utterances (and their count); None: this
    minibatch's (section 9b passes the global batch's)."""
    scale = C.Parameter((channels, 1, 1), init=1.0, name="scale")
    bias = C.Parameter((channels, 1, 1), init=0.0, name="bias")
    run_mean = C.Constant(0.0, shape=(channels, 1, 1), name="aggregate_mean")
    run_variance = C.Constant(1.0, shape=(channels, 1, 1), name="aggregate_variance")
    batch_axis = C.Axis.default_batch_axis()

    def batch_mean(v):   # mean over the minibatch's utterances (section 9b: over the global batch)
        return C.reduce_mean(v, axis=batch_axis) if statistics is None else statistics(v, (channels, 1, 1))

    def batch_count(x):  # samples per channel: utterances x F x T of the minibatch (section 9b: the global batch)
        positions = C.reduce_sum(C.slice(x, 0, 0, 1) * 0.0 + 1.0, axis=(1, 2))    # F x T of one utterance, (1, 1, 1)
        if statistics is None:
            return C.reduce_sum(positions, axis=batch_axis)
        per_utterance, utterances = statistics(positions, (1, 1, 1), with_count=True)
        return per_utterance * C.reshape(utterances, (1, 1, 1))

    @C.layers.blocks.BlockFunction("ConvBatchNorm", name)
    def conv_bn(x):
        mean = batch_mean(C.reduce_mean(x, axis=(1, 2)))
        variance = batch_mean(C.reduce_mean(C.square(x - mean), axis=(1, 2)))
        return normalize(x, mean, variance, batch_count(x), scale, bias, run_mean, run_variance)
    return conv_bn


def SequenceBatchNorm(width, name="bn"):
    """Sequence-wise BatchNorm of `width` features: CNTK's layer (section 9b passes a global one to DeepSpeech2)."""
    return C.layers.BatchNormalization(normalization_time_constant=bn_time_constant, epsilon=cfg.bn_eps, name=name)


def ConvBlock(kernel, stride, padding, name, statistics=None):
    """Explicit symmetric padding -> Conv2D (no bias) -> BatchNorm -> clipped ReLU, on (C, F, T)."""
    conv = C.layers.Convolution2D(kernel, cfg.conv_channels, strides=stride, pad=False, bias=False, name="conv")
    bn = ConvBatchNorm(cfg.conv_channels, statistics=statistics)
    pad_f, pad_t = padding

    @C.layers.blocks.BlockFunction("ConvBlock", name)
    def conv_block(x):
        x = C.pad(x, pattern=[(0, 0), (pad_f, pad_f), (pad_t, pad_t)])
        return clipped_relu(bn(conv(x)))
    return conv_block


def BatchRNN(width, name, sequence_bn=SequenceBatchNorm):
    """One bd layer: sequence-wise BatchNorm -> bidirectional ReLU RNN -> directions summed, clipped."""
    bn = sequence_bn(width)
    hidden = cfg.rnn_hidden
    if fused:   # cuDNN: both directions in one op, weights in one flat parameter (its size is inferred)
        weights = C.Parameter((C.InferredDimension, width), init=C.glorot_uniform(), name="rnn")

        def rnn(x):
            y = C.optimized_rnnstack(x, weights, hidden, num_layers=1, bidirectional=True, recurrent_op="rnnReLU")
            return y[:hidden] + y[hidden:]               # forward half + backward half
    else:       # one Recurrence per direction
        forward = C.layers.Recurrence(C.layers.RNNStep(hidden, activation=C.relu, name="fwd"))
        backward = C.layers.Recurrence(C.layers.RNNStep(hidden, activation=C.relu, name="bwd"), go_backwards=True)

        def rnn(x):
            return C.plus(forward(x), backward(x))

    @C.layers.blocks.BlockFunction("BatchRNN", name)
    def batch_rnn(x):
        return clipped_relu(rnn(bn(x)))
    return batch_rnn


def DeepSpeech2(features, labels, statistics=None, sequence_bn=SequenceBatchNorm):
    """The model; `statistics` (the convolutions' BatchNorm) and `sequence_bn` (the other BatchNorms): section 9b's
    global ones, or this minibatch's."""
    conv1 = ConvBlock(cfg.conv1_kernel, cfg.conv1_stride, cfg.conv1_padding, "conv1", statistics)
    conv2 = ConvBlock(cfg.conv2_kernel, cfg.conv2_stride, cfg.conv2_padding, "conv2", statistics)
    fc_bn = sequence_bn(cfg.rnn_hidden)
    fc_dense = C.layers.Dense(cfg.fc_hidden, activation=clipped_relu, name="dense")
    fc = C.layers.blocks.BlockFunction("FullyConnected", "fc")(lambda x: fc_dense(fc_bn(x)))
    out = C.layers.Dense(cfg.n_classes, name="out")

    x = C.reshape(C.transpose(features, perm=(1, 0)), (1, cfg.n_freq, -1))   # (1, 161, T): axes (frequency, time)
    x = conv2(conv1(x))                                                       # (32, 75, T/4)
    x = C.reshape(C.transpose(x, perm=(2, 0, 1)), (-1, cfg.rnn_input_width))   # (T/4, 2400), feature c * 75 + f
    x = C.to_sequence_like(x, labels)                                         # T/4 frames on the sequence axis
    for i, width in enumerate(cfg.rnn_input_widths(), start=1):
        x = BatchRNN(width, "bd%d" % i, sequence_bn)(x)              # T/4 frames of 1760
    return out(fc(x))                                                         # T/4 frames of 29 logits


# %% CNTK_DS2.ipynb cell 16 (rosetta:weights)
def cudnn_layout(W, i):
    """bd{i}'s weights as optimized_rnnstack's flat parameter."""
    zero = np.zeros(cfg.rnn_hidden, np.float32)
    fwd, bwd = "bd%d.fwd." % i, "bd%d.bwd." % i
    return np.concatenate([W[fwd + "W"].ravel(), W[fwd + "U"].ravel(), W[bwd + "W"].ravel(), W[bwd + "U"].ravel(),
                           W[fwd + "b"], zero, W[bwd + "b"], zero])


def batchnorms(model):
    """(canonical name, BatchNorm block) of every BatchNorm of the model."""
    return ([("conv%d.bn" % i, getattr(model, "conv%d" % i).bn) for i in (1, 2)]
            + [("bd%d.bn" % i, getattr(model, "bd%d" % i).bn) for i in range(1, cfg.rnn_layers + 1)]
            + [("fc.bn", model.fc.bn)])


def load_canonical(model, W):
    """Copy the canonical state W (parameters and running statistics, {name: array}) into the model's variables."""
    def put(variable, array):
        variable.value = np.ascontiguousarray(array, dtype=np.float32).reshape(variable.shape)

    for name, bn in batchnorms(model):
        put(bn.scale, W[name + ".gamma"])
        put(bn.bias, W[name + ".beta"])
        put(bn.aggregate_mean, W[name + ".mean"])
        put(bn.aggregate_variance, W[name + ".var"])
        if hasattr(bn, "aggregate_count"):                    # CNTK's own layer: statistics count as seen
            put(bn.aggregate_count, 1.0)
    for i in (1, 2):
        put(getattr(model, "conv%d" % i).conv.W, W["conv%d.weight" % i])
    for i in range(1, cfg.rnn_layers + 1):
        layer = getattr(model, "bd%d" % i)
        if fused:
            put(layer.rnn, cudnn_layout(W, i))
        else:
            for direction in ("fwd", "bwd"):
                step, name = getattr(layer, direction), "bd%d.%s." % (i, direction)
                put(step.W, W[name + "W"].T)
                put(step.H, W[name + "U"].T)
                put(step.b, W[name + "b"])
    put(model.fc.dense.W, W["fc.W"].T)
    put(model.fc.dense.b, W["fc.b"])
    put(model.out.W, W["out.W"].T)
    put(model.out.b, W["out.b"])


# %% CNTK_DS2.ipynb cell 19 (rosetta:loss)
def ds2_loss(model, labels):
    """The loss graph: CTC summed over the minibatch, divided by its utterances (the mean per utterance)."""
    ctc = C.forward_backward(C.labels_to_graph(labels), model, blankTokenId=cfg.blank)   # sum over the minibatch
    utterances = C.reduce_sum(C.sequence.is_first(labels), axis=C.Axis.all_axes())   # N
    return ctc / utterances


# %% CNTK_DS2.ipynb cell 23 (rosetta:optimizer)
def sgd(parameters):
    """SGD with classical momentum (no Nesterov, no weight decay); the gradient is the loss's, already / N."""
    return C.momentum_sgd(parameters, lr=C.learning_parameter_schedule(cfg.lr, minibatch_size=1),
                          momentum=C.momentum_schedule(cfg.momentum), unit_gain=False)


def make_train_step(model, loss, learner):
    """train_step(batch): forward, CTC, backward and `learner`'s update; returns the loss (computed before the
    update) as a NumPy scalar."""
    trainer = C.Trainer(model, (loss, None), [learner])

    def train_step(batch):
        _, values = trainer.train_minibatch(minibatch(batch), outputs=[loss.output])
        return values[loss.output]                       # a NumPy scalar: the step has run
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
    model = DeepSpeech2(features, labels)
    load_canonical(model, state)
    loss = ds2_loss(model, labels)
    train_step = make_train_step(model, loss, sgd(model.parameters))
    rng = np.random.RandomState(0)
    batch = Batch(rng.standard_normal((2, 200, cfg.n_freq)).astype(np.float32),
                  rng.randint(1, cfg.n_classes, size=(2, 10)).astype(np.int32))
    out = train_step(batch)
    print("one training step, loss %.6f" % float(out))
