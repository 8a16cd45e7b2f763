"""results.md and its plots, generated from the result records only.

Sections: the table of record (one row per record, failed and skipped rows with their reason),
speed and efficiency per preset and device (achieved FLOP/s, share of the measured matmul peak,
speed relative to the group's fastest row, rows of record against their framework's fastest
variant) with the measured peaks per device, throughput bars, audio s/s against batch size,
step time per utterance length, where the time of a step goes (records with a ``profile``),
the cross-framework agreement table and loss trajectories ("they compute the same thing") with the
float64 control (a pytorch record of precision fp64: every fp32 trajectory against it; the control is a
row of no other table or plot), the migration matrix of ``run_all.py --migrate`` and the convention
differences measured on the exports (runner/migrate.py), the environments, and how the records were made.  A record without a ``flops`` or ``profile`` section
(older records) keeps its rows, with dashes.
"""
import os
import sys
from collections import OrderedDict
from typing import List, Optional

import numpy as np

from common import envinfo, results
from common.flops import sequential_share, shape_roofline
from common.onnx_check import HELD_OUT_BATCH_SIZE, HELD_OUT_SECONDS, ONNX_RTOL, REPEATS
from common.profile import CATEGORIES
from common.results import atomic_write_text
from common.spec import CONTROL_PRECISION, DS2Config, FULL_MODEL

from . import distributed
from .bootstrap import ROOT

K_STEPS = 10          # losses compared across frameworks: the first K training steps
PLOTS = OrderedDict([
    ("summary", "summary.png"),
    ("throughput", "throughput.png"),
    ("step_time", "step_time_by_length.png"),
    ("trajectories", "loss_trajectories.png"),
    ("flops", "achieved_flops.png"),
    ("batch_sweep", "audio_per_s_by_batch_size.png"),
])


# ---- selecting and naming records ---------------------------------------------------------
def _label(rec: dict) -> str:
    return "%s %s%s" % (rec["target"], rec.get("precision") or "", " (as installed)" if rec.get("as_is") else "")


def _group_key(rec: dict):
    """Records that ran the same benchmark on the same device compare directly."""
    return (rec.get("preset"), rec.get("batch_size"), rec.get("scale"), rec.get("seed"),
            (rec.get("device") or {}).get("name"))


def _group_title(key) -> str:
    preset, batch, scale, seed, device = key
    return "%s (batch %s, scale %s, seed %s) on %s" % (preset, batch, scale, seed, device)


def _bench_key(rec: dict):
    """The speed comparison's group: the same preset, data and device, any batch size and precision
    (a batch-size sweep stays in one group)."""
    return (rec.get("preset"), rec.get("scale"), rec.get("seed"), (rec.get("device") or {}).get("name"))


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


# ---- the summary: one group per device and preset --------------------------------------------------------
#: the order of the summary's groups after the GPU ones: the full model first, the smoke check last
PRESET_ORDER = ("deepmark", "quick", "cpu", "smoke")


def summary_key(rec: dict) -> tuple:
    """A summary group: the device and the preset (every batch size of them)."""
    return ((rec.get("device") or {}).get("type"), (rec.get("device") or {}).get("name"), rec.get("preset"))


def _summary_order(key) -> tuple:
    dtype, name, preset = key
    return (dtype != "cuda", PRESET_ORDER.index(preset) if preset in PRESET_ORDER else len(PRESET_ORDER),
            str(name), str(preset))


def summary_groups(records: List[dict]) -> "OrderedDict":
    """{(device type, device name, preset): [completed fp32 single-process rows of record]}: GPU groups first,
    then the full model's presets before the smoke check's."""
    groups = {}
    for rec in _ok(records):
        if is_variant(rec) or rec.get("precision") != "fp32" or (rec.get("distributed") or {}).get("world_size"):
            continue
        if _speed(rec) is not None:
            groups.setdefault(summary_key(rec), []).append(rec)
    return OrderedDict((k, groups[k]) for k in sorted(groups, key=_summary_order))


def summary_title(key, recs: List[dict]) -> str:
    dtype, name, preset = key
    day = max((((r.get("run") or {}).get("finished") or "")[:10] for r in recs), default="")
    as_is = " (as installed)" if recs and all(r.get("as_is") for r in recs) else ""
    return "%s on %s%s%s" % (preset, name or dtype or "an unknown device", as_is, ", %s" % day if day else "")


