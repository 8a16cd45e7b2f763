"""The ONNX exit route: every notebook exports its trained, inference-mode acoustic model
with its framework's own ONNX exporter, and onnxruntime's CPU provider runs the file on a held-out batch.
NumPy + the ``onnx`` and ``onnxruntime`` packages (imported only when used); no framework import; runs on
Python 3.6 (CNTK's environment: onnx 1.11, onnxruntime 1.10).

What every notebook's section "11b. Export to ONNX" does, after the canonical export (section 11):

1. ``batch = held_out_batch(cfg, seed)``: another seed (``seed + 1``), another batch size (3) and a length
   (3 s, 300 frames) that the export never traced (exporters trace the check batch: 1 s, the run's batch
   size);
2. the framework's exporter writes ``paths["onnx"]`` (:func:`onnx_path`): the inference-mode model
   (BatchNorm with its running statistics, no CTC), spectrograms in, logits out, batch and time axes
   dynamic; ``annotate(path, cfg, input_layout, output_layout, ...)`` stores the layouts and the model's
   configuration in the file's metadata, so the file alone says how to feed it;
3. ``framework_logits, framework_s = timed(lambda: <inference-mode logits of batch>)`` in the canonical
   layout ``(T/4, N, classes)``;
4. ``section = check(path, framework_logits, framework_s, batch, exported, cfg, exporter, version)``:
   onnxruntime (CPU provider) runs the file on ``batch``; its logits are held to the framework's and to the
   NumPy reference's inference mode of the exported canonical state, both within :data:`ONNX_RTOL`
   (relative to the largest logit); the file's size, opset, nodes by type, and onnxruntime's inference time
   beside the framework's on the same batch in the same process go into the record's ``onnx`` section.
   A mismatch is ``status: failed`` with the difference as reason (the benchmark row stays);
5. an exporter that cannot express a part of DS2: ``section = export_failed(exporter, version, error,
   op=...)`` -- status ``failed``, the op, the exporter's one-line error.

``python -m common.onnx_check MODEL.onnx [--weights NPZ]`` runs the same onnxruntime check of a file
against the NumPy reference (the canonical ``.npz`` beside it by default): exit 0 when it matches, 1 when
it does not, 2 (one line) for a missing or corrupt file or one without the DS2 metadata and no
``--preset``.
"""
import argparse
import json
import os
import sys
import time
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from . import reference
from .checks import CheckFailed
from .data import DeepMarkIterator
from .exports import _relative, file_sha256, logit_difference
from .spec import DS2Config

#: largest allowed max |onnxruntime - other| / max |other| of the logits (fp32 export)
ONNX_RTOL = 1e-4
#: the held-out batch: another seed than the run's, another batch size, a length the export never traced
HELD_OUT_SEED_OFFSET = 1
HELD_OUT_BATCH_SIZE = 3
HELD_OUT_SECONDS = 3
#: timed repeats of each inference (after one untimed run); the median is recorded
REPEATS = 3
#: layouts of the exported graph's input and output (F: frequency bins, C: classes)
INPUT_LAYOUTS = ("NTF", "TNF")
OUTPUT_LAYOUTS = ("TNC", "NTC")
#: metadata keys ``annotate`` writes into the file
META_PREFIX = "ds2."


class OnnxFileError(Exception):
    """The file cannot be used: missing, not ONNX, not loadable by onnxruntime, no DS2 metadata (one line)."""


def onnx_path(paths: Dict[str, str]) -> str:
    """Where the ONNX file of a run goes: beside its canonical export, ``results/weights/<stem>.onnx``."""
    return os.path.splitext(paths["weights"])[0] + ".onnx"


def held_out_batch(config: DS2Config, seed: int):
    """A batch the export never saw: seed ``seed + 1``, :data:`HELD_OUT_BATCH_SIZE` utterances of
    :data:`HELD_OUT_SECONDS` s, from the shared iterator (same pool rule, labels never the blank)."""
    it = DeepMarkIterator(HELD_OUT_BATCH_SIZE, 1, seed + HELD_OUT_SEED_OFFSET, n_freq=config.n_freq,
                          n_classes=config.n_classes)
    for batch in it.one_batch_per_length():
        if batch.seconds == HELD_OUT_SECONDS and batch.batch_size == HELD_OUT_BATCH_SIZE:
            return batch
    raise AssertionError("the iterator has no %d-s batch of %d" % (HELD_OUT_SECONDS, HELD_OUT_BATCH_SIZE))


