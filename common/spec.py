"""The DS2 Rosetta specification, as code.

Every notebook builds its model from a :class:`DS2Config` and never types a width,
kernel or hyper-parameter itself.  The numbers below are the benchmark; the README
explains them in prose.

The model ("DS2-DeepMark", canonical form), for input ``x`` of shape (N, T, 161):

====  ==========  =====================================================================
 #    layer       definition
====  ==========  =====================================================================
 1    conv1       Conv2D 1->32 over (freq, time), kernel (5, 20), stride (2, 2),
                  padding (0, 9), no bias -> BatchNorm2d -> clipped ReLU
 2    conv2       Conv2D 32->32, kernel (5, 10), stride (1, 2), padding (0, 4), no bias
                  -> BatchNorm2d -> clipped ReLU
 3    to sequence flatten channel-major (feature = c * 75 + f) -> (T/4, N, 2400)
 4-10 bd x 7      sequence-wise BatchNorm of the input -> bidirectional ReLU RNN (hidden
                  1760, one bias per direction) -> min(h_fwd + h_bwd, 20)
 11   fc          sequence-wise BatchNorm -> Linear 1760->1760 -> clipped ReLU
 12   out         Linear 1760->29 -> logits (softmax lives inside the CTC loss)
====  ==========  =====================================================================

Loss: CTC with blank 0, summed over the batch and divided by the batch size.
Optimizer: SGD, classical momentum 0.9 (v = 0.9 v + g; p -= lr v), lr 1e-4.

This module is framework-free and runs on Python 3.6 (CNTK's interpreter) as well as 3.11+.
"""
from dataclasses import asdict, dataclass, field, replace
from collections import OrderedDict
from typing import Dict, Optional, Tuple

# DeepMark's utterance-length table (Baidu's DS2 proposal, the DeepMark benchmark's first issue on GitHub).
UTTERANCE_SECONDS = tuple(range(1, 16))
#: share of utterances of each length, in percent (sums to 100)
LENGTH_SHARE_PERCENT = (3, 10, 11, 13, 14, 13, 9, 8, 5, 4, 3, 2, 2, 2, 1)
#: label (transcript) length for each utterance length
LABEL_LENGTHS = (7, 17, 35, 48, 62, 78, 93, 107, 120, 134, 148, 163, 178, 193, 209)
#: spectrogram frames per second of audio (10 ms hop)
FRAMES_PER_SECOND = 100
#: DeepMark's scale: utterances per percent point of the length table in one full epoch
DEEPMARK_SCALE = 1280

