"""DS2 in PyTorch (torch.nn): the model, the CTC loss and one training step.

Lifted out of notebooks/PyTorch_DS2.ipynb: its cells tagged `translation`, written here by
`python -m runner.rosetta --extract pytorch`. Do not edit; edit the notebook. Standalone: the framework and NumPy
only. The preamble holds what the notebook's other cells compute: the DS2 configuration (common/spec.py) as
literal values, and the single-process CPU fp32 settings.

    python docs/translations/ds2_pytorch.py                   # the full model: one step on a random batch
    DS2_WIDTH=smoke python docs/translations/ds2_pytorch.py   # the same at the smoke width

The notebook then loads the canonical weights (its section 5) and checks the first loss against the NumPy
reference; tests/test_translation.py does the same with this file.
"""

import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

variant = ""                                          # eager torch.nn, the row of record
dev, dtype = torch.device("cpu"), torch.float32       # the notebook: cuda when there is a GPU; fp64 for the control
autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=False)   # on for precision bf16


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


# %% PyTorch_DS2.ipynb cell 9 (rosetta:data)
def features_of(batch):
    """The features (N, T, 161) as a tensor on the device, in the run's dtype (float64 in the fp64 control)."""
    return torch.tensor(batch.features, device=dev, dtype=dtype)   # a copy: from_numpy warns on read-only views


def ctc_targets(batch):
    """CTC targets in cuDNN's format: labels concatenated to 1-D int32 on the host, int32 lengths."""
    targets = torch.tensor(batch.labels.reshape(-1))   # a copy: the batch is a read-only view (from_numpy warns)
    target_lengths = torch.full((batch.batch_size,), batch.labels.shape[1], dtype=torch.int32)
    return targets, target_lengths


# %% PyTorch_DS2.ipynb cell 11 (rosetta:model)
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


model = DeepSpeech2(cfg).to(dev, dtype)
n_params = sum(p.numel() for p in model.parameters())
if variant == "compile":
    import torch._dynamo
    from torch._dynamo.utils import counters as dynamo_counters

    # graphs per function: every batch shape, with gradients and without (no_grad), for every module that
    # shares the function's code (SequenceWise.forward serves the bd layers and fc, with other widths)
    graphs_per_function = 2 * len(train_data.shapes()) * (cfg.rnn_layers + 1)
    torch._dynamo.config.recompile_limit = graphs_per_function
    torch._dynamo.config.accumulated_recompile_limit = max(256, graphs_per_function)
    torch._dynamo.config.fail_on_recompile_limit_hit = True   # never fall back to eager silently
    step_model = torch.compile(model, dynamic=False)

    def compilations():
        """Graphs Dynamo has compiled so far (each one a forward graph, and its backward when trained)."""
        return dynamo_counters["stats"]["unique_graphs"]
else:
    step_model = model
print(model)
print("%d parameters" % n_params)


# %% PyTorch_DS2.ipynb cell 15 (rosetta:loss)
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


# %% PyTorch_DS2.ipynb cell 20 (rosetta:optimizer)
optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)


def train_step(batch):
    x = features_of(batch)                               # host -> device copy, timed
    targets, target_lengths = ctc_targets(batch)
    optimizer.zero_grad(set_to_none=True)
    with autocast:
        logits = step_model(x)
    loss = ds2_loss(logits, targets, target_lengths)
    loss.backward()
    optimizer.step()
    return loss.detach()


def sync(_):
    """Wait for the GPU to finish all queued work, the update included (CPU work is synchronous)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


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
