"""The latency-aware roofline: a lower bound on a training pass's time that counts the recurrence's dependent steps.

The recurrence is sequential.  For a batch of utterances of T frames, the forward pass runs T/4 dependent steps
per bd layer and direction, each an (N x H) . (H x H) product plus its pointwise work, and the backward pass runs
the same chain again for the gradient with respect to the state; sequence-wise BatchNorm keeps one layer from
starting before the last has finished, and the two directions are independent.  So a batch takes at least::

    time(batch) = fixed + parallel FLOPs / gemm rate + 2 . L . (T/4) . t_step

- ``L``: the bd layers (``DS2Config.rnn_layers``); the 2: the forward chain and the backward (data) chain.
- ``t_step``: one dependent step on the card, measured as a chain of ``relu(x_t + h . U)`` replayed without
  launch gaps (``benchmarks/rnn_latency.py``).  The two directions share the time: they can run side by side.
- parallel FLOPs: the training FLOPs (:meth:`DS2Config.train_flops`) less the sequential products, which the
  ``t_step`` term accounts for: 2 FLOPs per multiply-add of every ``bd{i}.recurrent`` product of
  :meth:`DS2Config.forward_macs_by_layer`, forward and backward-data (the gradient of ``U`` is one large product
  over all steps: parallel).  The same split as :func:`common.flops.sequential_share`.
- ``gemm rate``: the card's dense-product rate at the run's precision (the largest measured).
- ``fixed``: a per-batch cost that is not FLOPs (launches, the loss, the update, host copies).  It is not a
  property of the card; 0 (the default) gives the plain bound, a framework's fitted intercept gives the
  review-style estimate below.

A pass's bound is the audio it holds divided by the sum of its batches' times, in seconds of audio per second;
a measured row's ``share`` is its audio-s/s divided by the bound (:func:`share`).  The batches are given as
``(seconds, batch_size)`` pairs (or objects with ``seconds`` and ``batch_size``: ``common.timing.StepTime``,
``common.data.Batch``); :func:`deepmark_batches` builds them for a DeepMark pass.

The review's estimate table (:data:`REVIEW_ESTIMATE`, PyTorch's fp32 quick run on an H200 as its base) and
what this formula makes of it: with ``t_step`` = 55 us per forward layer-step x 1/2 (the recurrent products'
share of a step) / 2 (cuDNN runs the two directions one after the other) = 13.75 us, the fitted fixed cost
8.1 ms per batch and the H200's measured fp32 square-product rate 51.3 TFLOP/s (the quick record), the quick
pass at batch 32 gives 2,560 audio-s/s (:func:`review_fp32_library`), the table's fp32 library figure.  The
review states no ``t_step`` or GEMM rate for its other entries; :func:`implied_t_step` says what each
implies.  Its bf16 figures cannot hold with the same 8.1 ms per batch: that alone caps the quick pass at
23,500 audio-s/s, and 18,700 would leave 0.41 s for 3.85e14 parallel FLOPs (930 TFLOP/s, near the H100's
dense bf16 peak of 989) and nothing for the recurrence, so they assume a smaller fixed cost.

NumPy-free and framework-free; Python 3.6 compatible.
"""
from collections import OrderedDict

from .spec import FRAMES_PER_SECOND, LENGTH_SHARE_PERCENT, UTTERANCE_SECONDS, DS2Config

#: the review's latency-aware estimate, audio-s/s for batch 32 on an H100/H200:
#: precision -> (library kernels, a persistent RNN kernel).  Estimated, not measured.
REVIEW_ESTIMATE = OrderedDict([("fp32", (2560.0, 3080.0)), ("tf32", (8900.0, 12600.0)),
                               ("bf16", (13300.0, 18700.0))])

#: the stated inputs of the review's fp32 library-kernel figure (PyTorch, fp32, H200, quick preset, batch 32):
#: the forward pass's time per layer-step, the recurrent products' share of it, the directions cuDNN runs one
#: after the other, the fitted fixed cost per batch (step(s) = 8.1 ms + 22.85 ms per second of utterance) and
#: the card's measured fp32 square-product rate.
REVIEW_FP32_INPUTS = OrderedDict([("forward_layer_step_s", 55e-6), ("recurrent_fraction", 0.5),
                                  ("directions_in_sequence", 2), ("fixed_s", 8.1e-3),
                                  ("gemm_flops_per_s", 51.28e12)])


