import subprocess
import sys
import textwrap

import numpy as np
import pytest

from common.data import DeepMarkIterator, epoch_audio_seconds, utterance_counts
from common.spec import LABEL_LENGTHS, LENGTH_SHARE_PERCENT

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def test_deepmark_epoch_size():
    it = DeepMarkIterator(batch_size=32, scale=1280, seed=0)
    assert it.utterances == 128000
    assert it.audio_seconds == 760320 == epoch_audio_seconds(1280)
    assert it.audio_hours == pytest.approx(211.2)
    assert len(it) == 4000


def test_counts_and_label_lengths_per_length():
    it = DeepMarkIterator(batch_size=7, scale=3, seed=1)
    per_length = {}
    for batch in it:
        n, t, f = batch.features.shape
        assert (t, f) == (batch.frames, 161)
        assert batch.frames == 100 * batch.seconds
        assert batch.labels.shape == (n, LABEL_LENGTHS[batch.seconds - 1])
        per_length[batch.seconds] = per_length.get(batch.seconds, 0) + n
    assert [per_length[s] for s in range(1, 16)] == [3 * p for p in LENGTH_SHARE_PERCENT] == utterance_counts(3)


def test_batches_are_one_length_and_last_one_smaller():
    it = DeepMarkIterator(batch_size=8, scale=1, seed=0)
    sizes = {}
    for batch in it:
        sizes.setdefault(batch.seconds, []).append(batch.batch_size)
    assert sizes[2] == [8, 2]          # 10 utterances of 2 s
    assert sizes[1] == [3]
    assert all(max(s) <= 8 for s in sizes.values())
    assert list(sizes) == sorted(sizes)  # ascending length


def test_batch_arrays():
    batch = next(iter(DeepMarkIterator(batch_size=4, scale=1, seed=0)))
    assert batch.features.dtype == np.float32 and batch.features.flags["C_CONTIGUOUS"]
    assert batch.labels.dtype == np.int32
    assert not batch.features.flags["WRITEABLE"]  # the pool is shared: consumers cannot corrupt it


def test_no_blank_in_labels_and_all_classes_used():
    labels = np.concatenate([b.labels.ravel() for b in DeepMarkIterator(batch_size=16, scale=2, seed=3)])
    assert labels.min() == 1 and labels.max() == 28
    assert len(np.unique(labels)) == 28


def test_features_are_standard_normal():
    it = DeepMarkIterator(batch_size=32, scale=1, seed=0)
    x = it.batch(len(it) - 1).features
    assert abs(float(x.mean())) < 0.01 and abs(float(x.std()) - 1) < 0.01


def test_same_seed_same_batches_and_checksum():
    a, b = DeepMarkIterator(8, 1, seed=5), DeepMarkIterator(8, 1, seed=5)
    for x, y in zip(list(a), list(b)):
        assert np.array_equal(x.features, y.features) and np.array_equal(x.labels, y.labels)
    assert a.checksum == b.checksum == a.expected_checksum()


def test_checksum_depends_on_seed_and_batch_size():
    sums = {DeepMarkIterator(bs, 1, seed=s).expected_checksum() for bs, s in [(8, 0), (8, 1), (9, 0)]}
    assert len(sums) == 3


def test_checksum_only_after_a_complete_pass():
    it = DeepMarkIterator(8, 1, seed=0)
    assert it.checksum is None
    gen = iter(it)
    next(gen)
    assert it.checksum is None
    list(gen)
    assert it.checksum == it.expected_checksum()


def test_determinism_across_two_processes():
    code = textwrap.dedent("""
        import hashlib, numpy as np
        from common.data import DeepMarkIterator
        it = DeepMarkIterator(batch_size=8, scale=1, seed=42)
        h = hashlib.sha256()
        for b in it:
            h.update(b.features.tobytes()); h.update(b.labels.tobytes())
        print(it.checksum, h.hexdigest())
    """)
    outs = [subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), stdout=subprocess.PIPE, check=True,
                           universal_newlines=True).stdout.split() for _ in range(2)]
    assert outs[0] == outs[1]
    it = DeepMarkIterator(batch_size=8, scale=1, seed=42)
    assert outs[0][0] == it.expected_checksum()


