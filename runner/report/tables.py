"""results.md's speed tables: the summary, the table of record, speed and efficiency, the measured matmul
peaks, the profile shares and the step time per utterance length."""
import os
import subprocess
from collections import OrderedDict
from typing import List, Optional

from common import results
from common.flops import sequential_share
from common.profile import CATEGORIES
from common.spec import FULL_MODEL, PRESETS, UTTERANCE_SECONDS

from runner.base import ROOT
from runner.report.latency import latency_share
from runner.report.records import (preset_label, _bench_groups, _bench_key, _bench_title, _flops, _fmt, _label,
                                   _number, _ok, _roofline, _speed, dp_label, flop_unit, is_variant, md_table,
                                   row_name, row_of_record, short_device, is_gpu, stopped_early, compiled_fast,
                                   FAST_COMPILE_NOTE, FLOP_UNITS)


# ---- the summary: one group per device and preset --------------------------------------------------------
#: the order of the summary's groups after the GPU ones: the full model first, the smoke check last
PRESET_ORDER = ("deepmark", "quick", "cpu", "smoke")


def summary_key(rec: dict) -> tuple:
    """A summary group: the device and the preset (every batch size of them; :func:`preset_label`: a record of
    other utterance lengths than the preset's is a group of its own)."""
    return ((rec.get("device") or {}).get("type"), (rec.get("device") or {}).get("name"), preset_label(rec))


def _summary_order(key) -> tuple:
    dtype, name, preset = key
    return (dtype != "cuda", PRESET_ORDER.index(preset) if preset in PRESET_ORDER else len(PRESET_ORDER),
            str(name), str(preset))


def _summary_row(rec: dict) -> bool:
    """A record the summary shows: a row of record at fp32, one process."""
    return not is_variant(rec) and rec.get("precision") == "fp32" and not (rec.get("distributed") or {}).get("world_size")


def summary_groups(records: List[dict]) -> "OrderedDict":
    """{(device type, device name, preset): [completed fp32 single-process rows of record]}: GPU groups first,
    then the full model's presets before the smoke check's."""
    groups = {}
    for rec in _ok(records):
        if not _summary_row(rec):
            continue
        if _speed(rec) is not None:
            groups.setdefault(summary_key(rec), []).append(rec)
    return OrderedDict((k, groups[k]) for k in sorted(groups, key=_summary_order))


def summary_title(key, recs: List[dict]) -> str:
    dtype, name, preset = key
    day = max((((r.get("run") or {}).get("finished") or "")[:10] for r in recs), default="")
    as_is = " (as installed)" if recs and all(r.get("as_is") for r in recs) else ""
    return "%s on %s%s%s" % (preset, name or dtype or "an unknown device", as_is, ", %s" % day if day else "")


def device_short_names(keys) -> "OrderedDict":
    """{device name: its name in a column header} for the summary's groups: :func:`short_device`, or the full name
    where two devices would get the same short one."""
    full = list(OrderedDict.fromkeys(name or dtype or "an unknown device" for dtype, name, _ in keys))
    short = OrderedDict((n, short_device(n)) for n in full)
    clash = {s for s in short.values() if list(short.values()).count(s) > 1}
    return OrderedDict((n, n if s in clash else s) for n, s in short.items())


def summary_column(key, batch: int, short: dict) -> str:
    """A summary column's header: device, preset and batch size ("H200 \u00b7 quick \u00b7 bs 32")."""
    dtype, name, preset = key
    return "%s \u00b7 %s \u00b7 bs %d" % (short[name or dtype or "an unknown device"], preset, batch)


#: the summary's cell of a row that a signal or a time limit stopped
NOT_FINISHED = "not finished (interrupted)"


