"""DS2 in PyTorch (torch.nn): the model, its canonical weights, the CTC loss and one training step.

Generated from notebooks/PyTorch_DS2.ipynb (its cells tagged `translation`) by
`python -m runner.rosetta --extract pytorch`: edit the notebook, not this file. Needs the framework and NumPy only.

    python docs/translations/ds2_pytorch.py WEIGHTS.npz                   # or DS2_WEIGHTS=WEIGHTS.npz
    python docs/translations/ds2_pytorch.py                               # no file: random canonical initial weights
    DS2_WIDTH=smoke python docs/translations/ds2_pytorch.py WEIGHTS.npz   # the smoke width

Importing it runs nothing. A canonical weights file is what every notebook exports after its timed epoch
(results/weights/<record>.npz): the same names and layouts for every framework, so any notebook's file loads here.
tests/test_translation.py runs this file on a smoke run's export and holds its loss to the NumPy reference's.
"""

import os
import sys
from dataclasses import dataclass
from typing import Dict, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

dev, dtype = torch.device("cpu"), torch.float32       # the notebook: cuda when there is a GPU; fp64 for the control
autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=False)   # on for precision bf16


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


# %% PyTorch_DS2.ipynb cell 10 (rosetta:data)
def features_of(batch):
    """The features (N, T, 161) as a tensor on the device, in the run's dtype (float64 in the fp64 control)."""
    return torch.tensor(batch.features, device=dev, dtype=dtype)   # a copy: from_numpy warns on read-only views


def ctc_targets(batch):
    """CTC targets in cuDNN's format: each utterance's labels (its first label_lengths[i] of the padded row)
    concatenated to 1-D int32 on the host, int32 lengths."""
    lengths = np.asarray(batch.label_lengths)           # synthetic batches: all the full width
    kept = np.arange(batch.labels.shape[1]) < lengths[:, None]   # row by row: its first label_lengths[i]
    targets = torch.tensor(batch.labels[kept])          # a copy (a batch of no utterance: an empty tensor)
    return targets, torch.tensor(lengths, dtype=torch.int32)


