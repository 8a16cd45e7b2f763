"""The 28-symbol alphabet, greedy CTC decoding and the character error rate (CER), computed once for every row.

Class ``0`` is the CTC blank; classes ``1..28`` are the symbols of :data:`ALPHABET`, in the order of
deepspeech.pytorch's English label set: the apostrophe, ``a``..``z`` and the space.  Every transcript of the real
task (``common/corpus.py``) is written in exactly these 28 symbols, lower case.

Greedy (best-path) decoding reads the most probable class of each output frame, merges runs of the same class and
drops the blanks: ``a a _ a b b _`` reads ``aab``.  Two equal letters in a row (``ll``) therefore need a blank
between them in the frames.  The CER is the character-level Levenshtein distance (substitutions, insertions,
deletions, each cost 1) summed over the utterances, divided by the total number of characters of the references:
a corpus-level rate, so long utterances weigh more than short ones, and it can exceed 1 when a model inserts more
than the references hold.

Framework-free (NumPy only) and Python 3.6-compatible (CNTK's interpreter).
"""
from typing import Iterable, List, Sequence, Tuple

import numpy as np

#: the CTC blank's class index
BLANK = 0
#: the 28 symbols, class ``i + 1`` for ``ALPHABET[i]``
ALPHABET = "'abcdefghijklmnopqrstuvwxyz "
#: classes including the blank (29)
N_CLASSES = len(ALPHABET) + 1

_INDEX = {ch: i + 1 for i, ch in enumerate(ALPHABET)}


def encode(text: str) -> np.ndarray:
    """A transcript in the 28 symbols -> int32 class ids in 1..28; any other character is a ValueError."""
    try:
        return np.array([_INDEX[ch] for ch in text], dtype=np.int32)
    except KeyError as e:
        raise ValueError("%r is not in the 28-symbol alphabet (a-z, apostrophe, space): %r" % (e.args[0], text)) \
            from None


def ids_to_text(ids: Iterable[int]) -> str:
    """Class ids in 1..28 -> text (a blank or an id out of range is a ValueError)."""
    out = []
    for i in ids:
        i = int(i)
        if not 1 <= i <= len(ALPHABET):
            raise ValueError("class %d is not a symbol (1..%d)" % (i, len(ALPHABET)))
        out.append(ALPHABET[i - 1])
    return "".join(out)


def collapse(path: Sequence[int], blank: int = BLANK) -> List[int]:
    """A best path (one class per frame) -> the label ids it reads: merge repeats, then drop blanks."""
    out = []
    prev = None
    for c in path:
        c = int(c)
        if c != prev and c != blank:
            out.append(c)
        prev = c
    return out


def greedy_decode(logits: np.ndarray, lengths: Sequence[int] = None, time_major: bool = False) -> List[str]:
    """Greedy CTC decoding of a batch of logits (or log-probabilities, or probabilities: only the argmax counts).

    ``logits``: (N, T', 29), or (T', N, 29) with ``time_major=True``; ``lengths``: the number of valid frames of
    each utterance (default: all T').  Returns N strings.  A tie between classes goes to the lower class (NumPy's
    argmax), so a frame tied with the blank reads blank.
    """
    logits = np.asarray(logits)
    if logits.ndim != 3 or logits.shape[-1] != N_CLASSES:
        raise ValueError("logits must have shape (N, T', %d) (or (T', N, %d) time-major), got %r"
                         % (N_CLASSES, N_CLASSES, logits.shape))
    if time_major:
        logits = np.swapaxes(logits, 0, 1)
    n, t = logits.shape[:2]
    if lengths is None:
        lengths = [t] * n
    if len(lengths) != n:
        raise ValueError("%d lengths for a batch of %d" % (len(lengths), n))
    best = np.argmax(logits, axis=-1)
    texts = []
    for row, length in zip(best, lengths):
        if not 0 <= int(length) <= t:
            raise ValueError("length %r outside 0..%d" % (length, t))
        texts.append(ids_to_text(collapse(row[:int(length)])))
    return texts


def edit_distance(reference: Sequence, hypothesis: Sequence) -> int:
    """Levenshtein distance between two sequences (strings: characters): substitutions, insertions, deletions."""
    r, h = list(reference), list(hypothesis)
    if len(r) < len(h):
        r, h = h, r
    prev = list(range(len(h) + 1))
    for i, a in enumerate(r, start=1):
        cur = [i]
        for j, b in enumerate(h, start=1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a != b)))
        prev = cur
    return prev[-1]


def cer_counts(references: Sequence[str], hypotheses: Sequence[str]) -> Tuple[int, int]:
    """(summed character edit distance, total reference characters) over pairs of transcripts."""
    if len(references) != len(hypotheses):
        raise ValueError("%d references but %d hypotheses" % (len(references), len(hypotheses)))
    errors = sum(edit_distance(r, h) for r, h in zip(references, hypotheses))
    chars = sum(len(r) for r in references)
    return errors, chars


def cer(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Corpus character error rate: summed edit distances / total reference characters (references non-empty)."""
    errors, chars = cer_counts(references, hypotheses)
    if chars == 0:
        raise ValueError("the references hold no characters: the CER is undefined")
    return errors / chars
