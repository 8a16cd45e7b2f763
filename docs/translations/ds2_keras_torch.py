"""DS2 in Keras 3 (torch backend): the model, the CTC loss and one training step.

Lifted out of notebooks/Keras3_DS2.ipynb: its cells tagged `translation`, written here by
`python -m runner.rosetta --extract keras-torch`. Do not edit; edit the notebook. Standalone: the framework and NumPy
only. The preamble holds what the notebook's other cells compute: the DS2 configuration (common/spec.py) as
literal values, and the single-process CPU fp32 settings.

    python docs/translations/ds2_keras_torch.py                   # the full model: one step on a random batch
    DS2_WIDTH=smoke python docs/translations/ds2_keras_torch.py   # the same at the smoke width

The notebook then loads the canonical weights (its section 5) and checks the first loss against the NumPy
reference; tests/test_translation.py does the same with this file.
"""

import os

backend = "torch"                                     # jax | tensorflow | torch: the notebook's parameter
os.environ["KERAS_BACKEND"] = backend                 # read once, at the first import of keras
import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers, ops  # noqa: E402

jit_compile = "auto"                                  # the backend's default; True: the xla variant (TensorFlow)


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


# %% Keras3_DS2.ipynb cell 10 (rosetta:model)
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


def bd_block(i):
    """Sequence-wise BatchNorm -> bidirectional ReLU RNN, directions summed -> clipped."""
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
        + [layer for i in range(1, cfg.rnn_layers + 1) for layer in bd_block(i)]
        + [layers.BatchNormalization(momentum=bn_momentum, epsilon=cfg.bn_eps, name="fc_bn"),
           layers.Dense(cfg.fc_hidden, name="fc"),
           layers.ReLU(max_value=cfg.clip, name="fc_clip"),
           layers.Dense(cfg.n_classes, name="out")],                          # (N, T/4, 29) logits
        name="deepspeech2")


model = build_model()
n_params = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
model.summary()


# %% Keras3_DS2.ipynb cell 14 (rosetta:loss)
@keras.saving.register_keras_serializable(package="ds2")   # model.save records the compiled loss by this name
class CTCLoss(keras.losses.Loss):
    """CTC per utterance (blank 0); the Loss base class sums over the batch and divides by its size."""

    def call(self, labels, logits):
        labels = ops.cast(labels, "int32")                   # Loss.__call__ hands labels over as float32
        n, steps = ops.shape(logits)[0], ops.shape(logits)[1]
        label_lengths = ops.full((n,), ops.shape(labels)[1], dtype="int32")
        logit_lengths = ops.full((n,), steps, dtype="int32")   # no padding: every utterance has T/4 steps
        return ops.ctc_loss(labels, logits, label_lengths, logit_lengths, mask_index=cfg.blank)


ctc_loss = CTCLoss(name="ctc")


# %% Keras3_DS2.ipynb cell 17 (rosetta:optimizer)
optimizer = keras.optimizers.SGD(learning_rate=cfg.lr, momentum=cfg.momentum)
model.compile(optimizer=optimizer, loss=ctc_loss, jit_compile=jit_compile)


def train_step(batch):
    return model.train_on_batch(batch.features, batch.labels)   # the batch's loss, a Python float


if backend == "tensorflow":
    probe = model.trainable_variables[-1]     # `out`'s bias: a variable the update writes

    def sync(output):
        """Wait for the whole step: read one element of an updated variable (queued behind the step)."""
        return float(ops.convert_to_numpy(probe.value[0]))
else:
    def sync(output):
        """Nothing left to wait for: train_on_batch's float loss was read after the whole step (see above)."""
        return output


print("jit_compile:", model.jit_compile)


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
