"""DS2 in CNTK (cntk.layers): the model, the CTC loss and one training step.

Lifted out of notebooks/CNTK_DS2.ipynb: its cells tagged `translation`, written here by
`python -m runner.rosetta --extract cntk`. Do not edit; edit the notebook. Standalone: the framework and NumPy
only. The preamble holds what the notebook's other cells compute: the DS2 configuration (common/spec.py) as
literal values, and the single-process CPU fp32 settings.

    python docs/translations/ds2_cntk.py                   # the full model: one step on a random batch
    DS2_WIDTH=smoke python docs/translations/ds2_cntk.py   # the same at the smoke width

The notebook then loads the canonical weights (its section 5) and checks the first loss against the NumPy
reference; tests/test_translation.py does the same with this file.
"""

import os

import math

import cntk as C
import numpy as np

dev = C.device.cpu()                                  # the notebook: a GPU when CNTK sees one
C.device.try_set_default_device(dev)
on_gpu = fused = False                                # fused: optimized_rnnstack (cuDNN), GPU only
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


from typing import Tuple  # noqa: E402  (the derived sizes' annotations)

#: common/spec.py's DS2 configuration (FULL_MODEL) and its smoke width (SMOKE_MODEL), as literal values
CONFIGS = {
    "full": dict(n_freq=161, conv_channels=32, conv1_kernel=(5, 20), conv1_stride=(2, 2), conv1_padding=(0, 9),
        conv2_kernel=(5, 10), conv2_stride=(1, 2), conv2_padding=(0, 4), rnn_layers=7, rnn_hidden=1760,
        fc_hidden=1760, n_classes=29, blank=0, clip=20.0, bn_eps=1e-05, bn_momentum=0.1, lr=0.0001,
        momentum=0.9),
    "smoke": dict(n_freq=161, conv_channels=4, conv1_kernel=(5, 20), conv1_stride=(2, 2), conv1_padding=(0, 9),
        conv2_kernel=(5, 10), conv2_stride=(1, 2), conv2_padding=(0, 4), rnn_layers=2, rnn_hidden=32,
        fc_hidden=32, n_classes=29, blank=0, clip=20.0, bn_eps=1e-05, bn_momentum=0.1, lr=0.0001,
        momentum=0.9),
}


class DS2Config:
    """Every number of the DS2 model, its loss and its optimizer (common/spec.py), and the sizes derived from them."""

    def __init__(self, **values):
        self.__dict__.update(values)

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


cfg = DS2Config(**CONFIGS[os.environ.get("DS2_WIDTH", "full")])


# %% CNTK_DS2.ipynb cell 9 (rosetta:data)
features = C.input_variable((C.FreeDimension, cfg.n_freq), name="features")   # one utterance: (T, 161)
labels = C.sequence.input_variable(cfg.n_classes, name="labels")              # T/4 frames of 29


def minibatch(batch):
    """A batch as the network's inputs: features (N, T, 161) and per-frame CTC labels (N, T/4, 29)."""
    return {features: batch.features,
            labels: frame_labels(batch.labels, cfg.output_length(batch.frames), cfg.n_classes)}


# %% CNTK_DS2.ipynb cell 12 (rosetta:model)
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


def BidirectionalReLU(width, name, sequence_bn=SequenceBatchNorm):
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

    @C.layers.blocks.BlockFunction("BidirectionalReLU", name)
    def bd_layer(x):
        return clipped_relu(rnn(bn(x)))
    return bd_layer


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
        x = BidirectionalReLU(width, "bd%d" % i, sequence_bn)(x)              # T/4 frames of 1760
    return out(fc(x))                                                         # T/4 frames of 29 logits


model = DeepSpeech2(features, labels)
n_params = sum(int(np.prod(p.shape)) for p in model.parameters)
for name in ["conv1", "conv2"] + ["bd%d" % i for i in range(1, cfg.rnn_layers + 1)] + ["fc", "out"]:
    print(getattr(model, name))        # per utterance: block(input) -> output; -3 marks the free time dimension
print("BatchNorm time constant %.1f samples (mean %.1f frames per minibatch)" % (bn_time_constant, frames_per_minibatch))
print("%d parameters" % n_params)


def running_statistics(f):
    """Every BatchNorm's running statistics in f (and CNTK's layers' sample counts): [(constant, value)]."""
    return [(c, c.value) for name in ("aggregate_mean", "aggregate_variance", "aggregate_count")
            for c in f.find_all_with_name(name, depth=-1)]


def restore_running_statistics(saved):
    for constant, value in saved:
        constant.value = value


mode_flags = {}   # id() of a model -> (the model, its bn_training constants); a loaded model repeats the uids


def inference(batch, f=None, feed=minibatch):
    """Inference-mode logits of a batch as NumPy (T/4, N, classes): CNTK's BatchNormalization uses its running
    statistics in a pass that keeps nothing for a backward pass (`eval`), the hand-written BatchNorm when bn_training
    is 0. `f`: `model` (default; section 9b's once it rebinds it) or one loaded from a file (inputs and flag found by
    name); `feed`: the batch's conversion (default: section 3's `minibatch`, the whole batch)."""
    f = model if f is None else f
    if id(f) not in mode_flags:
        mode_flags[id(f)] = (f, f.find_all_with_name("bn_training", depth=-1))
    flags = mode_flags[id(f)][1]
    inputs = {v.name: value for v, value in feed(batch).items()}
    for flag in flags:
        flag.value = np.zeros((), np.float32)
    try:
        logits = f.eval({a: inputs[a.name] for a in f.arguments})
    finally:
        for flag in flags:
            flag.value = np.ones((), np.float32)
    return np.asarray(logits, dtype=np.float32).transpose(1, 0, 2)     # (N, T/4, classes) -> (T/4, N, classes)


# %% CNTK_DS2.ipynb cell 16 (rosetta:loss)
ctc = C.forward_backward(C.labels_to_graph(labels), model, blankTokenId=cfg.blank)   # sum over the minibatch
utterances = C.reduce_sum(C.sequence.is_first(labels), axis=C.Axis.all_axes())   # N
loss = ctc / utterances


# %% CNTK_DS2.ipynb cell 19 (rosetta:optimizer)
learner = C.momentum_sgd(model.parameters, lr=C.learning_parameter_schedule(cfg.lr, minibatch_size=1),
                         momentum=C.momentum_schedule(cfg.momentum), unit_gain=False)
trainer = C.Trainer(model, (loss, None), [learner])


def train_step(batch):
    _, values = trainer.train_minibatch(minibatch(batch), outputs=[loss.output])
    return values[loss.output]                           # a NumPy scalar: the step has run


def sync(_):
    """CNTK has no synchronise call: copying a parameter that the update just wrote waits for the step on a GPU.
    On a CPU CNTK computes synchronously: train_minibatch returns after the update."""
    if on_gpu:
        model.out.b.value


if __name__ == "__main__":             # one step on a random batch: 2 utterances of 2 s (200 frames), 10 labels
    class Batch:
        def __init__(self, features, labels):
            self.features, self.labels = features, labels
            self.batch_size, self.frames = features.shape[0], features.shape[1]

    rng = np.random.RandomState(0)
    batch = Batch(rng.standard_normal((2, 200, cfg.n_freq)).astype(np.float32),
                  rng.randint(1, cfg.n_classes, size=(2, 10)).astype(np.int32))
    out = train_step(batch)
    print("one training step, loss %.6f" % float(out))
