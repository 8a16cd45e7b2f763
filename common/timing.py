"""The timing protocol, shared by every notebook; no framework import.

A notebook hands over three things of its framework:

* ``train_step(batch) -> loss``: one SGD step on a :class:`common.data.Batch`, host->device
  copy included;
* ``forward(batch) -> output``: the forward pass alone (training-mode BatchNorm, no gradient);
* ``sync(output)``: blocks until the device has finished all queued work (e.g.
  ``torch.cuda.synchronize()``, ``jax.block_until_ready``, ``mx.nd.waitall()``, reading the
  loss value).

and the :class:`BenchmarkTimer` runs the protocol:

1. **Warm-up**: one untimed step for every distinct batch shape of the pass (compilation,
   autotuning, allocation); its total is ``warmup_s``.  These are real training steps, the
   same batches in every framework, so the loss trajectory stays comparable.
2. **Timed pass**: the whole iterator once, in its order, the device synchronised at the end
   of every step.  ``train_s`` is the wall-clock time of the pass.
3. **Forward-only**: one batch per utterance length, a few repeats, median per length.  With a
   time budget (``budget_s``, opt-in) the repeats go round the lengths and stop once the budget is
   spent: every length is still timed at least once, whatever the number of lengths.

:meth:`BenchmarkTimer.summary` turns this into the record's ``timing`` and ``losses``.
"""
import math
import sys
import time
from collections import OrderedDict, namedtuple
from typing import Any, Callable, Iterable, List, Optional

import numpy as np

from .data import utterance_counts
from .envinfo import host_peak_rss_bytes
from .spec import DEEPMARK_SCALE, UTTERANCE_SECONDS

#: One timed training step.
StepTime = namedtuple("StepTime", ["index", "seconds", "batch_size", "step_s", "loss"])


def _stats_ms(seconds: List[float]) -> dict:
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    return {"mean": float(ms.mean()), "median": float(np.median(ms)), "p90": float(np.percentile(ms, 90))}