def summary_section(records: List[dict]) -> List[str]:
    """The page's first lines: per device and preset, each framework's audio s/s at each batch size, its rank in
    the group and its ratio to the group's fastest; and, when no record ran on a GPU, that sentence."""
    groups = summary_groups(records)
    no_gpu = not any((r.get("device") or {}).get("type") == "cuda" for r in records)
    gpu_line = ("No record here ran on a GPU: `python run_all.py` on a machine with an NVIDIA GPU makes them."
                if no_gpu else "")
    if not groups:
        return ["## Summary", "", "_No completed run yet._ " + gpu_line, ""]
    columns = []                                      # (group key, batch size)
    for key, recs in groups.items():
        columns += [(key, b) for b in sorted(set(r["batch_size"] for r in recs))]
    cell, ranked = {}, {}
    for key, recs in groups.items():
        top = max(_speed(r) for r in recs)
        for rank, rec in enumerate(sorted(recs, key=lambda r: -_speed(r)), 1):
            speed = _fmt(_speed(rec), "{:.0f}" if _speed(rec) >= 1000 else "{:.3g}")
            cell[(rec["target"], key, rec["batch_size"])] = "%s (%d, %.2f)" % (speed, rank, _speed(rec) / top)
            ranked.setdefault(key, []).append(rec["target"])
    for rec in records:                               # a row of the group that did not finish: its status
        key = summary_key(rec)
        if (key in groups and rec.get("status") != "ok" and not is_variant(rec) and rec.get("precision") == "fp32"
                and not (rec.get("distributed") or {}).get("world_size")):
            cell.setdefault((rec["target"], key, rec["batch_size"]), rec.get("status") or "failed")
            ranked[key].append(rec["target"])
    names = []
    for key in groups:                                # the first group's ranking, then what it lacks
        for name in ranked[key]:
            if name not in names:
                names.append(name)
    head = ["Row"] + ["#%d %s, batch %d" % (list(groups).index(k) + 1, k[2], b) for k, b in columns]
    lines = ["## Summary", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        lines.append("| %s | %s |" % (name, " | ".join(cell.get((name, k, b), "\u2013") for k, b in columns)))
    legend = "; ".join("#%d: %s" % (i, summary_title(k, groups[k])) for i, k in enumerate(groups, 1))
    lines += ["", "Seconds of audio trained per second (rank in its group, \u00f7 the group's fastest); rows of "
              "record at fp32, in the order of group #1; a row that did not finish says so (its reason: the table of "
              "record). %s. %s" % (legend, gpu_line), ""]
    return lines


#: the table of record's columns within a group: the device and preset are the group's; the version, audio
#: hours and parameter count are under Environments
RECORD_COLUMNS = [c[0] for c in results.TABLE_COLUMNS if c[0] not in ("Device", "Preset", "Version", "Audio h",
                                                                       "Params")]


def notebook_link(rec: dict, output: str) -> Optional[str]:
    """A Markdown link from ``output`` to the record's executed notebook, where that file exists."""
    path = (rec.get("run") or {}).get("executed_notebook")
    if not path:
        return None
    path = path if os.path.isabs(path) else os.path.join(ROOT, path)
    if not os.path.exists(path):
        return None
    return "[ipynb](%s)" % os.path.relpath(path, os.path.dirname(os.path.abspath(output)))


def record_tables(records: List[dict], output: str) -> List[str]:
    """The table of record, one table per device and preset (every batch size and precision of them), each
    under its heading: the summary's groups first, in its order, then groups with no completed row."""
    groups = OrderedDict()
    for rec in sorted(records, key=lambda r: _summary_order(summary_key(r))):
        groups.setdefault(summary_key(rec), []).append(rec)
    lines = []
    for key, recs in groups.items():
        df = results.records_frame(recs)
        df["notebook_link"] = [notebook_link(r, output) for r in recs]
        lines += ["### %s" % summary_title(key, recs), "", results.render_markdown(df, RECORD_COLUMNS)]
    return lines


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


def flop_unit(values) -> tuple:
    """(divisor, unit) for FLOP/s values: TFLOP/s when the largest is at least 1e12, else GFLOP/s."""
    values = [v for v in values if v is not None]
    return (1e12, "TFLOP/s") if values and max(values) >= 1e12 else (1e9, "GFLOP/s")


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


def agreement_rows(records: List[dict], controls: Optional[List[dict]] = None) -> List[OrderedDict]:
    """One row per completed record: its first-loss check, its first losses against PyTorch's and, when a
    float64 control of the benchmark exists (``controls``), its whole trajectory against the control's."""
    rows = []
    controls = _ok(controls or [])
    for rec in _ok(records):
        loss = (rec.get("checks") or {}).get("loss") or {}
        twin = pytorch_twin(rec, records)
        rel = None
        if twin is not None and twin is not rec:
            mine, theirs = trajectory(rec)[:K_STEPS], trajectory(twin)[:K_STEPS]
            n = min(len(mine), len(theirs))
            if n:
                rel = float(np.max(np.abs(mine[:n] - theirs[:n]) / np.abs(theirs[:n])))
        rows.append(OrderedDict([
            ("Row", _label(rec)), ("Device", (rec.get("device") or {}).get("name")), ("Preset", rec.get("preset")),
            ("Batch", rec.get("batch_size")), ("First loss", loss.get("framework")), ("NumPy reference", loss.get("reference")),
            ("Rel. diff", loss.get("rel_diff")), ("Check", "pass" if loss.get("ok") else "FAIL"),
            ("Max rel. diff of first %d step losses vs PyTorch" % K_STEPS,
             "(reference row)" if twin is rec else rel),
        ]))
        if controls:
            control = control_for(rec, controls)
            rows[-1][CONTROL_COLUMN] = control_deviation(rec, control) if control is not None else None
    return rows


def fastest_variant(rec: dict, records: List[dict]) -> Optional[dict]:
    """The fastest completed variant of the row of record ``rec``: same framework row, preset, data,
    device, batch size and precision."""
    same = [r for r in records if is_variant(r) and row_of_record(r) == rec["target"] and _speed(r) is not None
            and _bench_key(r) == _bench_key(rec) and r.get("batch_size") == rec.get("batch_size")
            and r.get("precision") == rec.get("precision")]
    return max(same, key=_speed) if same else None


def speed_rows(records: List[dict]) -> "OrderedDict":
    """Per preset-and-device group (:func:`_bench_key`), one row per record: audio s/s and its ratio to
    the group's fastest row, achieved FLOP/s and the share of the measured square-matmul peak, and for a
    row of record its audio s/s divided by its framework's fastest variant's.  Returns
    {group key: (unit, rows)}; completed rows first, fastest first."""
    out = OrderedDict()
    for key, recs in _bench_groups(records).items():
        top = max([_speed(r) for r in recs if _speed(r) is not None], default=None)
        divisor, unit = flop_unit([_number(_flops(r).get("achieved_per_s")) for r in recs])
        recs = sorted(recs, key=lambda r: (_speed(r) is None, -(_speed(r) or 0), r["target"]))
        rows = []
        for rec in recs:
            speed, f = _speed(rec), _flops(rec) if rec.get("status") == "ok" else {}
            achieved, eff = _number(f.get("achieved_per_s")), _number(f.get("efficiency"))
            roof = _roofline(rec) if f else None
            twin = None if is_variant(rec) or speed is None else fastest_variant(rec, records)
            status = rec.get("status") or "?"
            rows.append(OrderedDict([
                ("Row", rec["target"] + (" (as installed)" if rec.get("as_is") else "")),
                ("Framework", rec.get("framework")),
                ("Variant", (rec.get("variant") or rec["target"].partition("+")[2] or "?") if is_variant(rec)
                 else "(row of record)"),
                ("Precision", rec.get("precision")), ("Batch", rec.get("batch_size")),
                ("Audio s/s", speed),
                ("\u00f7 fastest of group", speed / top if speed is not None and top else None),
                ("Achieved " + unit, achieved / divisor if achieved is not None else None),
                ("% of matmul peak", 100.0 * eff if eff is not None else None),
                ("% of shape roofline", 100.0 * achieved / roof if achieved is not None and roof else None),
                ("Row of record \u00f7 fastest variant", speed / _speed(twin) if twin is not None else None),
                ("Status", status if status == "ok" else "%s: %s" % (status, rec.get("error") or "no reason given")),
            ]))
        out[key] = (unit, rows)
    return out


def peak_rows(records: List[dict]) -> "OrderedDict":
    """Per device: the measured matmul peak of each completed record that has one (square, the bd
    layers' input product, one recurrent step), and the CPU's theoretical peaks the records carry.
    Returns {device name: (unit, rows, theoretical)}, theoretical: {precision: dict}."""
    by_device = OrderedDict()
    for rec in sorted(_ok(records), key=lambda r: (str((r.get("device") or {}).get("name")), r["target"],
                                                   r.get("precision") or "", r.get("batch_size") or 0)):
        f = _flops(rec)
        if not f.get("peak_matmul") and not f.get("theoretical_peak"):
            continue
        by_device.setdefault((rec.get("device") or {}).get("name"), []).append(rec)
    out = OrderedDict()
    for device, recs in by_device.items():
        peaks = [_number(((_flops(r).get("peak_matmul") or {}).get(s) or {}).get("flops_per_s"))
                 for r in recs for s in ("square", "input", "recurrent")]
        divisor, unit = flop_unit(peaks)
        rows, theoretical = [], OrderedDict()
        for rec in recs:
            f = _flops(rec)
            if f.get("theoretical_peak"):
                theoretical.setdefault(rec.get("precision"), f["theoretical_peak"])
            peak = f.get("peak_matmul") or {}
            if not peak:
                continue
            row = OrderedDict([("Row", rec["target"]), ("Preset", rec.get("preset")),
                               ("Precision", rec.get("precision")), ("Batch", rec.get("batch_size"))])
            shapes = []
            for name in ("square", "input", "recurrent"):
                entry = peak.get(name) or {}
                value = _number(entry.get("flops_per_s"))
                row["%s %s" % (name.capitalize(), unit)] = value / divisor if value is not None else None
                if entry.get("shape"):
                    shapes.append("%s %s" % (name, "\u00d7".join(str(d) for d in entry["shape"])))
            roof = _roofline(rec)
            row["Shape roofline %s" % unit] = roof / divisor if roof is not None else None
            row["Shapes (m\u00d7k\u00d7n)"] = "; ".join(shapes) or None
            rows.append(row)
        out[device] = (unit, rows, theoretical)
    return out


def profile_rows(records: List[dict]) -> List[OrderedDict]:
    """One row per completed record with a ``profile`` section: the share of the profiled step's time
    in each category (percent), the profiled batch and step time, the tool."""
    recs = [r for r in _ok(records) if (r.get("profile") or {}).get("shares")]
    used = [c for c in CATEGORIES if c == "other" or any((r["profile"]["shares"].get(c) or 0) > 0 for r in recs)]
    rows = []
    for rec in recs:
        prof = rec["profile"]
        batch = prof.get("batch") or {}
        row = OrderedDict([("Row", _label(rec)), ("Device", (rec.get("device") or {}).get("name")),
                           ("Preset", rec.get("preset")), ("Batch", rec.get("batch_size")),
                           ("Profiled step", "%s s \u00d7 %s" % (batch.get("seconds"), batch.get("batch_size"))
                            if batch.get("seconds") else None),
                           ("Step s", _number(prof.get("step_s")))])
        for c in used:
            share = _number(prof["shares"].get(c))
            row["%s %%" % c] = 100.0 * share if share is not None else None
        row["Tool"] = prof.get("tool")
        other = prof.get("largest_other") or []
        row["Largest in other"] = ", ".join(str(n)[:40] for n, _ in other[:3]) or None
        rows.append(row)
    return rows


# ---- the ONNX exit route (issue #22) ----------------------------------------------------------------------
ONNX_NOTE = "\n".join([
    "- Every notebook's section 11b exports its trained inference-mode model (running statistics, no CTC, batch "
    "and time axes dynamic) with its framework's own exporter.",
    "- onnxruntime's CPU provider runs the file on a held-out batch (seed + 1, %d utterances of %d s: a shape the "
    "export never traced); its logits must match the framework's and the NumPy reference's within %s relative "
    "(`common/onnx_check.py`).",
    "- Nodes: every node, subgraphs included, and the three commonest op types. Inference audio s/s: the median of "
    "%d runs after one untimed run, onnxruntime and the framework in the same process.",
    "- Check a file again: `python -m common.onnx_check results/weights/<record>.onnx`."])


def onnx_rows(records: List[dict]) -> List[OrderedDict]:
    """One row per completed record that has an ``onnx`` section: exporter, opset, file, nodes, the two
    differences, inference throughput of onnxruntime and of the framework, or why the export failed."""
    rows = []
    for rec in _ok(records):
        if not rec.get("onnx"):
            continue
        o = rec["onnx"]
        tp = o.get("throughput") or {}
        ort_s = _number((tp.get("onnxruntime") or {}).get("audio_s_per_s"))
        fw_s = _number((tp.get("framework") or {}).get("audio_s_per_s"))
        nodes = o.get("nodes") or {}
        top = ", ".join("%s %d" % (k, v) for k, v in list(nodes.items())[:3])
        reason = o.get("reason")
        if o.get("status") == "ok" and o.get("workaround"):
            reason = "workaround: %s" % o["workaround"]
        rows.append(OrderedDict([
            ("Row", _label(rec)), ("Preset", rec.get("preset")), ("Batch", rec.get("batch_size")),
            ("Device", (rec.get("device") or {}).get("name")), ("ONNX", o.get("status") or "\u2013"),
            ("Exporter", ("%s %s" % (o.get("exporter") or "", o.get("exporter_version") or "")).strip() or None),
            ("Opset", o.get("opset")), ("MB", _number(o.get("bytes")) / 1e6 if _number(o.get("bytes")) else None),
            ("Nodes", "%s (%s)" % (o["nodes_total"], top) if o.get("nodes_total") else None),
            ("Max rel. diff vs framework", _number((o.get("vs_framework") or {}).get("max_rel"))),
            ("vs NumPy reference", _number((o.get("vs_reference") or {}).get("max_rel"))),
            ("onnxruntime audio s/s", ort_s), ("Framework audio s/s", fw_s),
            ("onnxruntime \u00f7 framework", ort_s / fw_s if ort_s and fw_s else None),
            ("Reason / workaround", results.one_line(reason, 200) if reason else None),
        ]))
    return rows


def experiment_onnx_lines(results_dir: str, output: str) -> List[str]:
    """A line per experiment directory (``<results>/experiments/*``) whose records have ONNX sections: a link and
    its headline figures (how many exports pass, the largest differences)."""
    base = os.path.join(results_dir, "experiments")
    lines = []
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        d = os.path.join(base, name, "records")
        recs = [r for r in (results.read_records(d) if os.path.isdir(d) else []) if r.get("onnx")]
        if not recs:
            continue
        ok = [r["onnx"] for r in recs if r["onnx"].get("status") == "ok"]
        worst = lambda k: max((_number((o.get(k) or {}).get("max_rel")) or 0.0) for o in ok) if ok else None  # noqa
        link = os.path.relpath(os.path.join(base, name), os.path.dirname(os.path.abspath(output)))
        lines.append("- [%s](%s): %d of %d exports pass (%s); the largest difference from the framework %s, from the "
                     "NumPy reference %s." % (link, link, len(ok), len(recs), ", ".join(sorted(set(
                         "%s %s" % (r.get("preset"), (r.get("device") or {}).get("name")) for r in recs))),
                         _fmt(worst("vs_framework"), "{:.1e}"), _fmt(worst("vs_reference"), "{:.1e}")))
    return lines


def onnx_section(records: List[dict], results_dir: str = "", output: str = "results.md") -> List[str]:
    rows = onnx_rows(records)
    older = len([r for r in _ok(records) if not r.get("onnx")])
    experiments = experiment_onnx_lines(results_dir, output) if results_dir else []
    if not rows and not older and not experiments:
        return []
    rtol = ("%.0e" % ONNX_RTOL).replace("e-0", "e-")
    out = ["## ONNX exit route", "", ONNX_NOTE % (HELD_OUT_BATCH_SIZE, HELD_OUT_SECONDS, rtol, REPEATS), ""]
    if rows:
        out.append(md_table(rows, {"MB": "{:.1f}", "Max rel. diff vs framework": "{:.1e}",
                                   "vs NumPy reference": "{:.1e}", "onnxruntime audio s/s": "{:.1f}",
                                   "Framework audio s/s": "{:.1f}", "onnxruntime \u00f7 framework": "{:.2f}"}))
    if older:
        out += ["%d older record%s no ONNX section (made before the export existed)." % (
            older, " has" if older == 1 else "s have"), ""]
    if experiments:
        out += ["Experiments with ONNX exports, apart from this table (another machine or preset):", ""] \
            + experiments + [""]
    return out


# ---- the float64 control (issue #12) --------------------------------------------------------------------
def is_control(rec: dict) -> bool:
    """A record of the float64 control (pytorch, precision fp64): a reference trajectory, never a row of the
    speed, efficiency, throughput, step-time, profile or agreement tables."""
    return rec.get("precision") == CONTROL_PRECISION


def control_for(rec: dict, controls: List[dict]) -> Optional[dict]:
    """The completed fp64 control of the same benchmark (preset, batch, scale, seed), on the same device if
    there is one."""
    same = [c for c in _ok(controls) if _group_key(c)[:4] == _group_key(rec)[:4]]
    same.sort(key=lambda c: _group_key(c)[4] != _group_key(rec)[4])
    return same[0] if same else None


def control_deviation(rec: dict, control: dict) -> Optional[float]:
    """Max over every step (warm-up and train) of |loss - fp64 loss| / |fp64 loss|."""
    mine, ref = trajectory(rec), trajectory(control)
    n = min(len(mine), len(ref))
    return float(np.max(np.abs(mine[:n] - ref[:n]) / np.abs(ref[:n]))) if n else None


CONTROL_COLUMN = "Max rel. dev. from fp64 (all steps)"


def control_section(records: List[dict], controls: List[dict]) -> str:
    """The float64 control's paragraph: its first-loss check, and PyTorch fp32's own deviation from it."""
    ok = _ok(controls)
    if not ok:
        return ""
    parts = []
    for c in ok:
        loss = (c.get("checks") or {}).get("loss") or {}
        torch32 = [r for r in _ok(records) if r["target"] == "pytorch" and r.get("precision") == "fp32"
                   and control_for(r, ok) is c]
        own = control_deviation(torch32[0], c) if torch32 else None
        parts.append("%s, batch %s, %s: first loss %s, relative difference from the NumPy reference %s; PyTorch "
                     "fp32's own deviation over its %d steps: %s" % (
                         c.get("preset"), c.get("batch_size"), (c.get("device") or {}).get("name"),
                         _fmt(loss.get("framework"), "{:.9f}"), _fmt(loss.get("rel_diff"), "{:.1e}"),
                         len(trajectory(c)), _fmt(own, "{:.1e}")))
    return ("**Float64 control.** The PyTorch notebook run in float64 (`run_all.py --frameworks pytorch --precision "
            "fp64`) is the trajectory rounding cannot explain away: column *%s* is each fp32 row's largest relative "
            "deviation from it (warm-up and timed steps), to be read against PyTorch fp32's own. The control is no "
            "row of any table or plot but this one (dashed in the loss plot).\n\n%s.\n" % (CONTROL_COLUMN,
                                                                                  "; ".join(parts)))


# ---- the migration matrix (run_all.py --migrate, issue #12) ----------------------------------------------
def _target_order(name: str) -> tuple:
    from .targets import ALL_TARGETS
    names = list(ALL_TARGETS)
    return (names.index(name) if name in names else len(names), name)


def migration_groups(migrations: List[dict]) -> "OrderedDict":
    """{(preset, precision, device name, batch size): [records]}, in a stable order."""
    groups = OrderedDict()
    for rec in sorted(migrations, key=lambda r: (str(r.get("preset")), str(r.get("precision")),
                                                 str((r.get("device") or {}).get("name")), r.get("batch_size") or 0)):
        key = (rec.get("preset"), rec.get("precision"), (rec.get("device") or {}).get("name"), rec.get("batch_size"))
        groups.setdefault(key, []).append(rec)
    return groups


def migration_matrix(recs: List[dict]) -> tuple:
    """(Markdown table, footnotes): rows = source, columns = destination; a completed cell is "logits max
    rel. diff / loss rel. diff" against the source's own inference logits, the diagonal (the round trip)
    in bold; a failed or skipped cell refers to its footnote."""
    sources = sorted(set(r["source"] for r in recs), key=_target_order)
    dests = sorted(set(r["destination"] for r in recs), key=_target_order)
    cells = {(r["source"], r["destination"]): r for r in recs}
    notes = []
    lines = ["| source \u2193 / destination \u2192 | " + " | ".join(dests) + " |",
             "|---|" + "|".join("---" for _ in dests) + "|"]
    for s in sources:
        row = []
        for d in dests:
            r = cells.get((s, d))
            if r is None:
                row.append("\u2013")
            elif r["status"] == "ok":
                text = "%.0e / %.0e" % ((r.get("logits") or {}).get("max_rel") or 0.0,
                                        (r.get("loss") or {}).get("rel_diff") or 0.0)
                row.append("**%s**" % text if s == d else text)
            else:
                notes.append("%s \u2192 %s: %s" % (s, d, r.get("error") or "no reason given"))
                row.append("%s [%d]" % (r["status"], len(notes)))
        lines.append("| %s | %s |" % (s, " | ".join(row)))
    return "\n".join(lines) + "\n", notes


def _load_export(rec: dict, records_dir: str) -> Optional[dict]:
    """The canonical state a record's run exported, or None (no export, or the file is gone)."""
    from common.weights import load_weights
    from .migrate import repo_path
    export = rec.get("export") or {}
    path = repo_path(export.get("path"))
    candidates = [path] if path else []
    if export.get("path"):
        candidates.append(os.path.join(os.path.dirname(records_dir), "weights", os.path.basename(export["path"])))
    for p in candidates:
        if p and os.path.exists(p):
            try:
                return load_weights(p)
            except (OSError, ValueError):
                return None
    return None


def _max_rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    d = float(np.max(np.abs(a - b))) if a.size else 0.0
    return d / scale if scale > 0 else d


def tensor_groups(names, config: dict) -> "OrderedDict":
    """Canonical names -> groups: parameters (all but the RNN biases), RNN biases, running means, running
    variances."""
    groups = OrderedDict([("parameters", []), ("rnn_biases", []), ("running_means", []), ("running_vars", [])])
    for n in names:
        if n.endswith(".mean"):
            groups["running_means"].append(n)
        elif n.endswith(".var"):
            groups["running_vars"].append(n)
        elif n.startswith("bd") and (n.endswith(".fwd.b") or n.endswith(".bwd.b")):
            groups["rnn_biases"].append(n)
        else:
            groups["parameters"].append(n)
    return groups


def convention_rows(records: List[dict], records_dir: str, controls: Optional[List[dict]] = None) -> List[OrderedDict]:
    """Per completed fp32 record with an export, against PyTorch's export after the same benchmark on the
    same device: the largest relative difference (max |a - b| / max |b| per tensor, the largest over the
    group) of the parameters, the RNN biases (and their least-squares scale against PyTorch's: 0.5 would
    mean one side trains two biases per direction, b_ih and b_hh both taking the full step, so their sum
    learns twice as fast -- PyTorch and MXNet freeze b_hh at 0 for that reason), the running means and the running variances (and the median ratio of the variances:
    a biased-variance framework stores less)."""
    from .migrate import BN_CONVENTIONS
    rows = []
    cache = {}

    def state(rec):
        key = id(rec)
        if key not in cache:
            cache[key] = _load_export(rec, records_dir)
        return cache[key]

    single = [r for r in _ok(records) if ((r.get("distributed") or {}).get("world_size") or 1) == 1]
    pairs = []
    for rec in single:
        if rec.get("precision") != "fp32" or not rec.get("export"):
            continue
        if rec["target"] == "pytorch":      # the scale of rounding alone: PyTorch fp32 against its float64 control
            control = control_for(rec, [c for c in (controls or []) if c.get("export")])
            if control is not None and _group_key(control) == _group_key(rec):
                pairs.insert(0, (rec, control, "pytorch fp32 vs its fp64 control (rounding alone)"))
            continue
        twins = [r for r in single if r["target"] == "pytorch" and r.get("precision") == "fp32"
                 and _group_key(r) == _group_key(rec) and r.get("export")]
        if twins:
            pairs.append((rec, twins[0], _label(rec)))
    for rec, twin, label in pairs:
        mine, theirs = state(rec), state(twin)
        if mine is None or theirs is None:
            continue
        groups = tensor_groups([n for n in theirs if n in mine], rec.get("config") or {})
        row = OrderedDict([("Row", label), ("Device", (rec.get("device") or {}).get("name")),
                           ("Preset", rec.get("preset"))])
        for group, title in (("parameters", "Parameters"), ("rnn_biases", "RNN biases"),
                             ("running_means", "Running means"), ("running_vars", "Running variances")):
            names = groups[group]
            row[title] = max((_max_rel(mine[n], theirs[n]) for n in names), default=None)
            if group == "rnn_biases" and names:
                a = np.concatenate([mine[n].ravel() for n in names]).astype(np.float64)
                b = np.concatenate([theirs[n].ravel() for n in names]).astype(np.float64)
                row["RNN bias scale vs PyTorch"] = float(a @ b / (b @ b)) if b @ b > 0 else None
            if group == "running_vars" and names:
                ratios = np.concatenate([(mine[n].astype(np.float64) / theirs[n].astype(np.float64)).ravel()
                                         for n in names])
                row["Variance ratio (median)"] = float(np.median(ratios))
        row["Two RNN biases"] = "yes (b_hh frozen at 0)" if ((rec.get("checks") or {}).get("params") or {}).get(
            "extra_rnn_biases") else "no"
        row["Running-variance convention"] = BN_CONVENTIONS.get(row_of_record(rec), "?")
        rows.append(row)
    return rows


def migration_section(results_dir: str, records: List[dict], records_dir: str,
                      controls: Optional[List[dict]] = None) -> List[str]:
    """results.md's migration part: one matrix per (preset, precision, device, batch), failed cells as
    numbered notes, then the convention differences measured on the ordinary runs' exports."""
    from .migrate import read_migration_records
    migrations = read_migration_records(results_dir)
    conventions = convention_rows(records, records_dir, controls)
    if not migrations and not conventions:
        return []
    lines = []
    for (preset, precision, device, batch), recs in migration_groups(migrations).items():
        table, notes = migration_matrix(recs)
        lines += ["## Migration matrix (%s, %s, %s)" % (preset, precision, device), "",
                  "- `run_all.py --migrate`: each source framework's exported canonical weights (after its timed "
                  "epoch, batch %s) loaded into each destination notebook (its cells through the correctness check, "
                  "then its export cell; no training).\n"
                  "- Cell: the largest relative difference of the destination's inference-mode logits of the check "
                  "batch from the source's own (max |a - b| / max |b|) / the relative difference of their CTC losses "
                  "(NumPy CTC). Bold: the round trip framework \u2192 canonical \u2192 the same framework.\n"
                  "- Every destination also passed its inference check against the NumPy reference of the file it "
                  "loaded; a dash: a pair not run (`--migrate-to`)." % batch, "", table]
        if notes:
            lines += ["\n".join("%d. %s" % (i, n) for i, n in enumerate(notes, 1)), ""]
    if conventions:
        lines += ["### Convention differences in the exports", "",
                  "Each framework's export after the same smoke epoch from the same canonical start, against "
                  "PyTorch's (computed from the files in `results/weights/`): the largest relative difference per "
                  "tensor group (max |a - b| / max |b| per tensor). Parameters differ by the training's rounding, "
                  "which this short epoch amplifies (the first row, when a float64 control ran, shows how far "
                  "PyTorch fp32 lands from its own float64 run: the scale of rounding alone); "
                  "the RNN biases compare like the parameters (scale \u2248 1: PyTorch and MXNet keep a second "
                  "bias `b_hh` per direction but freeze it at 0 -- trained, it takes `b_ih`'s step and the sum "
                  "learns twice as fast, scale 0.5); the running variances follow each "
                  "framework's convention (median ratio below 1: the biased batch variance; CNTK: its time "
                  "constant). The canonical format stores what the "
                  "framework keeps, as is.", "",
                  md_table(conventions, {"Parameters": "{:.1e}", "RNN biases": "{:.1e}", "Running means": "{:.1e}",
                                         "Running variances": "{:.1e}", "RNN bias scale vs PyTorch": "{:.3f}",
                                         "Variance ratio (median)": "{:.5f}"})]
    return lines


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


def step_time_rows(records: List[dict]) -> List[OrderedDict]:
    rows = []
    for rec in _ok(records):
        per = rec["timing"].get("per_length") or {}
        row = OrderedDict([("Row", _label(rec)), ("Device", (rec.get("device") or {}).get("name")),
                           ("Preset", rec.get("preset")), ("Batch", rec.get("batch_size"))])
        for s in range(1, 16):
            row["%d s" % s] = (per.get(str(s)) or {}).get("median_ms")
        rows.append(row)
    return rows


def environment_rows(records: List[dict]) -> List[OrderedDict]:
    rows = []
    for rec in records:
        env = rec.get("environment") or {}
        versions = rec.get("versions") or {}
        gpus = env.get("gpus") or []
        extra = ", ".join("%s %s" % (k, v) for k, v in sorted(versions.items())
                          if k not in ("framework", "python", "numpy") and v is not None)
        rows.append(OrderedDict([
            ("Row", _label(rec)), ("Preset", rec.get("preset")), ("Batch", rec.get("batch_size")),
            ("Status", rec["status"]), ("Framework version", versions.get("framework")), ("Python", versions.get("python") or env.get("python")),
            ("NumPy", versions.get("numpy")), ("Other versions", extra or None),
            ("GPU", ", ".join(g.get("name", "?") for g in gpus) or None),
            ("Driver", gpus[0].get("driver") if gpus else None), ("CUDA (driver)", env.get("cuda_driver")),
            ("CPU", env.get("cpu")), ("OS", env.get("os")),
            ("Audio h", _number((rec.get("data") or {}).get("audio_hours"))),
            ("Params", ((rec.get("checks") or {}).get("params") or {}).get("count")),
        ]))
    return rows


def _made_on(rec: dict) -> Optional[str]:
    """The machine a record was made on: its GPU's name, else its CPU's."""
    env = rec.get("environment") or {}
    gpus = env.get("gpus") or []
    return gpus[0].get("name") if gpus else env.get("cpu") or (rec.get("device") or {}).get("name")


def provenance_rows(records: List[dict]) -> List[OrderedDict]:
    """One row per command and machine that made records: the commits, when, and which rows."""
    seen = OrderedDict()
    for rec in sorted(records, key=lambda r: (r.get("run") or {}).get("started") or ""):
        run = rec.get("run") or {}
        key = (run.get("command"), _made_on(rec))
        entry = seen.setdefault(key, {"rows": [], "commits": [], "first": run.get("started"),
                                      "last": run.get("finished")})
        entry["rows"].append(_label(rec) + (" bs%s" % rec.get("batch_size") if rec.get("batch_size") else ""))
        if run.get("git_commit") and run["git_commit"][:12] not in entry["commits"]:
            entry["commits"].append(run["git_commit"][:12])
        entry["first"] = min(filter(None, [entry["first"], run.get("started")]), default=None)
        entry["last"] = max(filter(None, [entry["last"], run.get("finished")]), default=None)
    return [OrderedDict([("Command", "`%s`" % cmd if cmd else None), ("Machine", machine),
                         ("Commits", ", ".join(e["commits"]) or None), ("Started", e["first"]),
                         ("Finished", e["last"]), ("Records", len(e["rows"])), ("Rows", ", ".join(e["rows"]))])
            for (cmd, machine), e in seen.items()]


# ---- plots ---------------------------------------------------------------------------------
def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: str) -> None:
    """Save a figure atomically (a temporary PNG renamed into place) and close it."""
    tmp = path[:-len(".png")] + ".partial.png"
    try:
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, path)
    finally:
        _plt().close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)


