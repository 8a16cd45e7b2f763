import itertools

import numpy as np
import pytest

from common import reference as ref
from common.data import DeepMarkIterator
from common.spec import FULL_MODEL, SMOKE_MODEL
from common.weights import canonical_weights


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def brute_force_ctc(logits, label, blank=0):
    """-log of the summed probability of every frame path that collapses to ``label``."""
    p = softmax(np.asarray(logits, dtype=np.float64))   # (T, C) for one utterance
    steps, classes = p.shape
    total = 0.0
    for path in itertools.product(range(classes), repeat=steps):
        collapsed = [k for i, k in enumerate(path) if k != blank and (i == 0 or path[i - 1] != k)]
        if collapsed == list(label):
            total += np.prod([p[t, k] for t, k in enumerate(path)])
    return -np.log(total)


def test_ctc_one_label_two_frames_by_hand():
    # per-frame probabilities of (blank, a, b); label "a" (class 1) over 2 frames
    p = np.array([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
    logits = np.log(p)[:, None, :]                    # (T=2, N=1, C=3)
    # the alignments that collapse to "a": (a, a), (a, -), (-, a)
    expected = -np.log(0.3 * 0.6 + 0.3 * 0.1 + 0.5 * 0.6)
    assert ref.ctc_loss(logits, np.array([[1]]))[0] == pytest.approx(expected, rel=1e-12)
    # logits need not be normalised: CTC applies the softmax
    assert ref.ctc_loss(logits + np.array([1.0, -2.0, 3.0]), np.array([[1]]))[0] != pytest.approx(expected)
    assert ref.ctc_loss(logits + 4.0, np.array([[1]]))[0] == pytest.approx(expected, rel=1e-12)


def test_ctc_repeated_label_needs_a_blank_between():
    # "a a" over 2 frames is impossible (a a collapses to "a"); over 3 frames only "a - a"
    p = np.array([[0.2, 0.8], [0.7, 0.3], [0.4, 0.6]])
    logits = np.log(p)[:, None, :]
    assert ref.ctc_loss(logits[:2], np.array([[1, 1]]))[0] == np.inf
    assert ref.ctc_loss(logits, np.array([[1, 1]]))[0] == pytest.approx(-np.log(0.8 * 0.7 * 0.6))


@pytest.mark.parametrize("steps, classes, label", [
    (3, 3, [1]), (4, 3, [1, 2]), (4, 3, [2, 2]), (5, 4, [1, 2, 1]), (5, 3, [1, 1, 2]), (6, 3, [2]),
    (5, 4, [3, 3]), (4, 2, [1, 1]),
])
def test_ctc_matches_brute_force(steps, classes, label):
    rng = np.random.default_rng(steps * 10 + classes)
    logits = rng.normal(size=(steps, 2, classes)) * 2
    labels = np.array([label, label[::-1]])
    got = ref.ctc_loss(logits, labels)
    for i in range(2):
        assert got[i] == pytest.approx(brute_force_ctc(logits[:, i], labels[i]), rel=1e-10)


def test_ctc_is_invariant_to_logit_shift_and_takes_logits():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 3, 5))
    labels = np.array([[1, 2], [3, 3], [4, 1]])
    assert np.allclose(ref.ctc_loss(logits + 7.0, labels), ref.ctc_loss(logits, labels))
    assert np.allclose(ref.ctc_loss(ref.log_softmax(logits), labels), ref.ctc_loss(logits, labels))


def test_conv2d_against_direct_loops():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 3, 9, 12))
    w = rng.normal(size=(4, 3, 3, 5))
    stride, pad = (2, 3), (1, 2)
    got = ref.conv2d(x, w, stride, pad)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (2, 2)))
    fo, to = (9 + 2 - 3) // 2 + 1, (12 + 4 - 5) // 3 + 1
    assert got.shape == (2, 4, fo, to)
    for n, o, f, t in itertools.product(range(2), range(4), range(fo), range(to)):
        window = xp[n, :, f * 2:f * 2 + 3, t * 3:t * 3 + 5]
        assert got[n, o, f, t] == pytest.approx(float((window * w[o]).sum()))


