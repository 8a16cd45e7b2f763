"""Greedy CTC decoding and the character error rate (common/decode.py), on cases worked by hand."""
import numpy as np
import pytest

from common.decode import (ALPHABET, BLANK, N_CLASSES, cer, cer_counts, collapse, edit_distance, encode,
                           greedy_decode, ids_to_text)


def one_hot_logits(paths):
    """(N, T', 29) logits whose argmax per frame is the given path (class ids)."""
    paths = np.asarray(paths)
    logits = np.full(paths.shape + (N_CLASSES,), -1.0, dtype=np.float32)
    n, t = paths.shape
    logits[np.arange(n)[:, None], np.arange(t)[None, :], paths] = 3.0
    return logits


def test_alphabet_is_the_28_symbols_after_the_blank():
    assert BLANK == 0 and N_CLASSES == 29 and len(ALPHABET) == 28 and len(set(ALPHABET)) == 28
    assert set(ALPHABET) == set("abcdefghijklmnopqrstuvwxyz' ")
    assert list(encode("a z'")) == [2, 28, 27, 1]
    assert ids_to_text(encode("the lord's house")) == "the lord's house"


def test_encode_refuses_other_characters():
    with pytest.raises(ValueError, match="not in the 28-symbol alphabet"):
        encode("Amen.")
    with pytest.raises(ValueError, match="not a symbol"):
        ids_to_text([0])


def test_collapse_merges_repeats_then_drops_blanks():
    a, b = encode("a")[0], encode("b")[0]
    assert collapse([a, a, 0, a, b, b, 0]) == [a, a, b]      # a a _ a b b _ -> aab
    assert collapse([0, 0, 0]) == []
    assert collapse([a, a, a]) == [a]                        # a repeat needs a blank between
    assert collapse([]) == []


def test_greedy_decode_batch_and_lengths():
    h, e, l, o = (int(i) for i in encode("helo"))
    paths = [[h, h, e, 0, l, 0, l, o, 0, 0],                 # "hello"
             [0, h, 0, 0, 0, 0, 0, 0, e, e]]                 # "he", but only 4 valid frames -> "h"
    logits = one_hot_logits(paths)
    assert greedy_decode(logits) == ["hello", "he"]
    assert greedy_decode(logits, lengths=[10, 4]) == ["hello", "h"]
    assert greedy_decode(np.swapaxes(logits, 0, 1), time_major=True) == ["hello", "he"]
    assert greedy_decode(logits[:, :0]) == ["", ""]


def test_greedy_decode_refuses_bad_shapes():
    with pytest.raises(ValueError, match="shape"):
        greedy_decode(np.zeros((2, 5, 28)))
    with pytest.raises(ValueError, match="lengths"):
        greedy_decode(np.zeros((2, 5, 29)), lengths=[5])
    with pytest.raises(ValueError, match="outside"):
        greedy_decode(np.zeros((1, 5, 29)), lengths=[6])


@pytest.mark.parametrize("ref, hyp, distance", [
    ("", "", 0), ("abc", "abc", 0), ("abc", "", 3), ("", "ab", 2),
    ("kitten", "sitting", 3),            # k->s, e->i, +g
    ("the lord", "the lord", 0), ("the lord", "thelord", 1), ("the lord", "the lords", 1),
    ("abc", "cba", 2), ("flaw", "lawn", 2),
])
def test_edit_distance_hand_cases(ref, hyp, distance):
    assert edit_distance(ref, hyp) == distance
    assert edit_distance(hyp, ref) == distance


def test_cer_sums_distances_over_reference_characters():
    refs = ["kitten", "the lord"]                      # 6 + 8 = 14 characters
    hyps = ["sitting", "the lord"]                     # 3 + 0 errors
    assert cer_counts(refs, hyps) == (3, 14)
    assert cer(refs, hyps) == pytest.approx(3 / 14)
    assert cer(["ab"], ["xyzw"]) == 2.0                # insertions can take the rate past 1
    assert cer(["abc", "d"], ["abc", "d"]) == 0.0
    # corpus-level, not a mean of per-utterance rates: (1 + 0) / (1 + 9), not (1/1 + 0/9) / 2
    assert cer(["a", "bcdefghij"], ["b", "bcdefghij"]) == pytest.approx(0.1)


def test_cer_refuses_mismatched_or_empty_input():
    with pytest.raises(ValueError, match="references but"):
        cer(["a"], [])
    with pytest.raises(ValueError, match="undefined"):
        cer([""], ["a"])


def test_decode_then_cer_end_to_end():
    text = "and god saw the light"
    ids = [int(i) for i in encode(text)]
    path = []
    for i, c in enumerate(ids):                        # each symbol for two frames, a blank between repeats
        if i and ids[i - 1] == c:
            path.append(BLANK)
        path += [c, c]
    decoded = greedy_decode(one_hot_logits([path]))
    assert decoded == [text] and cer([text], decoded) == 0.0