def _frames(seconds):
    return int(round(seconds * FRAMES_PER_SECOND))


def train_flops_split(config, seconds, batch_size=1):
    """Training FLOPs of one batch of ``batch_size`` utterances of ``seconds`` s: ``total``, ``sequential``
    (forward ``U h`` and backward-data products of every bd layer, both directions) and ``parallel``."""
    frames = _frames(seconds)
    macs = config.forward_macs_by_layer(frames)
    recurrent = sum(v for name, v in macs.items() if name.endswith(".recurrent"))
    total = config.train_flops(frames, batch_size)
    sequential = 2.0 * 2.0 * recurrent * batch_size
    return OrderedDict([("total", float(total)), ("sequential", sequential), ("parallel", total - sequential)])


def dependent_steps(config, seconds):
    """Dependent recurrent steps of one training step: 2 (forward, backward) x L layers x T/4."""
    return 2 * config.rnn_layers * config.output_length(_frames(seconds))


def _pairs(batches):
    out = []
    for b in batches:
        seconds, size = (b.seconds, b.batch_size) if hasattr(b, "batch_size") else b
        if size < 0 or seconds <= 0:
            raise ValueError("a batch needs seconds > 0 and batch_size >= 0, got %r" % (b,))
        if size:
            out.append((seconds, int(size)))
    if not out:
        raise ValueError("no non-empty batch")
    return out


def _check_rate(name, value):
    if not value or value <= 0:
        raise ValueError("%s must be positive, got %r" % (name, value))


def batch_bound_s(config, seconds, batch_size, t_step_s, gemm_flops_per_s, fixed_s=0.0):
    """The least time of one training step on ``batch_size`` utterances of ``seconds`` s (the formula above)."""
    _check_rate("gemm_flops_per_s", gemm_flops_per_s)
    if t_step_s < 0 or fixed_s < 0:
        raise ValueError("t_step_s and fixed_s must be >= 0, got %r, %r" % (t_step_s, fixed_s))
    parallel = train_flops_split(config, seconds, batch_size)["parallel"]
    return fixed_s + parallel / gemm_flops_per_s + dependent_steps(config, seconds) * t_step_s


def epoch_bound(config, batches, t_step_s, gemm_flops_per_s, fixed_s=0.0, measured=None):
    """The latency-aware bound of a pass over ``batches`` ((seconds, batch_size) pairs, or objects with
    ``seconds`` and ``batch_size``).

    Returns ``audio_seconds``, ``batches``, ``time_s`` (the least time of the pass) and its parts ``fixed_s``,
    ``parallel_s`` and ``sequential_s``, ``audio_s_per_s`` (the bound), the inputs, and where ``measured``
    (audio-s/s) is given, ``share`` = measured / bound."""
    _check_rate("gemm_flops_per_s", gemm_flops_per_s)
    if t_step_s < 0 or fixed_s < 0:
        raise ValueError("t_step_s and fixed_s must be >= 0, got %r, %r" % (t_step_s, fixed_s))
    pairs = _pairs(batches)
    audio = float(sum(s * n for s, n in pairs))
    parallel_s = sum(train_flops_split(config, s, n)["parallel"] for s, n in pairs) / gemm_flops_per_s
    sequential_s = sum(dependent_steps(config, s) for s, _ in pairs) * t_step_s
    fixed_total = fixed_s * len(pairs)
    time_s = fixed_total + parallel_s + sequential_s
    out = OrderedDict([
        ("audio_seconds", audio), ("batches", len(pairs)), ("time_s", time_s), ("fixed_s", fixed_total),
        ("parallel_s", parallel_s), ("sequential_s", sequential_s), ("audio_s_per_s", audio / time_s),
        ("t_step_s", t_step_s), ("gemm_flops_per_s", gemm_flops_per_s), ("fixed_per_batch_s", fixed_s),
    ])
    if measured is not None:
        out["share"] = share(measured, out["audio_s_per_s"])
    return out