def plot_summary(records: List[dict], path: str) -> bool:
    """The summary's comparison: audio s/s of each row of record and batch size, one panel per device and preset."""
    groups = summary_groups(records)
    if not groups:
        return False
    plt = _plt()
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 0.9 + sum(0.32 * len(g) + 0.7 for g in groups.values())),
                             squeeze=False, gridspec_kw={"height_ratios": [len(g) + 1 for g in groups.values()]})
    for i, (ax, (key, recs)) in enumerate(zip(axes[:, 0], groups.items()), 1):
        recs = sorted(recs, key=_speed)
        top = _speed(recs[-1])
        ax.barh(["%s, batch %d" % (r["target"], r["batch_size"]) for r in recs], [_speed(r) for r in recs],
                color="#4477aa")
        for j, r in enumerate(recs):
            ax.text(_speed(r), j, " %s (%.2f)" % ("%.0f" % _speed(r) if _speed(r) >= 1000 else "%.3g" % _speed(r), _speed(r) / top), va="center", fontsize=8)
        ax.set_xlim(0, top * 1.25)
        ax.set_xlabel("seconds of audio trained per second (\u00f7 the fastest)", fontsize=8)
        ax.set_title("#%d: %s" % (i, summary_title(key, recs)), fontsize=9)
        ax.tick_params(labelsize=8)
    fig.tight_layout()
    _save(fig, path)
    return True


