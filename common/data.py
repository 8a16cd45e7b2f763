"""The DeepMark synthetic-utterance iterator, shared by every notebook.

DeepMark's DS2 benchmark trains on synthetic data with the length mix of a real corpus:
utterances of 1..15 seconds in the shares of :data:`common.spec.LENGTH_SHARE_PERCENT`,
``scale`` utterances per percent point (1280 -> 128,000 utterances, 211.2 h of audio).
Minibatches hold utterances of one length, so nothing is ever padded.

Design, following DeepMark: one pool of standard-normal float32 features is drawn once,
and every minibatch's features are a C-contiguous, read-only *slice* of that pool (no copy),
so producing data costs nothing next to training.  Labels are drawn per batch, uniformly
over the classes 1..28 (class 0 is the CTC blank and never a label).

Two fixes against DeepMark's generator (documented in the README): it drew labels from
0..28, i.e. including the blank, and passed its length probabilities in the wrong argument.

Everything derives from one seed, through NumPy's PCG64 generator, so equal seeds give
bit-identical batches in any process.  :attr:`DeepMarkIterator.checksum` is a SHA-256 over
exactly what a pass yielded: the pool's bytes (hashed once), and per batch its pool offset,
shape and label bytes -- which determine the feature bytes completely.
"""
import hashlib
import struct
from collections import namedtuple
from typing import Iterator, List, Optional, Tuple

import numpy as np

from .spec import (DEEPMARK_SCALE, FRAMES_PER_SECOND, LABEL_LENGTHS, LENGTH_SHARE_PERCENT,
                   UTTERANCE_SECONDS, _check_positive_int)

#: One minibatch: features (N, T, n_freq) float32, labels (N, L) int32 in 1..n_classes-1,
#: frames T, seconds of audio per utterance, and the batch's index in the (unshuffled) schedule.
class Batch(namedtuple("Batch", ["features", "labels", "frames", "seconds", "index"])):
    __slots__ = ()

    @property
    def batch_size(self) -> int:
        return self.features.shape[0]

    @property
    def audio_seconds(self) -> int:
        return self.features.shape[0] * self.seconds


# Batch plan entry: length index into the tables, number of utterances.
_Plan = namedtuple("_Plan", ["length_index", "size"])


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
                 n_freq: int = 161, n_classes: int = 29, blank: int = 0):
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

        # The batch plan: ascending length, full batches then the remainder of each length.
        self._plan = []  # type: List[_Plan]
        for li, count in enumerate(utterance_counts(scale)):
            full, rest = divmod(count, batch_size)
            self._plan += [_Plan(li, batch_size)] * full + ([_Plan(li, rest)] if rest else [])

        # One seed drives three independent streams: pool, per-batch offsets/labels, order.
        pool_seq, batch_seq, order_seq = np.random.SeedSequence(seed).spawn(3)
        self._batch_seeds = batch_seq.spawn(len(self._plan))

        # The feature pool: twice the largest batch, so batches start at varied offsets.
        max_frames = max(UTTERANCE_SECONDS) * FRAMES_PER_SECOND
        self._max_elements = batch_size * max_frames * n_freq
        # Drawn in float64 and rounded: NumPy's float32 sampler (dtype=np.float32) gives different
        # values in its tail under NumPy 1.19 (CNTK's Python 3.6) and 2.x; the float64 one rounded to
        # float32 is bit-identical in both.
        pool = np.random.Generator(np.random.PCG64(pool_seq)).standard_normal(
            2 * self._max_elements).astype(np.float32)
        pool.setflags(write=False)
        self._pool = pool
        self._pool_digest = hashlib.sha256(pool.tobytes()).digest()

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
        rng = np.random.Generator(np.random.PCG64(self._batch_seeds[index]))
        n_elements = p.size * frames * self.n_freq
        # Offsets fall on frame boundaries of the pool.
        n_starts = (self._pool.size - n_elements) // self.n_freq + 1
        offset = int(rng.integers(0, n_starts)) * self.n_freq
        features = self._pool[offset:offset + n_elements].reshape(p.size, frames, self.n_freq)
        labels = rng.integers(1, self.n_classes, size=(p.size, LABEL_LENGTHS[p.length_index]), dtype=np.int32)
        return Batch(features, labels, frames, seconds, index)

    def _offset_of(self, batch: Batch) -> int:
        return (batch.features.__array_interface__["data"][0]
                - self._pool.__array_interface__["data"][0]) // self._pool.itemsize

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

    # ---- checksum -------------------------------------------------------------------
    def _new_digest(self):
        digest = hashlib.sha256(b"DS2-Rosetta DeepMarkIterator v1")
        digest.update(self._pool_digest)
        return digest

    def _update_digest(self, digest, batch: Batch) -> None:
        n, t, f = batch.features.shape
        digest.update(struct.pack("<5q", batch.index, self._offset_of(batch), n, t, f))
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

    def describe(self) -> dict:
        """Facts about the data, for the result record."""
        return {
            "batch_size": self.batch_size, "scale": self.scale, "seed": self.seed, "shuffle": self.shuffle,
            "batches": len(self), "utterances": self.utterances, "audio_seconds": self.audio_seconds,
            "audio_hours": round(self.audio_hours, 4), "distinct_shapes": len(self.shapes()),
        }
