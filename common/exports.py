"""Trained models out of every framework: where a notebook's export goes and the checks
its section "11. Export" runs.  Standard library + NumPy, no framework import; runs on Python 3.6.

Every notebook, after its timed epoch:

1. ``exported = export_canonical(model)`` -- its own inverse of section 5 (transposes undone, NHWC
   feature orders mapped back, the two RNN biases of PyTorch/MXNet/cuDNN merged ``b = b_ih + b_hh``,
   the BatchNorm running statistics as ``<bn>.mean`` / ``<bn>.var``), float32;
2. ``paths = export_paths(result_path)`` and ``save_weights(paths["weights"], exported)``;
3. ``logits`` = the model's **inference-mode** forward of the check batch (running statistics, no
   gradient), as a NumPy array in the canonical layout ``(T/4, N, classes)``, saved with
   ``numpy.save(paths["logits"], logits)`` (the migration matrix compares frameworks on it);
4. ``info = export_section(paths, exported, inference_check(logits, exported, check_batch, cfg,
   precision), init_weights)`` -- the check against the NumPy reference's inference-mode forward of
   the state just written (raises :class:`CheckFailed`), the file's checksum and size;
5. the framework's native checkpoint saved, reloaded into a new model built by the notebook's own
   constructor, and its inference logits compared: ``info["native"] = native_check(format, path,
   logits, reloaded_logits)``;
6. the framework's *training-mode* loss of the check batch with the trained weights:
   ``info["train_loss"] = train_loss_check(loss, exported, check_batch, cfg, precision)``
   (last: a training-mode forward may move the running statistics, the file is written already);
7. ``write_export_info(paths, info)``; the record cell passes ``export=info`` to
   :func:`common.results.benchmark_record`.

``run_all.py --migrate`` runs the same cells (environment to check, then export) of every destination
notebook with ``init_weights`` = each source's exported file, and compares the destination's logits
with the source's (``runner/migrate.py``).
"""
import hashlib
import json
import os
from typing import Dict, Optional

import numpy as np

from . import reference
from .checks import CheckFailed
from .spec import LOSS_RTOL, DS2Config, check_precision

#: largest allowed max |framework - reference| / max |reference| of the inference-mode logits
LOGIT_RTOL = {"fp32": 1e-4, "tf32": 1e-2, "bf16": 5e-2, "fp64": 1e-9}
#: a native checkpoint must reload bit-for-bit in principle; this allows a different kernel choice
NATIVE_ATOL = 1e-5


