"""The correctness checks every notebook runs before it times anything.

Each check returns a dict for the result record and raises :class:`CheckFailed` (with a
one-line message) when it fails, so a wrong translation never produces a timing.
"""
from typing import Optional

from .spec import LOSS_RTOL, DS2Config, check_precision


class CheckFailed(AssertionError):
    """A correctness check failed; the message is one line."""


def check_loss(value: float, reference: float, precision: str = "fp32", rtol: Optional[float] = None) -> dict:
    """First-batch loss of the framework vs the NumPy reference, relative difference.

    The tolerance is the spec's 1e-4 for fp32 (:data:`common.spec.LOSS_RTOL` for the others).
    """
    check_precision(precision, control=True)
    rtol = LOSS_RTOL[precision] if rtol is None else rtol
    value, reference = float(value), float(reference)
    rel = abs(value - reference) / abs(reference) if reference != 0 else abs(value)
    result = {"framework": value, "reference": reference, "rel_diff": rel, "rtol": rtol,
              "precision": precision, "ok": bool(rel <= rtol)}   # NaN compares False: fails
    if not result["ok"]:
        raise CheckFailed("first-loss check failed: framework %.8g vs NumPy reference %.8g, relative difference "
                          "%.3g > %.3g (%s)" % (value, reference, rel, rtol, precision))
    return result


def check_param_count(count: int, config: DS2Config, two_rnn_biases: bool) -> dict:
    """The framework model's trainable parameter count vs the canonical one.

    ``two_rnn_biases``: the framework's fused RNN keeps b_ih and b_hh (PyTorch, MXNet,
    cuDNN), which holds :attr:`DS2Config.extra_rnn_biases` more (loaded as zeros).
    """
    extra = config.extra_rnn_biases if two_rnn_biases else 0
    expected = config.param_count + extra
    result = {"count": int(count), "canonical": config.param_count, "extra_rnn_biases": extra,
              "expected": expected, "ok": int(count) == expected}
    if not result["ok"]:
        raise CheckFailed("parameter-count check failed: framework has %d, expected %d (canonical %d + %d extra "
                          "RNN biases)" % (count, expected, config.param_count, extra))
    return result


def check_checksum(actual: Optional[str], expected: str) -> dict:
    """The data a notebook consumed vs what the shared iterator defines."""
    result = {"checksum": actual, "expected": expected, "ok": actual == expected}
    if not result["ok"]:
        raise CheckFailed("data checksum %s differs from the iterator's %s" % (actual, expected))
    return result
