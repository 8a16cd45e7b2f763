"""results.md's "Learns a real task" section: the records of a learn preset (``run_all.py --preset learn``), their
``learning`` sections (common/learn.py), a table of CER at equal steps and time to the target, a parity check against
the PyTorch row's seed-to-seed spread, and a plot of CER against step and against seconds.

Parity: rows that start from the same canonical weights and see the same batches should agree in CER at equal steps
within the PyTorch row's own seed-to-seed spread.  At every evaluation step all compared records share (step 0
excepted), the spread is the range (max - min) of the PyTorch row's CER over its seeds; a row's deviation is its CER
minus the PyTorch record's of the same seed (the PyTorch seeds' mean where that seed did not run).  A row outside the
spread at more than half of the steps is flagged, never left out.  With fewer than 2 PyTorch seeds there is no spread
and the section says so.
"""
import os
from collections import OrderedDict
from typing import Callable, List, Optional

from common.spec import is_learn_preset

from runner.report.plots import _plt, _save, discard
from runner.report.records import _label, md_table

#: the plot's file name, next to the other plots
PLOT = "learning_cer.png"
#: the reference row of the parity check
PARITY_TARGET = "pytorch"
#: equal-step columns of the table (at most this many evaluation steps that every row has)
STEP_COLUMNS = 5


def is_learning(rec: dict) -> bool:
    """A record of a learn preset (ok, failed or skipped)."""
    return is_learn_preset(rec.get("preset"))


def _ok(records: List[dict]) -> List[dict]:
    return [r for r in records if r.get("status") == "ok" and r.get("learning")]


def _cer(block: dict, step: int, split: Optional[str] = None) -> Optional[float]:
    split = split or block["target"]["split"]
    for e in block["evaluations"]:
        if e["step"] == step:
            return e["cer"].get(split)
    return None


def _steps(blocks: List[dict]) -> List[int]:
    sets = [set(e["step"] for e in b["evaluations"]) for b in blocks]
    return sorted(set.intersection(*sets)) if sets else []


def _name(rec: dict) -> str:
    return "%s seed %s" % (_label(rec), rec.get("seed"))


def _columns(steps: List[int]) -> List[int]:
    """Up to STEP_COLUMNS of the common steps, spread over them, the last included (step 0 left out)."""
    steps = [s for s in steps if s > 0]
    if len(steps) <= STEP_COLUMNS:
        return steps
    picks = [steps[round(i * (len(steps) - 1) / (STEP_COLUMNS - 1))] for i in range(STEP_COLUMNS)]
    return sorted(set(picks))


def table_rows(records: List[dict]) -> List[OrderedDict]:
    """One row per learn record: CER of the target split at equal steps, steps and seconds to the target, the final
    CER of both test splits; a failed row with its reason."""
    ok = _ok(records)
    cols = _columns(_steps([r["learning"] for r in ok]))
    rows = []
    for rec in sorted(records, key=lambda r: (r.get("preset") or "", r["target"], r.get("precision") or "",
                                              r.get("seed") or 0)):
        b = rec.get("learning") if rec.get("status") == "ok" else None
        row = OrderedDict([("Row", _name(rec))])
        for s in cols:
            row["CER @%d" % s] = _cer(b, s) if b else None
        t = (b or {}).get("target") or {}
        row["Steps to target"] = t.get("steps")
        row["Train s to target"] = t.get("train_s")
        row["Wall s to target"] = t.get("wall_s")
        final = (b or {}).get("final") or {}
        row["Steps run"] = final.get("step")
        row["Final CER seen"] = (final.get("cer") or {}).get("test_seen")
        row["Final CER unseen"] = (final.get("cer") or {}).get("test_unseen")
        row["Note"] = rec.get("error") if rec.get("status") != "ok" else (t.get("reason") or "")
        rows.append(row)
    return rows