PRECISIONS = ("fp32", "tf32", "bf16")


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

    # ---- derived quantities (computed, never typed) -------------------------------
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

    @property
    def param_count(self) -> int:
        """Canonical trainable parameter count: one bias per RNN direction (92,244,637)."""
        total = 0
        for shape in self.param_shapes().values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    @property
    def extra_rnn_biases(self) -> int:
        """Parameters a fused two-bias RNN (cuDNN layout: b_ih and b_hh) holds on top (24,640)."""
        return self.rnn_layers * 2 * self.rnn_hidden

    def forward_macs_by_layer(self, frames: int) -> "OrderedDict[str, int]":
        """Multiply-accumulates of one forward pass over one utterance of ``frames`` frames, per product.

        Convolutions, and for every bd layer the input product ``W x`` and the recurrent product
        ``U h`` of both directions, the fc and the output layer (BatchNorm, activations and CTC are
        lower order and not counted).  Keys: ``conv1``, ``conv2``, ``bd{i}.input``, ``bd{i}.recurrent``,
        ``fc``, ``out``.
        """
        c = self.conv_channels
        t1 = self.time_after_conv1(frames)
        t2 = self.output_length(frames)
        kf1, kt1 = self.conv1_kernel
        kf2, kt2 = self.conv2_kernel
        macs = OrderedDict()
        macs["conv1"] = t1 * self.freq_after_conv1 * c * (1 * kf1 * kt1)
        macs["conv2"] = t2 * self.freq_after_conv2 * c * (c * kf2 * kt2)
        for i, width in enumerate(self.rnn_input_widths(), start=1):
            macs["bd%d.input" % i] = t2 * 2 * width * self.rnn_hidden              # both directions
            macs["bd%d.recurrent" % i] = t2 * 2 * self.rnn_hidden * self.rnn_hidden
        macs["fc"] = t2 * self.rnn_hidden * self.fc_hidden
        macs["out"] = t2 * self.fc_hidden * self.n_classes
        return macs

    def forward_macs(self, frames: int) -> int:
        """Multiply-accumulates of one forward pass over one utterance of ``frames`` frames
        (the sum of :meth:`forward_macs_by_layer`)."""
        return sum(self.forward_macs_by_layer(frames).values())

    def train_flops(self, frames: int, batch_size: int = 1) -> float:
        """FLOPs of one training step on ``batch_size`` utterances of ``frames`` frames:
        2 FLOPs per multiply-accumulate, x3 for forward + backward (the backward pass computes the
        gradients of inputs and of weights, one product each per forward product)."""
        return 3.0 * 2.0 * self.forward_macs(frames) * batch_size

    @property
    def forward_flops_per_audio_second(self) -> float:
        """Forward FLOPs (2 per MAC) per second of audio: about 4.82e9 for the full model."""
        return 2.0 * self.forward_macs(FRAMES_PER_SECOND)

    @property
    def train_flops_per_audio_second(self) -> float:
        """Training FLOPs per second of audio (forward + backward ~ 3x forward)."""
        return 3.0 * self.forward_flops_per_audio_second

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Preset:
    """A named benchmark setting: the model, how much data, and the default batch size."""

    name: str
    config: DS2Config
    scale: int              # utterances per percent point of the length table
    batch_size: int         # default minibatch size
    purpose: str
    forward_repeats: int = 3    # repeats per utterance length of the forward-only timing (median)
    peak_square: int = 4096     # side of the square matmul whose rate is the device's measured peak
    peak_time_s: float = 0.2    # each of the peak's measurements lasts at least this (measure_matmul_peak min_time_s)
    lengths: Tuple[int, ...] = UTTERANCE_SECONDS   # the utterance lengths (s) of the data: all 15, or a few

    def with_overrides(self, batch_size=None, scale=None) -> "Preset":
        """This preset with a different batch size and/or data scale (validated)."""
        batch_size = self.batch_size if batch_size is None else batch_size
        scale = self.scale if scale is None else scale
        _check_positive_int("batch_size", batch_size)
        _check_positive_int("scale", scale)
        return replace(self, batch_size=batch_size, scale=scale)

    def to_dict(self) -> dict:
        d = asdict(self)
        return d


def _check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("%s must be a positive integer, got %r" % (name, value))


FULL_MODEL = DS2Config()
SMOKE_MODEL = DS2Config(conv_channels=4, rnn_layers=2, rnn_hidden=32, fc_hidden=32)

PRESETS = {
    "deepmark": Preset("deepmark", FULL_MODEL, scale=DEEPMARK_SCALE, batch_size=32,
                       purpose="the real benchmark on a GPU: full model, one full DeepMark epoch"),
    "quick": Preset("quick", FULL_MODEL, scale=64, batch_size=32,
                    purpose="a fast GPU run: full model, 5% of an epoch with the same length mix"),
    # The correctness check, quick by design: 4 of the 15 lengths at one utterance per percent point, in
    # batches of 8 -- 3 x 1 s (a partial batch), 10 x 2 s (8 + 2), 9 x 7 s (8 + a batch of one: with 2
    # workers one share is empty), 8 x 8 s (the profiled batch): 30 utterances, 150 s of audio, 6 batches of 6
    # shapes, so an XLA row compiles 6 programs, not 21, and warm-up plus epoch make the 12 losses of which the
    # cross-framework comparisons read 10.
    "smoke": Preset("smoke", SMOKE_MODEL, scale=1, batch_size=8, lengths=(1, 2, 7, 8),
                    purpose="CPU, CI and tests: same structure with small widths, 30 utterances of 4 lengths",
                    peak_square=1024, peak_time_s=0.05),   # a correctness run: its peak frames no speed claim
    # The full model on a machine without a GPU, sized for minutes per framework on 2 CPU cores (the
    # committed Xeon records: 5.5 to 12 minutes with a profiled step, docs/benchmark.md): one utterance per percent point (100 utterances, 594 s of audio) in batches of 8, so the
    # long lengths (10-15 s) come in batches of 1-4 utterances -- their recurrence is a matrix-vector
    # product, memory-bound; forward timing once per length.
    "cpu": Preset("cpu", FULL_MODEL, scale=1, batch_size=8, forward_repeats=1,
                  purpose="the full model on a CPU: 100 utterances (594 s of audio), about 5 to 12 min per framework "
                          "on 2 cores"),
}