def plot_throughput(records: List[dict], path: str) -> bool:
    groups = _groups(_ok(records))
    if not groups:
        return False
    plt = _plt()
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 1.2 + 0.45 * max(len(g) for g in groups.values())
                                                          * len(groups) + 0.6 * len(groups)), squeeze=False)
    for ax, (key, recs) in zip(axes[:, 0], groups.items()):
        recs = sorted(recs, key=lambda r: r["timing"]["audio_s_per_s"])
        ax.barh([_label(r) for r in recs], [r["timing"]["audio_s_per_s"] for r in recs], color="#4477aa")
        for i, r in enumerate(recs):
            ax.text(r["timing"]["audio_s_per_s"], i, " %.0f" % r["timing"]["audio_s_per_s"], va="center", fontsize=8)
        ax.set_xlabel("seconds of audio trained per second")
        ax.set_title(_group_title(key), fontsize=9)
    fig.tight_layout()
    _save(fig, path)
    return True


def plot_step_time(records: List[dict], path: str) -> bool:
    groups = _groups(_ok(records))
    if not groups:
        return False
    plt = _plt()
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 4 * len(groups)), squeeze=False)
    for ax, (key, recs) in zip(axes[:, 0], groups.items()):
        for r in recs:
            per = r["timing"].get("per_length") or {}
            xs = sorted(int(s) for s in per)
            ax.plot(xs, [per[str(s)]["median_ms"] for s in xs], marker="o", markersize=3, label=_label(r))
        ax.set_xlabel("utterance length (s)")
        ax.set_ylabel("median ms per training step")
        ax.set_yscale("log")
        ax.set_title(_group_title(key), fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path)
    return True


