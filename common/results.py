"""Result records: one JSON file per notebook run, and the table built from them.

A record is a JSON object with ``schema_version`` (see :data:`SCHEMA_VERSION`):

====================  ==================================================================
field                 content
====================  ==================================================================
status, error         "ok" / "failed" / "skipped"; a one-line reason when not ok
target                the row's id: framework plus variant/backend ("pytorch", "keras-jax")
framework, api,       human names: "PyTorch", "torch.nn", "cuDNN RNN"
variant
versions              framework, python, numpy and whatever else the notebook reports
device                {"type": "cpu"|"cuda", "name": ...}
environment           :func:`common.envinfo.collect` plus framework facts (cuDNN)
precision             fp32 / tf32 / bf16
preset, batch_size,   the benchmark setting; ``config`` is the DS2Config as a dict
scale, seed, config
data                  the iterator's facts and the checksum of what the pass consumed
checks                params, loss (first loss vs NumPy reference), checksum
timing, losses        :meth:`common.timing.BenchmarkTimer.summary`
flops                 training FLOPs of the timed pass, achieved FLOP/s, the measured matmul peak
                      and the efficiency (:func:`common.flops.flops_section`)
row_of_record         the framework's row of record a variant row belongs to (run_all.py)
memory                device_peak_bytes, host_peak_rss_bytes (the process at the record),
                      host_peak_rss_training_bytes (at the end of the timed pass)
options               framework switches the run used (torch.compile, hybridize, ...)
export                the canonical export of section 11 and its checks (:mod:`common.exports`)
onnx                  the ONNX export of section 11b, checked in onnxruntime (:mod:`common.onnx_check`)
run                   started/finished (UTC), notebook, command, git commit (run_all.py)
as_is                 true when the row ran in an interpreter as installed (``--use-installed``):
                      its versions (``run.installed``) are not the pins'
====================  ==================================================================

Records are written atomically: a temporary file in the same directory, renamed into
place, so a reader never sees half a record.  pandas is imported only where tables are
made, so notebooks (and CNTK's Python 3.6) write records without it.
"""
import datetime
import json
import math
import os
import tempfile
from typing import Dict, Iterable, List, Optional, Tuple

SCHEMA_VERSION = 1
STATUSES = ("ok", "failed", "skipped")


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def new_record(target: str, framework: str, api: str, variant: str = "", **fields) -> dict:
    """A record skeleton; ``fields`` fill or override any top-level field."""
    record = {
        "schema_version": SCHEMA_VERSION,
        "status": "ok",
        "error": None,
        "target": target,
        "framework": framework,
        "api": api,
        "variant": variant,
        "versions": {},
        "device": {},
        "environment": {},
        "precision": None,
        "preset": None,
        "batch_size": None,
        "scale": None,
        "seed": None,
        "config": {},
        "data": {},
        "checks": {},
        "timing": {},
        "losses": {},
        "memory": {},
        "options": {},
        "flops": {},
        "run": {"started": utc_now()},
    }
    record.update(fields)
    return record


def benchmark_record(target: str, framework: str, api: str, variant: str, preset, precision: str, seed: int,
                     iterator, timer, checks: dict, device: dict, versions: dict, memory: Optional[dict] = None,
                     options: Optional[dict] = None, environment: Optional[dict] = None,
                     peak: Optional[dict] = None, **sections) -> dict:
    """The record of a completed notebook run, from the objects every notebook has.

    ``preset``: the :class:`common.spec.Preset` run; ``iterator``: the
    :class:`common.data.DeepMarkIterator` after its timed pass; ``timer``: the
    :class:`common.timing.BenchmarkTimer`; ``versions``: framework facts (``framework`` at least);
    ``environment``: framework facts about the machine (CUDA, cuDNN) added to :func:`envinfo.collect`;
    ``peak``: the notebook's :func:`common.flops.measure_matmul_peak` (the record's ``flops`` section is
    computed from the configuration, the timed pass and this peak); ``sections``: further top-level
    sections (``profile``, ...).
    """
    import platform
    import numpy
    from . import envinfo
    from .flops import flops_section
    summary = timer.summary()
    theoretical = envinfo.cpu_theoretical_peak(precision) if (device or {}).get("type") == "cpu" else None
    mem = {"device_peak_bytes": None, "host_peak_rss_bytes": envinfo.host_peak_rss_bytes(),
           "host_peak_rss_training_bytes": timer.training_peak_rss}
    mem.update(memory or {})
    return new_record(
        target, framework, api, variant,
        versions=dict({"python": platform.python_version(), "numpy": numpy.__version__}, **versions),
        device=device, environment=envinfo.collect(environment), precision=precision,
        preset=preset.name, batch_size=preset.batch_size, scale=preset.scale, seed=seed,
        config=preset.config.to_dict(), data=dict(iterator.describe(), checksum=iterator.checksum),
        checks=checks, timing=summary["timing"], losses=summary["losses"], memory=mem, options=options or {},
        flops=flops_section(preset.config, timer.steps, timer.train_s, peak, theoretical), **sections)


