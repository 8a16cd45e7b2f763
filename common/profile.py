"""Where the time of a training step goes: a framework profiler's events reduced to the same few
categories in every notebook; no framework import.

A notebook profiles one training step with its framework's own profiler (torch.profiler, the
TensorFlow profiler, jax.profiler, MXNet's profiler; CNTK: timing by hand), lists the events as
``(name, seconds)`` -- self time, so nothing is counted twice -- and classifies them with its own
regular expressions (operator names are the framework's)::

    rules = [("convolution", r"conv"), ("rnn", r"rnn"), ("ctc", r"ctc"), ("batchnorm", r"batch_norm"),
             ("optimizer", r"sgd|momentum"), ...]
    record_profile = time_shares(events, rules, tool="torch.profiler", step_s=...)

The first rule that matches (``re.search``, case-insensitive) names an event's category;
unmatched events are ``other``, and the largest of them are listed so a reader can see what
``other`` holds.
"""
import re
from collections import OrderedDict
from typing import Iterable, List, Optional, Sequence, Tuple

#: the categories every notebook reports, in this order
CATEGORIES = ("convolution", "rnn_input", "rnn_recurrence", "rnn", "fc", "ctc", "batchnorm", "optimizer", "other")


def time_shares(events: Iterable[Tuple[str, float]], rules: Sequence[Tuple[str, str]], tool: str,
                step_s: Optional[float] = None, batch: Optional[dict] = None, top_other: int = 5) -> "OrderedDict":
    """Seconds and shares per category of ``events`` (name, self seconds) classified by ``rules``."""
    compiled = []  # type: List[Tuple[str, object]]
    for category, pattern in rules:
        if category not in CATEGORIES:
            raise ValueError("unknown profile category %r; categories: %s" % (category, ", ".join(CATEGORIES)))
        compiled.append((category, re.compile(pattern, re.IGNORECASE)))
    seconds = OrderedDict((c, 0.0) for c in CATEGORIES)
    other = {}
    for name, s in events:
        for category, rx in compiled:
            if rx.search(name):
                break
        else:
            category = "other"
            other[name] = other.get(name, 0.0) + float(s)
        seconds[category] += float(s)
    total = sum(seconds.values())
    shares = OrderedDict((c, (v / total if total else None)) for c, v in seconds.items())
    largest_other = sorted(other.items(), key=lambda kv: -kv[1])[:top_other]
    return OrderedDict([("tool", tool), ("step_s", step_s), ("profiled_s", total), ("batch", batch),
                        ("seconds", seconds), ("shares", shares),
                        ("largest_other", [[n, s] for n, s in largest_other])])