def _summary_legend(groups: "OrderedDict", short: dict) -> str:
    """What the column headers' device names and presets stand for, and when the rows ran."""
    devices, presets = OrderedDict(), OrderedDict()
    for (dtype, name, preset), recs in groups.items():
        devices.setdefault(name or dtype or "an unknown device", []).extend(recs)
        presets.setdefault(preset, recs[0])
    parts = []
    for full, recs in devices.items():
        days = sorted(set(((r.get("run") or {}).get("finished") or "")[:10] for r in recs) - {""})
        when = " to ".join([days[0], days[-1]] if len(days) > 1 else days)
        as_is = [bool(r.get("as_is")) for r in recs]
        installed = ("its frameworks as installed, `--use-installed`" if all(as_is)
                     else "some rows with frameworks as installed, `--use-installed`" if any(as_is) else "")
        extra = "; ".join(x for x in (when, installed) if x)
        parts.append("%s%s%s" % (short[full] + " = " if short[full] != full else "", full,
                                 " (%s)" % extra if extra else ""))
    described = [_preset_legend(p, rec) for p, rec in presets.items()]
    fast = ["%s on %s, %s" % (" and ".join(sorted(set(r["target"] for r in recs if compiled_fast(r)))),
                              short.get(name, name), preset)
            for (dtype, name, preset), recs in groups.items() if any(compiled_fast(r) for r in recs)]
    return ("Devices: %s. Presets: %s. Why a row did not finish: its status in the table of record.%s"
            % ("; ".join(parts), "; ".join(described) or ", ".join(str(p) for p in presets),
               " %s: %s (the tables name them *(LLVM -O0)*)." % (FAST_COMPILE_NOTE, "; ".join(fast)) if fast else ""))


def _preset_legend(label: str, rec: dict) -> str:
    """``label = what it is``: the preset's purpose, or for a record of other lengths than the preset keeps
    (:func:`preset_label`), what its data held."""
    preset = rec.get("preset")
    if label == preset and preset in PRESETS:
        return "%s = %s" % (label, PRESETS[preset].purpose)
    data = rec.get("data") or {}
    return "%s = the %s preset's model on %s lengths: %s utterances, %s s of audio" % (
        label, preset, len(data.get("lengths") or UTTERANCE_SECONDS), data.get("utterances", "?"),
        data.get("audio_seconds", "?"))