def timed(fn: Callable[[], object], repeats: int = REPEATS) -> Tuple[object, float]:
    """``fn()`` once untimed (compilation, allocation), then ``repeats`` times: (its last result, the median
    seconds).  The same rule for the framework and onnxruntime, so the two times compare."""
    out = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, float(np.median(times))


def one_line(error, limit: int = 300) -> str:
    """An exception (or text) as one line: ``Type: first non-empty line``, at most ``limit`` characters, terminal
    colour codes removed (exporters print them)."""
    import re
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    if isinstance(error, BaseException):
        lines = [l.strip() for l in text.splitlines() if l.strip()]
        text = "%s: %s" % (type(error).__name__, lines[0]) if lines else type(error).__name__
    else:
        lines = [l.strip() for l in text.splitlines() if l.strip()]
        text = lines[0] if lines else ""
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ---- the file --------------------------------------------------------------------------------------------
def _load_model(path: str):
    import onnx
    if not os.path.isfile(path):
        raise OnnxFileError("%s: no such file" % path)
    try:
        return onnx.load(path)
    except Exception as e:
        raise OnnxFileError("%s is not a readable ONNX model (%s)" % (path, one_line(e))) from None


def annotate(path: str, config: DS2Config, input_layout: str = "NTF", output_layout: str = "TNC",
             **facts) -> None:
    """Store how to use the file in its own metadata (``metadata_props``): the model's configuration, the
    input and output layouts, and ``facts`` (target, preset, exporter...).  Rewrites the file in place."""
    import onnx
    if input_layout not in INPUT_LAYOUTS or output_layout not in OUTPUT_LAYOUTS:
        raise ValueError("layouts: input one of %s, output one of %s" % (INPUT_LAYOUTS, OUTPUT_LAYOUTS))
    model = _load_model(path)
    meta = {p.key: p.value for p in model.metadata_props}
    meta.update({META_PREFIX + "config": json.dumps(config.to_dict(), sort_keys=True),
                 META_PREFIX + "input_layout": input_layout, META_PREFIX + "output_layout": output_layout})
    meta.update({META_PREFIX + k: str(v) for k, v in facts.items()})
    onnx.helper.set_model_props(model, meta)
    tmp = path + ".partial"
    onnx.save(model, tmp)
    os.replace(tmp, path)


def metadata(model) -> Dict[str, str]:
    return {p.key[len(META_PREFIX):]: p.value for p in model.metadata_props if p.key.startswith(META_PREFIX)}


def _config_of(meta: Dict[str, str]) -> Optional[DS2Config]:
    if "config" not in meta:
        return None
    d = json.loads(meta["config"])
    return DS2Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def node_counts(model) -> Tuple[Dict[str, int], int, int]:
    """Nodes by op type over the graph and every subgraph (Loop and Scan bodies, If branches):
    (counts, total, top-level nodes)."""
    counts = {}

    def walk(graph):
        for node in graph.node:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
            for attr in node.attribute:
                if attr.g is not None and len(attr.g.node):
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(model.graph)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))), sum(counts.values()), len(model.graph.node)


def opset(model) -> Optional[int]:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return None


