"""The DeepMark synthetic-utterance iterator, shared by every notebook.

DeepMark's DS2 benchmark trains on synthetic data with the length mix of a real corpus:
utterances of 1..15 seconds in the shares of :data:`common.spec.LENGTH_SHARE_PERCENT`,
``scale`` utterances per percent point (1280 -> 128,000 utterances, 211.2 h of audio).
Minibatches hold utterances of one length, so nothing is ever padded.

Design, following DeepMark: one pool of standard-normal float32 features is drawn once,
and every minibatch's features are a C-contiguous, read-only *slice* of that pool (no copy),
so producing data costs nothing next to training.  Labels are drawn once for the epoch,
uniformly over the classes 1..28 (class 0 is the CTC blank and never a label), and sliced
per batch (read-only too).

Two fixes against DeepMark's generator (documented in the README): it drew labels from
0..28, i.e. including the blank, and passed its length probabilities in the wrong argument.

Everything derives from one seed, through NumPy's PCG64 generator, so equal seeds give
bit-identical batches in any process.  :attr:`DeepMarkIterator.checksum` is a SHA-256 over
exactly what a pass yielded: the pool's bytes (hashed once), and per batch its pool offset,
shape and label bytes -- which determine the feature bytes completely.

Data-parallel runs (:func:`shard_bounds`, :meth:`Batch.shard`): every worker builds the same
seeded iterator with the *global* batch size and takes its contiguous slice of each batch, so the
global batches are exactly the single-device ones.  Workers iterate the whole iterator (and
shard inside their training step), so every worker's :attr:`DeepMarkIterator.checksum` is the
checksum of the global pass -- the one a single worker with the global batch size computes, and
the one the runner checks; it says nothing about which slice a worker took (that is determined
by rank and world size alone).
"""
import hashlib
import struct
from collections import namedtuple
from typing import Iterator, List, Optional, Tuple

import numpy as np

from .spec import (DEEPMARK_SCALE, FRAMES_PER_SECOND, LABEL_LENGTHS, LENGTH_SHARE_PERCENT,
                   UTTERANCE_SECONDS, _check_positive_int)

#: One minibatch: features (N, T, n_freq) float32, labels (N, L) int32 in 1..n_classes-1,
#: frames T, seconds of audio per utterance, the batch's index in the (unshuffled) schedule, and
#: -- for one worker's shard of a data-parallel step only -- the size of the global batch it is cut from.
class Batch(namedtuple("Batch", ["features", "labels", "frames", "seconds", "index", "global_batch_size"])):
    __slots__ = ()

    @property
    def batch_size(self) -> int:
        """Utterances in this batch (in a shard: this worker's share)."""
        return self.features.shape[0]

    @property
    def global_size(self) -> int:
        """Utterances of the global batch: what the loss is divided by (see :func:`shard_bounds`)."""
        return self.batch_size if self.global_batch_size is None else self.global_batch_size

    @property
    def audio_seconds(self) -> int:
        return self.features.shape[0] * self.seconds

    @property
    def label_lengths(self) -> np.ndarray:
        """(N,) int32: every label of a synthetic batch has the full width L (the real task's batches,
        :class:`common.corpus.Batch`, pad shorter labels with 0 and carry their own lengths)."""
        return np.full((self.features.shape[0],), self.labels.shape[1], dtype=np.int32)

    @property
    def empty(self) -> bool:
        """True for a worker's shard of a global batch smaller than the number of workers."""
        return self.features.shape[0] == 0

    def shard(self, rank: int, world: int) -> "Batch":
        """Worker ``rank``'s contiguous slice of this (global) batch among ``world`` workers.

        Features and labels are views (no copy) of rows ``shard_bounds(N, rank, world)``; frames,
        seconds and index are the global batch's, and ``global_batch_size`` is N.  The slices of
        ranks 0..world-1, concatenated in rank order, are the global batch; a rank past the end of a
        small batch gets an empty slice (0 rows, same T and label length).
        """
        start, stop = shard_bounds(self.batch_size, rank, world)
        return Batch(self.features[start:stop], self.labels[start:stop], self.frames, self.seconds, self.index,
                     self.global_size)


