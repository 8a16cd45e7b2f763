"""DS2 in MXNet (Gluon): the model, the CTC loss and one training step.

Lifted out of notebooks/MXNet_DS2.ipynb: its cells tagged `translation`, written here by
`python -m runner.rosetta --extract mxnet`. Do not edit; edit the notebook. Standalone: the framework and NumPy
only. The preamble holds what the notebook's other cells compute: the DS2 configuration (common/spec.py) as
literal values, and the single-process CPU fp32 settings.

    python docs/translations/ds2_mxnet.py                   # the full model: one step on a random batch
    DS2_WIDTH=smoke python docs/translations/ds2_mxnet.py   # the same at the smoke width

The notebook then loads the canonical weights (its section 5) and checks the first loss against the NumPy
reference; tests/test_translation.py does the same with this file.
"""

import os

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn, rnn

ctx = mx.cpu()                                        # the notebook: mx.gpu(0) when there is a GPU


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


# %% MXNet_DS2.ipynb cell 9 (rosetta:data)
def to_device(batch):
    """Features and Gluon-numbered CTC labels (canonical k -> k - 1) as NDArrays on the device."""
    return mx.nd.array(batch.features, ctx=ctx), mx.nd.array(batch.labels - 1, ctx=ctx)


# %% MXNet_DS2.ipynb cell 11 (rosetta:model)
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


net = DeepSpeech2(cfg)
net.initialize(ctx=ctx)                 # no deferred initialisation: every layer knows its input size
trainable = [p for p in net.collect_params().values() if p.grad_req != "null"]   # not BN running stats
n_params = sum(p.data().size for p in trainable)
print(net)
print("%d parameters" % n_params)


# %% (not a notebook cell)
net.hybridize(static_alloc=True)   # the notebook does this after loading the weights


# %% MXNet_DS2.ipynb cell 15 (rosetta:loss)
ctc = gluon.loss.CTCLoss(layout="TNC", label_layout="NT")


def ds2_loss(logits, labels):
    """CTC of each utterance (N,); the spec's loss is their mean (sum over the batch / batch size)."""
    blank_last = mx.nd.concat(logits[:, :, 1:], logits[:, :, :1], dim=2)   # classes 1..28, then blank 0
    return ctc(blank_last, labels)


# %% MXNet_DS2.ipynb cell 18 (rosetta:optimizer)
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": cfg.lr, "momentum": cfg.momentum})


def train_step(batch):
    x, labels = to_device(batch)                          # host -> device copy, timed
    with autograd.record():
        losses = ds2_loss(net(x), labels)                 # (N,)
    losses.backward()
    trainer.step(batch.batch_size)                        # gradient / N, then the SGD update (queued)
    return losses.mean()


def sync(_):
    """Wait for all queued work: MXNet's engine runs operators asynchronously, on CPU and GPU. waitall() waits for
    every operator pushed so far -- trainer.step's SGD updates included -- not only for the loss."""
    mx.nd.waitall()


if __name__ == "__main__":             # one step on a random batch: 2 utterances of 2 s (200 frames), 10 labels
    class Batch:
        def __init__(self, features, labels):
            self.features, self.labels = features, labels
            self.batch_size, self.frames = features.shape[0], features.shape[1]

    rng = np.random.RandomState(0)
    batch = Batch(rng.standard_normal((2, 200, cfg.n_freq)).astype(np.float32),
                  rng.randint(1, cfg.n_classes, size=(2, 10)).astype(np.int32))
    out = train_step(batch)
    print("one training step, loss %.6f" % float(out.asscalar()))
