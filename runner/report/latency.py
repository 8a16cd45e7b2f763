"""The latency-aware roofline in results.md: a row's seconds of audio per second as a share of the bound that the
same card's latency figures give (common/roofline.py; docs/benchmark.md, "The latency-aware roofline").

The figures are the JSON files ``benchmarks/rnn_latency.py --out`` writes, kept under ``<results dir>/latency/``
(one per card; a later file of the same card replaces an earlier one). A row gets a share only when a file names
its device and its precision: a CPU row, or a card without figures, gets none."""
import glob
import json
import os
from typing import Dict, Optional

from common import roofline
from common.spec import DS2Config

from runner.report.records import _number, _speed

LATENCY_DIR = "latency"


def load_latency(results_dir: str) -> Dict[str, dict]:
    """Device name -> the newest latency report for it, from ``<results_dir>/latency/*.json``; an unreadable file
    is left out (the page does not depend on it)."""
    out, when = {}, {}
    for path in sorted(glob.glob(os.path.join(results_dir, LATENCY_DIR, "*.json"))):
        try:
            with open(path) as f:
                report = json.load(f)
            name = report["device"]["name"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        stamp = os.path.getmtime(path)
        if name not in out or stamp >= when[name]:
            out[name], when[name] = report, stamp
    return out


def latency_share(rec: dict, latency: Dict[str, dict]) -> Optional[float]:
    """``rec``'s audio-s/s over the latency-aware bound of its own pass (preset, batch size, scale, lengths) from
    its card's figures at its precision; None without figures, a completed run or a model configuration, and None
    where the figures were measured at another width or batch size than the row's (``sizes.hidden``,
    ``sizes.batch``: one step's latency depends on both, so a smoke-width row gets no share from full-width
    figures)."""
    speed, device = _speed(rec), (rec.get("device") or {}).get("name")
    report = latency.get(device) if device else None
    if speed is None or report is None or not rec.get("config") or not _number(rec.get("batch_size")):
        return None
    sizes = report.get("sizes") or {}
    if sizes.get("hidden") != rec["config"].get("rnn_hidden") or sizes.get("batch") != rec["batch_size"]:
        return None
    try:
        figures = roofline.figures_from_benchmark(report, rec.get("precision"))
    except (KeyError, ValueError, TypeError):
        return None
    config = DS2Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in rec["config"].items()})
    lengths = (rec.get("data") or {}).get("lengths")
    batches = roofline.deepmark_batches(rec["batch_size"], rec.get("scale") or 1, lengths=lengths)
    bound = roofline.epoch_bound(config, batches, figures["t_step_s"], figures["gemm_flops_per_s"])
    return speed / bound["audio_s_per_s"]
