"""results.md and its plots, generated from the result records only.

Sections: the table of record (one row per record, failed and skipped rows with their reason),
throughput bars, step time per utterance length, the cross-framework agreement table and loss
trajectories ("they compute the same thing"), the environments, and how the records were made.
"""
import os
from collections import OrderedDict
from typing import List, Optional

import numpy as np

from common import envinfo, results
from common.results import atomic_write_text

from . import distributed
from .bootstrap import ROOT

K_STEPS = 10          # losses compared across frameworks: the first K training steps
PLOTS = OrderedDict([
    ("throughput", "throughput.png"),
    ("step_time", "step_time_by_length.png"),
    ("trajectories", "loss_trajectories.png"),
])


# ---- selecting and naming records ---------------------------------------------------------
def _label(rec: dict) -> str:
    return "%s %s" % (rec["target"], rec.get("precision") or "")


def _group_key(rec: dict):
    """Records that ran the same benchmark on the same device compare directly."""
    return (rec.get("preset"), rec.get("batch_size"), rec.get("scale"), rec.get("seed"),
            (rec.get("device") or {}).get("name"))


def _group_title(key) -> str:
    preset, batch, scale, seed, device = key
    return "%s (batch %s, scale %s, seed %s) on %s" % (preset, batch, scale, seed, device)


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


def agreement_rows(records: List[dict]) -> List[OrderedDict]:
    rows = []
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
            ("First loss", loss.get("framework")), ("NumPy reference", loss.get("reference")),
            ("Rel. diff", loss.get("rel_diff")), ("Check", "pass" if loss.get("ok") else "FAIL"),
            ("Max rel. diff of first %d step losses vs PyTorch" % K_STEPS,
             "(reference row)" if twin is rec else rel),
        ]))
    return rows


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
            ("Row", _label(rec)), ("Status", rec["status"]),
            ("Framework version", versions.get("framework")), ("Python", versions.get("python") or env.get("python")),
            ("NumPy", versions.get("numpy")), ("Other versions", extra or None),
            ("GPU", ", ".join(g.get("name", "?") for g in gpus) or None),
            ("Driver", gpus[0].get("driver") if gpus else None), ("CUDA (driver)", env.get("cuda_driver")),
            ("CPU", env.get("cpu")), ("OS", env.get("os")),
        ]))
    return rows


def provenance_rows(records: List[dict]) -> List[OrderedDict]:
    seen = OrderedDict()
    for rec in records:
        run = rec.get("run") or {}
        key = (run.get("command"), run.get("git_commit"))
        entry = seen.setdefault(key, {"rows": [], "first": run.get("started"), "last": run.get("finished")})
        entry["rows"].append(_label(rec))
        entry["first"] = min(filter(None, [entry["first"], run.get("started")]), default=None)
        entry["last"] = max(filter(None, [entry["last"], run.get("finished")]), default=None)
    return [OrderedDict([("Command", "`%s`" % cmd if cmd else None), ("Commit", commit), ("Started", e["first"]),
                         ("Finished", e["last"]), ("Rows", ", ".join(e["rows"]))])
            for (cmd, commit), e in seen.items()]


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


def plot_trajectories(records: List[dict], path: str, k: int = 40) -> bool:
    """Left: the first ``k`` losses of every row; right: their relative difference from PyTorch's."""
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
    records = results.read_records(records_dir) if os.path.isdir(records_dir) else []
    df = results.records_frame(records) if records else None
    plots_dir = os.path.join(results_dir, "plots")
    os.makedirs(plots_dir, exist_ok=True)
    made = {}
    for name, fn in (("throughput", plot_throughput), ("step_time", plot_step_time),
                     ("trajectories", plot_trajectories)):
        path = os.path.join(plots_dir, PLOTS[name])
        made[name] = fn(records, path)
        if not made[name] and os.path.exists(path):
            os.remove(path)
    rel = lambda p: os.path.relpath(p, os.path.dirname(os.path.abspath(output)))  # noqa: E731

    def image(name, alt):
        return "![%s](%s)\n" % (alt, rel(os.path.join(plots_dir, PLOTS[name]))) if made[name] else ""

    lines = [
        "# DS2 Rosetta results",
        "",
        "Generated by `%s` on %s from %d result record(s) in `%s` (commit `%s`); never edited by hand. "
        "Generating machine: %s." % (command, results.utc_now(), len(records), rel(records_dir), commit or "unknown",
                                      _machine()),
        "",
        "Every row names the device it ran on and its preset: compare rows of the same preset and device. "
        "A framework that could not run keeps its row with the reason. CPU `smoke` rows check correctness "
        "and the pipeline; they say nothing about GPU speed.",
        "",
        "## Table of record",
        "",
        results.render_markdown(df) if df is not None else "_No result records._\n",
        "Audio s/s: seconds of audio trained per second of wall time over the timed pass (the headline). "
        "Fwd ms: forward-only milliseconds for a batch of 1 s and of 15 s utterances. Peak mem: device memory "
        "on a GPU, the process's peak resident memory on a CPU. First-loss check: relative difference from the "
        "NumPy reference.",
        "",
        "## Throughput",
        "",
        image("throughput", "seconds of audio per second, per framework and precision") or "_No completed runs._\n",
        "## Step time per utterance length",
        "",
        "Median milliseconds per training step, by utterance length (seconds).",
        "",
        md_table(step_time_rows(records), {"%d s" % s: "{:.1f}" for s in range(1, 16)}),
        image("step_time", "ms per step against utterance length"),
        "## Do they compute the same thing?",
        "",
        "The first batch's loss from the canonical weights against the NumPy reference, and the largest "
        "relative difference of the first %d training losses (warm-up steps first) from PyTorch's on the same "
        "benchmark." % K_STEPS,
        "",
        md_table(agreement_rows(records), {"First loss": "{:.6f}", "NumPy reference": "{:.6f}", "Rel. diff": "{:.1e}",
                                           "Max rel. diff of first %d step losses vs PyTorch" % K_STEPS: "{:.1e}"}),
        image("trajectories", "loss trajectories of all frameworks"),
    ] + distributed.report_section(records, md_table) + [
        "## Environments",
        "",
        md_table(environment_rows(records)),
        "## How these records were made",
        "",
        md_table(provenance_rows(records)),
    ]
    return "\n".join(lines)


def _machine() -> str:
    gpus = envinfo.gpus()
    return ", ".join(g.get("name", "?") for g in gpus) if gpus else "CPU only (%s)" % envinfo.cpu_model()


def write(results_dir: str, output: str, command: str, commit: Optional[str]) -> str:
    atomic_write_text(output, render(results_dir, command, commit, output))
    return output