def _flop_label(rec: dict, with_batch: bool) -> str:
    return _label(rec) + (" bs%s" % rec.get("batch_size") if with_batch else "")


def plot_flops(records: List[dict], path: str) -> bool:
    """Per preset-and-device group: achieved training FLOP/s of every completed row (bars), each row's
    measured square-matmul peak (a red mark on its bar) and the CPU's theoretical peak (dashed)."""
    groups = OrderedDict((k, [r for r in v if _number(_flops(r).get("achieved_per_s"))])
                         for k, v in _bench_groups(_ok(records)).items())
    groups = OrderedDict((k, v) for k, v in groups.items() if v)
    if not groups:
        return False
    plt = _plt()
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 1.4 + 0.45 * sum(len(g) for g in groups.values())
                                                          + 0.9 * len(groups)), squeeze=False)
    for ax, (key, recs) in zip(axes[:, 0], groups.items()):
        recs = sorted(recs, key=lambda r: _flops(r)["achieved_per_s"])
        peaks = [_number(_flops(r).get("peak_matmul_per_s")) for r in recs]
        divisor, unit = flop_unit([_flops(r)["achieved_per_s"] for r in recs] + peaks)
        with_batch = len(set(r.get("batch_size") for r in recs)) > 1
        ax.barh([_flop_label(r, with_batch) for r in recs], [_flops(r)["achieved_per_s"] / divisor for r in recs],
                color="#4477aa", label="achieved (training FLOPs of the timed pass / train s)")
        marked = False
        for i, (r, peak) in enumerate(zip(recs, peaks)):
            eff = _number(_flops(r).get("efficiency"))
            ax.text(_flops(r)["achieved_per_s"] / divisor, i, " %.3g%s" % (_flops(r)["achieved_per_s"] / divisor,
                    "" if eff is None else " (%.1f%% of peak)" % (100 * eff)), va="center", fontsize=8)
            if peak is not None:
                ax.plot([peak / divisor] * 2, [i - 0.4, i + 0.4], color="#cc3311", linewidth=2,
                        label=None if marked else "measured square-matmul peak (same framework and precision)")
                marked = True
        theoretical = OrderedDict()
        for r in recs:
            t = _flops(r).get("theoretical_peak") or {}
            if _number(t.get("flops_per_s")):
                theoretical.setdefault(r.get("precision"), t["flops_per_s"])
        for prec, value in theoretical.items():
            if value / divisor <= 50 * max(_flops(r)["achieved_per_s"] / divisor for r in recs):
                ax.axvline(value / divisor, color="#777777", linestyle="--", linewidth=1,
                           label="theoretical CPU peak, %s (not measured)" % prec)
        ax.set_xlabel("training %s" % unit)
        ax.set_title(_bench_title(key), fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    _save(fig, path)
    return True


def sweep_groups(records: List[dict]) -> "OrderedDict":
    """Groups (preset, data, device) whose completed records ran more than one batch size:
    {group key: {(target, precision): [(batch size, audio s/s), ...] sorted by batch size}}."""
    out = OrderedDict()
    for key, recs in _bench_groups([r for r in records if _speed(r) is not None]).items():
        if len(set(r.get("batch_size") for r in recs)) < 2:
            continue
        series = OrderedDict()
        for r in recs:
            series.setdefault((r["target"], r.get("precision")), []).append((r.get("batch_size"), _speed(r)))
        out[key] = OrderedDict((k, sorted(v, key=lambda p: p[0] or 0)) for k, v in series.items())
    return out


def plot_batch_sweep(records: List[dict], path: str) -> bool:
    """Audio s/s against batch size, one line per row (target and precision), per group with several batch sizes."""
    groups = sweep_groups(records)
    if not groups:
        return False
    plt = _plt()
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 4 * len(groups)), squeeze=False)
    for ax, (key, series) in zip(axes[:, 0], groups.items()):
        sizes = sorted(set(b for points in series.values() for b, _ in points))
        for (target, precision), points in series.items():
            ax.plot([b for b, _ in points], [v for _, v in points], marker="o", markersize=4,
                    label="%s %s" % (target, precision or ""))
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([str(b) for b in sizes])
        ax.set_xlabel("batch size")
        ax.set_ylabel("seconds of audio trained per second")
        ax.set_title(_bench_title(key), fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path)
    return True