def share(measured, bound):
    """A measured audio-s/s as a share of the bound (an :func:`epoch_bound` result or its audio-s/s)."""
    if isinstance(bound, dict):
        bound = bound["audio_s_per_s"]
    _check_rate("bound", bound)
    if measured is None or measured < 0:
        raise ValueError("measured audio-s/s must be >= 0, got %r" % (measured,))
    return measured / bound


def deepmark_batches(batch_size, scale, lengths=None):
    """(seconds, batch_size) of every batch of a DeepMark pass, in the iterator's order: ascending length,
    full batches, then the rest of the length (``common.data.DeepMarkIterator``'s plan); ``lengths``: keep
    only these utterance lengths (seconds)."""
    for name, value in (("batch_size", batch_size), ("scale", scale)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError("%s must be a positive integer, got %r" % (name, value))
    out = []
    for seconds, percent in zip(UTTERANCE_SECONDS, LENGTH_SHARE_PERCENT):
        if lengths is not None and seconds not in lengths:
            continue
        full, rest = divmod(percent * scale, batch_size)
        out += [(seconds, batch_size)] * full + ([(seconds, rest)] if rest else [])
    return out


def figures_from_benchmark(report, precision):
    """``t_step_s`` and the GEMM rate (the largest measured, the single-step ``recurrent`` shape aside) of one
    precision of ``benchmarks/rnn_latency.py``'s report (the parsed JSON)."""
    entry = report["precisions"][precision]
    rates = [v for k, v in entry["gemm_flops_per_s"].items() if k != "recurrent" and v]
    if not rates:
        raise ValueError("no GEMM rate for %s in the report" % precision)
    return OrderedDict([("t_step_s", entry["t_step_s"]), ("gemm_flops_per_s", max(rates))])


def t_step_from_layer_step(layer_step_s, recurrent_fraction=0.5, directions_in_sequence=2):
    """One dependent step of one direction, from a forward time per layer-step: the recurrent products'
    share of it, divided among the directions that ran one after the other."""
    return layer_step_s * recurrent_fraction / directions_in_sequence


def implied_t_step(config, batches, audio_s_per_s, gemm_flops_per_s, fixed_s=0.0):
    """The ``t_step`` at which :func:`epoch_bound` gives ``audio_s_per_s`` (the bound is linear in it).
    Negative where the fixed and parallel parts alone are already slower: no ``t_step`` reaches it."""
    base = epoch_bound(config, batches, 0.0, gemm_flops_per_s, fixed_s)
    steps = sum(dependent_steps(config, s) for s, _ in _pairs(batches))
    return (base["audio_seconds"] / audio_s_per_s - base["time_s"]) / steps


def estimate_table(config, batches, inputs):
    """Audio-s/s bounds from stated inputs: ``inputs`` maps a precision to {kernel: {t_step_s,
    gemm_flops_per_s, fixed_s}}; the result maps precision -> kernel -> audio-s/s."""
    table = OrderedDict()
    for precision, kernels in inputs.items():
        table[precision] = OrderedDict(
            (kernel, epoch_bound(config, batches, v["t_step_s"], v["gemm_flops_per_s"],
                                 v.get("fixed_s", 0.0))["audio_s_per_s"])
            for kernel, v in kernels.items())
    return table


def review_fp32_library(config=None, batch_size=32, scale=64):
    """The review's fp32 library-kernel figure from :data:`REVIEW_FP32_INPUTS`: the quick pass (scale 64) at
    batch 32 on the full model.  About 2,560 audio-s/s."""
    config = config or DS2Config()
    r = REVIEW_FP32_INPUTS
    t_step = t_step_from_layer_step(r["forward_layer_step_s"], r["recurrent_fraction"], r["directions_in_sequence"])
    return epoch_bound(config, deepmark_batches(batch_size, scale), t_step, r["gemm_flops_per_s"], r["fixed_s"])
