"""CTC labels in CNTK's per-frame encoding, in NumPy (framework-free, so CI tests it without CNTK).

CNTK's CTC (``C.forward_backward(C.labels_to_graph(labels), logits, blankTokenId=0)``) takes its
labels as a *sequence as long as the logits*: one vector of ``n_classes`` per output frame, which
``labels_to_graph`` turns into the graph of allowed paths.  In a frame's vector, 2 at class ``k``
starts a new label ``k`` and 1 at class ``k`` continues the previous one.  Labels that are not
aligned to frames (CTC's case) are written as the CNTK documentation of ``forward_backward`` shows:
label ``i`` starts in frame ``i`` (value 2), and the remaining frames repeat the last label with
value 1.  Two equal labels in a row stay two labels, because each starts with a 2.
"""
import numpy as np


def frame_labels(labels: np.ndarray, n_frames: int, n_classes: int) -> np.ndarray:
    """(N, L) integer labels in 1..n_classes-1 -> (N, n_frames, n_classes) float32 per-frame encoding.

    ``n_frames`` is the number of output (CTC) frames, at least ``L``.
    """
    labels = np.asarray(labels)
    if labels.ndim != 2 or labels.shape[1] < 1:
        raise ValueError("labels must have shape (N, L) with L >= 1, got %r" % (labels.shape,))
    n, length = labels.shape
    if length > n_frames:
        raise ValueError("%d labels do not fit in %d frames" % (length, n_frames))
    if labels.min() < 0 or labels.max() >= n_classes:
        raise ValueError("labels must lie in 0..%d" % (n_classes - 1))
    encoded = np.zeros((n, n_frames, n_classes), dtype=np.float32)
    utterance = np.arange(n)
    encoded[utterance[:, None], np.arange(length), labels] = 2.0     # label i starts in frame i
    encoded[utterance, length:, labels[:, -1]] = 1.0                 # the last label continues to the end
    return encoded