def failed_record(target: str, status: str, error: str, **fields) -> dict:
    """A record for a run that did not produce numbers: status "failed" or "skipped", one-line reason."""
    if status not in ("failed", "skipped"):
        raise ValueError("a failed record's status is 'failed' or 'skipped', got %r" % (status,))
    record = new_record(target, fields.pop("framework", target), fields.pop("api", ""), **fields)
    record["status"] = status
    record["error"] = one_line(error)
    return record


def one_line(text: Optional[str], limit: int = 300) -> str:
    """The first non-empty line of ``text``, shortened to ``limit`` characters."""
    for line in (text or "").strip().splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[:limit - 1] + "\u2026"
    return "unknown error"


def _json_default(obj):
    # NumPy scalars and arrays without importing NumPy here
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError("not JSON serialisable: %r" % (type(obj),))


def _finite(obj):
    """JSON has no NaN/Infinity: write them as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def validate(record: dict) -> dict:
    """Raise ValueError if ``record`` is not a record of this schema."""
    if not isinstance(record, dict):
        raise ValueError("a record is a JSON object")
    if record.get("schema_version") != SCHEMA_VERSION:
        raise ValueError("record schema_version %r, expected %d" % (record.get("schema_version"), SCHEMA_VERSION))
    for key in ("status", "target", "framework"):
        if not record.get(key):
            raise ValueError("record has no %r" % key)
    if record["status"] not in STATUSES:
        raise ValueError("record status %r not one of %s" % (record["status"], ", ".join(STATUSES)))
    if record["status"] != "ok" and not record.get("error"):
        raise ValueError("a record that is not ok needs its reason in 'error'")
    return record


def write_record(path: str, record: dict) -> str:
    """Validate and write ``record`` as JSON atomically (temporary file + rename)."""
    validate(record)
    record.setdefault("run", {}).setdefault("finished", utc_now())
    text = json.dumps(_finite(json.loads(json.dumps(record, default=_json_default))), indent=1, sort_keys=False)
    atomic_write_text(path, text + "\n")
    return path


def atomic_write_text(path: str, text: str) -> None:
    """Write a text file atomically: a temporary file in the same directory, flushed to disk, then
    renamed into place -- a reader sees the old file or the new one, never half of one."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".partial", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)                       # mkstemp makes 0600 files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_record(path: str) -> dict:
    with open(path) as f:
        return validate(json.load(f))


def read_records(directory: str) -> List[dict]:
    """Every ``*.json`` record in ``directory`` (not recursive), sorted by file name."""
    records = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json") and not name.startswith("."):
            records.append(read_record(os.path.join(directory, name)))
    return records


def scan_records(directory: str) -> Tuple[List[dict], List[Tuple[str, str]]]:
    """Every ``*.json`` record of ``directory`` that reads as one (sorted by file name), and (path, why) for each
    that does not: invalid or truncated JSON, no ``status``, a schema this project does not write.  The report
    is made from the first and lists the second, so one bad file neither stops it nor goes unnoticed."""
    records, unreadable = [], []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json") and not name.startswith("."):
            path = os.path.join(directory, name)
            try:
                records.append(read_record(path))
            except (OSError, ValueError) as e:        # JSONDecodeError and UnicodeDecodeError are ValueErrors
                unreadable.append((path, one_line("%s" % (getattr(e, "strerror", None) or e), 200)))
    return records, unreadable


def load_records(directory: str):
    """The records of ``directory`` as a pandas DataFrame, nested fields flattened with dots
    (``timing.audio_s_per_s``); one row per record."""
    return records_frame(read_records(directory))


def records_frame(records: List[dict]):
    """Records already read, as the DataFrame of :func:`load_records`."""
    import pandas as pd
    if not records:
        return pd.DataFrame(columns=["target", "status"])
    return pd.json_normalize(records, max_level=2)