# %% PyTorch_DS2.ipynb cell 12 (rosetta:model)
class SequenceWise(nn.Module):
    """A module applied to every frame of a (T, N, H) sequence, on its (T * N, H) view."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        t, n, h = x.shape
        return self.module(x.reshape(t * n, h)).view(t, n, h)


def sequence_batch_norm(width, cfg):
    """Sequence-wise BatchNorm: statistics over T x N, per feature."""
    return SequenceWise(nn.BatchNorm1d(width, eps=cfg.bn_eps, momentum=cfg.bn_momentum))


class BatchRNN(nn.Module):
    """One bd layer: sequence-wise BatchNorm -> bidirectional ReLU RNN -> directions summed, clipped."""

    bf16 = True   # under bf16 autocast: the RNN in bfloat16 (False: autocast's own RNN, float16 in cuDNN)

    def __init__(self, input_size, cfg):
        super().__init__()
        self.bn = sequence_batch_norm(input_size, cfg)
        self.rnn = nn.RNN(input_size, cfg.rnn_hidden, nonlinearity="relu", bidirectional=True)  # time-major
        for name, bias in self.rnn.named_parameters():   # the spec has one bias per direction: bias_hh stays 0
            if name.startswith("bias_hh"):                 # (section 5) and is not trained -- trained, it gets
                bias.requires_grad_(False)                 # bias_ih's gradient and the sum learns twice as fast
        self.clip = nn.Hardtanh(0.0, cfg.clip)

    def forward(self, x):
        x, device = self.bn(x), x.device.type
        if self.bf16 and torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.bfloat16:
            # autocast's cuDNN RNN computes in float16: bfloat16 copies of the fp32 parameters (the master weights;
            # the casts pass the gradients back), autocast off
            weights = {name: p.to(torch.bfloat16) for name, p in self.rnn.named_parameters()}
            with torch.autocast(device, enabled=False):
                y, _ = torch.func.functional_call(self.rnn, weights, (x.to(torch.bfloat16),))
        else:
            y, _ = self.rnn(x)                            # (T, N, 2H): forward | backward
        forward, backward = y.chunk(2, dim=-1)
        return self.clip(forward + backward)


def conv_block(in_channels, cfg, kernel, stride, padding):
    return nn.Sequential(
        nn.Conv2d(in_channels, cfg.conv_channels, kernel, stride=stride, padding=padding, bias=False),
        nn.BatchNorm2d(cfg.conv_channels, eps=cfg.bn_eps, momentum=cfg.bn_momentum),
        nn.Hardtanh(0.0, cfg.clip),                       # clipped ReLU: min(max(x, 0), 20)
    )


class DeepSpeech2(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.conv1 = conv_block(1, cfg, cfg.conv1_kernel, cfg.conv1_stride, cfg.conv1_padding)
        self.conv2 = conv_block(cfg.conv_channels, cfg, cfg.conv2_kernel, cfg.conv2_stride, cfg.conv2_padding)
        self.rnns = nn.Sequential(*[BatchRNN(width, cfg) for width in cfg.rnn_input_widths()])
        self.fc = nn.Sequential(
            sequence_batch_norm(cfg.rnn_hidden, cfg),
            nn.Linear(cfg.rnn_hidden, cfg.fc_hidden),
            nn.Hardtanh(0.0, cfg.clip),
        )
        self.out = nn.Linear(cfg.fc_hidden, cfg.n_classes)

    def forward(self, x):                                 # x: (N, T, 161) spectrograms
        x = x.transpose(1, 2).unsqueeze(1)                # (N, 1, 161, T): axes (frequency, time)
        x = self.conv2(self.conv1(x))                     # (N, 32, 75, T/4)
        n, c, f, t = x.shape
        x = x.permute(3, 0, 1, 2).reshape(t, n, c * f)    # (T/4, N, 2400), feature index c * 75 + f
        x = self.rnns(x)                                  # (T/4, N, 1760)
        return self.out(self.fc(x))                       # (T/4, N, 29) logits


# %% PyTorch_DS2.ipynb cell 17 (rosetta:weights)
def canonical_map(model):
    """Canonical name -> the model's tensor holding it; an RNN bias -> the pair (bias_ih, bias_hh).
    One table for loading (load_canonical) and exporting (export_canonical, section 11)."""
    table, bns = {}, [("conv1.bn", model.conv1[1]), ("conv2.bn", model.conv2[1])]
    for i, block in ((1, model.conv1), (2, model.conv2)):
        table["conv%d.weight" % i] = block[0].weight
    for i, layer in enumerate(model.rnns, start=1):
        bns.append(("bd%d.bn" % i, layer.bn.module))
        for direction, suffix in (("fwd", ""), ("bwd", "_reverse")):
            p, rnn = "bd%d.%s." % (i, direction), {k: getattr(layer.rnn, k + "_l0" + suffix)
                                                  for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
            table[p + "W"], table[p + "U"] = rnn["weight_ih"], rnn["weight_hh"]
            table[p + "b"] = (rnn["bias_ih"], rnn["bias_hh"])
    bns.append(("fc.bn", model.fc[0].module))
    for name, bn in bns:
        table.update({name + ".gamma": bn.weight, name + ".beta": bn.bias,
                      name + ".mean": bn.running_mean, name + ".var": bn.running_var})
    table.update({"fc.W": model.fc[1].weight, "fc.b": model.fc[1].bias,
                  "out.W": model.out.weight, "out.b": model.out.bias})
    return table


@torch.no_grad()
def load_canonical(model, state):
    """A canonical state into the model: parameters and running statistics; bias_hh = 0."""
    table = canonical_map(model)
    assert set(table) == set(state), sorted(set(table) ^ set(state))
    for name, tensor in table.items():
        value = torch.from_numpy(state[name])
        if isinstance(tensor, tuple):                    # (bias_ih, bias_hh): the canonical b and 0
            tensor[0].copy_(value)
            tensor[1].zero_()
        else:
            tensor.copy_(value)                          # float32 -> the model's dtype (float64 in the control)


# %% PyTorch_DS2.ipynb cell 20 (rosetta:loss)
ctc = nn.CTCLoss(blank=cfg.blank, reduction="sum", zero_infinity=False)


def ctc_sum(logits, targets, target_lengths):
    """CTC summed over the batch, from logits (T/4, N, 29): log_softmax in fp32 (float64 in the control, fp32 also
    under autocast), then nn.CTCLoss."""
    t, n, _ = logits.shape
    log_probs = F.log_softmax(logits, dim=-1, dtype=dtype)
    input_lengths = torch.full((n,), t, dtype=torch.int32)   # no padding: every utterance has T/4 steps
    return ctc(log_probs, targets, input_lengths, target_lengths)


def ds2_loss(logits, targets, target_lengths):
    """CTC summed over the batch, divided by the batch size (the mean per utterance)."""
    return ctc_sum(logits, targets, target_lengths) * (1.0 / logits.shape[1])


# %% PyTorch_DS2.ipynb cell 25 (rosetta:optimizer)
def sgd(model):
    """SGD with classical momentum (no Nesterov, no weight decay)."""
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)


def make_train_step(model, optimizer):
    """train_step(batch): forward (under the run's autocast), CTC, backward and the update; returns the loss (a
    tensor), computed before the update."""
    def train_step(batch):
        x = features_of(batch)                           # host -> device copy, timed
        targets, target_lengths = ctc_targets(batch)
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = model(x)
        loss = ds2_loss(logits, targets, target_lengths)
        loss.backward()
        optimizer.step()
        return loss.detach()
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
    model = DeepSpeech2(cfg).to(dev, dtype)
    load_canonical(model, state)
    train_step = make_train_step(model, sgd(model))
    rng = np.random.RandomState(0)
    batch = Batch(rng.standard_normal((2, 200, cfg.n_freq)).astype(np.float32),
                  rng.randint(1, cfg.n_classes, size=(2, 10)).astype(np.int32))
    out = train_step(batch)
    print("one training step, loss %.6f" % float(out))