def export_paths(result_path: str) -> Dict[str, str]:
    """Where the export of the run whose record is ``result_path`` goes: ``weights`` (the canonical
    ``.npz``), ``logits`` (the inference-mode logits of the check batch, ``.npy``), ``info`` (this
    module's check results, ``.json``) and ``native`` (a stem for the framework's own checkpoint; add
    the format's extension).  ``results/records/<stem>.json`` -> ``results/weights/<stem>.*``; the
    directory is created."""
    records_dir = os.path.dirname(os.path.abspath(result_path))
    directory = os.path.join(os.path.dirname(records_dir), "weights")
    os.makedirs(directory, exist_ok=True)
    stem = os.path.join(directory, os.path.splitext(os.path.basename(result_path))[0])
    return {"weights": stem + ".npz", "logits": stem + ".logits.npy", "info": stem + ".export.json",
            "native": stem + ".native"}


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def logit_difference(logits, expected) -> dict:
    """``max_abs`` = max |a - b| and ``max_rel`` = max_abs / max |b| (relative to the largest
    expected logit: elementwise ratios blow up at logits near 0)."""
    a, b = np.asarray(logits, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if a.shape != b.shape:
        raise CheckFailed("logits have shape %s, expected %s (layout (T/4, N, classes))" % (a.shape, b.shape))
    max_abs = float(np.max(np.abs(a - b))) if a.size else 0.0
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    if not np.all(np.isfinite(a)):
        max_abs = float("inf")
    return {"max_abs": max_abs, "max_rel": max_abs / scale if scale > 0 else max_abs}


def inference_check(logits, state: Dict[str, np.ndarray], batch, config: DS2Config, precision: str) -> dict:
    """The framework's inference-mode logits of ``batch`` against the NumPy reference's inference-mode
    forward of ``state`` (the exported canonical state): max logit difference within
    :data:`LOGIT_RTOL` and the CTC loss of both (computed by the same NumPy CTC) within the first-loss
    tolerance.  Returns the record's ``export.inference`` entry; raises :class:`CheckFailed`."""
    rtol = LOGIT_RTOL[_precision(precision)]
    expected = reference.forward(state, batch.features, config, training=False)
    diff = logit_difference(logits, expected)
    labels = batch.labels
    loss = float(reference.ctc_loss(np.asarray(logits, dtype=np.float64), labels, blank=config.blank).mean())
    ref_loss = float(reference.ctc_loss(expected, labels, blank=config.blank).mean())
    loss_rel = abs(loss - ref_loss) / abs(ref_loss) if ref_loss else abs(loss)
    loss_rtol = LOSS_RTOL[precision]
    result = {"logits_max_abs": diff["max_abs"], "logits_max_rel": diff["max_rel"], "logits_rtol": rtol,
              "loss": loss, "reference_loss": ref_loss, "loss_rel_diff": loss_rel, "loss_rtol": loss_rtol,
              "batch_size": int(batch.batch_size), "seconds": int(batch.seconds), "precision": precision,
              "ok": bool(diff["max_rel"] <= rtol and loss_rel <= loss_rtol)}
    if not result["ok"]:
        raise CheckFailed("inference-mode check failed: logits differ from the NumPy reference by %.3g relative "
                          "(tolerance %.0e), loss %.8g vs %.8g (relative %.3g, tolerance %.0e)"
                          % (diff["max_rel"], rtol, loss, ref_loss, loss_rel, loss_rtol))
    return result


def train_loss_check(loss: float, state: Dict[str, np.ndarray], batch, config: DS2Config, precision: str) -> dict:
    """The framework's training-mode loss of ``batch`` with the trained weights against the NumPy
    reference's training-mode loss from the exported ``state`` (so the export holds the trained
    parameters, not only the running statistics)."""
    ref = reference.ds2_loss(state, batch.features, batch.labels, config, training=True)
    loss = float(loss)
    rel = abs(loss - ref) / abs(ref) if ref else abs(loss)
    rtol = LOSS_RTOL[precision]
    result = {"framework": loss, "reference": ref, "rel_diff": rel, "rtol": rtol, "ok": bool(rel <= rtol)}
    if not result["ok"]:
        raise CheckFailed("training-mode loss of the exported weights: framework %.8g vs NumPy reference %.8g, "
                          "relative difference %.3g > %.0e" % (loss, ref, rel, rtol))
    return result


def native_check(fmt: str, path: str, logits, reloaded_logits, atol: float = NATIVE_ATOL) -> dict:
    """The framework's own checkpoint (``fmt``: e.g. "torch.save(state_dict)") reloaded into a new
    model: its inference logits against the trained model's, max |difference| within ``atol``."""
    diff = logit_difference(reloaded_logits, logits)
    size = os.path.getsize(path) if os.path.isfile(path) else None
    result = {"format": fmt, "path": _relative(path), "bytes": size, "logits_max_abs": diff["max_abs"],
              "atol": atol, "ok": bool(diff["max_abs"] <= atol)}
    if not result["ok"]:
        raise CheckFailed("native checkpoint %s (%s) reloads with different logits: max |difference| %.3g > %.0e"
                          % (path, fmt, diff["max_abs"], atol))
    return result


def export_section(paths: Dict[str, str], state: Dict[str, np.ndarray], inference: dict,
                   init_weights: Optional[str] = None) -> dict:
    """The record's ``export`` section: the file, its checksum and size, what it holds, the checks."""
    return {"path": _relative(paths["weights"]), "sha256": file_sha256(paths["weights"]),
            "bytes": os.path.getsize(paths["weights"]), "tensors": len(state),
            "logits_path": _relative(paths["logits"]), "init_weights": init_weights, "inference": inference}


def skipped(skip) -> dict:
    """The ``export`` section of a run whose ``skip`` parameter names it (``run_all.py --skip export,onnx``): the
    canonical state was computed in memory (the record's ``checks.param_summary``), no file written, no check run."""
    return {"status": "skipped", "reason": "skip=%s: the canonical state is computed in memory only; no file is "
                                           "written and no export check runs" % ",".join(skip)}


def write_export_info(paths: Dict[str, str], info: dict) -> str:
    """Write the export section next to the weights (``paths["info"]``), atomically."""
    tmp = paths["info"] + ".partial"
    with open(tmp, "w") as f:
        json.dump(info, f, indent=1, sort_keys=True, default=float)
    os.replace(tmp, paths["info"])
    return paths["info"]


def _precision(precision: str) -> str:
    return check_precision(precision, control=True)


def _relative(path: str) -> str:
    """A path under the repository as a relative one (records must not carry this machine's paths)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.abspath(path)
    return os.path.relpath(path, root) if path.startswith(root + os.sep) else path
