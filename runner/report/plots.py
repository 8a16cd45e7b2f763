"""results.md's plots (matplotlib, Agg), each written atomically next to the records."""
import os
import tempfile
from collections import OrderedDict
from typing import List, Optional

import numpy as np

from runner.report.records import (_bench_groups, _bench_title, _flops, _group_key, _group_title, _groups, _label,
                                   _number, _ok, _speed, flop_unit, pytorch_twin, trajectory)
from runner.report.tables import device_short_names, summary_groups, summary_title


PLOTS = OrderedDict([
    ("summary", "summary.png"),
    ("throughput", "throughput.png"),
    ("step_time", "step_time_by_length.png"),
    ("trajectories", "loss_trajectories.png"),
    ("flops", "achieved_flops.png"),
    ("batch_sweep", "audio_per_s_by_batch_size.png"),
])


# ---- plots ---------------------------------------------------------------------------------
def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: str) -> None:
    """Save a figure atomically and close it: a temporary PNG of this call's own (two runs that share a results
    directory may redraw the same plot at once) renamed into place."""
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path)[:-len(".png")] + ".", suffix=".partial.png",
                               dir=os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110)
        os.chmod(tmp, 0o644)                       # mkstemp makes 0600 files
        os.replace(tmp, path)
    finally:
        _plt().close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)


def discard(path: str) -> None:
    """Remove a plot that has nothing to show; another run sharing the folder may have removed it first."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def plot_summary(records: List[dict], path: str) -> bool:
    """The summary's comparison: audio s/s of each row of record and batch size, one panel per device and preset."""
    groups = summary_groups(records)
    if not groups:
        return False
    plt = _plt()
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 0.9 + sum(0.32 * len(g) + 0.7 for g in groups.values())),
                             squeeze=False, gridspec_kw={"height_ratios": [len(g) + 1 for g in groups.values()]})
    short = device_short_names(groups)
    for ax, (key, recs) in zip(axes[:, 0], groups.items()):
        recs = sorted(recs, key=_speed)
        top = _speed(recs[-1])
        ax.barh(["%s, batch %d" % (r["target"], r["batch_size"]) for r in recs], [_speed(r) for r in recs],
                color="#4477aa")
        alone = len(set(r["target"] for r in recs)) < 2       # one framework: nothing to rank it against
        for j, r in enumerate(recs):
            value = "%.0f" % _speed(r) if _speed(r) >= 1000 else "%.3g" % _speed(r)
            ax.text(_speed(r), j, " " + value + ("" if alone else " (%.2f)" % (_speed(r) / top)), va="center",
                    fontsize=8)
        ax.set_xlim(0, top * 1.25)
        ax.set_xlabel("seconds of audio trained per second" + ("" if alone else " (\u00f7 the fastest)"), fontsize=8)
        name = key[1] or key[0] or "an unknown device"
        ax.set_title("%s \u00b7 %s \u2014 %s" % (short[name], key[2], summary_title(key, recs).split(" on ", 1)[-1]),
                     fontsize=9)
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
            speed = r["timing"]["audio_s_per_s"]                 # 3 figures: the CPU rows run 2 to 9 audio-s/s
            ax.text(speed, i, " %.0f" % speed if speed >= 100 else " %.3g" % speed, va="center", fontsize=8)
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
