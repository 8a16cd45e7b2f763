"""results.md's "Before you rent a GPU": what the records show has run on a GPU, what the build audit says cannot
run where, which routes no GPU has run yet, and how long each preset takes per row on the card that ran it.

Every statement comes from a committed record (``results/records``) or from ``runner/envs/gpu_preflight.py``'s audit of the
GPU builds; nothing here is typed by hand.  README.md carries a copy between two marker lines.
"""
import os
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

from common.spec import DEEPMARK_SCALE, PRESETS

from runner.envs.gpu_preflight import BUILDS, arch_verdict
from runner.report.latency import latency_share
from runner.report.records import _speed, is_gpu, preset_label, stopped_early
from runner.run.targets import ALL_TARGETS

#: the cards the audit is read for: (compute capability, the cards of that architecture)
CARDS = [((7, 0), "V100 (Volta)"), ((8, 0), "A100 (Ampere)"), ((8, 9), "L4, L40S (Ada)"),
         ((9, 0), "H100, H200 (Hopper)"), ((10, 0), "B200 (Blackwell)")]
#: the three routes to a GPU machine (docs/gpus.md#three-routes-to-a-gpu-machine)
ROUTES = OrderedDict([("pinned", "the pinned environments (`python run_all.py`, envs/*-cuda.txt)"),
                      ("installed", "the frameworks as installed (`--use-installed`)"),
                      ("wheelhouse", "an offline wheelhouse (`--wheelhouse DIR`)")])
TITLE = "## Before you rent a GPU"


def route(rec: dict) -> str:
    """How the record's row got its framework: as installed, from a wheelhouse or from the pinned environments."""
    if rec.get("as_is"):
        return "installed"
    if "--wheelhouse" in str((rec.get("run") or {}).get("command") or ""):
        return "wheelhouse"
    return "pinned"


def _record_link(rec: dict, records_dir: str, output: str) -> str:
    """A link to the record's file (named as its executed notebook), or nothing where there is no such file."""
    notebook = (rec.get("run") or {}).get("executed_notebook") or ""
    path = os.path.join(records_dir, os.path.splitext(os.path.basename(notebook))[0] + ".json")
    if not notebook or not os.path.exists(path):
        return "no record file"
    return "[record](%s)" % os.path.relpath(path, os.path.dirname(os.path.abspath(output)))


def _outcome(rec: dict) -> str:
    if rec.get("status") == "ok":
        speed = (rec.get("timing") or {}).get("audio_s_per_s")
        return "ok, %s audio-s/s" % ("%.0f" % speed if speed is not None else "?")
    if stopped_early(rec):
        return "not finished (interrupted)"
    return "%s: %s" % (rec.get("status"), str(rec.get("error") or "no reason given")[:120])


#: the order of a row's precisions on one line
PRECISION_ORDER = ("fp32", "tf32", "bf16")


def _by_row(items: list, key, record=lambda item: item) -> "OrderedDict":
    """``items`` grouped by ``key(record(item))`` (groups sorted), each group's items in PRECISION_ORDER of their
    record."""
    groups = OrderedDict()
    for item in sorted(items, key=lambda i: tuple(str(k) for k in key(record(i)))):
        groups.setdefault(key(record(item)), []).append(item)
    rank = {p: i for i, p in enumerate(PRECISION_ORDER)}
    precision = lambda item: record(item).get("precision")
    return OrderedDict((k, sorted(v, key=lambda i: (rank.get(precision(i), len(rank)), str(precision(i)))))
                       for k, v in groups.items())


def card_of(rec: dict) -> str:
    """The GPU a record ran on, by name."""
    return (rec.get("device") or {}).get("name") or "unknown GPU"