# ---- the comparison table -------------------------------------------------------------
#: (column title, record field, format) of the table of record, in order
TABLE_COLUMNS = [
    ("Framework", "framework", "{}"),
    ("API / variant", "api_variant", "{}"),
    ("Version", "version_text", "{}"),
    ("Device", "device.name", "{}"),
    ("Precision", "precision", "{}"),
    ("Preset", "preset", "{}"),
    ("Batch", "batch_size", "{:.0f}"),
    ("Audio h", "data.audio_hours", "{:.2f}"),
    ("Train s", "timing.train_s", "{:.1f}"),
    ("Audio s/s", "timing.audio_s_per_s", "{:.1f}"),
    ("Utt/s", "timing.utterances_per_s", "{:.2f}"),
    ("ms/step median", "timing.step_ms_median", "{:.1f}"),
    ("ms/step p90", "timing.step_ms_p90", "{:.1f}"),
    ("Fwd ms (1 s / 15 s)", "forward_ms_span", "{}"),
    ("Warm-up s", "timing.warmup_s", "{:.1f}"),
    ("Peak mem GiB", "peak_mem_gib", "{:.2f}"),
    ("Params", "checks.params.count", "{:,.0f}"),
    ("First-loss check", "loss_check", "{}"),
    ("Final loss", "losses.last", "{:.4f}"),
    ("Status", "status_text", "{}"),
    ("Notebook", "notebook_link", "{}"),
]


def _get(row, key):
    value = row.get(key) if hasattr(row, "get") else None
    if value is None:
        return None
    try:
        if isinstance(value, float) and math.isnan(value):
            return None
    except TypeError:
        pass
    return value


def _derived(row) -> Dict[str, Optional[str]]:
    api, variant = _get(row, "api") or "", _get(row, "variant") or ""
    rel, ok = _get(row, "checks.loss.rel_diff"), _get(row, "checks.loss.ok")
    fwd1, fwd15 = _get(row, "timing.forward_ms.1"), _get(row, "timing.forward_ms.15")
    peak = _get(row, "memory.device_peak_bytes")
    if peak is None and _get(row, "device.type") == "cpu":   # a CPU run's device memory is the host's: its peak
        peak = _get(row, "memory.host_peak_rss_training_bytes")   # through the warm-up and the timed pass (a
        if peak is None and not _get(row, "profile.tool"):         # profile after them can take far more: an
            peak = _get(row, "memory.host_peak_rss_bytes")         # older profiled record's peak is not shown
    status = _get(row, "status") or "?"
    version = _get(row, "versions.framework")
    return {
        "version_text": None if version is None else "%s%s" % (version, " (as installed)" if _get(row, "as_is")
                                                               else ""),
        "api_variant": api + (" / " + variant if variant else "") + (
            " / %d workers" % _get(row, "distributed.world_size") if (_get(row, "distributed.world_size") or 1) > 1
            else ""),
        "loss_check": None if rel is None else ("%s %.1e" % ("pass" if ok else "FAIL", rel)),
        "forward_ms_span": None if fwd1 is None else "%.1f / %s" % (fwd1, "-" if fwd15 is None else "%.1f" % fwd15),
        "peak_mem_gib": None if peak is None else peak / 2.0 ** 30,
        "status_text": _get(row, "status_override") or (
            status if status == "ok" else "%s: %s" % (status, _get(row, "error") or "no reason given")),
    }


def _cell(value, fmt: str) -> str:
    if value is None:
        return "\u2013"
    try:
        text = fmt.format(value)
    except (ValueError, TypeError):
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def table_rows(df) -> List[List[str]]:
    rows = []
    for _, row in df.iterrows():
        row = row.to_dict()
        row.update(_derived(row))
        rows.append([_cell(_get(row, key), fmt) for _, key, fmt in TABLE_COLUMNS])
    return rows


def render_markdown(df, columns: Optional[Iterable[str]] = None) -> str:
    """The comparison table in Markdown, one row per record; failed and skipped runs keep their row
    with the reason.  Rows are ordered ok first, then by audio seconds per second (fastest first)."""
    if len(df) == 0:
        return "_No result records._\n"
    df = df.copy()
    order = df["status"].map({"ok": 0, "failed": 1, "skipped": 2}).fillna(3)
    speed = df["timing.audio_s_per_s"] if "timing.audio_s_per_s" in df else order * 0
    df = df.assign(_order=order, _speed=-speed.fillna(0)).sort_values(["_order", "_speed", "target"], kind="stable")
    wanted = [c for c in TABLE_COLUMNS if columns is None or c[0] in set(columns)]
    header = "| " + " | ".join(title for title, _, _ in wanted) + " |"
    rule = "|" + "|".join("---" for _ in wanted) + "|"
    lines = [header, rule]
    all_titles = [title for title, _, _ in TABLE_COLUMNS]
    for cells in table_rows(df):
        chosen = [cells[all_titles.index(title)] for title, _, _ in wanted]
        lines.append("| " + " | ".join(chosen) + " |")
    return "\n".join(lines) + "\n"
