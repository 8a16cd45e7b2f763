"""DS2 in JAX (Flax NNX): the model, the CTC loss and one training step.

Lifted out of notebooks/JAX_Flax_DS2.ipynb: its cells tagged `translation`, written here by
`python -m runner.rosetta --extract jax`. Do not edit; edit the notebook. Standalone: the framework and NumPy
only. The preamble holds what the notebook's other cells compute: the DS2 configuration (common/spec.py) as
literal values, and the single-process CPU fp32 settings.

    python docs/translations/ds2_jax.py                   # the full model: one step on a random batch
    DS2_WIDTH=smoke python docs/translations/ds2_jax.py   # the same at the smoke width

The notebook then loads the canonical weights (its section 5) and checks the first loss against the NumPy
reference; tests/test_translation.py does the same with this file.
"""

import os

import operator

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

seed = 0                                              # the weights' seed (the notebook loads the canonical ones)
scan_unroll = 1                                       # the unroll variant: 2
compute_dtype = jnp.float32                           # bfloat16 for precision bf16


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


# %% JAX_Flax_DS2.ipynb cell 11 (rosetta:data)
def to_device(batch):
    """Features and labels of a batch as arrays on the default device (host -> device copy).

    Without a device argument `jax.device_put` leaves them uncommitted, like the model's parameters.
    (Inputs committed with `jax.device_put(x, dev)` would commit the parameters after the first step,
    which changes the compiled step's signature: the first shape would be compiled a second time.)"""
    return jax.device_put(batch.features), jax.device_put(batch.labels)


def to_host(x):
    """A device array as NumPy."""
    return np.asarray(x)


# %% JAX_Flax_DS2.ipynb cell 13 (rosetta:model)
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

    def __init__(self, in_features, cfg, dtype, rngs, unroll=1):
        def direction():   # unroll: time steps per iteration of the scan (1: Flax's default)
            return nnx.RNN(nnx.SimpleCell(in_features, cfg.rnn_hidden, activation_fn=nnx.relu, dtype=dtype, rngs=rngs),
                           unroll=unroll)

        self.bn = batch_norm(in_features, cfg, dtype, rngs)
        self.rnn = nnx.Bidirectional(direction(), direction(), merge_fn=operator.add)   # a scan each way
        self.clip = clipped_relu(cfg.clip)
        self.hidden, self.dtype = cfg.rnn_hidden, dtype

    def __call__(self, x):                                # x: (N, T, in)
        # h_0 = 0 in the compute dtype (the cells' own zero carry has the parameters' float32,
        # which a bfloat16 scan cannot carry)
        h0 = jnp.zeros((x.shape[0], self.hidden), self.dtype)
        with jax.named_scope("batchnorm"):                # scopes name the operations in a profile
            x = self.bn(x)
        with jax.named_scope("rnn"):
            x = self.rnn(x, initial_carry=(h0, h0))
        return self.clip(x)                               # (N, T, H)


class DeepSpeech2(nnx.Module):
    """dtype: the compute dtype of every layer (float32, or bfloat16 for mixed precision); the
    parameters are float32 either way (param_dtype's default). unroll: time steps per scan iteration
    of every recurrence."""

    def __init__(self, cfg, dtype, rngs, unroll=1):
        c = cfg
        self.conv1 = conv_block(1, c, c.conv1_kernel, c.conv1_stride, c.conv1_padding, dtype, rngs)
        self.conv2 = conv_block(c.conv_channels, c, c.conv2_kernel, c.conv2_stride, c.conv2_padding, dtype, rngs)
        self.rnns = nnx.Sequential(*[BatchRNN(width, c, dtype, rngs, unroll) for width in c.rnn_input_widths()])
        self.fc = nnx.Sequential(
            batch_norm(c.rnn_hidden, c, dtype, rngs),
            nnx.Linear(c.rnn_hidden, c.fc_hidden, dtype=dtype, rngs=rngs),
            clipped_relu(c.clip),
        )
        self.out = nnx.Linear(c.fc_hidden, c.n_classes, dtype=dtype, rngs=rngs)

    def __call__(self, x):                                # x: (N, T, 161) spectrograms
        x = x.transpose(0, 2, 1)[..., None]               # (N, 161, T, 1): H = frequency, W = time
        with jax.named_scope("convolution"):              # (with their BatchNorm and clipped ReLU)
            x = self.conv2(self.conv1(x))                 # (N, 75, T/4, 32)
        n, f, t, c = x.shape
        x = x.transpose(0, 2, 3, 1).reshape(n, t, c * f)  # (N, T/4, 2400), feature index c * 75 + f
        x = self.rnns(x)                                  # (N, T/4, 1760)
        with jax.named_scope("fc"):                       # (with its BatchNorm) and the output layer
            return self.out(self.fc(x))                   # (N, T/4, 29) logits


model = DeepSpeech2(cfg, compute_dtype, nnx.Rngs(seed), unroll=scan_unroll)   # BatchNorm in training mode
n_params = sum(p.size for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
for path, param in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    print("%-50s %s" % (".".join(map(str, path)), param.shape))
print("%d parameters" % n_params)


# %% JAX_Flax_DS2.ipynb cell 17 (rosetta:loss)
def ds2_loss(logits, labels):
    """CTC summed over the batch, divided by the batch size (mean per utterance)."""
    with jax.named_scope("ctc"):
        logits = logits.astype(jnp.float32)
        logit_paddings = jnp.zeros(logits.shape[:2])   # no padding: every utterance has T/4 steps
        label_paddings = jnp.zeros(labels.shape)
        return optax.ctc_loss(logits, logit_paddings, labels, label_paddings, blank_id=cfg.blank).mean()


@jax.jit
def _training_loss(graphdef, state, features, labels):
    model = nnx.merge(graphdef, state)                 # a copy inside the traced function
    loss = ds2_loss(model(features), labels)           # training-mode BatchNorm: the batch's statistics
    return loss, nnx.state(model, nnx.BatchStat)       # the statistics the step would leave


def training_loss(model, features, labels):
    """(loss, new BatchNorm statistics) of a batch in training mode, without a gradient and without changing `model`."""
    graphdef, state = nnx.split(model)
    return _training_loss(graphdef, state, features, labels)


# %% JAX_Flax_DS2.ipynb cell 20 (rosetta:optimizer)
optimizer = nnx.Optimizer(model, optax.sgd(cfg.lr, momentum=cfg.momentum), wrt=nnx.Param)


@nnx.jit
def train_step_jit(model, optimizer, features, labels):
    def loss_fn(model):
        return ds2_loss(model(features), labels)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    with jax.named_scope("optimizer"):
        optimizer.update(model, grads)
    return loss


def train_step(batch):
    return train_step_jit(model, optimizer, *to_device(batch))   # host -> device copy, timed


def sync(out):
    """JAX dispatches asynchronously: wait until the step's results exist. The step is one XLA program
    whose outputs (loss, new parameters, optimizer state, BatchNorm statistics) become ready together,
    when the whole program has run: its loss is ready only after the parameter update."""
    jax.block_until_ready(out)


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
