"""A plain NumPy implementation of the DS2 model and of CTC: the ground truth every
framework's first loss is checked against.

Written to be read, not to be fast: float64 throughout, one loop per kernel tap and per
time step, training-mode BatchNorm (batch statistics, biased variance).

    logits = forward(weights, features, config)      # (T/4, N, 29)
    losses = ctc_loss(logits, labels)                # (N,)  -log p(labels | features)
    loss   = ds2_loss(weights, features, labels, config)   # mean over the batch
"""
from typing import Dict, Optional, Tuple

import numpy as np

from .spec import DS2Config


def clipped_relu(x: np.ndarray, clip: float) -> np.ndarray:
    """min(max(x, 0), clip)."""
    return np.minimum(np.maximum(x, 0.0), clip)


def conv2d(x: np.ndarray, w: np.ndarray, stride: Tuple[int, int], padding: Tuple[int, int]) -> np.ndarray:
    """Cross-correlation, no bias.  x (N, C, F, T), w (O, C, kF, kT) -> (N, O, F', T').

    ``padding`` is symmetric zero padding (frequency, time); ``stride`` is (frequency, time).
    """
    n, c, f, t = x.shape
    o, c_w, kf, kt = w.shape
    assert c == c_w, "channels of input and kernel differ"
    (sf, st), (pf, pt) = stride, padding
    x = np.pad(x, ((0, 0), (0, 0), (pf, pf), (pt, pt)))
    f_out = (f + 2 * pf - kf) // sf + 1
    t_out = (t + 2 * pt - kt) // st + 1
    out = np.zeros((o, n, f_out, t_out))
    for i in range(kf):
        for j in range(kt):
            patch = x[:, :, i:i + sf * (f_out - 1) + 1:sf, j:j + st * (t_out - 1) + 1:st]  # (N, C, F', T')
            out += np.tensordot(w[:, :, i, j], patch, axes=([1], [1]))                    # (O, N, F', T')
    return out.transpose(1, 0, 2, 3)


def batch_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, feature_axis: int, eps: float,
               running: Optional[Tuple[np.ndarray, np.ndarray]] = None, stats: Optional[list] = None) -> np.ndarray:
    """BatchNorm of each feature over all other axes.

    Training mode (``running`` None): the batch's mean and biased variance; for conv maps (N, C, F, T)
    the statistics of channel c run over N x F x T, for a sequence (T, N, H) -- "sequence-wise"
    BatchNorm -- those of feature h over T x N.  ``stats``, a list, receives (mean, unbiased variance)
    of the batch: what the running statistics are updated with.  Inference mode: ``running`` =
    (mean, var), the running statistics.
    """
    axes = tuple(a for a in range(x.ndim) if a != feature_axis % x.ndim)
    if running is None:
        mean = x.mean(axis=axes, keepdims=True)
        var = x.var(axis=axes, keepdims=True)
        if stats is not None:
            n = x.size // x.shape[feature_axis]
            stats.append((mean.reshape(-1), var.reshape(-1) * n / max(n - 1, 1)))
    else:
        keep = [1] * x.ndim
        keep[feature_axis] = -1
        mean, var = (np.asarray(r, dtype=np.float64).reshape(keep) for r in running)
    shape = [1] * x.ndim
    shape[feature_axis] = -1
    return (x - mean) / np.sqrt(var + eps) * gamma.reshape(shape) + beta.reshape(shape)


def rnn_direction(x: np.ndarray, W: np.ndarray, U: np.ndarray, b: np.ndarray, reverse: bool) -> np.ndarray:
    """One direction of a vanilla ReLU RNN: h_t = relu(W x_t + U h_{t-1} + b), h_0 = 0.

    x (T, N, in), W (H, in), U (H, H), b (H,) -> (T, N, H).  ``reverse`` runs t = T-1 .. 0.
    """
    steps, n = x.shape[:2]
    wx = x @ W.T + b                                # input projection of every step at once
    h = np.zeros((n, U.shape[0]))
    out = np.empty((steps, n, U.shape[0]))
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        h = np.maximum(wx[t] + h @ U.T, 0.0)
        out[t] = h
    return out


