"""results.md's data-parallel section: each W-worker record against the single-worker record with the same
global batch (:func:`report_section`)."""
from collections import OrderedDict
from typing import List, Optional

from common import parallel

from runner.report.records import preset_label
from runner.run.targets import MXNET_DP_MODES

#: the addresses tools/simulate_hosts.sh gives its hosts (its PREFIX): network namespaces on one machine
SIMULATED_PREFIX = "10.77.0."


# ---- results.md: W workers against one -------------------------------------------------------------------
def same_benchmark(other: dict, rec: dict) -> bool:
    """Whether ``other`` ran ok what ``rec`` ran: the same target, preset and data (:func:`preset_label`), scale,
    seed, precision, device and *global* batch size."""
    keys = ("target", "preset", "scale", "seed", "precision", "batch_size")
    return (other.get("status") == "ok" and all(other.get(k) == rec.get(k) for k in keys)
            and preset_label(other) == preset_label(rec)
            and (other.get("device") or {}).get("name") == (rec.get("device") or {}).get("name"))


def single_worker_twin(rec: dict, records: List[dict]) -> Optional[dict]:
    """The completed single-worker record ``rec`` (W workers) must equal (:func:`same_benchmark`)."""
    return next((other for other in records if (other.get("distributed") or {}).get("world_size", 1) == 1
                 and same_benchmark(other, rec)), None)


def equivalence_twin(rec: dict, records: List[dict]) -> Optional[dict]:
    """The completed record ``rec`` must equal: one worker with the global batch, or -- MXNet dist_sync -- the
    one-process run with each device's own BatchNorm statistics (``--mxnet-dp local``) of the same world size."""
    d = rec.get("distributed") or {}
    mode = d.get("mxnet_dp", "sync")
    if MXNET_DP_MODES.get(mode, {}).get("reference") == "single-worker":
        return single_worker_twin(rec, records)
    if mode != "dist_sync":
        return None
    return next((other for other in records if (other.get("distributed") or {}).get("mxnet_dp") == "local"
                 and (other.get("distributed") or {}).get("world_size") == d.get("world_size")
                 and same_benchmark(other, rec)), None)


def simulated(distributed: dict) -> bool:
    """Whether the run's hosts were tools/simulate_hosts.sh's network namespaces on one machine."""
    hosts = distributed.get("hosts") or []
    return bool(hosts) and all(str(h.get("host", "")).startswith(SIMULATED_PREFIX) for h in hosts)


def equivalence_rows(records: List[dict]) -> List[OrderedDict]:
    """One row per data-parallel record: how it ran, and its equivalence with one worker (computed here
    from the records, so a single-worker run made after the W-worker run counts too)."""
    rows = []
    for rec in records:
        d = rec.get("distributed") or {}
        if d.get("world_size", 1) < 2:
            continue
        twin = equivalence_twin(rec, records) if rec.get("status") == "ok" else None
        eq = parallel.equivalence(rec, twin) if twin else {}
        speed = (rec.get("timing") or {}).get("audio_s_per_s")
        single = single_worker_twin(rec, records)       # MXNet dist_sync's reference is W processes: not this
        speed1 = ((single or {}).get("timing") or {}).get("audio_s_per_s")
        rows.append(OrderedDict([
            ("Row", "%s %s%s" % (rec["target"], rec.get("precision") or "",
                                 " (%s)" % d["mxnet_dp"] if d.get("mxnet_dp", "sync") != "sync" else "")),
            ("Status", rec["status"]),
            ("Workers", d.get("world_size")),
            ("Hosts", "%d %shosts (%s)" % (len(d["hosts"]), "simulated " if simulated(d) else "",
                                           ", ".join("%s:%s" % (h["host"], h["processes"]) for h in d["hosts"]))
             if d.get("hosts") else "1"),
            ("Launcher", d.get("launcher")), ("Backend", d.get("backend")),
            ("Batch per worker / global", "%s / %s" % (d.get("per_worker_batch"), d.get("global_batch"))),
            ("BatchNorm sync", d.get("sync_batchnorm")),
            ("Audio s/s", speed), ("1 worker audio s/s", speed1),
            ("Max rel. diff, first %d losses" % parallel.EQUIVALENCE_STEPS, eq.get("loss_rel_diff")),
            ("Params rel. diff", eq.get("param_rel_diff")),
            ("Equivalent", ("pass" if eq["ok"] else "FAIL: " + eq.get("error", "")) if eq else
             ("the reference of dist_sync (each device its own BatchNorm statistics)" if d.get("mxnet_dp") == "local"
              else "no --mxnet-dp local record of %d workers" % d.get("world_size", 0)
              if d.get("mxnet_dp") == "dist_sync" else "no single-worker record with batch %s" % rec.get("batch_size"))
             if rec["status"] == "ok" else "%s: %s" % (rec["status"], rec.get("error"))),
        ]))
    return rows


def report_section(records: List[dict], md_table) -> List[str]:
    """results.md's data-parallel section (empty when no record ran with more than one worker)."""
    rows = equivalence_rows(records)
    if not rows:
        return []
    return ["## Data-parallel: W workers against one", "",
            "Each run with `--workers W` (per-worker batch b) against the single-worker run with batch W*b on "
            "the same benchmark and device: the largest relative difference of the first %d training losses "
            "(warm-up first), within %.0e, and of the trained parameters' summary after the epoch, within %.0e "
            "(float32 rounding grows over the epoch). The audio s/s columns are the scaling table: W workers "
            "against one; on a CPU the W processes share the same cores, so they prove the plumbing, not GPU "
            "scaling. MXNet `dist_sync` is compared with `--mxnet-dp local` (W devices in one process, each its own "
            "BatchNorm statistics, as dist_sync's workers have); its *1 worker audio s/s* is still the single "
            "process's. Simulated hosts: network namespaces on one machine (`tools/simulate_hosts.sh`), which "
            "prove the multi-host launch and its faults, not a network's speed."
            % (parallel.EQUIVALENCE_STEPS, parallel.EQUIVALENCE_RTOL, parallel.PARAM_RTOL), "",
            md_table(rows, {"Audio s/s": "{:.1f}", "1 worker audio s/s": "{:.1f}",
                            "Max rel. diff, first %d losses" % parallel.EQUIVALENCE_STEPS: "{:.1e}",
                            "Params rel. diff": "{:.1e}"})]