def test_shuffle_is_seeded():
    def order(seed, shuffle=True):
        return [b.index for b in DeepMarkIterator(4, 1, seed=seed, shuffle=shuffle)]
    assert order(0, shuffle=False) == sorted(order(0, shuffle=False))
    assert order(0) == order(0)
    assert order(0) != order(1)
    assert order(0) != order(0, shuffle=False)
    assert sorted(order(0)) == order(0, shuffle=False)
    # the batches themselves do not depend on the order
    plain, shuffled = DeepMarkIterator(4, 1, seed=0), DeepMarkIterator(4, 1, seed=0, shuffle=True)
    b = next(iter(shuffled))
    assert np.array_equal(plain.batch(b.index).features, b.features)


def test_warmup_and_forward_subsamples():
    it = DeepMarkIterator(batch_size=8, scale=1, seed=0)
    warm = it.warmup_batches()
    assert [(b.batch_size, b.frames) for b in warm] == it.shapes()
    assert len(set(it.shapes())) == len(it.shapes())
    fwd = it.one_batch_per_length()
    assert [b.seconds for b in fwd] == list(range(1, 16))


def test_random_access_matches_iteration():
    it = DeepMarkIterator(batch_size=8, scale=1, seed=0)
    for b in it:
        again = it.batch(b.index)
        assert np.array_equal(again.features, b.features) and np.array_equal(again.labels, b.labels)


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_size=0), "batch_size must be a positive integer"),
    (dict(batch_size=-1), "batch_size must be a positive integer"),
    (dict(batch_size=8, scale=0), "scale must be a positive integer"),
    (dict(batch_size=8, scale=1.5), "scale must be a positive integer"),
    (dict(batch_size=8, seed=-1), "seed must be a non-negative integer"),
    (dict(batch_size=8, blank=28), "blank is class 0"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DeepMarkIterator(**kwargs)


def test_describe():
    d = DeepMarkIterator(batch_size=8, scale=1, seed=0).describe()
    assert d["utterances"] == 100 and d["audio_seconds"] == 594 and d["batches"] == 21


def test_checksums_are_pinned_across_numpy_versions():
    """The same data under NumPy 1.19 (CNTK's Python 3.6) and 2.x: pinned values, computed with both."""
    assert DeepMarkIterator(8, 1, seed=0).expected_checksum() == \
        "63bc287789a175a387e875f37b91d5b5eb2d9d365cf85e3796cec553b0c07d0d"
    assert DeepMarkIterator(32, 1280, seed=0).expected_checksum() == \
        "e5da1c5f80358469d599185356bb88ea32212bfdcc3632d897db72f7a099526f"


def test_a_subset_of_lengths_keeps_their_batches_and_shares():
    """The smoke preset's few lengths: each kept length has its share of utterances, batched as in the full
    table; the full table's data is unchanged by the option (pinned checksums above)."""
    it = DeepMarkIterator(8, 1, seed=0, lengths=(1, 2, 7, 8))
    assert it.shapes() == [(3, 100), (8, 200), (2, 200), (8, 700), (1, 700), (8, 800)]
    assert (len(it), it.utterances, it.audio_seconds) == (6, 30, 150)
    assert it.describe()["lengths"] == [1, 2, 7, 8]
    assert it.length_batch(8).features.shape == (8, 800, 161)
    assert [b.seconds for b in it.one_batch_per_length()] == [1, 2, 7, 8]
    assert it.shard_stats(2)["batches_with_empty_shards"] == 1
    assert it.expected_checksum() != DeepMarkIterator(8, 1, seed=0).expected_checksum()
    with pytest.raises(ValueError, match="no utterances of 3 s"):
        it.length_batch(3)


@pytest.mark.parametrize("lengths", [(), (2, 1), (1, 1), (0,), (16,), (True,)])
def test_bad_lengths(lengths):
    with pytest.raises(ValueError, match="lengths must be ascending distinct seconds among 1..15"):
        DeepMarkIterator(8, 1, seed=0, lengths=lengths)