def test_sequence_batch_norm_statistics_run_over_batch_and_time():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(7, 5, 3)) * np.array([1.0, 4.0, 0.5]) + np.array([2.0, -1.0, 10.0])  # (T, N, H)
    y = ref.batch_norm(x, np.ones(3), np.zeros(3), feature_axis=-1, eps=0.0)
    assert np.allclose(y.reshape(-1, 3).mean(0), 0) and np.allclose(y.reshape(-1, 3).var(0), 1)  # biased
    assert not np.allclose(y.mean(axis=1), 0)        # not per time step
    g, b = np.array([2.0, 3.0, 4.0]), np.array([1.0, 0.0, -1.0])
    assert np.allclose(ref.batch_norm(x, g, b, -1, 0.0), y * g + b)
    eps = 1e-5
    manual = (x - x.mean((0, 1))) / np.sqrt(x.var((0, 1)) + eps)
    assert np.allclose(ref.batch_norm(x, np.ones(3), np.zeros(3), -1, eps), manual)


def test_conv_batch_norm_is_per_channel_over_batch_frequency_time():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 4, 5, 6)) + np.arange(4)[None, :, None, None]
    y = ref.batch_norm(x, np.ones(4), np.zeros(4), feature_axis=1, eps=0.0)
    assert np.allclose(y.mean((0, 2, 3)), 0) and np.allclose(y.var((0, 2, 3)), 1)


def test_rnn_direction_recurrence():
    rng = np.random.default_rng(4)
    x, W, U, b = rng.normal(size=(5, 2, 3)), rng.normal(size=(4, 3)), rng.normal(size=(4, 4)) * 0.3, rng.normal(size=4)
    h = np.zeros((2, 4))
    for t in range(5):
        h = np.maximum(x[t] @ W.T + h @ U.T + b, 0)
    fwd = ref.rnn_direction(x, W, U, b, reverse=False)
    assert np.allclose(fwd[-1], h)
    bwd = ref.rnn_direction(x, W, U, b, reverse=True)
    assert np.allclose(bwd, ref.rnn_direction(x[::-1], W, U, b, reverse=False)[::-1])