def ran_lines(gpu: List[dict], records_dir: str, output: str) -> List[str]:
    """A line per row, preset, batch size, card and route; per precision the outcome, and for a finished run of the
    full model its wall time and the deepmark preset's estimated from it (:func:`wall_estimates`, what a run left
    out said once per line where its runs left out the same), and the record's link.  So a new row adds one line."""
    if not gpu:
        return ["- **Has run on a GPU:** nothing yet: no record here ran on a GPU."]
    lines = ["- **Has run on a GPU** (one line per row, preset, batch size, card and route; per precision its "
             "outcome, on the full model how long its run took, and its record):"]
    times = {id(rec): (wall, deepmark) for rec, wall, deepmark in wall_estimates(gpu)}
    key = lambda r: (r.get("target", ""), preset_label(r) or "", r.get("batch_size"),
                     card_of(r), route(r))
    for (target, preset, batch, card, how), recs in _by_row(gpu, key).items():
        withouts = {id(rec): _without(rec) for rec in recs if id(rec) in times}
        shared = len(set(withouts.values())) == 1       # every timed run of the line left out the same: said once
        entries = []
        for rec in recs:
            took = ""
            if id(rec) in times:
                wall, deepmark = times[id(rec)]
                took = " in %s" % _minutes(wall) + (", deepmark about %s" % _minutes(deepmark)
                                                     if preset != "deepmark" else "")
                took += "" if shared or not withouts[id(rec)] else ", " + withouts[id(rec)]
            entries.append("%s %s%s (%s)" % (rec.get("precision"), _outcome(rec), took,
                                             _record_link(rec, records_dir, output)))
        said = next(iter(withouts.values()), "") if shared else ""
        once = "; %stimes %s" % ("" if len(withouts) == 1 else "all ", said) if said else ""
        lines.append("  - `%s` %s, batch %s, on an %s through %s: %s%s" % (
            target, preset, batch, card, ROUTES[how], "; ".join(entries), once))
    return lines


#: the presets of the full model on a GPU: their speeds compare across rows and precisions
FULL_MODEL_PRESETS = ("quick", "deepmark")


def fastest_lines(gpu: List[dict], records_dir: str, output: str, latency: Dict[str, dict]) -> List[str]:
    """The fastest finished record of the full model on each card, of any row, precision and route, with its share
    of that card's latency-aware roofline where the card has latency figures (runner/report/latency.py)."""
    finished = [r for r in gpu if r.get("preset") in FULL_MODEL_PRESETS and _speed(r) is not None]   # a speed
    best = OrderedDict()
    for rec in sorted(finished, key=lambda r: str((r.get("device") or {}).get("name"))):
        card, speed = card_of(rec), _speed(rec)
        if card not in best or speed > best[card][1]:
            best[card] = (rec, speed)
    if not best:
        return []
    entries = []
    for card, (rec, speed) in best.items():
        share = latency_share(rec, latency)
        entries.append("on an %s, `%s` at %s (%s, batch %s): %.0f audio-s/s, %s (%s)" % (
            card, rec.get("target"), rec.get("precision"), preset_label(rec), rec.get("batch_size"), speed,
            "%.0f%% of the card's latency-aware roofline" % (100 * share) if share is not None
            else "no latency figures for the card", _record_link(rec, records_dir, output)))
    rows = set((rec.get("target"), rec.get("precision")) for rec, _ in best.values())
    ran = {card: set((r.get("target"), r.get("precision")) for r in finished if card_of(r) == card)
           for card in best}   # the full model's rows: a row a card ran only at smoke width is not a row it ran
    unlike = len(rows) > 1 and any(row not in ran[card] for row in rows for card in ran)
    return ["- **Fastest on each card** (the full model; any row, precision and route): %s.%s" % (
        "; ".join(entries), " Each card's fastest among the rows it ran, and the cards did not run the same rows: "
        "a row's speed on two cards is in the table of record." if unlike else "")]


def never_lines(gpu: List[dict]) -> List[str]:
    used = set(route(r) for r in gpu)
    never = [text for key, text in ROUTES.items() if key not in used]
    ran = set(ALL_TARGETS[r["target"]].env for r in gpu if r.get("target") in ALL_TARGETS and r.get("status") == "ok")
    rows = [env for env in BUILDS if env not in ran]
    finished = set(r["target"] for r in gpu if r.get("status") == "ok")
    unrun = [t.name for t in ALL_TARGETS.values() if t.row_of_record == t.name and t.name not in finished]
    out = []
    if never:
        out.append("- **Routes no GPU has run:** %s." % "; ".join(never))
    if rows:
        out.append("- **Environments no row has finished in on a GPU:** %s." % ", ".join("`%s`" % e for e in rows))
    if unrun:
        out.append("- **Rows of record no GPU has finished:** %s." % ", ".join("`%s`" % t for t in unrun))
    return out


