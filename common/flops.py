"""Arithmetic of a run, and the device's measured peak it is held against; no framework import.

FLOPs come from the configuration (:meth:`common.spec.DS2Config.forward_macs_by_layer`), never
typed in: 2 FLOPs per multiply-accumulate, x3 for a training step (forward + backward).

The peak is measured by the notebook itself, with its own framework on its own device and at the
run's precision: dense matrix products, a square one (:attr:`common.spec.Preset.peak_square`) and
the model's own shapes -- the bd layers' input product ``(T/4 * N, 2400) x (2400, 1760)`` and the
recurrent product ``(N, 1760) x (1760, 1760)`` -- each the median of several synchronised
measurements after a warm-up.  A notebook hands over one function::

    def make_matmul(m, k, n):      # operands of shapes (m, k), (k, n) on the device, in the run's precision
        a, b = ...
        return lambda: a @ b       # one product; its result is passed to sync()

    peak = measure_matmul_peak(make_matmul, sync, matmul_shapes(cfg, P.batch_size, P.peak_square),
                               min_time_s=P.peak_time_s)

and :func:`flops_section` turns the timed pass and the peak into the record's ``flops``:
``train`` (FLOPs of the timed pass), ``achieved_per_s``, ``peak_matmul_per_s`` (the square product),
the per-shape rates and ``efficiency`` = achieved / square peak.
"""
import math
import time
from collections import OrderedDict
from typing import Callable, Dict, Iterable, Optional, Tuple

import numpy as np

from .spec import FRAMES_PER_SECOND, DS2Config

#: utterance length (seconds) whose shapes stand for the model's products in the peak measurement
PEAK_SECONDS = 8


def pass_flops(config: DS2Config, steps: Iterable) -> "OrderedDict":
    """Training FLOPs of a pass, per utterance length (seconds, as a string key) and in total.

    ``steps``: objects with ``seconds`` and ``batch_size`` (:class:`common.timing.StepTime`, or batches).
    """
    per_length = OrderedDict()
    for step in steps:
        key = str(step.seconds)
        per_length[key] = per_length.get(key, 0.0) + config.train_flops(step.seconds * FRAMES_PER_SECOND,
                                                                        step.batch_size)
    per_length = OrderedDict(sorted(per_length.items(), key=lambda kv: int(kv[0])))
    return OrderedDict([("total", float(sum(per_length.values()))), ("per_length", per_length)])


def matmul_shapes(config: DS2Config, batch_size: int, square: int,
                  seconds: int = PEAK_SECONDS) -> "OrderedDict[str, Tuple[int, int, int]]":
    """(m, k, n) of the products the peak is measured on: ``square``, ``input`` (every step's input
    product of bd1 at once for a batch of ``seconds``-long utterances) and ``recurrent`` (one time
    step of the recurrence for the batch)."""
    steps = config.output_length(seconds * FRAMES_PER_SECOND)
    return OrderedDict([
        ("square", (square, square, square)),
        ("input", (steps * batch_size, config.rnn_input_width, config.rnn_hidden)),
        ("recurrent", (batch_size, config.rnn_hidden, config.rnn_hidden)),
    ])


#: synchronised products timed to set the iterations per measurement: the fastest counts
CALIBRATIONS = 3