def session(path: str):
    """An onnxruntime inference session on the CPU provider; a file it cannot load raises OnnxFileError."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 3          # errors only: shape-merge notes on exporters' files are not news to a user
    try:
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise OnnxFileError("onnxruntime cannot load %s (%s)" % (path, one_line(e))) from None


def feed(sess, features: np.ndarray, input_layout: str) -> Dict[str, np.ndarray]:
    x = np.ascontiguousarray(features if input_layout == "NTF" else features.transpose(1, 0, 2), dtype=np.float32)
    return {sess.get_inputs()[0].name: x}


def to_canonical(out: np.ndarray, output_layout: str) -> np.ndarray:
    """Logits in the canonical layout ``(T/4, N, classes)``."""
    return np.asarray(out) if output_layout == "TNC" else np.asarray(out).transpose(1, 0, 2)


def run(sess, features: np.ndarray, input_layout: str, output_layout: str) -> np.ndarray:
    return to_canonical(sess.run(None, feed(sess, features, input_layout))[0], output_layout)


# ---- the record's section ----------------------------------------------------------------------------------
def _throughput(seconds: Optional[float], batch) -> Optional[dict]:
    if seconds is None:
        return None
    return {"seconds": seconds, "audio_s_per_s": batch.audio_seconds / seconds if seconds > 0 else None,
            "utterances_per_s": batch.batch_size / seconds if seconds > 0 else None}


def _batch_facts(batch, seed: Optional[int] = None) -> dict:
    return {"batch_size": int(batch.batch_size), "seconds": int(batch.seconds), "frames": int(batch.frames),
            "seed": seed}


def check(path: str, framework_logits, framework_seconds: Optional[float], batch, state: Dict[str, np.ndarray],
          config: DS2Config, exporter: str, exporter_version: str, repeats: int = REPEATS,
          workaround: Optional[str] = None, seed: Optional[int] = None, attempts=None) -> dict:
    """The record's ``onnx`` section for an exported file (see the module docstring).  ``framework_logits``:
    the framework's inference-mode logits of ``batch`` in the canonical layout; ``framework_seconds``: their
    median time by :func:`timed`; ``state``: the exported canonical state (section 11).  onnxruntime's logits
    are held to both within :data:`ONNX_RTOL`: ``status`` "ok", else "failed" with the difference as reason.
    A file onnxruntime cannot load is "failed" with its one-line error.  ``workaround``: what the notebook
    changed so that the exporter works (None: the exporter's plain call); ``attempts``: the
    :func:`export_failed` sections of the routes that failed before it (kept in the record)."""
    import onnxruntime as ort
    section = {"status": "ok", "reason": None, "exporter": exporter, "exporter_version": str(exporter_version),
               "path": _relative(path), "onnxruntime": ort.__version__, "provider": "CPUExecutionProvider",
               "batch": _batch_facts(batch, seed), "rtol": ONNX_RTOL, "repeats": repeats,
               "workaround": workaround, "attempts": list(attempts or [])}
    model = _load_model(path)
    meta = metadata(model)
    counts, total, top = node_counts(model)
    section.update({"bytes": os.path.getsize(path), "sha256": file_sha256(path), "opset": opset(model),
                    "nodes": counts, "nodes_total": total, "nodes_top_level": top,
                    "input_layout": meta.get("input_layout", "NTF"), "output_layout": meta.get("output_layout", "TNC"),
                    "ir_version": int(model.ir_version)})
    del model
    try:
        sess = session(path)
        logits, ort_seconds = timed(lambda: run(sess, batch.features, section["input_layout"],
                                                section["output_layout"]), repeats)
    except Exception as e:
        section.update(status="failed", reason="onnxruntime: %s" % one_line(e), failed_op=None)
        return section
    expected = reference.forward(state, batch.features, config, training=False)
    vs_fw = logit_difference(logits, framework_logits)
    vs_ref = logit_difference(logits, expected)
    fw, rt = _throughput(framework_seconds, batch), _throughput(ort_seconds, batch)
    section.update({"vs_framework": vs_fw, "vs_reference": vs_ref,
                    "throughput": {"framework": fw, "onnxruntime": rt,
                                   "onnxruntime_over_framework": (framework_seconds / ort_seconds
                                                                  if framework_seconds and ort_seconds else None)}})
    bad = [(what, d["max_rel"]) for what, d in (("the framework's", vs_fw), ("the NumPy reference's", vs_ref))
           if not d["max_rel"] <= ONNX_RTOL]
    if bad:
        section.update(status="failed", reason="onnxruntime's logits differ from %s by %.3g relative (tolerance %.0e)"
                       % (bad[0][0], bad[0][1], ONNX_RTOL))
    return section


def export_failed(exporter: str, exporter_version: str, error, op: Optional[str] = None,
                  workaround: Optional[str] = None) -> dict:
    """The ``onnx`` section of a run whose exporter failed: the op it could not express (when known) and
    its one-line error."""
    return {"status": "failed", "reason": "%s%s" % ("%s: " % op if op else "", one_line(error)),
            "failed_op": op, "exporter": exporter, "exporter_version": str(exporter_version),
            "workaround": workaround}


def not_installed(*modules: str) -> Optional[dict]:
    """A ``skipped`` section naming those of ``modules`` (the exporter and the check's packages) that this
    interpreter cannot import, or None when it has them all.  Pinned environments always have them; an
    interpreter run as installed (``run_all.py --use-installed``) may have the framework but not its exporter."""
    import importlib.util
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    return skipped("not installed in this interpreter: %s" % ", ".join(missing)) if missing else None


def skipped(reason: str, exporter: Optional[str] = None) -> dict:
    """The ``onnx`` section of a run that does not export (another precision, a data-parallel worker)."""
    return {"status": "skipped", "reason": one_line(reason), "exporter": exporter}


def summary_line(section: dict) -> str:
    """What a notebook prints after its check."""
    if section.get("status") != "ok":
        return "ONNX (%s): %s -- %s" % (section.get("exporter"), section.get("status"), section.get("reason"))
    t = section["throughput"]
    return ("ONNX (%s %s, opset %s): %.1f MB, %d nodes; onnxruntime %s vs framework max rel. diff %.2e, vs NumPy "
            "reference %.2e (tolerance %.0e); inference %.1f audio s/s (framework %.1f)"
            % (section["exporter"], section["exporter_version"], section["opset"], section["bytes"] / 1e6,
               section["nodes_total"], section["onnxruntime"], section["vs_framework"]["max_rel"],
               section["vs_reference"]["max_rel"], ONNX_RTOL, t["onnxruntime"]["audio_s_per_s"],
               (t["framework"] or {}).get("audio_s_per_s") or float("nan")))


# ---- the command line -------------------------------------------------------------------------------------
def check_file(path: str, weights: Optional[str] = None, seed: int = 0, preset: Optional[str] = None,
               input_layout: Optional[str] = None, output_layout: Optional[str] = None) -> dict:
    """onnxruntime on ``path`` against the NumPy reference's inference mode of ``weights`` (default: the
    canonical ``.npz`` beside the file) on the held-out batch of ``seed``.  Raises OnnxFileError for a file
    that cannot be checked."""
    from .spec import get_preset
    from .weights import WeightsError, load_state
    model = _load_model(path)
    meta = metadata(model)
    del model
    config = get_preset(preset).config if preset else _config_of(meta)
    if config is None:
        raise OnnxFileError("%s has no DS2 metadata (ds2.config): not written by a DS2 Rosetta notebook; "
                            "pass --preset and the layouts" % path)
    input_layout = input_layout or meta.get("input_layout", "NTF")
    output_layout = output_layout or meta.get("output_layout", "TNC")
    weights = weights or os.path.splitext(path)[0] + ".npz"
    try:
        state = load_state(weights, config)
    except WeightsError as e:
        raise OnnxFileError(str(e)) from None
    batch = held_out_batch(config, seed)
    sess = session(path)
    try:
        logits = run(sess, batch.features, input_layout, output_layout)
    except Exception as e:
        raise OnnxFileError("onnxruntime cannot run %s on a (%d, %d, %d) batch (%s)"
                            % (path, batch.batch_size, batch.frames, config.n_freq, one_line(e))) from None
    expected = reference.forward(state, batch.features, config, training=False)
    try:
        diff = logit_difference(logits, expected)
    except CheckFailed as e:
        raise OnnxFileError("%s: %s" % (path, e)) from None
    return {"path": path, "weights": weights, "max_rel": diff["max_rel"], "max_abs": diff["max_abs"],
            "rtol": ONNX_RTOL, "ok": bool(diff["max_rel"] <= ONNX_RTOL), "batch": _batch_facts(batch, seed + 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m common.onnx_check",
        description="Run a DS2 Rosetta ONNX export in onnxruntime (CPU) on a held-out batch and compare its "
                    "logits with the NumPy reference's inference mode of the canonical weights.")
    parser.add_argument("model", help="the .onnx file (results/weights/<record>.onnx)")
    parser.add_argument("--weights", help="the canonical .npz to compare with (default: the .npz beside the file)")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed; the held-out batch uses seed + 1")
    parser.add_argument("--preset", help="the model's preset, for a file without DS2 metadata")
    parser.add_argument("--input-layout", choices=INPUT_LAYOUTS, help="for a file without DS2 metadata")
    parser.add_argument("--output-layout", choices=OUTPUT_LAYOUTS, help="for a file without DS2 metadata")
    args = parser.parse_args(argv)
    prog = parser.prog
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as e:
        print("%s: error: %s (pip install onnx onnxruntime)" % (prog, e), file=sys.stderr)
        return 2
    try:
        result = check_file(args.model, args.weights, args.seed, args.preset, args.input_layout,
                            args.output_layout)
    except (OnnxFileError, ValueError) as e:
        print("%s: error: %s" % (prog, one_line(str(e))), file=sys.stderr)
        return 2
    print("%s: onnxruntime vs NumPy reference (%s), %d x %d s held-out batch: max rel. diff %.3g (tolerance %.0e): %s"
          % (args.model, result["weights"], result["batch"]["batch_size"], result["batch"]["seconds"],
             result["max_rel"], ONNX_RTOL, "ok" if result["ok"] else "MISMATCH"))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