def plot_trajectories(records: List[dict], path: str, k: int = 40, controls: Optional[List[dict]] = None) -> bool:
    """Left: the first ``k`` losses of every row, and the float64 control's (dashed, black); right: their
    relative difference from PyTorch's."""
    groups = OrderedDict()
    for r in _ok(records):
        groups.setdefault(_group_key(r)[:4], []).append(r)
    if not groups:
        return False
    plt = _plt()
    fig, axes = plt.subplots(len(groups), 2, figsize=(13, 4 * len(groups)), squeeze=False)
    for (ax, ax_diff), (key, recs) in zip(axes, groups.items()):
        steps = 0
        for r in recs:
            y = trajectory(r)[:k]
            steps = max(steps, len(y))
            label = "%s (%s)" % (_label(r), (r.get("device") or {}).get("type"))
            ax.plot(np.arange(1, len(y) + 1), y, marker=".", linewidth=1, label=label)
            twin = pytorch_twin(r, records)
            if twin is not None and twin is not r:
                ref = trajectory(twin)[:len(y)]
                n = min(len(y), len(ref))
                ax_diff.semilogy(np.arange(1, n + 1), np.abs(y[:n] - ref[:n]) / np.abs(ref[:n]) + 1e-12,
                                 marker=".", linewidth=1, label=label)
        for c in _ok(controls or []):
            if _group_key(c)[:4] == key:
                y = trajectory(c)[:k]
                ax.plot(np.arange(1, len(y) + 1), y, linestyle="--", color="black", linewidth=1,
                        label="%s (float64 control)" % _label(c))
                torch32 = [r for r in recs if r["target"] == "pytorch" and r.get("precision") == "fp32"]
                if torch32:    # the rounding floor: PyTorch fp32 against its float64 self
                    mine = trajectory(torch32[0])[:len(y)]
                    n = min(len(mine), len(y))
                    ax_diff.semilogy(np.arange(1, n + 1), np.abs(mine[:n] - y[:n]) / np.abs(y[:n]) + 1e-12,
                                     linestyle="--", color="black", linewidth=1,
                                     label="pytorch fp32 vs the float64 control (rounding)")
                break
        ax.set_xlabel("training step (warm-up steps first)")
        ax.set_ylabel("CTC loss per utterance")
        ax.set_title("first %d steps: %s (batch %s, scale %s, seed %s)" % ((steps,) + key), fontsize=9)
        ax.legend(fontsize=7)
        ax_diff.set_xlabel("training step")
        ax_diff.set_ylabel("relative difference from PyTorch")
        ax_diff.set_title("the same losses, relative to PyTorch's", fontsize=9)
        if ax_diff.lines:
            ax_diff.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path)
    return True


