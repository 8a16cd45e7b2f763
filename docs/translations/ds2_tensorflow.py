"""DS2 in TensorFlow (tf.keras): the model, the CTC loss and one training step.

Lifted out of notebooks/TensorFlow_DS2.ipynb: its cells tagged `translation`, written here by
`python -m runner.rosetta --extract tensorflow`. Do not edit; edit the notebook. Standalone: the framework and NumPy
only. The preamble holds what the notebook's other cells compute: the DS2 configuration (common/spec.py) as
literal values, and the single-process CPU fp32 settings.

    python docs/translations/ds2_tensorflow.py                   # the full model: one step on a random batch
    DS2_WIDTH=smoke python docs/translations/ds2_tensorflow.py   # the same at the smoke width

The notebook then loads the canonical weights (its section 5) and checks the first loss against the NumPy
reference; tests/test_translation.py does the same with this file.
"""

import os

import keras
import numpy as np
import tensorflow as tf
from keras import layers

jit_compile = False                                   # True: the xla variant


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


# %% TensorFlow_DS2.ipynb cell 9 (rosetta:data)
def ctc_labels(batch):
    """CTC labels as a SparseTensor: indices (N * L, 2) int64, values int32, dense shape (N, L);
    dense (N, L) int32 for XLA."""
    if jit_compile:
        return tf.constant(batch.labels)
    n, length = batch.labels.shape
    indices = np.stack(np.unravel_index(np.arange(n * length), (n, length)), axis=1)
    return tf.SparseTensor(indices, batch.labels.reshape(-1), dense_shape=(n, length))


features_spec = tf.TensorSpec([None, None, cfg.n_freq], tf.float32)   # (N, T, 161), any N and T
labels_spec = tf.TensorSpec([None, None], tf.int32) if jit_compile else tf.SparseTensorSpec([None, None], tf.int32)


# %% TensorFlow_DS2.ipynb cell 11 (rosetta:model)
def batch_norm(name, synchronized):
    # Keras's momentum weights the old running value: 1 - 0.1 = 0.9; synchronized: statistics of the global batch
    return layers.BatchNormalization(momentum=1 - cfg.bn_momentum, epsilon=cfg.bn_eps, synchronized=synchronized,
                                     name=name)


def conv_block(x, i, kernel, stride, padding, synchronized):
    """Conv over (time, frequency) with the spec's symmetric padding, no bias -> BatchNorm -> clipped ReLU."""
    (k_freq, k_time), (s_freq, s_time), (p_freq, p_time) = kernel, stride, padding   # spec order: (freq, time)
    x = layers.ZeroPadding2D(((p_time, p_time), (p_freq, p_freq)), name="conv%d_pad" % i)(x)
    x = layers.Conv2D(cfg.conv_channels, (k_time, k_freq), strides=(s_time, s_freq), padding="valid",
                      use_bias=False, name="conv%d" % i)(x)
    x = batch_norm("conv%d_bn" % i, synchronized)(x)
    return layers.ReLU(max_value=cfg.clip, name="conv%d_clip" % i)(x)   # min(max(x, 0), 20)


def bd_layer(x, i, synchronized):
    """One bd layer: sequence-wise BatchNorm -> bidirectional ReLU RNN -> directions summed, clipped."""
    x = batch_norm("bd%d_bn" % i, synchronized)(x)
    rnn = layers.SimpleRNN(cfg.rnn_hidden, activation="relu", return_sequences=True)   # batch-major
    x = layers.Bidirectional(rnn, merge_mode="sum", name="bd%d" % i)(x)
    return layers.ReLU(max_value=cfg.clip, name="bd%d_clip" % i)(x)