def summary_section(records: List[dict]) -> List[str]:
    """The page's first lines, readable on their own (README.md copies them): per device and preset, each row of
    record's audio s/s at each batch size, its rank in the group and its ratio to the group's fastest -- where at
    least two frameworks finished there -- under column headers that name the device, the preset and the batch
    size; then what the device names and presets stand for; and, when no record ran on a GPU, that sentence."""
    groups = summary_groups(records)
    no_gpu = not any(is_gpu(r) for r in records)
    gpu_line = ("No record here ran on a GPU: `python run_all.py` on a machine with an NVIDIA GPU makes them."
                if no_gpu else "")
    if not groups:
        return ["## Summary", "", "_No completed run yet._ " + gpu_line, ""]
    columns = []                                      # (group key, batch size)
    for key, recs in groups.items():
        columns += [(key, b) for b in sorted(set(r["batch_size"] for r in recs))]
    unfinished = {}                                   # group -> the rows of record that did not finish there
    for rec in records:
        key = summary_key(rec)
        if key in groups and rec.get("status") != "ok" and _summary_row(rec):
            unfinished.setdefault(key, []).append(rec)
    cell, ranked = {}, {}
    for key, recs in groups.items():
        top = max(_speed(r) for r in recs)
        alone = len(set(r["target"] for r in recs)) < 2
        others = set(r["target"] for r in unfinished.get(key, [])) - set(r["target"] for r in recs)
        for rank, rec in enumerate(sorted(recs, key=lambda r: -_speed(r)), 1):
            speed = _fmt(_speed(rec), "{:.0f}" if _speed(rec) >= 1000 else "{:.3g}")
            cell[(rec["target"], key, rec["batch_size"])] = (
                "%s (no other framework %s)" % (speed, "finished" if others else "ran") if alone
                else "%s (#%d, %.2f)" % (speed, rank, _speed(rec) / top))
            ranked.setdefault(key, []).append(rec["target"])
    for key, recs in unfinished.items():              # a row of the group that did not finish: why, in a word
        for rec in recs:
            cell.setdefault((rec["target"], key, rec["batch_size"]),
                            NOT_FINISHED if stopped_early(rec) else rec.get("status") or "failed")
            ranked[key].append(rec["target"])
    names = []
    for key in groups:                                # the first group's ranking, then what it lacks
        for name in ranked[key]:
            if name not in names:
                names.append(name)
    short = device_short_names(groups)
    head = ["Row"] + [summary_column(k, b, short) for k, b in columns]
    lines = ["## Summary", "",
             "Seconds of audio trained per second by each framework's row of record (fp32, one process). A column is "
             "one device, preset and batch size (bs); in brackets, the row's rank among all rows of that device and "
             "preset (any batch size) and its speed \u00f7 the fastest of them. Compare rows of one device and "
             "preset only.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        lines.append("| %s | %s |" % (name, " | ".join(cell.get((name, k, b), "\u2013") for k, b in columns)))
    lines += ["", _summary_legend(groups, short) + (" " + gpu_line if gpu_line else ""), ""]
    return lines


#: the table of record's columns within a group: the device and preset are the group's; the version, audio
#: hours and parameter count are under Environments
RECORD_COLUMNS = [c[0] for c in results.TABLE_COLUMNS if c[0] not in ("Device", "Preset", "Version", "Audio h",
                                                                       "Params")]


def _ignored(path: str) -> bool:
    """A path a clone of the project lacks: in a hidden folder (``results/.staging``) or one .gitignore excludes."""
    rel = os.path.relpath(path, ROOT)
    if any(part.startswith(".") and part not in (".", "..") for part in rel.split(os.sep)):
        return True
    if rel.startswith(".."):                          # outside the repository: no .gitignore applies
        return False
    try:
        return subprocess.run(["git", "check-ignore", "-q", rel], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode == 0
    except OSError:                                   # no git: the hidden-folder rule alone
        return False


def notebook_link(rec: dict, output: str) -> Optional[str]:
    """A Markdown link from ``output`` to the record's executed notebook, where that file exists and a clone has it;
    a data-parallel row ran a script made from its notebook and kept out of the repository: a link to that
    notebook (its section 9b) instead."""
    rel = lambda p: os.path.relpath(p, os.path.dirname(os.path.abspath(output)))  # noqa: E731
    run = rec.get("run") or {}
    path = run.get("executed_notebook")
    if path:
        path = path if os.path.isabs(path) else os.path.join(ROOT, path)
        if os.path.exists(path) and not _ignored(path):
            return "[ipynb](%s)" % rel(path)
    source = run.get("notebook")
    if dp_label(rec) and source:
        source = source if os.path.isabs(source) else os.path.join(ROOT, source)
        if os.path.exists(source) and not _ignored(source):
            return "[source, 9b](%s)" % rel(source)
    return None


def record_tables(records: List[dict], output: str) -> List[str]:
    """The table of record, one table per device and preset (every batch size and precision of them), each
    under its heading: the summary's groups first, in its order, then groups with no completed row.  A
    data-parallel row's API / variant names its workers, MXNet's mode and its hosts."""
    groups = OrderedDict()
    for rec in sorted(records, key=lambda r: _summary_order(summary_key(r))):
        groups.setdefault(summary_key(rec), []).append(rec)
    lines = []
    for key, recs in groups.items():
        df = results.records_frame(recs)
        df["notebook_link"] = [notebook_link(r, output) for r in recs]
        # stopped by a signal or a time limit: not the row's own failure
        df["status_override"] = ["%s: %s" % (NOT_FINISHED, r.get("error")) if stopped_early(r) else None
                                 for r in recs]
        if any(dp_label(r) for r in recs):            # "Gluon / 2 workers, dist_sync, 2 hosts"
            df["variant"] = [" / ".join(x for x in ((r.get("variant") or ""), dp_label(r)) if x) or None
                             for r in recs]
            if "distributed.world_size" in df:
                df["distributed.world_size"] = None
        lines += ["### %s" % summary_title(key, recs), "", results.render_markdown(df, RECORD_COLUMNS)]
    return lines


def fastest_variant(rec: dict, records: List[dict]) -> Optional[dict]:
    """The fastest completed variant of the row of record ``rec``: same framework row, preset, data,
    device, batch size and precision."""
    same = [r for r in records if is_variant(r) and row_of_record(r) == rec["target"] and _speed(r) is not None
            and _bench_key(r) == _bench_key(rec) and r.get("batch_size") == rec.get("batch_size")
            and r.get("precision") == rec.get("precision")]
    return max(same, key=_speed) if same else None


#: the speed table's column for the latency-aware roofline (runner/report/latency.py)
LATENCY_COLUMN = "% of latency roofline"


def speed_rows(records: List[dict], latency: Optional[dict] = None) -> "OrderedDict":
    """Per preset-and-device group (:func:`_bench_key`), one row per record: audio s/s and its ratio to
    the group's fastest row, achieved FLOP/s and the share of the measured square-matmul peak, the share of the
    latency-aware roofline where ``latency`` (runner/report/latency.py) has the card's figures (the column only
    in such a group), and for a row of record its audio s/s divided by its framework's fastest variant's.
    Returns {group key: (unit, rows)}; completed rows first, fastest first."""
    out = OrderedDict()
    for key, recs in _bench_groups(records).items():
        shares = {id(r): latency_share(r, latency or {}) for r in recs}
        with_latency = any(v is not None for v in shares.values())
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
                ("Row", row_name(rec)),
                ("Framework", rec.get("framework")),
                ("Variant", (rec.get("variant") or rec["target"].partition("+")[2] or "?") if is_variant(rec)
                 else "(row of record)"),
                ("Precision", rec.get("precision")), ("Batch", rec.get("batch_size")),
                ("Audio s/s", speed),
                ("\u00f7 fastest of group", speed / top if speed is not None and top else None),
                ("Achieved " + unit, achieved / divisor if achieved is not None else None),
                ("% of matmul peak", 100.0 * eff if eff is not None else None),
                ("% of shape roofline", 100.0 * achieved / roof if achieved is not None and roof else None),
            ] + ([(LATENCY_COLUMN, 100.0 * shares[id(rec)] if shares[id(rec)] is not None else None)]
                 if with_latency else []) + [
                ("Row of record \u00f7 fastest variant", speed / _speed(twin) if twin is not None else None),
                ("Status", status if status == "ok" else "%s: %s" % (NOT_FINISHED if stopped_early(rec) else status,
                                                                    rec.get("error") or "no reason given")),
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
            row = OrderedDict([("Row", row_name(rec)), ("Preset", preset_label(rec)),
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


#: the RNN's categories a profile may tell apart from the rest of "rnn" (a dash where it does not), and their sum
RNN_SPLIT = ("rnn_input", "rnn_recurrence")
RNN_TOTAL = "RNN in all %"


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
                           ("Preset", preset_label(rec)), ("Batch", rec.get("batch_size")),
                           ("Profiled step", "%s s \u00d7 %s" % (batch.get("seconds"), batch.get("batch_size"))
                            if batch.get("seconds") else None),
                           ("Step s", _number(prof.get("step_s")))])
        split = any(_number(prof["shares"].get(c)) for c in RNN_SPLIT)   # the tool told them apart
        for c in used:
            share = _number(prof["shares"].get(c))
            row["%s %%" % c] = None if share is None or (c in RNN_SPLIT and not split) else 100.0 * share
            if c == "rnn":
                parts = [_number(prof["shares"].get(k)) for k in RNN_SPLIT + ("rnn",)]
                row[RNN_TOTAL] = 100.0 * sum(p for p in parts if p) if any(p is not None for p in parts) else None
        row["Tool"] = prof.get("tool")
        other = prof.get("largest_other") or []
        row["Largest in other"] = ", ".join(str(n)[:40] for n, _ in other[:3]) or None
        rows.append(row)
    return rows


#: the least R² of the fit that step_time_rows shows: below it the steps do not grow as a line with the length
FIT_MIN_R2 = 0.95


def step_time_fit(per_length: dict) -> Optional[dict]:
    """The least-squares line through a record's median step times against the utterance length: ``{"fixed_ms",
    "ms_per_s", "r2", "lengths"}`` (ms = fixed_ms + ms_per_s x seconds of audio), or None with fewer than 3 lengths
    or steps that do not vary. fixed_ms is what a step costs whatever its length (launches, CTC, the update, host
    copies), ms_per_s what each second of audio adds (the recurrence's steps above all)."""
    points = [(float(s), float(v["median_ms"])) for s, v in (per_length or {}).items()
              if isinstance(v, dict) and isinstance(v.get("median_ms"), (int, float))]
    n = len(points)
    if n < 3:
        return None
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    syy = sum((y - my) ** 2 for _, y in points)
    if sxx == 0 or syy == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    fixed = my - slope * mx
    residual = sum((y - fixed - slope * x) ** 2 for x, y in points)
    return {"fixed_ms": fixed, "ms_per_s": slope, "r2": 1.0 - residual / syy, "lengths": n}


def full_batches(per_length: dict, batch_size) -> bool:
    """Whether every length's steps were full batches (``utterances`` = ``steps`` x the batch size; a record without
    those counts is taken as full): on the cpu and smoke presets a length's batch holds that length's share of the
    utterances (1 to 14), so their step times are not of one batch size and no line fits them."""
    for v in (per_length or {}).values():
        if isinstance(v, dict) and v.get("utterances") is not None and v.get("steps") and batch_size and \
                v["utterances"] != v["steps"] * batch_size:
            return False
    return True


def step_time_rows(records: List[dict]) -> List[OrderedDict]:
    rows = []
    for rec in _ok(records):
        per = rec["timing"].get("per_length") or {}
        row = OrderedDict([("Row", _label(rec)), ("Device", (rec.get("device") or {}).get("name")),
                           ("Preset", preset_label(rec)), ("Batch", rec.get("batch_size"))])
        fit = step_time_fit(per) if full_batches(per, rec.get("batch_size")) else None
        shown = fit is not None and fit["r2"] >= FIT_MIN_R2
        row["Fixed ms"] = fit["fixed_ms"] if shown else None
        row["ms per s of audio"] = fit["ms_per_s"] if shown else None
        for s in range(1, 16):
            row["%d s" % s] = (per.get(str(s)) or {}).get("median_ms")
        rows.append(row)
    return rows


def speed_section(records: List[dict], latency: Optional[dict] = None) -> str:
    """The speed-and-efficiency tables, one per preset-and-device group, with their explanation."""
    groups = speed_rows(records, latency)
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
                                     LATENCY_COLUMN: "{:.1f}",
                                     "Row of record \u00f7 fastest variant": "{:.2f}"}))
        parts.append("\n")
    parts.append("\n".join([
        "- The headings: the preset, its scale (utterances per percent point of the length mix: scale 1 is 100 "
        "utterances; `quick`'s 64 is 5 % of a DeepMark epoch, whose scale is 1280) and the seed of the data and "
        "the weights.",
        "- Variant: `(row of record)` is the framework's highest-level API; a variant (target `<row>+<variant>`, "
        "`run_all.py --variants`) changes what its description says and passes the same checks.",
        "- \u00f7 fastest of group: audio s/s over the group's fastest row (any batch size and precision).",
        "- Achieved: the timed pass's training FLOPs (counted from the model's configuration, forward and backward) "
        "over its train seconds.",
        "- % of matmul peak: achieved over the same notebook's measured square matrix-product rate at the same "
        "precision (a data-parallel row: its W processes' throughput over one process's peak). % of shape "
        "roofline: achieved over the rate the step would reach if each product ran at the rate measured for its "
        "shape (the peaks below); over 100 where a fused RNN kernel (cuDNN's) runs the recurrent products faster than one product of that shape alone. % of latency roofline (where the card's "
        "latency figures are in the results directory's latency/): audio s/s over the bound that the recurrence's dependent steps "
        "and the card's product rate give (docs/benchmark.md, the latency-aware roofline).",
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
        "full model's training FLOPs) at the recurrent rate (`common.flops.shape_roofline`): a reference built from "
        "separate library products, which a fused RNN kernel such as cuDNN's can beat (rows over 100 %%)."
        % (100 * sequential_share(FULL_MODEL)),
        "- No shape roofline for `smoke` rows: their products are measured, but at their widths each is a call "
        "overhead of microseconds.",
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
            measured = [_number(row.get("Square " + unit)) for row in rows if row.get("Precision") == precision]
            top = max([m * FLOP_UNITS[unit] for m in measured if m is not None], default=None)
            over = (" A measured square product reached %.3g %s, above it: the CPU ran faster than the clock the "
                    "operating system reports (a virtual machine's nominal clock, below its turbo)." % (top / d, u)
                    if top is not None and top > value else "")
            parts.append("\nTheoretical peak of this CPU, %s (%s, not measured): %.3g %s = %s. Assumed: %s.%s\n"
                         % (precision, t.get("label") or "theoretical", value / d, u, t.get("basis") or "?",
                            t.get("assumptions") or "?", over))
        parts.append("\n")
    return "".join(parts)