# ---- the page ----------------------------------------------------------------------------
def _records_dir(results_dir: str) -> str:
    d = os.path.join(results_dir, "records")
    return d if os.path.isdir(d) else results_dir


def render(results_dir: str, command: str, commit: Optional[str], output: str) -> str:
    """results.md's text; writes the plots next to the records (``<results_dir>/plots``)."""
    records_dir = _records_dir(results_dir)
    all_records = results.read_records(records_dir) if os.path.isdir(records_dir) else []
    controls = [r for r in all_records if is_control(r)]        # the float64 control: no row anywhere
    records = [r for r in all_records if not is_control(r)]
    plots_dir = os.path.join(results_dir, "plots")
    os.makedirs(plots_dir, exist_ok=True)
    made = {}
    for name, fn in (("summary", plot_summary), ("throughput", plot_throughput), ("step_time", plot_step_time),
                     ("trajectories", lambda recs, p: plot_trajectories(recs, p, controls=controls)),
                     ("flops", plot_flops), ("batch_sweep", plot_batch_sweep)):
        path = os.path.join(plots_dir, PLOTS[name])
        made[name] = fn(records, path)
        if not made[name] and os.path.exists(path):
            os.remove(path)
    rel = lambda p: os.path.relpath(p, os.path.dirname(os.path.abspath(output)))  # noqa: E731

    def image(name, alt):
        return "![%s](%s)\n" % (alt, rel(os.path.join(plots_dir, PLOTS[name]))) if made[name] else ""

    provenance = provenance_rows(all_records)
    lines = [
        "# DS2 Rosetta results",
        "",
        "Generated by `%s` (commit `%s`) on %s from %d result record(s) in `%s`, which %d command(s) made on %d "
        "machine(s) (the last section lists them); never edited by hand." % (
            command, commit or "unknown", results.utc_now()[:10], len(all_records), rel(records_dir),
            len(provenance), len(set(p["Machine"] for p in provenance))),
        "",
    ] + summary_section(records) + [
        image("summary", "seconds of audio per second per framework and batch size, one panel per device and preset"),
        "Compare rows of the same device and preset only. A framework that could not run keeps its row with the "
        "reason. CPU `smoke` rows check correctness and the pipeline; they say nothing about GPU speed.",
        "",
        "## Table of record",
        "",
    ] + (record_tables(records, output) if records else ["_No result records._\n"]) + [
        "Audio s/s: seconds of audio trained per second of wall time over the timed pass (the headline). "
        "Fwd ms: forward-only milliseconds for a batch of 1 s and of 15 s utterances. Peak mem: device memory "
        "on a GPU, the process's peak resident memory on a CPU. First-loss check: relative difference from the "
        "NumPy reference." + (" A row marked *(as installed)* ran in an interpreter whose frameworks were already "
                              "installed (`run_all.py --use-installed`): its versions, under Environments, are not "
                              "the pins'." if any(r.get("as_is") for r in all_records) else ""),
        "",
        "## Speed and efficiency",
        "",
        speed_section(records),
        image("flops", "achieved training FLOP/s per row, with the measured matmul peak"),
        "## Measured matrix-product peak",
        "",
        peak_section(records),
        "## Throughput",
        "",
        image("throughput", "seconds of audio per second, per framework and precision") or "_No completed runs._\n",
        "## Batch size",
        "",
        "Seconds of audio per second against the batch size, where one preset ran on one device with several "
        "batch sizes (`run_all.py --batch-size 8,32`).",
        "",
        image("batch_sweep", "audio seconds per second against batch size")
        or "_No preset ran on one device with more than one batch size._\n",
        "## Step time per utterance length",
        "",
        "Median milliseconds per training step, by utterance length (seconds).",
        "",
        md_table(step_time_rows(records), {"%d s" % s: "{:.1f}" for s in range(1, 16)}),
        image("step_time", "ms per step against utterance length"),
        "## Where the time goes",
        "",
        "One training step on a batch of 8-second utterances under the framework's own profiler "
        "(`run_all.py --profile`): the share of the profiled operations' own time in each category, as each "
        "notebook classifies its framework's operation names (`common/profile.py`). Profiling slows a step "
        "down; the shares, not the seconds, are the result.",
        "",
        md_table(profile_rows(records), dict({"Step s": "{:.3f}"}, **{"%s %%" % c: "{:.1f}" for c in CATEGORIES}))
        if profile_rows(records) else "_No record has a profile section._\n",
        "## Do they compute the same thing?",
        "",
        "The first batch's loss from the canonical weights against the NumPy reference, and the largest "
        "relative difference of the first %d training losses (warm-up steps first) from PyTorch's on the same "
        "benchmark." % K_STEPS,
        "",
        md_table(agreement_rows(records, controls),
                 {"First loss": "{:.6f}", "NumPy reference": "{:.6f}", "Rel. diff": "{:.1e}",
                  "Max rel. diff of first %d step losses vs PyTorch" % K_STEPS: "{:.1e}", CONTROL_COLUMN: "{:.1e}"}),
        control_section(records, controls),
        image("trajectories", "loss trajectories of all frameworks"),
    ] + migration_section(results_dir, records, records_dir, controls) + onnx_section(records, results_dir, output) \
        + distributed.report_section(records, md_table) + [
        "## Environments",
        "",
        md_table(environment_rows(all_records)),
        "## How these records were made",
        "",
        md_table(provenance),
    ]
    return "\n".join(lines)


