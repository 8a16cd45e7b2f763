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