Batch.__new__.__defaults__ = (None,)   # global_batch_size: None for a whole batch (Python 3.6 has no defaults=)


def shard_bounds(n: int, rank: int, world: int) -> Tuple[int, int]:
    """``[start, stop)`` of worker ``rank``'s contiguous share of ``n`` utterances among ``world`` workers.

    The sizes are ``numpy.array_split``'s: the first ``n % world`` ranks get ``n // world + 1``, the
    others ``n // world`` -- they differ by at most one, and ranks ``>= n`` get an empty share when
    ``world > n``.

    **The rule that keeps W workers exactly equal to one worker with the whole batch**, whatever the
    split: every worker's loss is the *sum* of its utterances' CTC losses divided by the *global* batch
    size ``N`` (``Batch.global_size``), and the workers' gradients are *summed* (all-reduce SUM; an
    engine that averages over W workers, such as PyTorch DDP, gets the local loss multiplied by W).
    The sum of the W gradients is then ``sum_w d/dp (sum_{i in w} l_i) / N = d/dp (sum_i l_i) / N``:
    the single-worker gradient of the spec's loss (the mean per utterance), term for term; the global
    loss is the all-reduced sum of the local ones.  Averaging per-worker *means* instead is exact only
    when N is divisible by W: shares of 3 and 2 utterances would weight them 1/6 and 1/4, not 1/5.
    BatchNorm statistics are all-reduced as sums and counts (sum, sum of squares or deviations, count),
    so they are the global batch's statistics for any split.  The only difference from one worker is
    the order of floating-point additions (about 1e-7 relative in fp32).

    **An empty share** (``world > n``) adds 0 to the loss, 0 to the gradients and (0, 0, 0) to the
    BatchNorm sums; its worker must still enter every collective of the step (gradient all-reduce,
    BatchNorm statistics, loss), or the others wait forever.  A framework that cannot run a forward
    pass on 0 utterances contributes zeros without running the model.
    """
    _check_positive_int("world", world)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError("n must be a non-negative integer, got %r" % (n,))
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world:
        raise ValueError("rank must be an integer in 0..%d, got %r" % (world - 1, rank))
    q, r = divmod(int(n), world)
    start = int(rank) * q + min(int(rank), r)
    return start, start + q + (1 if rank < r else 0)


def shard_sizes(n: int, world: int) -> List[int]:
    """The share of each rank (``numpy.array_split``'s sizes), in rank order; sums to ``n``."""
    return [b - a for a, b in (shard_bounds(n, rank, world) for rank in range(world))]


# Batch plan entry: length index into the tables, number of utterances.
_Plan = namedtuple("_Plan", ["length_index", "size"])


def check_lengths(lengths: Optional[Tuple[int, ...]]) -> Tuple[int, ...]:
    """The utterance lengths (seconds) an iterator keeps: None -> all of DeepMark's 1..15, else a
    non-empty, ascending, duplicate-free subset of them (the ``smoke`` preset's few lengths)."""
    if lengths is None:
        return UTTERANCE_SECONDS
    lengths = tuple(lengths)
    if not lengths or list(lengths) != sorted(set(lengths)) or any(
            isinstance(s, bool) or s not in UTTERANCE_SECONDS for s in lengths):
        raise ValueError("lengths must be ascending distinct seconds among 1..15, got %r" % (lengths,))
    return lengths


def utterance_counts(scale: int) -> List[int]:
    """Utterances of each length (1..15 s) in one epoch at ``scale``."""
    _check_positive_int("scale", scale)
    return [share * scale for share in LENGTH_SHARE_PERCENT]


def epoch_audio_seconds(scale: int) -> int:
    """Seconds of audio in one epoch at ``scale`` (760,320 s at DeepMark's 1280)."""
    return sum(n * s for n, s in zip(utterance_counts(scale), UTTERANCE_SECONDS))