def measure_matmul_peak(make_matmul: Callable[[int, int, int], Callable[[], object]], sync: Callable[[object], object],
                        shapes: Dict[str, Tuple[int, int, int]], repeats: int = 5, min_time_s: float = 0.2,
                        clock: Callable[[], float] = time.perf_counter, budget_s: float = 2.0) -> "OrderedDict":
    """FLOP/s of dense products of each shape: after one synchronised warm-up product, enough products
    per measurement to last ``min_time_s`` (counted from the fastest of up to ``CALIBRATIONS`` products),
    synchronised, ``repeats`` measurements, the median.  A product so slow that ``repeats`` measurements would
    take over ``budget_s`` (bf16 on a CPU without bf16 instructions: seconds each) gets as many as fit, at least
    one; the entry's ``repeats`` says how many ran."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1, got %r" % (repeats,))
    out = OrderedDict()
    for name, (m, k, n) in shapes.items():
        run = make_matmul(m, k, n)
        start = clock()
        sync(run())                                   # warm-up: allocation, kernel choice, compilation
        first = clock() - start
        once, spent = float("inf"), 0.0
        for _ in range(CALIBRATIONS):                 # the fastest of a few: one slow product (a stalled or busy
            start = clock()                           # core) would shorten every measurement below min_time_s
            sync(run())
            took = clock() - start
            once, spent = min(once, took), spent + took
            if spent >= budget_s / 2:                 # products of seconds (bf16 without bf16 instructions)
                break
        once = max(once, 1e-9)
        iterations = max(1, int(math.ceil(min_time_s / once))) if once < min_time_s else 1
        fit = max(1, min(repeats, int(budget_s // (once * iterations))))
        rates = []
        for _ in range(fit):
            start = clock()
            result = None
            for _ in range(iterations):
                result = run()
            sync(result)
            rates.append(2.0 * m * k * n * iterations / max(clock() - start, 1e-12))
        out[name] = OrderedDict([("shape", [m, k, n]), ("flops_per_s", float(np.median(rates))),
                                 ("iterations", iterations), ("repeats", fit), ("warmup_s", first)])
    return out


def sequential_share(config: DS2Config, frames: int = PEAK_SECONDS * FRAMES_PER_SECOND) -> float:
    """Share of a training step's FLOPs in products that must run one time step after another.

    Of the recurrent product's three training products -- ``U h_{t-1}`` forward, the gradient with respect to
    ``h_{t-1}`` and the gradient of ``U`` -- the first two need the previous step's result: one ``(N, H) x (H, H)``
    product per time step.  The third, and every other product of the model, can run as one large product
    over all time steps.  About 0.30 for the full model at any length (the recurrent products are 45 % of
    the MACs)."""
    macs = config.forward_macs_by_layer(frames)
    recurrent = sum(v for name, v in macs.items() if name.endswith(".recurrent"))
    return (2.0 / 3.0) * recurrent / float(sum(macs.values()))


def shape_roofline(config: DS2Config, peak: Optional[dict]) -> Optional[float]:
    """FLOP/s of a training step whose products each ran at the rate measured for their shape.

    The sequential share (:func:`sequential_share`) at the measured ``recurrent`` product's rate (one time
    step for the run's batch size), everything else at the larger of the ``square`` and ``input`` rates:
    ``1 / (s / recurrent + (1 - s) / large)``.  Everything else in a step (BatchNorm, activations, CTC, the
    update, the loop itself) is left out, and the long utterances' smaller batches are credited with the
    batch size's rate, so it is a ceiling on what a framework can achieve on this device with its own matrix
    products run one at a time (as they were measured), not an estimate.  None where a rate is missing."""
    rates = {name: ((peak or {}).get(name) or {}).get("flops_per_s") for name in ("square", "input", "recurrent")}
    if not rates["recurrent"] or not (rates["square"] or rates["input"]):
        return None
    share = sequential_share(config)
    large = max(r for r in (rates["square"], rates["input"]) if r)
    return 1.0 / (share / rates["recurrent"] + (1.0 - share) / large)


def flops_section(config: DS2Config, steps, train_s: float, peak: Optional[dict] = None,
                  theoretical: Optional[dict] = None) -> "OrderedDict":
    """The record's ``flops``: training FLOPs of the timed pass (per length and in total), the rate
    achieved, the measured peaks and the efficiency (achieved / measured square-matmul peak).

    ``steps``: the timed pass (:attr:`common.timing.BenchmarkTimer.steps`); ``peak``: what
    :func:`measure_matmul_peak` returned (None: not measured); ``theoretical``: the CPU's
    theoretical peak (:func:`common.envinfo.cpu_theoretical_peak`), labelled as such.
    """
    steps = list(steps)
    counted = pass_flops(config, steps)
    seconds_by_length = OrderedDict()
    for s in steps:
        seconds_by_length[str(s.seconds)] = seconds_by_length.get(str(s.seconds), 0.0) + s.step_s
    per_length = OrderedDict()
    for key, flops in counted["per_length"].items():
        t = seconds_by_length.get(key)
        per_length[key] = OrderedDict([("train", flops), ("achieved_per_s", flops / t if t else None)])
    achieved = counted["total"] / train_s if train_s else None
    square = ((peak or {}).get("square") or {}).get("flops_per_s")
    section = OrderedDict([
        ("train", counted["total"]),
        ("train_per_audio_second", config.train_flops(FRAMES_PER_SECOND)),
        ("achieved_per_s", achieved),
        ("peak_matmul_per_s", square),
        ("peak_matmul", peak or None),
        ("efficiency", achieved / square if achieved and square else None),
        ("theoretical_peak", theoretical or None),
        ("per_length", per_length),
    ])
    return section