def test_forward_shapes_and_output_lengths():
    it = DeepMarkIterator(batch_size=2, scale=1, seed=0)
    w = canonical_weights(SMOKE_MODEL, seed=0)
    for batch in (it.batch(0), it.batch(len(it) - 1)):
        logits = ref.forward(w, batch.features, SMOKE_MODEL)
        assert logits.shape == (batch.frames // 4, batch.batch_size, 29)
        assert logits.shape[0] == SMOKE_MODEL.output_length(batch.frames)


def test_forward_full_model_shape():
    batch = DeepMarkIterator(batch_size=1, scale=1, seed=0).batch(0)
    logits = ref.forward(canonical_weights(FULL_MODEL, seed=0), batch.features, FULL_MODEL)
    assert logits.shape == (25, 1, 29) and np.all(np.isfinite(logits))


def test_ds2_loss_is_the_batch_mean_of_ctc():
    batch = DeepMarkIterator(batch_size=3, scale=1, seed=0).batch(0)
    w = canonical_weights(SMOKE_MODEL, seed=0)
    per_utt = ref.ctc_loss(ref.forward(w, batch.features, SMOKE_MODEL), batch.labels)
    assert per_utt.shape == (3,) and np.all(per_utt > 0)
    assert ref.ds2_loss(w, batch.features, batch.labels, SMOKE_MODEL) == pytest.approx(per_utt.mean())
    # the loss depends on the weights: a changed weight changes it (the check can fail)
    w2 = dict(w, **{"out.b": w["out.b"] + np.eye(29, dtype=np.float32)[0]})
    assert ref.ds2_loss(w2, batch.features, batch.labels, SMOKE_MODEL) != pytest.approx(per_utt.mean(), rel=1e-4)


def test_channel_major_feature_order():
    """The sequence feature index is c * F + f: zeroing the bd1 input weights of channel 0 only
    (columns 0..F-1) must leave the output unchanged when channel 0 is silenced by its BN beta/gamma."""
    cfg = SMOKE_MODEL
    w = canonical_weights(cfg, seed=0)
    batch = DeepMarkIterator(batch_size=2, scale=1, seed=0).batch(0)
    F = cfg.freq_after_conv2
    w_silent = dict(w)
    w_silent["conv2.bn.gamma"] = w["conv2.bn.gamma"].copy()
    w_silent["conv2.bn.gamma"][0] = 0.0                 # channel 0 becomes constant 0 after BN + ReLU
    base = ref.forward(w_silent, batch.features, cfg)
    changed = dict(w_silent)
    for d in ("fwd", "bwd"):
        changed["bd1.%s.W" % d] = w["bd1.%s.W" % d].copy()
        changed["bd1.%s.W" % d][:, :F] *= 5.0           # channel 0's columns under channel-major order
    # a constant input column is removed by the sequence BatchNorm anyway, so nothing changes
    assert np.allclose(ref.forward(changed, batch.features, cfg), base)
    other = dict(w_silent)
    for d in ("fwd", "bwd"):
        other["bd1.%s.W" % d] = w["bd1.%s.W" % d].copy()
        other["bd1.%s.W" % d][:, F:2 * F] *= 5.0        # channel 1's columns: the output changes
    assert not np.allclose(ref.forward(other, batch.features, cfg), base)


def test_inference_mode_normalises_with_the_running_statistics():
    """With every running statistic set to the batch's own (biased) statistics, inference mode computes
    exactly what training mode computes on that batch; with the initial 0/1 it computes something else."""
    from common.weights import canonical_state
    cfg = SMOKE_MODEL
    state = canonical_state(cfg, seed=0)
    batch = DeepMarkIterator(batch_size=3, scale=1, seed=0).batch(0)
    stats = {}
    train = ref.forward(state, batch.features, cfg, batch_stats=stats)
    assert list(stats) == list(cfg.bn_names())
    n_values = {"conv1.bn": 3 * cfg.freq_after_conv1 * cfg.time_after_conv1(batch.frames),
                "conv2.bn": 3 * cfg.freq_after_conv2 * cfg.output_length(batch.frames)}
    matched = dict(state)
    for name, (mean, unbiased) in stats.items():
        n = n_values.get(name, 3 * cfg.output_length(batch.frames))
        matched[name + ".mean"], matched[name + ".var"] = mean, unbiased * (n - 1) / n
    assert np.allclose(ref.forward(matched, batch.features, cfg, training=False), train, rtol=1e-10, atol=1e-10)
    assert not np.allclose(ref.forward(state, batch.features, cfg, training=False), train, rtol=1e-3)
    # the training-mode path ignores the running statistics
    assert np.array_equal(ref.forward(matched, batch.features, cfg), train)


def test_running_statistics_update_with_the_unbiased_variance():
    from common.weights import canonical_state
    cfg = SMOKE_MODEL
    state = canonical_state(cfg, seed=0)
    batch = DeepMarkIterator(batch_size=2, scale=1, seed=0).batch(0)
    stats = {}
    ref.forward(state, batch.features, cfg, batch_stats=stats)
    after = ref.update_running_stats(state, stats, cfg)
    mean, var = stats["fc.bn"]
    assert np.allclose(after["fc.bn.mean"], 0.1 * mean) and np.allclose(after["fc.bn.var"], 0.9 + 0.1 * var)
    # the unbiased variance: n / (n - 1) times the variance that normalised the batch
    t = cfg.output_length(batch.frames)
    x = np.random.default_rng(0).normal(size=(t, 2, 5))
    got = []
    ref.batch_norm(x, np.ones(5), np.zeros(5), -1, 1e-5, stats=got)
    assert np.allclose(got[0][1], x.reshape(-1, 5).var(axis=0, ddof=1))