def get_preset(name: str) -> Preset:
    """Look up a preset by name; an unknown name raises ValueError listing the valid ones.  A real-task preset's
    name (:data:`LEARN_PRESETS`) gives its :meth:`LearnPreset.check_preset`: what a notebook's sections 3-12 run
    before the learning section."""
    try:
        if isinstance(name, str) and name in LEARN_PRESETS:
            return LEARN_PRESETS[name].check_preset()
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError("unknown preset %r; valid presets: %s"
                         % (name, ", ".join(sorted(PRESETS) + sorted(LEARN_PRESETS)))) from None


def is_learn_preset(name) -> bool:
    """Whether ``name`` is a real-task preset (:data:`LEARN_PRESETS`)."""
    return isinstance(name, str) and name in LEARN_PRESETS


@dataclass(frozen=True)
class LearnPreset:
    """The real task (spec section 9): a DS2 of reduced width learns spoken English (``common/corpus.py``) from the
    canonical weights of its width, with the optimizer of its config, evaluated by greedy CTC decoding and CER
    (``common/decode.py``) every ``eval_every`` steps; the run stops at ``target_cer`` on ``target_split`` or after
    ``max_steps`` steps.  The corpus is the committed manifest's (its seed and sizes are repeated here)."""

    name: str
    config: DS2Config
    batch_size: int             # training utterances per step
    eval_every: int             # steps between evaluations (evaluation time counts: MLPerf-style)
    target_cer: float           # stop when target_split's CER is at or below this
    target_split: str
    max_steps: int              # the cap when the target is not reached
    eval_batch_size: int        # utterances per evaluation batch (forward only)
    corpus_seed: int
    train_utterances: int
    test_utterances: int        # in each test split (test_seen, test_unseen)
    purpose: str
    grid_frames: int = 40       # the corpus's padding grid (common/corpus.py): every batch's T is a multiple of it

    def to_dict(self) -> dict:
        return asdict(self)

    def check_preset(self) -> Preset:
        """The benchmark preset a notebook runs before its learning section, under this preset's name: the learn
        width and batch size, and synthetic data of one batch (3 utterances of 1 s, DeepMark's mix at scale 1) --
        the check batch of the first-loss, parameter-count and checksum checks, one warm-up step and a timed pass
        of that one step, so the record keeps its sections; the learning section starts again from the canonical
        weights."""
        return Preset(self.name, self.config, scale=1, batch_size=self.batch_size, lengths=(1,), forward_repeats=1,
                      peak_square=1024, peak_time_s=0.05, purpose=self.purpose)


#: The learn width: 2 convolutions of 16 channels, 3 bidirectional ReLU RNNs of 256, fc 256 (1,362,941 canonical
#: parameters), and its optimizer: the spec's SGD with momentum 0.9 at lr 1e-3.
LEARN_MODEL = DS2Config(conv_channels=16, rnn_layers=3, rnn_hidden=256, fc_hidden=256, lr=1e-3)

