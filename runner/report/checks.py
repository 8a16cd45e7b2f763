"""results.md's "do they compute the same thing" sections: the agreement table, the float64 control, the
ONNX exit route and the migration matrix with the convention differences of the exports."""
import os
from collections import OrderedDict
from typing import List, Optional

import numpy as np

from common import results
from common.onnx_check import HELD_OUT_BATCH_SIZE, HELD_OUT_SECONDS, ONNX_RTOL, REPEATS
from common.spec import CONTROL_PRECISION

from runner.report.records import (K_STEPS, _fmt, _group_key, _label, _number, _ok, md_table, preset_label,
                                   pytorch_twin, row_of_record, trajectory)


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
            ("Row", _label(rec)), ("Device", (rec.get("device") or {}).get("name")), ("Preset", preset_label(rec)),
            ("Batch", rec.get("batch_size")), ("First loss", loss.get("framework")), ("NumPy reference", loss.get("reference")),
            ("Rel. diff", loss.get("rel_diff")), ("Check", "pass" if loss.get("ok") else "FAIL"),
            ("Max rel. diff of first %d step losses vs PyTorch" % K_STEPS,
             "(reference row)" if twin is rec else rel),
        ]))
        if controls:
            control = control_for(rec, controls)
            rows[-1][CONTROL_COLUMN] = control_deviation(rec, control) if control is not None else None
    return rows


# ---- the float64 control --------------------------------------------------------------------------------
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
                         preset_label(c), c.get("batch_size"), (c.get("device") or {}).get("name"),
                         _fmt(loss.get("framework"), "{:.9f}"), _fmt(loss.get("rel_diff"), "{:.1e}"),
                         len(trajectory(c)), _fmt(own, "{:.1e}")))
    return ("**Float64 control.** The PyTorch notebook run in float64 (`run_all.py --frameworks pytorch --precision "
            "fp64`) is the trajectory rounding cannot explain away: column *%s* is each fp32 row's largest relative "
            "deviation from it (warm-up and timed steps), to be read against PyTorch fp32's own. The control is no "
            "row of the speed tables, the summary or the agreement table (dashed in the loss plot; the convention "
            "table compares the exports with it, and the environments and provenance list its run).\n\n%s.\n" % (CONTROL_COLUMN,
                                                                                  "; ".join(parts)))


# ---- the ONNX exit route ----------------------------------------------------------------------------------
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
            ("Row", _label(rec)), ("Preset", preset_label(rec)), ("Batch", rec.get("batch_size")),
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
    """A line per experiment directory (``<results>/experiments/*``) whose records tried the ONNX export: a link
    and its headline figures (how many exports pass, the largest differences). A record whose ONNX section says
    ``skipped`` (a run with ``--skip onnx``) made no export and is not counted."""
    base = os.path.join(results_dir, "experiments")
    lines = []
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        d = os.path.join(base, name, "records")
        recs = [r for r in (results.scan_records(d)[0] if os.path.isdir(d) else [])
                if r.get("onnx") and r["onnx"].get("status") != "skipped"]
        if not recs:
            continue
        ok = [r["onnx"] for r in recs if r["onnx"].get("status") == "ok"]
        worst = lambda k: max((_number((o.get(k) or {}).get("max_rel")) or 0.0) for o in ok) if ok else None  # noqa
        link = os.path.relpath(os.path.join(base, name), os.path.dirname(os.path.abspath(output)))
        lines.append("- [%s](%s): %d of %d exports pass (%s); the largest difference from the framework %s, from the "
                     "NumPy reference %s." % (link, link, len(ok), len(recs), ", ".join(sorted(set(
                         "%s %s" % (preset_label(r), (r.get("device") or {}).get("name")) for r in recs))),
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
        out += ["Experiments with ONNX exports, apart from this table (their own results directories, each with its "
                "own results.md: another machine, preset or day):", ""] \
            + experiments + [""]
    return out


# ---- the migration matrix (run_all.py --migrate) ----------------------------------------------------------
def _target_order(name: str) -> tuple:
    from runner.run.targets import ALL_TARGETS
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
    from runner.migrate import repo_path
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
    from runner.migrate import BN_CONVENTIONS
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
                           ("Preset", preset_label(rec))])
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
    from runner.migrate import read_migration_records
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
