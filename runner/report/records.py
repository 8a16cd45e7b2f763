"""results.md's building blocks: selecting, grouping and naming result records, and the Markdown
table helpers every section uses (runner/report/render.py composes the page)."""
import re
from collections import OrderedDict
from typing import List, Optional

import numpy as np

from common.compile_cache import FAST_COMPILE_FLAG
from common.flops import shape_roofline
from common.spec import PRESETS, UTTERANCE_SECONDS, DS2Config


K_STEPS = 10          # losses compared across frameworks: the first K training steps


# ---- selecting and naming records ---------------------------------------------------------
def dp_label(rec: dict) -> str:
    """A data-parallel record's workers, MXNet's mode and the hosts ("2 workers, dist_sync, 2 hosts"); "" for a
    one-process record."""
    d = rec.get("distributed") or {}
    workers = d.get("world_size")
    if not isinstance(workers, int) or workers <= 1:
        return ""
    parts = ["%d workers" % workers]
    if d.get("mxnet_dp"):
        parts.append(str(d["mxnet_dp"]))
    hosts = d.get("hosts") or []
    if len(hosts) > 1:
        parts.append("%d hosts" % len(hosts))
    return ", ".join(parts)


#: what a row named *(LLVM -O0)* ran with, for the pages' legends (the table of record's, the summary's)
FAST_COMPILE_NOTE = ("XLA compiled with LLVM's optimisation off (`--xla_backend_optimization_level=0`, the smoke "
                     "preset on a CPU, where compiling outlasts training), so the speed is not what the framework "
                     "reaches")


def compiled_fast(rec: dict) -> bool:
    """Whether the record's XLA ran with LLVM's optimisation off (its name then says *(LLVM -O0)*)."""
    return FAST_COMPILE_FLAG in str((rec.get("options") or {}).get("xla_flags") or "")


def row_name(rec: dict) -> str:
    """The row's target, with its data-parallel setting, *LLVM -O0* and *as installed* where they apply:
    ``mxnet (2 workers, dist_sync, 2 hosts)``, ``jax (LLVM -O0)``, ``pytorch (as installed)``."""
    dp = dp_label(rec)
    fast = compiled_fast(rec)
    return rec["target"] + (" (%s)" % dp if dp else "") + (" (LLVM -O0)" if fast else "") + \
        (" (as installed)" if rec.get("as_is") else "")


def _label(rec: dict) -> str:
    """The row's target and precision, with its data-parallel setting and *as installed* where they apply."""
    dp = dp_label(rec)
    return "%s %s%s%s" % (rec["target"], rec.get("precision") or "", " (%s)" % dp if dp else "",
                          " (as installed)" if rec.get("as_is") else "")


#: a failed record's reason when a signal or a time limit stopped the run (runner/interrupt.py, runner/run/execute.py,
#: runner/dp/supervisor.py) or its runner ended with no time to say why (runner/run/staging.py), not the notebook's
#: own error
STOPPED = re.compile(r"^(interrupted|terminated|stopped) \(SIG[A-Z0-9]+\)|^a cell ran past the .* timeout"
                     r"|^timed out after |^the runner \(pid \d+\) ended while this row ran")


def is_gpu(rec: dict) -> bool:
    """The record ran on a CUDA GPU."""
    return (rec.get("device") or {}).get("type") == "cuda"


def stopped_early(rec: dict) -> bool:
    """The run did not finish because a signal or a time limit stopped it."""
    return rec.get("status") == "failed" and bool(STOPPED.search(str(rec.get("error") or "")))


#: words a device's name can lose in a column header: vendors, brands and trademarks
_DEVICE_NOISE = {"nvidia", "amd", "intel", "geforce", "tesla", "cpu", "processor", "apple", "graphics"}
_FAMILIES = {"rtx", "gtx", "quadro", "titan", "radeon", "instinct", "arc", "core", "ryzen"}


def short_device(name: Optional[str]) -> str:
    """A device's name for a column header: "NVIDIA H200" -> "H200", "Intel(R) Xeon(R) Processor" -> "Xeon",
    "AMD EPYC 7B13" -> "EPYC", "NVIDIA GeForce RTX 4090" -> "RTX 4090", "NVIDIA A100-SXM4-80GB" -> "A100",
    "Intel(R) Core(TM) i7-8700 CPU" -> "Core i7"."""
    if not name:
        return "?"
    text = re.sub(r"\((R|TM|tm|r)\)|@.*$", " ", str(name))
    words = [w for w in text.split() if w.lower() not in _DEVICE_NOISE and not re.match(r"^\d+-core$", w, re.I)]
    if not words:
        return str(name)
    first = words[0].split("-")[0] or words[0]
    if first.lower() in _FAMILIES and len(words) > 1:
        return "%s %s" % (first, words[1].split("-")[0] or words[1])
    return first


def _group_key(rec: dict):
    """Records that ran the same benchmark on the same device compare directly: the same data (the preset as
    :func:`preset_label` names it: a record of the preset's former lengths is a benchmark of its own), batch size,
    scale and seed."""
    return (preset_label(rec), rec.get("batch_size"), rec.get("scale"), rec.get("seed"),
            (rec.get("device") or {}).get("name"))


def _group_title(key) -> str:
    preset, batch, scale, seed, device = key
    return "%s (batch %s, scale %s, seed %s) on %s" % (preset, batch, scale, seed, device)