#: The real-task presets.  Kept apart from PRESETS (the benchmark presets); ``run_all.py --preset`` accepts both,
#: and :func:`get_preset` gives a learn preset's :meth:`LearnPreset.check_preset`.  ``common/learn.py`` runs them.
LEARN_PRESETS = {
    "learn": LearnPreset("learn", LEARN_MODEL, batch_size=16, eval_every=50, target_cer=0.35,
                         target_split="test_seen", max_steps=1500, eval_batch_size=32, corpus_seed=0,
                         train_utterances=3000, test_utterances=200,
                         purpose="the real task: spoken English (3,000 training utterances, 1.75 h), greedy CER "
                                 "on unseen sentences of training voices and of unseen voices"),
    # The tests' short run (tests/test_learning_rows.py): the same model, optimizer and batch size on a corpus of
    # the same recipe made small enough to build in seconds, a cap of a few dozen steps and a target a learning row
    # reaches within it (measured: docs/real-task.md).  Its grid of 80 frames instead of 40 gives 4 lengths instead
    # of 8, so an XLA row compiles 11 programs instead of 27 (7 training and 4 evaluation shapes).
    "learn-smoke": LearnPreset("learn-smoke", LEARN_MODEL, batch_size=16, eval_every=30, target_cer=0.9,
                               target_split="test_seen", max_steps=60, eval_batch_size=32, corpus_seed=0,
                               train_utterances=200, test_utterances=30,
                               purpose="tests and CI: the learn model on 200 training utterances, at most 60 steps",
                               grid_frames=80),
}


def get_learn_preset(name: str = "learn") -> LearnPreset:
    """Look up a real-task preset; an unknown name raises ValueError listing the valid ones."""
    try:
        return LEARN_PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError("unknown learn preset %r; valid: %s" % (name, ", ".join(sorted(LEARN_PRESETS)))) from None


#: the float64 control: a reference mode of the PyTorch notebook (``precision="fp64"``),
#: never a benchmark row; the report holds every fp32 trajectory against it.
CONTROL_PRECISION = "fp64"


def check_precision(precision: str, control: bool = False) -> str:
    """Validate a precision name (fp32, tf32, bf16; with ``control=True`` also the float64 control)."""
    if control and precision == CONTROL_PRECISION:
        return precision
    if precision not in PRECISIONS:
        raise ValueError("unknown precision %r; valid precisions: %s" % (precision, ", ".join(PRECISIONS)))
    return precision


#: the parts of a run that a notebook's ``skip`` parameter (``run_all.py --skip PARTS``) leaves out, and what each
#: is: what a timed run on a lent GPU needs no time for.  Training, its checks and the record always run.
SKIPPABLE = OrderedDict([
    ("export", "section 11: the canonical export's files and its checks (the state is still computed in memory)"),
    ("onnx", "section 11b: the ONNX export and its onnxruntime check"),
    ("forward", "section 10: the forward-only timing (the record's timing.forward_ms stays empty)"),
])


def skip_error(parts) -> Optional[str]:
    """Why ``parts`` (a list of :data:`SKIPPABLE` names) cannot be skipped together, or None: each part once, and
    ``export`` only with ``onnx`` (the ONNX route starts from the files the export writes)."""
    for i, part in enumerate(parts):
        if part not in SKIPPABLE:
            return "unknown part %r; choose from: %s" % (part, ", ".join(SKIPPABLE))
        if part in parts[:i]:
            return "%s is named twice; name each part once" % part
    if "export" in parts and "onnx" not in parts:
        return "export without onnx: the ONNX route (section 11b) starts from the files the export writes; skip both"
    return None


def check_skip(skip) -> list:
    """Validate a notebook's ``skip`` parameter, a list of :data:`SKIPPABLE` parts (``[]``: the whole run);
    returns it as a list."""
    if isinstance(skip, str) or not isinstance(skip, (list, tuple)):
        raise ValueError("skip is a list of parts (%s), e.g. [\"forward\"]; got %r" % (", ".join(SKIPPABLE), skip))
    problem = skip_error(list(skip))
    if problem:
        raise ValueError("skip=%r: %s" % (list(skip), problem))
    return list(skip)


#: relative tolerance of the first-loss check against the NumPy reference, per precision.
#: fp32 is the spec's 1e-4; tf32 and bf16 round inputs of every matmul (10 and 7 mantissa bits).
LOSS_RTOL = {"fp32": 1e-4, "tf32": 1e-2, "bf16": 5e-2, "fp64": 1e-9}