class DeepMarkIterator:
    """DeepMark's synthetic utterance iterator.

    >>> it = DeepMarkIterator(batch_size=32, scale=1280, seed=0)
    >>> len(it), it.utterances, it.audio_seconds
    (4000, 128000, 760320)
    >>> for batch in it: ...          # batch.features (N, T, 161) float32, batch.labels (N, L) int32

    Iteration order is ascending length (as DeepMark); ``shuffle=True`` shuffles the batch
    order with a generator seeded from ``seed``.  Each ``iter()`` is one pass over the same
    batches; :attr:`checksum` describes the last pass.
    """

    def __init__(self, batch_size: int, scale: int = DEEPMARK_SCALE, seed: int = 0, shuffle: bool = False,
                 n_freq: int = 161, n_classes: int = 29, blank: int = 0,
                 lengths: Optional[Tuple[int, ...]] = None):
        _check_positive_int("batch_size", batch_size)
        _check_positive_int("scale", scale)
        _check_positive_int("n_freq", n_freq)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError("seed must be a non-negative integer, got %r" % (seed,))
        if blank != 0:
            raise ValueError("the benchmark's CTC blank is class 0, got blank=%r" % (blank,))
        if n_classes < 2:
            raise ValueError("n_classes must be at least 2 (blank + one symbol), got %r" % (n_classes,))
        self.batch_size = batch_size
        self.scale = scale
        self.seed = seed
        self.shuffle = shuffle
        self.n_freq = n_freq
        self.n_classes = n_classes
        self.lengths = check_lengths(lengths)

        # The batch plan: ascending length, full batches then the remainder of each length.
        self._plan = []  # type: List[_Plan]
        for li, count in enumerate(utterance_counts(scale)):
            if UTTERANCE_SECONDS[li] not in self.lengths:
                continue
            full, rest = divmod(count, batch_size)
            self._plan += [_Plan(li, batch_size)] * full + ([_Plan(li, rest)] if rest else [])

        # One seed drives three independent streams: features, offsets + labels, batch order.
        pool_seq, batch_seq, order_seq = np.random.SeedSequence(seed).spawn(3)

        # The feature pool: twice the largest batch, so batches start at varied offsets.  Drawn in
        # float64 and rounded to float32: NumPy's float32 sampler changed its tail between 1.19
        # (CNTK's Python 3.6) and 1.23 (77 of 3.9 million values differ in the last bit), the
        # float64 one gives the same bits in every NumPy version the project uses.
        max_frames = max(self.lengths) * FRAMES_PER_SECOND
        self._max_elements = batch_size * max_frames * n_freq
        pool = np.random.Generator(np.random.PCG64(pool_seq)).standard_normal(
            2 * self._max_elements).astype(np.float32)
        pool.setflags(write=False)
        self._pool = pool
        self._pool_digest = hashlib.sha256(pool.tobytes()).digest()

        # Per batch, drawn once: where its features start in the pool (on a frame boundary) and
        # its labels, all labels of the epoch in one array sliced per batch.
        rng = np.random.Generator(np.random.PCG64(batch_seq))
        frames = np.array([UTTERANCE_SECONDS[p.length_index] * FRAMES_PER_SECOND for p in self._plan], dtype=np.int64)
        sizes = np.array([p.size for p in self._plan], dtype=np.int64)
        n_starts = (pool.size - sizes * frames * n_freq) // n_freq + 1
        self._offsets = rng.integers(0, n_starts) * n_freq
        label_counts = sizes * np.array([LABEL_LENGTHS[p.length_index] for p in self._plan], dtype=np.int64)
        self._label_starts = np.concatenate([[0], np.cumsum(label_counts)])
        self._labels = rng.integers(1, n_classes, size=int(self._label_starts[-1]), dtype=np.int32)
        self._labels.setflags(write=False)

        self._order = np.arange(len(self._plan))
        if shuffle:
            np.random.Generator(np.random.PCG64(order_seq)).shuffle(self._order)
        self._checksum = None  # type: Optional[str]

    # ---- sizes known before iterating --------------------------------------------
    def __len__(self) -> int:
        return len(self._plan)

    @property
    def utterances(self) -> int:
        return sum(p.size for p in self._plan)

    @property
    def audio_seconds(self) -> int:
        return sum(p.size * UTTERANCE_SECONDS[p.length_index] for p in self._plan)

    @property
    def audio_hours(self) -> float:
        return self.audio_seconds / 3600.0

    def shapes(self) -> List[Tuple[int, int]]:
        """Distinct (batch size, frames) shapes of a pass, in the order a pass meets them."""
        seen = []  # type: List[Tuple[int, int]]
        for i in self._order:
            p = self._plan[i]
            shape = (p.size, UTTERANCE_SECONDS[p.length_index] * FRAMES_PER_SECOND)
            if shape not in seen:
                seen.append(shape)
        return seen

    # ---- batches ------------------------------------------------------------------
    def batch(self, index: int) -> Batch:
        """The ``index``-th batch of the (unshuffled) schedule; random access, deterministic."""
        p = self._plan[index]
        seconds = UTTERANCE_SECONDS[p.length_index]
        frames = seconds * FRAMES_PER_SECOND
        start = int(self._offsets[index])
        features = self._pool[start:start + p.size * frames * self.n_freq].reshape(p.size, frames, self.n_freq)
        labels = self._labels[self._label_starts[index]:self._label_starts[index + 1]].reshape(p.size, -1)
        return Batch(features, labels, frames, seconds, index)

    def __iter__(self) -> Iterator[Batch]:
        digest = self._new_digest()
        self._checksum = None
        for i in self._order:
            batch = self.batch(int(i))
            self._update_digest(digest, batch)
            yield batch
        self._checksum = digest.hexdigest()

    def warmup_batches(self) -> List[Batch]:
        """The first batch of every distinct shape, in pass order: what a warm-up runs."""
        seen, out = set(), []
        for i in self._order:
            p = self._plan[i]
            key = (p.size, p.length_index)
            if key not in seen:
                seen.add(key)
                out.append(self.batch(int(i)))
        return out

    def one_batch_per_length(self) -> List[Batch]:
        """The first batch of each utterance length (ascending): the forward-timing subsample."""
        firsts = {}
        for i, p in enumerate(self._plan):
            firsts.setdefault(p.length_index, i)
        return [self.batch(firsts[li]) for li in sorted(firsts)]

    def length_batch(self, seconds: int) -> Batch:
        """The first batch of utterances of ``seconds`` seconds (one of :attr:`lengths`)."""
        for i, p in enumerate(self._plan):
            if UTTERANCE_SECONDS[p.length_index] == seconds:
                return self.batch(i)
        raise ValueError("no utterances of %r s in this iterator (lengths %s)" % (seconds, list(self.lengths)))

    # ---- checksum -------------------------------------------------------------------
    def _new_digest(self):
        digest = hashlib.sha256(b"DS2-Rosetta DeepMarkIterator v1")
        digest.update(self._pool_digest)
        return digest

    def _update_digest(self, digest, batch: Batch) -> None:
        n, t, f = batch.features.shape
        digest.update(struct.pack("<5q", batch.index, int(self._offsets[batch.index]), n, t, f))
        digest.update(np.ascontiguousarray(batch.labels, dtype="<i4").tobytes())

    @property
    def checksum(self) -> Optional[str]:
        """SHA-256 (hex) of what the last complete pass yielded; None before one completes."""
        return self._checksum

    def expected_checksum(self) -> str:
        """The checksum a complete pass yields, computed without training on anything."""
        digest = self._new_digest()
        for i in self._order:
            self._update_digest(digest, self.batch(int(i)))
        return digest.hexdigest()

    def shard_stats(self, world: int) -> dict:
        """How a pass splits among ``world`` workers: batches whose size ``world`` does not divide
        (their shares differ by one) and batches smaller than ``world`` (some worker's share is empty)."""
        _check_positive_int("world", world)
        sizes = [p.size for p in self._plan]
        return {"world_size": world, "batches": len(sizes),
                "uneven_batches": sum(1 for n in sizes if n % world),
                "batches_with_empty_shards": sum(1 for n in sizes if n < world),
                "max_shard": max(shard_sizes(max(sizes), world)) if sizes else 0}

    def describe(self) -> dict:
        """Facts about the data, for the result record."""
        return {
            "batch_size": self.batch_size, "scale": self.scale, "seed": self.seed, "shuffle": self.shuffle,
            "batches": len(self), "utterances": self.utterances, "audio_seconds": self.audio_seconds,
            "audio_hours": round(self.audio_hours, 4), "distinct_shapes": len(self.shapes()),
            "lengths": list(self.lengths),
        }