def forward(weights: Dict[str, np.ndarray], features: np.ndarray, config: DS2Config, training: bool = True,
            batch_stats: Optional[Dict[str, Tuple[np.ndarray, np.ndarray]]] = None) -> np.ndarray:
    """The whole model.  features (N, T, n_freq) -> logits (T/4, N, classes).

    ``training=True`` (the default): BatchNorm normalises with each batch's statistics, and
    ``batch_stats`` (a dict, if given) receives ``<bn> -> (mean, unbiased var)`` of this batch.
    ``training=False``: inference mode, BatchNorm normalises with the running statistics
    ``<bn>.mean`` and ``<bn>.var`` of ``weights`` (the canonical format's, :func:`common.weights.canonical_state`).
    """
    w = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    c = config

    def bn(x, name, feature_axis):
        running = None if training else (w[name + ".mean"], w[name + ".var"])
        stats = [] if batch_stats is not None else None
        y = batch_norm(x, w[name + ".gamma"], w[name + ".beta"], feature_axis, c.bn_eps, running, stats)
        if stats:
            batch_stats[name] = stats[0]
        return y

    # (N, T, F) -> (N, 1, F, T): one input channel, axes (frequency, time)
    x = np.asarray(features, dtype=np.float64).transpose(0, 2, 1)[:, None]
    for name, stride, padding in (("conv1", c.conv1_stride, c.conv1_padding),
                                  ("conv2", c.conv2_stride, c.conv2_padding)):
        x = conv2d(x, w[name + ".weight"], stride, padding)
        x = bn(x, name + ".bn", feature_axis=1)
        x = clipped_relu(x, c.clip)
    # (N, C, F, T') -> (T', N, C * F), channel-major: feature index = c * F + f
    n, ch, f, t = x.shape
    x = x.transpose(3, 0, 1, 2).reshape(t, n, ch * f)
    for i in range(1, c.rnn_layers + 1):
        p = "bd%d." % i
        x = bn(x, p + "bn", feature_axis=-1)
        h_fwd = rnn_direction(x, w[p + "fwd.W"], w[p + "fwd.U"], w[p + "fwd.b"], reverse=False)
        h_bwd = rnn_direction(x, w[p + "bwd.W"], w[p + "bwd.U"], w[p + "bwd.b"], reverse=True)
        x = clipped_relu(h_fwd + h_bwd, c.clip)     # directions summed, then clipped
    x = bn(x, "fc.bn", feature_axis=-1)
    x = clipped_relu(x @ w["fc.W"].T + w["fc.b"], c.clip)
    return x @ w["out.W"].T + w["out.b"]


def log_softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    m = z.max(axis=axis, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=axis, keepdims=True))


def ctc_loss(logits: np.ndarray, labels: np.ndarray, blank: int = 0) -> np.ndarray:
    """CTC negative log-likelihood per utterance, by the forward algorithm in log space.

    logits (T, N, C), unnormalised; labels (N, L) int, every row a full label sequence
    (no padding, no blanks).  Returns (N,) float64: -log sum over all alignments of the
    product of per-frame softmax probabilities.

    The label sequence is extended with blanks, ``b l1 b l2 ... lL b`` (S = 2L + 1 states);
    an alignment moves each frame to the same state, the next one, or skips a blank between
    two different labels.
    """
    logp = log_softmax(logits, axis=-1)                       # (T, N, C)
    labels = np.asarray(labels)
    steps, n, _ = logp.shape
    s = 2 * labels.shape[1] + 1
    ext = np.full((n, s), blank, dtype=np.int64)
    ext[:, 1::2] = labels
    can_skip = np.zeros((n, s), dtype=bool)
    can_skip[:, 2:] = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])
    neg_inf = np.full((n, 1), -np.inf)

    alpha = np.full((n, s), -np.inf)
    emit = np.take_along_axis(logp[0], ext, axis=1)          # log p(ext[s] at frame 0)
    alpha[:, :2] = emit[:, :2]                                # start in the first blank or label
    for t in range(1, steps):
        stay = alpha
        advance = np.concatenate([neg_inf, alpha[:, :-1]], axis=1)
        skip = np.where(can_skip, np.concatenate([neg_inf, neg_inf, alpha[:, :-2]], axis=1), -np.inf)
        alpha = np.logaddexp(np.logaddexp(stay, advance), skip) + np.take_along_axis(logp[t], ext, axis=1)
    # end in the last label or the final blank
    return -np.logaddexp(alpha[:, -1], alpha[:, -2])


def update_running_stats(state: Dict[str, np.ndarray], batch_stats: Dict[str, Tuple[np.ndarray, np.ndarray]],
                         config: DS2Config) -> Dict[str, np.ndarray]:
    """The running statistics after one training step: ``r = (1 - m) r + m batch`` (m = bn_momentum, 0.1),
    the variance with the batch's unbiased variance (the canonical choice, :meth:`DS2Config.running_stat_shapes`)."""
    m = config.bn_momentum
    out = dict(state)
    for name, (mean, var) in batch_stats.items():
        out[name + ".mean"] = (1 - m) * np.asarray(state[name + ".mean"], np.float64) + m * mean
        out[name + ".var"] = (1 - m) * np.asarray(state[name + ".var"], np.float64) + m * var
    return out


def ds2_loss(weights: Dict[str, np.ndarray], features: np.ndarray, labels: np.ndarray, config: DS2Config,
             training: bool = True) -> float:
    """The benchmark's loss: CTC summed over the batch, divided by the batch size (``training=False``:
    BatchNorm with the running statistics)."""
    logits = forward(weights, features, config, training=training)
    return float(ctc_loss(logits, labels, blank=config.blank).mean())