def speed_section(records: List[dict]) -> str:
    """The speed-and-efficiency tables, one per preset-and-device group, with their explanation."""
    groups = speed_rows(records)
    if not groups:
        return "_No result records._\n"
    parts = []
    for key, (unit, rows) in groups.items():
        per_audio = sorted(set(_number(_flops(r).get("train_per_audio_second")) for r in records
                               if _bench_key(r) == key and _number(_flops(r).get("train_per_audio_second"))))
        parts.append("### %s\n\n" % _bench_title(key))
        if per_audio:
            parts.append("Training FLOPs per second of audio (from the model's configuration, in the records): %s "
                         "GFLOP.\n\n" % ", ".join("%.4g" % (v / 1e9) for v in per_audio))
        ratio = "\u00f7 fastest of group"
        parts.append(md_table(rows, {"Audio s/s": "{:.1f}", ratio: "{:.2f}", "Achieved " + unit: "{:.3g}",
                                     "% of matmul peak": "{:.1f}", "% of shape roofline": "{:.1f}",
                                     "Row of record \u00f7 fastest variant": "{:.2f}"}))
        parts.append("\n")
    parts.append("\n".join([
        "- Variant: `(row of record)` is the framework's highest-level API; a variant (target `<row>+<variant>`, "
        "`run_all.py --variants`) changes what its description says and passes the same checks.",
        "- \u00f7 fastest of group: audio s/s over the group's fastest row (any batch size and precision).",
        "- Achieved: the timed pass's training FLOPs (counted from the model's configuration, forward and backward) "
        "over its train seconds.",
        "- % of matmul peak: achieved over the same notebook's measured square matrix-product rate at the same "
        "precision. % of shape roofline: achieved over the rate the step would reach if each product ran at the "
        "rate measured for its shape (the peaks below).",
        "- Row of record \u00f7 fastest variant: below 1, a variant is faster. A dash: not measured or not "
        "applicable. How the FLOPs are counted: docs/benchmark.md.", ""]))
    return "".join(parts)


def peak_section(records: List[dict]) -> str:
    """Per device: the measured peaks of every record that has them, then the CPU's theoretical peak."""
    devices = peak_rows(records)
    if not devices:
        return "_No record has a measured matmul peak._\n"
    parts = ["\n".join([
        "- Each notebook measures dense matrix products with its own framework on its own device at the run's "
        "precision (the median of several synchronised measurements after a warm-up): a square product, the bd "
        "layers' input product for 8-second utterances, and one step of the recurrence.",
        "- Shape roofline: the FLOP/s of a step whose products each ran at its shape's measured rate -- the "
        "recurrent product forward and its gradient with respect to the previous hidden state (%.0f %% of the "
        "full model's training FLOPs) at the recurrent rate (`common.flops.shape_roofline`): a ceiling, not an "
        "estimate." % (100 * sequential_share(FULL_MODEL)),
        "- None for `smoke` rows: at their widths each measured product is a call overhead of microseconds.",
        "", ""])]
    for device, (unit, rows, theoretical) in devices.items():
        parts.append("### %s\n\n" % (device or "unknown device"))
        parts.append(md_table(rows, {c: "{:.3g}" for c in (rows[0] if rows else {}) if c.endswith("FLOP/s")})
                     if rows else "_No measured peak on this device._\n")
        for precision, t in theoretical.items():
            value = _number(t.get("flops_per_s"))
            if value is None:
                continue
            d, u = flop_unit([value])
            parts.append("\nTheoretical peak of this CPU, %s (%s, not measured): %.3g %s = %s. Assumed: %s.\n"
                         % (precision, t.get("label") or "theoretical", value / d, u, t.get("basis") or "?",
                            t.get("assumptions") or "?"))
        parts.append("\n")
    return "".join(parts)


def _machine() -> str:
    gpus = envinfo.gpus()
    return ", ".join(g.get("name", "?") for g in gpus) if gpus else "CPU only (%s)" % envinfo.cpu_model()


def write(results_dir: str, output: str, command: str, commit: Optional[str]) -> str:
    atomic_write_text(output, render(results_dir, command, commit, output))
    return output


def main(argv=None) -> int:
    """``python -m runner.report [--results-dir DIR] [--output FILE]``: results.md again from the records."""
    import argparse
    from .execute import git_commit
    p = argparse.ArgumentParser(prog="python -m runner.report", description=main.__doc__)
    p.add_argument("--results-dir", default=os.path.join(ROOT, "results"))
    p.add_argument("--output", default=None, help="default: results.md, or <results-dir>/results.md")
    args = p.parse_args(argv)
    results_dir = os.path.abspath(args.results_dir)
    output = args.output or (os.path.join(ROOT, "results.md") if results_dir == os.path.join(ROOT, "results")
                             else os.path.join(results_dir, "results.md"))
    write(results_dir, output, "python -m runner.report", git_commit())
    print("Wrote %s" % output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