def parity(records: List[dict]):
    """(rows, note): per compared row, how often its CER at equal steps lies outside the PyTorch seeds' spread."""
    ok = _ok(records)
    ref = [r for r in ok if r["target"] == PARITY_TARGET and r.get("precision") == "fp32"]
    seeds = sorted(set(r.get("seed") for r in ref))
    if len(seeds) < 2:
        return [], ("No parity check: it needs the %s row over at least 2 seeds (benchmarks/learn_parity.py runs it "
                    "over 3); %d seed(s) here." % (PARITY_TARGET, len(seeds)))
    by_seed = OrderedDict((s, next(r for r in ref if r.get("seed") == s)) for s in seeds)
    steps = [s for s in _steps([r["learning"] for r in ok]) if s > 0]
    rows = []
    for rec in ok:
        if rec in by_seed.values():
            continue
        twin = by_seed.get(rec.get("seed"))
        outside, worst = 0, 0.0
        for s in steps:
            ref_cers = [_cer(r["learning"], s) for r in by_seed.values()]
            spread = max(ref_cers) - min(ref_cers)
            base = _cer(twin["learning"], s) if twin else sum(ref_cers) / len(ref_cers)
            dev = _cer(rec["learning"], s) - base
            if abs(dev) > spread:
                outside += 1
            worst = max(worst, abs(dev) / spread if spread > 0 else float("inf") if dev else 0.0)
        flagged = outside * 2 > len(steps)
        rows.append(OrderedDict([("Row", _name(rec)), ("Against", "%s seed %s" % (PARITY_TARGET, rec.get("seed"))
                                                      if twin else "%s mean of seeds" % PARITY_TARGET),
                                 ("Steps compared", len(steps)), ("Outside the spread", outside),
                                 ("Largest deviation / spread", worst),
                                 ("Parity", "**outside**" if flagged else "within")]))
    note = ("PyTorch's seeds %s: CER spread (max - min) at the %d common evaluation steps after step 0 from %.3f to %.3f."
            % (", ".join(str(s) for s in seeds), len(steps),
               min(max(c) - min(c) for c in ([_cer(r["learning"], s) for r in by_seed.values()] for s in steps)),
               max(max(c) - min(c) for c in ([_cer(r["learning"], s) for r in by_seed.values()] for s in steps)))
            if steps else "No evaluation step in common.")
    return rows, note


def plot(records: List[dict], path: str) -> bool:
    """CER of the target split against step and against wall seconds, one line per record."""
    ok = _ok(records)
    if not ok:
        return False
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for rec in sorted(ok, key=_name):
        b = rec["learning"]
        split = b["target"]["split"]
        ev = b["evaluations"]
        for ax, x in ((axes[0], [e["step"] for e in ev]), (axes[1], [e["wall_s"] for e in ev])):
            ax.plot(x, [e["cer"][split] for e in ev], marker=".", label=_name(rec))
    target = ok[0]["learning"]["target"]
    for ax, xlabel in zip(axes, ("training step", "wall seconds (training and evaluation)")):
        ax.axhline(target["cer"], color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("CER on %s (greedy)" % target["split"])
    axes[0].set_ylim(0, min(1.2, max(e["cer"][target["split"]] for r in ok for e in r["learning"]["evaluations"])
                        + 0.05))
    axes[1].legend(fontsize=7, loc="upper right")
    fig.suptitle("Learns a real task: CER against step and against seconds (dotted: the target)")
    fig.tight_layout()
    _save(fig, path)
    return True


def section(records: List[dict], plots_dir: str, rel: Callable[[str], str]) -> List[str]:
    """The section's lines (none when no record is a learn preset's); writes its plot into ``plots_dir``."""
    records = [r for r in records if is_learning(r)]
    if not records:
        return []
    path = os.path.join(plots_dir, PLOT)
    made = plot(records, path)
    if not made:
        discard(path)
    ok = _ok(records)
    corpora = sorted(set(r["learning"]["corpus"]["corpus_sha256"][:12] for r in ok))
    lines = [
        "## Learns a real task",
        "",
        "A DS2 of reduced width trained on spoken English made offline (docs/real-task.md): every row from the "
        "canonical weights of that width, on the same batches in the same order, scored by greedy-decoded CER on "
        "sentences it never trained on (`test_seen`: training voices; `test_unseen`: held-out voices). "
        "CER @N: the target split's CER at step N. Seconds are on the row's own machine and include the evaluations "
        "(and, for XLA rows, compiling each batch shape on first use). Corpus: %s." % (", ".join(corpora) or "\u2013"),
        "",
        md_table(table_rows(records), {"Train s to target": "{:.1f}", "Wall s to target": "{:.1f}"}),
    ]
    if made:
        lines.append("![CER against training step and against seconds](%s)\n" % rel(path))
    rows, note = parity(records)
    lines += ["Parity: %s" % note, ""]
    if rows:
        lines.append(md_table(rows, {"Largest deviation / spread": "{:.2f}"}))
    return lines
