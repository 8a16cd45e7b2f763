"""results.md's last sections: the environments the records ran in, and which commands on which machines
made them."""
from collections import OrderedDict
from typing import List, Optional

from common import envinfo

from runner.report.records import _label, _number, preset_label


def environment_rows(records: List[dict]) -> List[OrderedDict]:
    rows = []
    for rec in records:
        env = rec.get("environment") or {}
        versions = rec.get("versions") or {}
        gpus = env.get("gpus") or []
        extra = ", ".join("%s %s" % (k, v) for k, v in sorted(versions.items())
                          if k not in ("framework", "python", "numpy") and v is not None)
        rows.append(OrderedDict([
            ("Row", _label(rec)), ("Preset", preset_label(rec)), ("Batch", rec.get("batch_size")),
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
                                      "last": run.get("finished"), "unnamed": ""})
        command = run.get("command") or ""
        if rec.get("as_is") and "use-installed" not in command and "DS2_USE_INSTALLED" not in command:
            entry["unnamed"] = (" with the frameworks as installed (`DS2_USE_INSTALLED`, which the commands kept "
                                "then did not name)")
        entry["rows"].append(_label(rec) + (" bs%s" % rec.get("batch_size") if rec.get("batch_size") else ""))
        commit = run.get("git_commit")
        short = commit[:12] + ("-dirty" if commit.endswith("-dirty") else "") if commit else None
        if short and short not in entry["commits"]:          # -dirty: made from a tree with uncommitted changes
            entry["commits"].append(short)
        entry["first"] = min(filter(None, [entry["first"], run.get("started")]), default=None)
        entry["last"] = max(filter(None, [entry["last"], run.get("finished")]), default=None)
    return [OrderedDict([("Command", "`%s`%s" % (cmd, e["unnamed"]) if cmd else None), ("Machine", machine),
                         ("Commits", ", ".join(e["commits"]) or None), ("Started", e["first"]),
                         ("Finished", e["last"]), ("Records", len(e["rows"])), ("Rows", ", ".join(e["rows"]))])
            for (cmd, machine), e in seen.items()]


def _machine() -> str:
    gpus = envinfo.gpus()
    return ", ".join(g.get("name", "?") for g in gpus) if gpus else "CPU only (%s)" % envinfo.cpu_model()