def audit(cc: Tuple[int, int]) -> "OrderedDict":
    """{environment: None when one of its builds has machine code or compiles for ``cc``, else what it needs or
    why none runs}: the best of its builds on that architecture."""
    out = OrderedDict()
    for env, builds in BUILDS.items():
        verdicts = [(b,) + arch_verdict(b, cc) for b in builds]
        native = [b for b, _, how in verdicts if how in ("sass", "codegen")]
        jit = [b for b, _, how in verdicts if how == "jit"]
        if any(b.verified for b in native):
            out[env] = None
        elif native:                        # only builds whose architectures this project could not read
            out[env] = ("%s, whose architectures come from %s build scripts, not read from %s binaries (nor "
                        "whether %s: never installed here)" % (" or ".join(b.package for b in native),
                                                               *(("its", "its", "that wheel exists") if len(native) == 1
                                                                 else ("their", "their", "those wheels exist"))))
        elif jit:
            out[env] = "only through the driver's JIT of older PTX (never run): %s" % (
                jit[0].jit_note or "minutes at the first start")
        else:
            out[env] = next(reason for _, reason, _ in verdicts if reason)
    return out


def cannot_lines() -> List[str]:
    lines = ["- **What each architecture cannot run, or runs only as said** (runner/envs/gpu_preflight.py's audit of "
             "each GPU build; the GPU preflight says it again on the machine, before anything is installed):"]
    for cc, cards in CARDS:
        issues = [(env, why) for env, why in audit(cc).items() if why]
        text = ("; ".join("`%s`: %s" % (env, why) for env, why in issues) if issues
                else "every environment has a build whose architectures were read from its binaries")
        lines.append("  - %s, sm_%d%d: %s" % (cards, cc[0], cc[1], text))
    return lines


def _minutes(seconds: Optional[float]) -> str:
    return "?" if seconds is None else "%.0f min" % (seconds / 60.0) if seconds >= 120 else "%.0f s" % seconds


def wall_estimates(gpu: List[dict]) -> List[Tuple[dict, float, Optional[float]]]:
    """(record, its measured notebook wall time, the deepmark preset's estimated wall time) for each finished GPU
    record of the full model: the run's own time with its timed pass replaced by one full epoch at its measured
    speed (``timing.projected_epoch_s``, which the timing helper writes)."""
    out = []
    for rec in gpu:
        timing, run = rec.get("timing") or {}, rec.get("run") or {}
        if rec.get("status") != "ok" or rec.get("preset") not in ("quick", "deepmark") or run.get("wall_s") is None:
            continue
        epoch = timing.get("projected_epoch_s") if timing.get("projected_scale") == DEEPMARK_SCALE else None
        deepmark = (run["wall_s"] - timing.get("train_s", 0.0) + epoch) if epoch is not None else None
        out.append((rec, run["wall_s"], deepmark))
    return out


#: what a run left out (run_all.py --skip), as the lines of the runs name it
SKIPPED_PARTS = {"export": "the export", "onnx": "ONNX", "forward": "the forward timing"}


def _without(rec: dict) -> str:
    """``without the export, ONNX and the forward timing`` for a run that skipped them (a device session's): a
    default run, which has them, takes longer. Empty for a run that left nothing out."""
    skipped = [SKIPPED_PARTS.get(s, s) for s in ((rec.get("options") or {}).get("skipped") or [])]
    if not skipped:
        return ""
    return "without %s" % (", ".join(skipped[:-1]) + " and " + skipped[-1] if len(skipped) > 1 else skipped[0])


def time_lines(gpu: List[dict]) -> List[str]:
    """What the wall times in :func:`ran_lines` are, or that no row's time is known yet."""
    if not wall_estimates(gpu):
        return ["- **How long a row takes:** no finished GPU record of the full model yet, so no row's time is "
                "known."]
    return ["- **How long a row takes:** the times above: the notebook's whole run on `quick` (%s), and the "
            "`deepmark` preset (%s, the GPU default) estimated as that run with its timed pass replaced by one full "
            "epoch at its measured speed. A row not listed has no finished GPU record: its time is unknown, and "
            "slower frameworks take far longer." % (PRESETS["quick"].purpose, PRESETS["deepmark"].purpose)]


def before_you_rent(records: List[dict], records_dir: str, output: str,
                    latency: Optional[Dict[str, dict]] = None) -> List[str]:
    """The section's lines (README.md copies them); ``latency``: the cards' latency figures (runner/report/latency.py
    load_latency), for each card's fastest record's share of its roofline."""
    gpu = [r for r in records if is_gpu(r)]
    return [TITLE, ""] + ran_lines(gpu, records_dir, output) + fastest_lines(gpu, records_dir, output, latency or {}) \
        + never_lines(gpu) + cannot_lines() \
        + time_lines(gpu) + [
            "- **Run `python run_all.py --preset quick` first**: 5% of an epoch, enough for every row's speed, and "
            "its records say how long the full preset will take.", ""]
