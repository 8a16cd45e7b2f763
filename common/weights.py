"""Canonical initial weights: one seeded NumPy function for every framework.

Names, shapes and layouts are the project's interchange format (see
:meth:`common.spec.DS2Config.param_shapes`): weight matrices are (out, in), convolution
kernels (out, in, freq, time), one bias per RNN direction.  Each notebook loads these arrays
into its framework's model (transposing, permuting, zero-filling a second bias as its
layout needs), so every framework starts from the same point and computes the same function.

Init: uniform in +-1/sqrt(fan_in) for every weight matrix and convolution kernel
(fan_in = in x kernel area for convolutions), BatchNorm gamma 1 and beta 0, biases 0.
"""
import os
from typing import Dict

import numpy as np

from .spec import DS2Config


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


class WeightsError(ValueError):
    """A canonical weights file that cannot be used; the message is one line naming the file."""


def load_state(path: str, config: DS2Config) -> Dict[str, np.ndarray]:
    """Load a canonical ``.npz`` (parameters and running statistics) and check it against ``config``:
    every name present and no other, each with the canonical shape and float32.  The first mismatch
    raises :class:`WeightsError` with one line naming the file."""
    try:
        weights = load_weights(path)
    except FileNotFoundError:
        raise WeightsError("weights file %s does not exist" % path) from None
    except ValueError as e:  # NumPy reads a file that is neither .npy nor .npz as a pickle, which it refuses
        if "pickle" not in str(e):
            raise WeightsError("weights file %s cannot be read: %s: %s" % (path, type(e).__name__, e)) from None
        raise WeightsError("weights file %s is not a NumPy .npz archive (the canonical format: a notebook's export, "
                           "results/weights/*.npz)" % path) from None
    except Exception as e:  # a truncated or foreign file: zipfile, pickle or OS errors
        raise WeightsError("weights file %s cannot be read: %s: %s" % (path, type(e).__name__, e)) from None
    expected = config.state_shapes()
    missing = [n for n in expected if n not in weights]
    if missing:
        raise WeightsError("weights file %s lacks %s (%d canonical names missing)" % (path, missing[0], len(missing)))
    extra = [n for n in weights if n not in expected]
    if extra:
        raise WeightsError("weights file %s has %s, which is not a canonical name of this model (%d extra)"
                           % (path, extra[0], len(extra)))
    for name, shape in expected.items():
        a = weights[name]
        if tuple(a.shape) != tuple(shape):
            raise WeightsError("weights file %s: %s has shape %s, this model's is %s (another preset's widths?)"
                               % (path, name, tuple(a.shape), tuple(shape)))
        if a.dtype != np.float32:
            raise WeightsError("weights file %s: %s is %s, the canonical format is float32" % (path, name, a.dtype))
    return {name: weights[name] for name in expected}


def param_count(config: DS2Config) -> int:
    """Canonical trainable parameter count (92,244,637 for the full model)."""
    return config.param_count


def count(weights: Dict[str, np.ndarray]) -> int:
    """Number of scalars in a weight dict."""
    return int(sum(int(np.prod(a.shape)) for a in weights.values()))


def save_weights(path: str, weights: Dict[str, np.ndarray]) -> None:
    """Save to ``.npz`` atomically (a temporary file renamed into place)."""
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        np.savez(f, **weights)
    os.replace(tmp, path)


def load_weights(path: str) -> Dict[str, np.ndarray]:
    """Load a ``.npz`` written by :func:`save_weights`, in the saved order."""
    with np.load(path) as data:
        return {name: data[name] for name in data.files}