class BenchmarkTimer:
    """Runs the spec's timing protocol around a framework's step, forward and sync functions."""

    def __init__(self, sync: Callable[[Any], Any], to_float: Callable[[Any], float] = float,
                 clock: Callable[[], float] = time.perf_counter):
        self.sync = sync
        self.to_float = to_float
        self.clock = clock
        self.warmup_s = None          # type: Optional[float]
        self.warmup_losses = []       # type: List[float]
        self.steps = []               # type: List[StepTime]
        self.train_s = None           # type: Optional[float]
        self.forward_ms = OrderedDict()  # seconds of audio -> median ms
        self.forward_repeats = None   # type: Optional[int]
        self.forward_counts = OrderedDict()   # seconds of audio -> how many times that length was timed
        self.forward_budget_s = None  # type: Optional[float]
        self.training_peak_rss = None  # type: Optional[int]  # process peak RSS at the end of the timed pass

    def _timed(self, fn, batch):
        start = self.clock()
        out = fn(batch)
        self.sync(out)
        return out, self.clock() - start

    def warmup(self, train_step: Callable, batches: Iterable) -> float:
        """One untimed step per batch (``iterator.warmup_batches()``); returns the total seconds."""
        total = 0.0
        for batch in batches:
            loss, seconds = self._timed(train_step, batch)
            total += seconds
            self.warmup_losses.append(self.to_float(loss))
        self.warmup_s = total
        return total

    def epoch(self, train_step: Callable, batches: Iterable, total: Optional[int] = None,
              log_every: Optional[int] = None, out=None) -> float:
        """The timed pass over ``batches`` (the iterator); returns its wall-clock seconds."""
        out = out or sys.stdout
        if total is None and hasattr(batches, "__len__"):
            total = len(batches)
        if log_every is None:
            log_every = max(1, (total or 10) // 10)
        self.steps = []
        audio = 0
        start = self.clock()
        for batch in batches:
            loss, seconds = self._timed(train_step, batch)
            value = self.to_float(loss)
            if not math.isfinite(value):
                raise FloatingPointError("loss is %r at step %d (batch %d)" % (value, len(self.steps), batch.index))
            self.steps.append(StepTime(batch.index, batch.seconds, batch.batch_size, seconds, value))
            audio += batch.audio_seconds
            if len(self.steps) % log_every == 0 or len(self.steps) == total:
                elapsed = self.clock() - start
                out.write("step %d/%s  loss %.4f  %.1f s of audio per second\n"
                          % (len(self.steps), total or "?", value, audio / elapsed if elapsed > 0 else float("nan")))
                out.flush()
        self.train_s = self.clock() - start
        self.training_peak_rss = host_peak_rss_bytes()   # warm-up and timed pass; not what a notebook does later
        return self.train_s

    def forward(self, forward: Callable, batches: Iterable, repeats: int = 3,
                budget_s: Optional[float] = None) -> "OrderedDict":
        """Median forward-only milliseconds per utterance length (``iterator.one_batch_per_length()``).

        Without ``budget_s`` (the default) each length is timed ``repeats`` times, one length after the other.
        With ``budget_s`` (seconds) the timing goes round the lengths, at most ``repeats`` rounds: the first
        round times every length once, and after it a timing starts only while less than ``budget_s`` has
        passed since the first one began (a round may stop part-way).  So every length is timed at least once
        and at most ``repeats`` times, whatever the number of lengths; ``forward_counts`` says how often each
        was, and ``forward_repeats`` stays the repeats asked for (the most any length got).
        """
        if repeats < 1:
            raise ValueError("repeats must be at least 1, got %r" % (repeats,))
        if budget_s is not None and not (isinstance(budget_s, (int, float)) and not isinstance(budget_s, bool)
                                         and budget_s >= 0 and math.isfinite(budget_s)):
            raise ValueError("budget_s must be a finite number of seconds >= 0 or None, got %r" % (budget_s,))
        batches = list(batches)
        self.forward_repeats = repeats if batches else None      # no batch (skip=["forward"]): nothing timed
        self.forward_budget_s = budget_s
        times = OrderedDict((batch.seconds, []) for batch in batches)   # type: OrderedDict
        if budget_s is None:
            for batch in batches:
                times[batch.seconds] = [self._timed(forward, batch)[1] for _ in range(repeats)]
        else:
            start = self.clock()
            for i, batch in enumerate(batches * repeats):         # round after round over the lengths
                if i >= len(batches) and self.clock() - start >= budget_s:
                    break                                         # budget spent; every length timed once
                times[batch.seconds].append(self._timed(forward, batch)[1])
        for seconds, samples in times.items():
            self.forward_ms[seconds] = float(np.median(samples) * 1e3)
            self.forward_counts[seconds] = len(samples)
        return self.forward_ms

    def summary(self, projected_scale: int = DEEPMARK_SCALE) -> dict:
        """The record's ``timing`` and ``losses`` sections as one dict: {"timing": .., "losses": ..}."""
        if not self.steps or self.train_s is None:
            raise RuntimeError("no timed pass has run")
        steps = self.steps
        utterances = sum(s.batch_size for s in steps)
        audio = sum(s.batch_size * s.seconds for s in steps)
        full_counts = dict(zip(UTTERANCE_SECONDS, utterance_counts(projected_scale)))

        per_length = OrderedDict()
        projected = 0.0
        for seconds in sorted(set(s.seconds for s in steps)):
            mine = [s for s in steps if s.seconds == seconds]
            n_utt = sum(s.batch_size for s in mine)
            step_s = sum(s.step_s for s in mine)
            entry = OrderedDict([("steps", len(mine)), ("utterances", n_utt),
                                 ("audio_seconds", n_utt * seconds), ("train_s", step_s)])
            entry.update(("%s_ms" % k, v) for k, v in _stats_ms([s.step_s for s in mine]).items())
            entry["forward_ms"] = self.forward_ms.get(seconds)
            per_length[str(seconds)] = entry
            projected += step_s / n_utt * full_counts[seconds]   # time per utterance x full-epoch count
        if len(per_length) < len(UTTERANCE_SECONDS):
            projected = None    # a pass that missed a length cannot be projected to a full epoch

        stats = _stats_ms([s.step_s for s in steps])
        timing = OrderedDict([
            ("warmup_s", self.warmup_s),
            ("warmup_steps", len(self.warmup_losses)),
            ("train_s", self.train_s),
            ("steps", len(steps)),
            ("utterances", utterances),
            ("audio_seconds", audio),
            ("audio_s_per_s", audio / self.train_s),
            ("utterances_per_s", utterances / self.train_s),
            ("step_ms_mean", stats["mean"]),
            ("step_ms_median", stats["median"]),
            ("step_ms_p90", stats["p90"]),
            ("projected_epoch_s", projected),
            ("projected_scale", projected_scale),
            ("forward_ms", OrderedDict((str(k), v) for k, v in self.forward_ms.items())),
            ("forward_repeats", self.forward_repeats),
            ("forward_budget_s", self.forward_budget_s),
            ("forward_counts", OrderedDict((str(k), v) for k, v in self.forward_counts.items())),
            ("per_length", per_length),
        ])
        losses = OrderedDict([
            ("warmup", list(self.warmup_losses)),
            ("train", [s.loss for s in steps]),
            ("first", steps[0].loss),
            ("last", steps[-1].loss),
        ])
        return {"timing": timing, "losses": losses}