def preset_label(rec: dict) -> Optional[str]:
    """The record's preset as tables name it: its name, and where the record's data kept other utterance lengths
    than the preset keeps now, how many (``smoke, 15 lengths``): such rows ran other data and compare with
    neither the preset's rows nor its timing."""
    preset, data = rec.get("preset"), rec.get("data") or {}
    if "utterances" not in data and "lengths" not in data:      # a row that never reached its data
        return preset
    lengths = tuple(data.get("lengths") or UTTERANCE_SECONDS)
    current = PRESETS.get(preset)
    if current is not None and tuple(current.lengths) != lengths:
        return "%s, %d lengths" % (preset, len(lengths))
    return preset


def _bench_key(rec: dict):
    """The speed comparison's group: the same preset, data and device, any batch size and precision
    (a batch-size sweep stays in one group)."""
    return (preset_label(rec), rec.get("scale"), rec.get("seed"), (rec.get("device") or {}).get("name"))


def _bench_title(key) -> str:
    preset, scale, seed, device = key
    return "%s (scale %s, seed %s) on %s" % (preset or "unknown preset", "?" if scale is None else scale,
                                              "?" if seed is None else seed, device or "an unknown device")


def _bench_groups(records: List[dict]) -> "OrderedDict":
    groups = OrderedDict()
    for rec in sorted(records, key=lambda r: (str(_bench_key(r)), r["target"], r.get("precision") or "",
                                              r.get("batch_size") or 0)):
        groups.setdefault(_bench_key(rec), []).append(rec)
    return groups


def row_of_record(rec: dict) -> str:
    """The row of record ``rec`` belongs to: the runner's ``row_of_record``, else the target's name
    before ``+`` (variant targets are ``<row>+<variant>``)."""
    return rec.get("row_of_record") or rec["target"].split("+")[0]


def is_variant(rec: dict) -> bool:
    return row_of_record(rec) != rec["target"]


def _speed(rec: dict) -> Optional[float]:
    if rec.get("status") != "ok":
        return None
    value = (rec.get("timing") or {}).get("audio_s_per_s")
    return float(value) if isinstance(value, (int, float)) and value == value and value > 0 else None


def _flops(rec: dict) -> dict:
    return rec.get("flops") or {}


def _number(value) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value else None


def _roofline(rec: dict) -> Optional[float]:
    """The record's shape roofline (:func:`common.flops.shape_roofline`) from its configuration and measured
    peaks; None without them, and for the smoke preset: at its widths every measured product is a call
    overhead of microseconds that the step's own loops do not pay (TensorFlow's smoke row trains at 2.2 x it)."""
    if not rec.get("config") or rec.get("preset") == "smoke":
        return None
    try:
        config = DS2Config(**rec["config"])
    except TypeError:                                     # a record whose configuration is not this spec's
        return None
    return shape_roofline(config, _flops(rec).get("peak_matmul"))


#: the units the tables give FLOP/s in, and their divisors
FLOP_UNITS = {"GFLOP/s": 1e9, "TFLOP/s": 1e12}


def flop_unit(values) -> tuple:
    """(divisor, unit) for FLOP/s values: TFLOP/s when the largest is at least 1e12, else GFLOP/s."""
    values = [v for v in values if v is not None]
    unit = "TFLOP/s" if values and max(values) >= FLOP_UNITS["TFLOP/s"] else "GFLOP/s"
    return FLOP_UNITS[unit], unit


def _ok(records: List[dict]) -> List[dict]:
    return [r for r in records if r["status"] == "ok" and r.get("timing")]


def _groups(records: List[dict]) -> "OrderedDict":
    groups = OrderedDict()
    for rec in sorted(records, key=lambda r: (str(_group_key(r)), r["target"], r.get("precision") or "")):
        groups.setdefault(_group_key(rec), []).append(rec)
    return groups


def trajectory(rec: dict) -> np.ndarray:
    losses = rec.get("losses") or {}
    return np.asarray(list(losses.get("warmup") or []) + list(losses.get("train") or []), dtype=np.float64)


def pytorch_twin(rec: dict, records: List[dict]) -> Optional[dict]:
    """The PyTorch record the agreement of ``rec`` is measured against: same benchmark, device and
    precision if there is one, else the same benchmark in fp32 on any device."""
    same = [r for r in _ok(records) if r["target"] == "pytorch" and _group_key(r)[:4] == _group_key(rec)[:4]]
    for wanted in (lambda r: _group_key(r) == _group_key(rec) and r.get("precision") == rec.get("precision"),
                   lambda r: r.get("precision") == "fp32"):
        hits = [r for r in same if wanted(r)]
        if hits:
            return hits[0]
    return None


# ---- Markdown helpers ------------------------------------------------------------------------
def _fmt(value, fmt="{:.4g}") -> str:
    if value is None:
        return "\u2013"
    if isinstance(value, float):
        if value != value:
            return "\u2013"
        return fmt.format(value)
    return str(value).replace("|", "\\|")


def md_table(rows: List[OrderedDict], formats: Optional[dict] = None) -> str:
    if not rows:
        return "_None._\n"
    formats = formats or {}
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row[c], formats.get(c, "{:.4g}")) for c in cols) + " |")
    return "\n".join(lines) + "\n"