def deepspeech2(cfg, synchronized=False):
    spectrogram = keras.Input(shape=(None, cfg.n_freq), name="spectrogram")         # (N, T, 161)
    x = layers.Reshape((-1, cfg.n_freq, 1), name="to_image")(spectrogram)          # (N, T, 161, 1): NHWC
    x = conv_block(x, 1, cfg.conv1_kernel, cfg.conv1_stride, cfg.conv1_padding, synchronized)   # (N, T/2, 79, 32)
    x = conv_block(x, 2, cfg.conv2_kernel, cfg.conv2_stride, cfg.conv2_padding, synchronized)   # (N, T/4, 75, 32)
    x = layers.Reshape((-1, cfg.rnn_input_width), name="to_sequence")(x)           # (N, T/4, 2400): f * 32 + c
    for i in range(1, cfg.rnn_layers + 1):
        x = bd_layer(x, i, synchronized)                                           # (N, T/4, 1760)
    x = batch_norm("fc_bn", synchronized)(x)
    x = layers.Dense(cfg.fc_hidden, name="fc")(x)
    x = layers.ReLU(max_value=cfg.clip, name="fc_clip")(x)
    logits = layers.Dense(cfg.n_classes, name="out")(x)                            # (N, T/4, 29) logits
    return keras.Model(spectrogram, logits, name="deepspeech2")


model = deepspeech2(cfg)
n_params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)  # BatchNorm's moving statistics are not trained
model.summary()


# %% TensorFlow_DS2.ipynb cell 15 (rosetta:loss)
def ctc_per_utterance(logits, labels):
    """The CTC loss of every utterance, (N,)."""
    logits = tf.cast(logits, tf.float32)                       # (N, T/4, 29), batch-major
    n, t = tf.shape(logits)[0], tf.shape(logits)[1]
    if isinstance(labels, tf.SparseTensor):
        label_length = None                                    # lengths come with the SparseTensor
    else:
        label_length = tf.fill([n], tf.shape(labels)[1])       # dense labels: every label has L symbols
    return tf.nn.ctc_loss(labels, logits, label_length=label_length,
                          logit_length=tf.fill([n], t),    # no padding: every utterance has T/4 steps
                          logits_time_major=False, blank_index=cfg.blank)


def ds2_loss(logits, labels):
    """CTC summed over the batch, divided by the batch size (mean per utterance)."""
    per_utterance = ctc_per_utterance(logits, labels)
    return tf.reduce_sum(per_utterance) / tf.cast(tf.shape(per_utterance)[0], tf.float32)


# %% TensorFlow_DS2.ipynb cell 18 (rosetta:optimizer)
optimizer = keras.optimizers.SGD(learning_rate=cfg.lr, momentum=cfg.momentum)
optimizer.build(model.trainable_variables)                     # momentum slots, created outside the graph
written = model.trainable_variables + model.non_trainable_variables   # what a step writes (moving statistics too)


@tf.function(input_signature=[features_spec, labels_spec], jit_compile=jit_compile)
def tf_train_step(x, labels):
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss = ds2_loss(logits, labels)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    # read after the writes (automatic control dependencies): ready only when the whole update has run
    done = tf.add_n([tf.cast(tf.reshape(v, [-1])[0], tf.float32) for v in written])
    return loss, done


def train_step(batch):
    return tf_train_step(tf.constant(batch.features), ctc_labels(batch))


def sync(output):
    """Wait for the device: read one scalar of the step's `done` (its update has run), or of a result."""
    done = output[1] if isinstance(output, tuple) else output
    tf.reshape(done, [-1])[0].numpy()


if __name__ == "__main__":             # one step on a random batch: 2 utterances of 2 s (200 frames), 10 labels
    class Batch:
        def __init__(self, features, labels):
            self.features, self.labels = features, labels
            self.batch_size, self.frames = features.shape[0], features.shape[1]

    rng = np.random.RandomState(0)
    batch = Batch(rng.standard_normal((2, 200, cfg.n_freq)).astype(np.float32),
                  rng.randint(1, cfg.n_classes, size=(2, 10)).astype(np.int32))
    out = train_step(batch)
    print("one training step, loss %.6f" % float(out[0]))
