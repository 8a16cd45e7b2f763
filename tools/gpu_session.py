#!/usr/bin/env python3
"""A device session in one prepared call: the GPU rows that fit a deadline, and everything they made, in at most
eight files under one folder.

    python3 tools/gpu_session.py --deadline-s 560 --out $OUT --wheelhouse .whl        # on the lent GPU machine
    .venvs/runner/bin/python tools/gpu_session.py --dry-run --out /tmp/session \\
        --python .venvs/pytorch-cpu/bin/python --rows pytorch:fp32                    # the same on this CPU

In order, under its own deadline (``--deadline-s`` from its start; :data:`RESERVE_S` of it kept for the end):

1. the versions and clocks: ``nvidia-smi -q`` (``nvidia-smi.txt``) and the frameworks' versions in the interpreter
   that runs the rows (``versions.json``, with the GPU's clocks from ``nvidia-smi --query-gpu``);
2. ``benchmarks/rnn_latency.py --out`` (``latency.json``: the recurrence's latency, about 30 s on a GPU), where
   ``results/latency`` has no figures for the card (``--latency``: measured again; ``--no-latency``: never);
3. each row of ``--rows`` (ROW:PRECISION, in order) as ``run_all.py --use-installed ... --skip export,onnx,forward
   --frameworks ROW --precision PRECISION --preset quick --timeout <seconds left>``: in the interpreter ``--python``
   as it is installed, through ``tools/installed_offline.sh`` when ``--wheelhouse`` carries what the runner needs,
   else with the runner in this interpreter (``DS2_RUNNER=current``).  A row starts only when its estimate
   (:func:`estimate`) fits in the seconds left; one still running at the deadline gets SIGTERM (run_all.py records
   it as terminated and stops its kernel), then SIGKILL, its process group and every process that carries the
   session's marker variable (a run_all.py that needed the SIGKILL wrote nothing: its row's record is the one it
   prepared at the start, :mod:`runner.run.staging`).  After each row its record, executed notebook, logs and
   autotuning results are appended to ``session.tar`` (a copy made whole, then renamed: a killed call still
   returns every row that finished) and a line to ``summary.tsv``.  A signal to the session (the device tool's
   SIGTERM at the call's limit, Ctrl-C) stops the row in flight, which is then kept as one stopped at the
   deadline is; no row starts after it, and the exit status is 128 + the signal.  Two rows in a row that fail with
   the same note (a wheelhouse or an interpreter that serves no row) end the rows.

Every row's warm-up is a first run's on this card: the JAX and Keras-on-JAX rows compile with a JAX compilation
cache of their own (``JAX_COMPILATION_CACHE_DIR``, empty at the start: no program and no autotuning of an earlier
row is reused), and read the card's XLA autotuning results (common/xla_autotune.py) from the session's copy of
``results/autotune`` (``DS2_XLA_AUTOTUNE_RESULTS_DIR``). Each row has XLA write its own results
(``DS2_XLA_AUTOTUNE_DUMP_DIR``; the JAX notebook then compiles one program at a time, as each compilation writes the
whole file); they go into the tarball and are merged into the session's copy, so that a later row reads them as a
later run reads them once they are imported and committed. A JAX or Keras-on-JAX row named twice in ``--rows`` runs
twice: the second run writes no results, so its warm-up is what a first run on this card takes once the first run's
results are committed (the default rows run the first JAX row of record twice). ``--no-autotune-dump``: no row
whose committed run on this card wrote the card's results writes them again (a call made after the results of an
earlier one were imported: its rows compile on every core), a JAX row without such a run still writes them (its
warm-up is a cold one anyway), and no row runs twice.  The newest run of a row is its row:
``tools/import_session.py`` keeps its record, unless it failed where an earlier one ran ok; ``summary.tsv`` and
``session.log`` have both.

What comes back (:data:`OUT_FILES`, six files, five without the latency step): ``session.tar`` (``records/``, ``notebooks/``, ``logs/``,
``latency/``, ``autotune/``: ``tools/import_session.py`` brings it into a results directory, where
``python -m runner.report --results-dir`` reads it),
``summary.tsv`` (:data:`COLUMNS`), ``latency.json``, ``versions.json``, ``nvidia-smi.txt`` and ``session.log``
(what started, what was not started and why).

``--dry-run``: the same code path on the CPU (``--device cpu``, the smoke preset, estimates from the CPU records):
the deadline, the tarball, the TSV, ``--skip``, ``--use-installed`` with the runner in this interpreter.
``nvidia-smi`` is read where it is on PATH (a test puts a fake one there) and not required.

Standard library only (the image's ``python3`` has no papermill); exit status 0 when every started row is ok, 1
when one is not or none started, 2 for bad input (one line).
"""
import argparse
import glob
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common import envinfo, xla_autotune  # noqa: E402  (standard library only, as are those below)
from common.spec import PRECISIONS, PRESETS, get_preset  # noqa: E402
from runner.dp import host_agent  # noqa: E402
from runner import validate  # noqa: E402
from runner.run.targets import ALL_TARGETS  # noqa: E402
from runner.run import staging  # noqa: E402

PROG = "gpu_session.py"
#: the rows worth a lent GPU, in order of value (TensorFlow, MXNet and CNTK cannot run on its image): after JAX's
#: fp32 row, its three variants that aim at its speed on a GPU (both directions in one scan, the input products and
#: dL/dU out of it: the chain of dependent steps halved, and on a CPU the whole model 3.2 x faster; the input
#: products out of the scans alone: 2.2 x on a CPU; the scans' loops in CUDA graphs); last, the PyTorch variants,
#: short rows that fill what the others leave.  First the one that runs a layer's two directions as one recurrence
#: inside the CUDA graphs, fp32 first: by the H100's and the H200's latency figures cuDNN's bidirectional step took
#: 51 us at fp32, one direction 35, where one step of the chain replayed from a graph took 18 (so even at fp32, where
#: cuDNN overlaps the directions, its steps are slow), and at tf32 and bf16 it runs the directions one after the
#: other (41-46 us against 9-14); at fp32 the fastest PyTorch row so far reached 56 % of the latency-aware roofline
#: (tf32 51 %, bf16 66 %: the H100's pytorch+graphs), and a row's first record gives its other precisions their
#: estimates (in the next call, once imported).  Then the graphs alone at bf16 and tf32 (2.8 x and 1.2 x the row of
#: record on the H100), then the batched recurrence eager, whose launches (an eager chain step took 37-66 us) would
#: set its pace.  The first JAX row of record is run twice (:func:`with_repeat`)
DEFAULT_ROWS = ("pytorch:fp32,pytorch:tf32,pytorch:bf16,jax:fp32,jax+bidir2:fp32,jax+hoist:fp32,jax+graphs:fp32,"
                "jax:tf32,jax:bf16,keras-jax:fp32,keras-jax:tf32,keras-jax:bf16,keras-torch:fp32,"
                "pytorch+bidir2+graphs:fp32,pytorch+bidir2+graphs:bf16,pytorch+bidir2+graphs:tf32,"
                "pytorch+graphs:bf16,pytorch+graphs:tf32,pytorch+bidir2:tf32,pytorch+bidir2:bf16")
#: what a device session leaves out of every notebook (run_all.py --skip): nothing the GPU adds to
SKIP = "export,onnx,forward"
#: seconds between SIGTERM and SIGKILL for a row past the deadline (run_all.py stops its kernel in seconds)
GRACE_S = 10
#: seconds of the deadline kept for the end: a killed row's grace twice over (its process group, then what carries
#: the marker), the last append, the clocks after the rows
RESERVE_S = 2 * GRACE_S + 10
#: the shortest --deadline-s: the reserve and 10 s for the first step (the versions, then a row given a short
#: --estimate); a deadline within the reserve would start nothing and still write the session's files
MIN_DEADLINE_S = RESERVE_S + 10
#: the estimate of a row: MARGIN x the run's wall seconds (run.wall_s of a committed record: papermill's run of
#: the notebook, with the export, ONNX and forward timing it then had) + START_S (run_all.py's own start: the
#: interpreter's preflight imports each framework, the runner builds the data iterator for its checksum; the
#: wheelhouse route re-checks .venvs/installed).  MARGIN covers another card of the same kind (an H100's slower
#: memory against the H200 records) and a machine that starts slower.
MARGIN = 1.15
START_S = 20
#: the latency benchmark's estimate: about 30 s on a GPU (docs/benchmark.md), a few on a CPU at --smoke
LATENCY_S = {"cuda": 60, "cpu": 30}
#: run.wall_s where no committed record of the row ran ok, per (preset, device type): stated, conservative
DEFAULT_WALL_S = {
    ("quick", "cuda"): {
        # the H200's first jax fp32 row (2026-11-26, interrupted in its forward timing): 323 s of cells up to the
        # timed epoch (warm-up 249 s, 15 XLA compilations one after another 229 s of it; epoch 56 s); its committed
        # record (2026-11-27, every shape compiled ahead of time on 16 threads) says 319 s
        "jax": 340,
        "jax+bidir2": 340,      # no GPU record: hoist's programs with both directions in one scan
        "jax+hoist": 340,       # no GPU record: the row of record's programs with the input products out of the scan
        "keras-jax": 340,       # no GPU record: XLA compiles the same 15 shapes (on a CPU its warm-up is jax's)
        "keras-torch": 400,     # no GPU record: eager, SimpleRNN a Python loop over the steps; the longest guess
        "pytorch": 120,         # the first H200 run (2026-11-26): 94 s with the export, ONNX and forward timing;
                                # the device sessions' records 44-65 s without them
        "pytorch+bidir2+graphs": 90,    # no GPU record: pytorch+graphs's took 33-70 s, pytorch+bidir2's 68 s
    },
    ("smoke", "cpu"): {"pytorch": 60, "jax": 160, "keras-jax": 160, "keras-torch": 60},
}
#: a row without a record and without a default above
UNKNOWN_WALL_S = 480
#: a variant that compiles its row of record's programs: estimated as that row where it has no record of its own,
#: as that row's first run on the card (whether the row of record's autotuning results serve it is not measured:
#: XLA should put the loops into command buffers after it has autotuned the fusions, so the same HLO would be tuned
#: the same; until a GPU run of the variant says so, it gets the cold estimate)
SAME_PROGRAMS = {"jax+graphs": "jax"}
#: a row's second run reads the autotuning results its first run wrote: its estimate is the first run's wall
#: seconds with this share of its warm-up (on the H100, three shapes compiled in 4.5 s with the results read against
#: 63.2 s writing them, 7 %: twice that leaves room for what the first run's file lacks; MARGIN comes on top)
REPEAT_WARMUP_SHARE = 0.15
#: the rows' environment that runs XLA: a row of it may be named twice (its second run reads the first's results)
XLA_ENV = "jax"
#: summary.tsv's columns
COLUMNS = ("row", "precision", "card", "status", "audio_s_per_s", "warmup_s", "compile_s", "rnn_dtype", "peak_gib",
           "first_loss", "last_loss", "wall_s", "estimate_s", "note")
#: every file the session writes under --out (the device tool returns at most 8)
OUT_FILES = ("session.tar", "summary.tsv", "latency.json", "versions.json", "nvidia-smi.txt", "session.log")
MAX_OUT_FILES = 8
#: the variable every process of a row carries (its value: the session's id): what outlives a kill is found by it
MARKER = "DS2_GPU_SESSION"
#: the packages versions.json lists (importlib.metadata, nothing imported)
PACKAGES = ("torch", "jax", "jaxlib", "flax", "optax", "keras", "numpy", "onnx", "onnxruntime", "onnxscript",
            "jax2onnx", "ipykernel", "papermill", "nbclient", "jupyter_client")


# ---- estimates and the deadline ---------------------------------------------------------------------------------
def ok_records(records_dir: str, preset: str, batch_size: int) -> List[Tuple[str, dict]]:
    """(path, record) of every record in ``records_dir`` that ran ok on one process with this preset, batch size
    and the preset's scale; an unreadable file is left out."""
    out = []
    scale = get_preset(preset).scale
    for path in sorted(glob.glob(os.path.join(records_dir, "*.json"))):
        try:
            with open(path) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        if (isinstance(rec, dict) and rec.get("status") == "ok" and rec.get("preset") == preset
                and rec.get("batch_size") == batch_size and rec.get("scale") == scale and not rec.get("distributed")):
            out.append((path, rec))
    return out


def committed_walls(records: List[Tuple[str, dict]], target: str, precision: str,
                    device_type: str) -> List[Tuple[float, str]]:
    """(run.wall_s, file name) of every record of ``records`` (:func:`ok_records`: ok, one process, this preset
    and batch size) of this row with this precision on this kind of device."""
    out = []
    for path, rec in records:
        wall = (rec.get("run") or {}).get("wall_s")
        if (rec.get("target") == target and rec.get("precision") == precision
                and (rec.get("device") or {}).get("type") == device_type and isinstance(wall, (int, float))):
            out.append((float(wall), os.path.basename(path)))
    return out


def autotuned_run(records: List[Tuple[str, dict]], target: str, precision: str, card: str,
                  autotune_dir: str) -> Optional[Tuple[float, float, str]]:
    """(run.wall_s, warm-up s, file name) of the longest run among ``records`` (:func:`ok_records`) of this row on
    this card that wrote XLA's autotuning results (``options.xla_autotune.written``), where the card's file for
    that run's jaxlib is in ``autotune_dir``: the next run of the row reads those results and autotunes little;
    else None."""
    found = []
    for path, rec in records:
        tuned = (rec.get("options") or {}).get("xla_autotune") or {}
        wall, warmup = (rec.get("run") or {}).get("wall_s"), (rec.get("timing") or {}).get("warmup_s")
        jaxlib = tuned.get("jaxlib")                    # the JAX notebook's and the Keras notebook's on JAX
        if (rec.get("target") == target and rec.get("precision") == precision
                and (rec.get("device") or {}).get("name") == card and tuned.get("written")
                and isinstance(wall, (int, float)) and isinstance(warmup, (int, float)) and jaxlib
                and os.path.isfile(xla_autotune.results_file(jaxlib, card, autotune_dir))):
            found.append((float(wall), float(warmup), os.path.basename(path)))
    return max(found) if found else None


def estimate(target: str, precision: str, preset: str, batch_size: int, device_type: str,
             records_dir: str = os.path.join(ROOT, "results", "records"), card: Optional[str] = None,
             autotune_dir: str = xla_autotune.RESULTS_DIR) -> Tuple[int, str]:
    """Seconds the row is expected to take, and where the figure comes from.  With ``card``, a committed run of
    this row on it that wrote XLA's autotuning results, now in the card's file (:func:`autotuned_run`): its wall
    seconds with :data:`REPEAT_WARMUP_SHARE` of its warm-up, as a row's second run in a session.  Else the longest
    run.wall_s of the committed records of this row (:func:`committed_walls`); else of its fp32 row (the same
    shapes, the same compilations); else, for a variant of :data:`SAME_PROGRAMS`, its row of record's estimate;
    else :data:`DEFAULT_WALL_S` (:data:`UNKNOWN_WALL_S` for a row it lacks).  Then ``ceil(MARGIN x wall +
    START_S)``."""
    records = ok_records(records_dir, preset, batch_size)          # read once
    tuned = autotuned_run(records, target, precision, card, autotune_dir) if card else None
    if tuned:
        wall, warmup, name = tuned
        return read_results_estimate(wall, warmup), ("%s: run.wall_s %.0f s, warm-up %.0f s taken at %d %%: this "
                                                     "card's autotuning results cover it"
                                                     % (name, wall, warmup, round(100 * REPEAT_WARMUP_SHARE)))
    for prec in (precision, "fp32"):
        walls = committed_walls(records, target, prec, device_type)
        if walls:
            wall, name = max(walls)
            source = "%s: run.wall_s %.0f s" % (name, wall) + ("" if prec == precision else " (its fp32 row)")
            break
    else:
        if target in SAME_PROGRAMS:         # its row of record's first run on the card: no autotuning results
            est, source = estimate(SAME_PROGRAMS[target], precision, preset, batch_size, device_type, records_dir)
            return est, "no record: %s's, whose programs it compiles (%s)" % (SAME_PROGRAMS[target], source)
        table = DEFAULT_WALL_S.get((preset, device_type), {})
        wall = table.get(target, UNKNOWN_WALL_S)
        source = "no record: the default %d s" % wall
    return int(math.ceil(MARGIN * wall + START_S)), source


def first_on_card(target: str, precision: str, card: str, preset: str, batch_size: int,
                  records_dir: str = os.path.join(ROOT, "results", "records"),
                  autotune_dir: str = xla_autotune.RESULTS_DIR) -> bool:
    """Whether a JAX or Keras-on-JAX row has no committed run on this card that wrote XLA's autotuning results into
    the card's file (:func:`autotuned_run`): under ``--no-autotune-dump`` it still writes them, since its warm-up is
    a cold one anyway and the next session would pay its autotuning again."""
    return ALL_TARGETS[target].env == XLA_ENV and autotuned_run(ok_records(records_dir, preset, batch_size), target,
                                                                precision, card, autotune_dir) is None


def gaps_first(rows: List[Tuple[str, str]], card: str, preset: str, batch_size: int,
               records_dir: str = os.path.join(ROOT, "results", "records")) -> List[Tuple[str, str]]:
    """The default rows, those without a committed record that ran ok on this card (its name, as the records give
    it) with this preset and batch size, and whose warm-up is the one a run there gets (:func:`warmed_as_kept`),
    first, each group in its order: a session fills the table's gaps before it measures a row again."""
    done = {(rec.get("target"), rec.get("precision")) for _, rec in ok_records(records_dir, preset, batch_size)
            if (rec.get("device") or {}).get("name") == card and warmed_as_kept(rec)}
    return [r for r in rows if r not in done] + [r for r in rows if r in done]


def warmed_as_kept(rec: dict) -> bool:
    """Whether a record's warm-up is what a run on its card gets with the project's autotuning results: so for every
    row but those of JAX and Keras on JAX on a GPU, whose run must have read the card's results
    (``options.xla_autotune``: a file loaded, with entries) and autotuned nothing they lacked (it wrote no more
    entries than it read, where it wrote: XLA writes every result it holds).  A JAX row's first run on a card, which
    writes them, measures its speed but not that warm-up: its row stays a gap until a run reads them."""
    row = ALL_TARGETS.get(rec.get("target"))
    if row is None or row.env != XLA_ENV or (rec.get("device") or {}).get("type") != "cuda":
        return True
    tuned = (rec.get("options") or {}).get("xla_autotune") or {}
    entries, written = tuned.get("entries") or 0, tuned.get("written")
    return bool(tuned.get("loaded")) and entries > 0 and not (isinstance(written, int) and written > entries)


def default_session_rows(rows: List[Tuple[str, str]], card: str, preset: str, batch_size: int, no_autotune_dump: bool,
                         records_dir: str = os.path.join(ROOT, "results", "records")) -> List[Tuple[str, str]]:
    """The default rows as a session runs them: this card's gaps first (:func:`gaps_first`), and the first JAX row
    of record twice (:func:`with_repeat`) unless ``--no-autotune-dump``, where no first run writes what a second
    would read."""
    rows = gaps_first(rows, card, preset, batch_size, records_dir)
    return rows if no_autotune_dump else with_repeat(rows)


def with_repeat(rows: List[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """The rows with the first JAX or Keras-on-JAX row of record (not a variant) named twice, next to itself, unless
    a row is named twice already."""
    xla = [r for r in rows if ALL_TARGETS[r[0]].env == XLA_ENV and "+" not in r[0]]
    if not xla or validate.first_repeated(rows) is not None:
        return list(rows)
    i = rows.index(xla[0])
    return rows[:i + 1] + [xla[0]] + rows[i + 1:]


def repeat_estimate(first: dict) -> Optional[Tuple[int, str]]:
    """A row's second run: ``ceil(MARGIN x (wall - (1 - REPEAT_WARMUP_SHARE) x warm-up) + START_S)`` from its first
    run in this session (summary.tsv's values); None where the first run left no wall or warm-up seconds."""
    wall, warmup = first.get("wall_s"), first.get("warmup_s")
    if not isinstance(wall, (int, float)) or not isinstance(warmup, (int, float)):
        return None
    return read_results_estimate(wall, warmup), ("this session's first run: %.0f s, warm-up %.0f s, taken at %d %%"
                                                 % (wall, warmup, round(100 * REPEAT_WARMUP_SHARE)))


def read_results_estimate(wall: float, warmup: float) -> int:
    """The estimate of a run that reads the autotuning results an earlier run of its row wrote: ``ceil(MARGIN x
    (wall - (1 - REPEAT_WARMUP_SHARE) x warm-up) + START_S)`` from that run's wall and warm-up seconds."""
    return int(math.ceil(MARGIN * max(0.0, wall - (1 - REPEAT_WARMUP_SHARE) * min(warmup, wall)) + START_S))


def fits(estimate_s: float, left_s: float) -> bool:
    """A row starts only when its estimate fits in the seconds left."""
    return estimate_s <= left_s


class Deadline:
    """Seconds left until the rows must be done: ``deadline_s`` from the start, less :data:`RESERVE_S`."""

    def __init__(self, deadline_s: float, reserve_s: float = RESERVE_S, clock=time.monotonic):
        self.clock = clock
        self.start = clock()
        self.end = self.start + deadline_s - reserve_s

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return max(0.0, self.end - self.clock())


# ---- processes ----------------------------------------------------------------------------------------------------
def marked_processes(value: str, name: str = MARKER) -> List[int]:
    """Live processes whose environment holds ``name=value`` (a /proc scan; kernels start sessions of their own)."""
    return host_agent.marked(value, name)


def stop(proc: subprocess.Popen, marker: str, grace: float = GRACE_S) -> None:
    """SIGTERM to the child's process group and to every marked process, SIGKILL to what is left after ``grace``
    seconds (runner/dp/host_agent.py's ``stop_all``); the child reaped."""
    host_agent.stop_all([proc], marker, grace, name=MARKER)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass


def run_until(cmd: List[str], env: Dict[str, str], log_path: str, seconds: float, marker: str,
              grace: float = GRACE_S) -> Tuple[Optional[int], bool]:
    """Run ``cmd`` in a process group of its own, its output to ``log_path``, for at most ``seconds``: (its exit
    status, whether it was stopped at the deadline).  Nothing marked with ``marker`` outlives it."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=os.setpgrp)
        CURRENT["proc"] = proc
        try:
            proc.wait(timeout=max(0.0, seconds))
            killed = CURRENT["signum"] is not None      # the session's signal handler stopped it
        except subprocess.TimeoutExpired:
            killed = True
        finally:
            stop(proc, marker, grace)       # a finished row: its leftovers, if any (a kernel in its own session)
            CURRENT["proc"] = None
    return proc.returncode, killed


#: the row's process while it runs (a signal to the session stops it), and the signal that stopped the session: the
#: row it stopped is collected like one stopped at the deadline, and no row starts after it
CURRENT = {"proc": None, "marker": None, "signum": None}


# ---- what comes back ----------------------------------------------------------------------------------------------
class Out:
    """The --out folder: the session's own files only (:data:`OUT_FILES`)."""

    def __init__(self, directory: str):
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        self.path = {name: os.path.join(directory, name) for name in OUT_FILES}
        with tarfile.open(self.path["session.tar"], "w"):
            pass
        with open(self.path["summary.tsv"], "w") as f:
            f.write("\t".join(COLUMNS) + "\n")
        open(self.path["session.log"], "w").close()

    def log(self, clock: Deadline, text: str) -> None:
        line = "[%6.1f s] %s" % (clock.elapsed(), text)
        print(line, flush=True)
        with open(self.path["session.log"], "a") as f:
            f.write(line + "\n")

    def append_tar(self, members: List[Tuple[str, str]]) -> None:
        """Append (path, name in the archive) to session.tar: on a copy, renamed over it once whole."""
        members = [(p, n) for p, n in members if os.path.isfile(p)]
        if not members:
            return
        tar = self.path["session.tar"]
        partial = tar + ".partial"
        shutil.copyfile(tar, partial)
        with tarfile.open(partial, "a") as t:
            for path, name in members:
                t.add(path, arcname=name)
        os.replace(partial, tar)

    def tsv(self, values: Dict[str, object]) -> None:
        def cell(v):
            if v is None:
                return ""
            if isinstance(v, float):
                return "%.6g" % v
            return str(v).replace("\t", " ").replace("\n", " ")
        with open(self.path["summary.tsv"], "a") as f:
            f.write("\t".join(cell(values.get(c)) for c in COLUMNS) + "\n")


def record_columns(rec: dict) -> Dict[str, object]:
    """summary.tsv's columns from a record: card, status, throughput, warm-up, compile seconds (the JAX notebook's
    ``options.xla_compilations``: every program XLA built, ``compile_s``, else the warm-up's, ``warmup_compile_s``),
    the RNN's dtype (``options.rnn_dtype``), the device's peak memory, the first and last loss, the run's wall
    seconds."""
    timing, options = rec.get("timing") or {}, rec.get("options") or {}
    xla = options.get("xla_compilations") if isinstance(options.get("xla_compilations"), dict) else {}
    compile_s = xla.get("compile_s", xla.get("warmup_compile_s"))
    peak = (rec.get("memory") or {}).get("device_peak_bytes")
    losses = rec.get("losses") or {}
    return {"card": (rec.get("device") or {}).get("name"), "status": rec.get("status"),
            "audio_s_per_s": timing.get("audio_s_per_s"), "warmup_s": timing.get("warmup_s"), "compile_s": compile_s,
            "rnn_dtype": options.get("rnn_dtype"), "peak_gib": peak / 2.0 ** 30 if peak else None,
            "first_loss": losses.get("first"), "last_loss": losses.get("last"),
            "wall_s": (rec.get("run") or {}).get("wall_s"), "note": rec.get("error")}


def last_line(path: str, prefix: str = "run_all.py: ") -> Optional[str]:
    """The last line of a log that starts with ``prefix`` (run_all.py's one-line refusals and reasons)."""
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return None
    mine = [line for line in lines if line.startswith(prefix)]
    return (mine or lines or [None])[-1]


# ---- the steps ------------------------------------------------------------------------------------------------------
def capture(cmd: List[str], timeout: float = 60) -> str:
    """A command's output, or a line saying why there is none."""
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                           timeout=timeout)
        return p.stdout if p.returncode == 0 else "%s exited with %d:\n%s" % (cmd[0], p.returncode, p.stdout)
    except FileNotFoundError:
        return "%s: not found\n" % cmd[0]
    except (OSError, subprocess.TimeoutExpired) as e:
        return "%s: %s\n" % (cmd[0], e)


GPU_QUERY = ("name,driver_version,memory.total,compute_cap,pstate,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,"
             "power.draw,power.limit,temperature.gpu")
VERSIONS_SCRIPT = r"""
import json, platform, sys
from importlib.metadata import PackageNotFoundError, distributions, version
out = {"python": platform.python_version(), "executable": sys.executable, "packages": {}}
for name in sys.argv[1].split(","):
    try:
        out["packages"][name] = version(name)
    except PackageNotFoundError:
        out["packages"][name] = None
out["cuda_wheels"] = sorted(set("%s %s" % (d.metadata["Name"], d.version) for d in distributions()
                                if (d.metadata["Name"] or "").lower().startswith(("jax-cuda", "nvidia-cudnn"))))
try:
    import torch
    out["torch_cuda"] = torch.version.cuda
    out["torch_cudnn"] = torch.backends.cudnn.version() if torch.cuda.is_available() else None
    out["torch_sees_gpu"] = torch.cuda.is_available()
except Exception as e:
    out["torch_error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(out))
"""


def versions(python: str, when: str, out: Out, clock: Deadline, facts: dict) -> None:
    """nvidia-smi -q into nvidia-smi.txt (``when``: before or after the rows) and, before, the interpreter's
    versions; both times the GPU's clocks (``--query-gpu``) into versions.json."""
    smi = capture(["nvidia-smi", "-q"])
    with open(out.path["nvidia-smi.txt"], "a") as f:
        f.write("==== nvidia-smi -q, %s the rows (%.0f s into the session)\n%s\n" % (when, clock.elapsed(), smi))
    facts["gpu_" + when] = capture(["nvidia-smi", "--query-gpu=" + GPU_QUERY, "--format=csv"]).strip().splitlines()
    if when == "before":
        text = capture([python, "-c", VERSIONS_SCRIPT, ",".join(PACKAGES)], timeout=120).strip()
        try:
            facts["interpreter"] = json.loads(text.splitlines()[-1])
        except (ValueError, IndexError):
            facts["interpreter"] = {"error": text[-2000:]}
    with open(out.path["versions.json"], "w") as f:
        json.dump(facts, f, indent=1, sort_keys=True)


def committed_latency(card: str, results_dir: str = os.path.join(ROOT, "results")) -> Optional[str]:
    """The card's committed latency figures (``results/latency/<card>.json``, which results.md reads), or None."""
    path = os.path.join(results_dir, "latency", envinfo.device_slug(card) + ".json")
    return path if os.path.isfile(path) else None


def latency(args, out: Out, clock: Deadline, env: Dict[str, str], scratch: str, card: Optional[str] = None) -> None:
    """Step 2: benchmarks/rnn_latency.py, where asked (``--latency``) or where the card has no committed figures
    (``--no-latency``: never): the rows get the seconds a card's second measurement would take."""
    if args.no_latency:
        out.log(clock, "latency: not run (--no-latency)")
        return
    committed = committed_latency(card) if card and not args.latency else None
    if committed:
        out.log(clock, "latency: not run: %s holds this card's figures (--latency measures them again)"
                % os.path.relpath(committed, ROOT))
        return
    device = "cpu" if args.dry_run else "cuda"
    est = LATENCY_S[device]
    if not fits(est, clock.left()):
        out.log(clock, "latency: not started: estimate %d s > %.0f s left" % (est, clock.left()))
        return
    cmd = [args.python, os.path.join("benchmarks", "rnn_latency.py"), "--device", device,
           "--out", out.path["latency.json"]] + (["--smoke"] if args.dry_run else [])
    log = os.path.join(scratch, "rnn_latency.log")
    out.log(clock, "latency: %s" % " ".join(cmd))
    t0 = time.monotonic()
    code, killed = run_until(cmd, env, log, clock.left(), env[MARKER])
    out.log(clock, "latency: %s in %.0f s" % ("stopped at the deadline" if killed else "exit %s" % code,
                                              time.monotonic() - t0))
    out.append_tar([(out.path["latency.json"], "latency/rnn_latency.json"), (log, "logs/rnn_latency.log")])


def row_command(args, target: str, precision: str, results_dir: str, timeout_s: int) -> List[str]:
    """run_all.py for one row: through tools/installed_offline.sh with --wheelhouse (its .venvs/installed holds the
    runner's packages), else in this interpreter with --use-installed ENV=--python."""
    options = ["--frameworks", target, "--precision", precision, "--preset", args.preset, "--skip", SKIP,
               "--device", "cpu" if args.dry_run else "cuda", "--results-dir", results_dir,
               "--timeout", str(max(1, timeout_s)), "--no-progress"]
    if args.batch_size:
        options += ["--batch-size", str(args.batch_size)]
    if args.wheelhouse:
        return ["bash", os.path.join("tools", "installed_offline.sh"), args.wheelhouse, args.python] + options
    env_name = ALL_TARGETS[target].env
    return [sys.executable, "run_all.py", "--use-installed", "%s=%s" % (env_name, args.python)] + options


def session_autotune(card: str, scratch: str, directory: str = xla_autotune.RESULTS_DIR) -> str:
    """The session's copy of the project's autotuning results for this card (``directory``'s
    ``jax-*/<card>.textproto``), which its rows read and their results are merged into; its path."""
    copy = os.path.join(scratch, "autotune-results")
    for path in glob.glob(os.path.join(directory, "jax-*", envinfo.device_slug(card) + xla_autotune.SUFFIX)):
        there = os.path.join(copy, os.path.relpath(path, directory))
        os.makedirs(os.path.dirname(there), exist_ok=True)
        shutil.copyfile(path, there)
    os.makedirs(copy, exist_ok=True)
    return copy


def merge_dumps(dumps: List[Tuple[str, str]], copy: str) -> List[str]:
    """A row's autotuning results ((path, jax-<jaxlib>/<card>.<tag>.textproto) each) merged into the session's copy
    (:func:`session_autotune`) for the rows after it (:func:`xla_autotune.merge_into`); a line per card file
    written (what it holds now) and per result left out (why)."""
    members = []
    for path, name in dumps:
        with open(path, errors="replace") as f:
            members.append((name, f.read()))
    written, left_out = xla_autotune.merge_into(copy, members)
    return (["%s: %d entries for the rows after this one" % (os.path.relpath(p, copy).replace(os.sep, "/"),
                                                              xla_autotune.count_file(p)) for p in written]
            + ["left out: %s" % why for why in left_out])


def run_row(args, target: str, precision: str, out: Out, clock: Deadline, env: Dict[str, str], scratch: str,
            card: str, earlier: Optional[List[dict]] = None) -> Optional[str]:
    """One row: started if its estimate fits, stopped at the deadline; its files into the tarball, its autotuning
    results into the session's copy (``env``'s :data:`xla_autotune.RESULTS_ENV`, where set) and its line into
    summary.tsv.  ``earlier``: this row's earlier runs in the session (their summary.tsv values); the values of
    this run are appended.  Returns its status."""
    earlier = [] if earlier is None else earlier
    run = len(earlier) + 1
    preset = get_preset(args.preset)
    batch = args.batch_size or preset.batch_size
    given = dict(args.estimate)
    repeat = repeat_estimate(earlier[0]) if earlier else None
    if (target, precision) in given:
        est, source = given[(target, precision)], "given"
    elif repeat:
        est, source = repeat
    else:
        est, source = estimate(target, precision, args.preset, batch, "cpu" if args.dry_run else "cuda", card=card)
    line = {"row": target, "precision": precision, "card": card, "estimate_s": est}
    label = "%s %s%s" % (target, precision, " (run %d)" % run if run > 1 else "")
    left = clock.left()
    if not fits(est, left):
        note = "not started: estimate %d s (%s) > %.0f s left" % (est, source, left)
        out.log(clock, "%s: %s" % (label, note))
        out.tsv(dict(line, status="not started", note=("run %d: " % run if run > 1 else "") + note))
        return None
    name = "%s_%s" % (target, precision) + (".run%d" % run if run > 1 else "")
    results_dir = os.path.join(scratch, name)
    log = os.path.join(scratch, name + ".run_all.log")
    cmd = row_command(args, target, precision, results_dir, int(left))
    out.log(clock, "%s: started, estimate %d s (%s), %.0f s left: %s" % (label, est, source, left, " ".join(cmd)))
    t0 = time.monotonic()
    autotune_dir = os.path.join(results_dir, "autotune")      # XLA's autotuning results, on JAX (the notebooks)
    row_env = dict(env, JAX_COMPILATION_CACHE_DIR=os.path.join(scratch, name + ".jax-cache"))   # empty
    if run == 1 and (not args.no_autotune_dump or first_on_card(target, precision, card, args.preset, batch)):
        row_env[xla_autotune.DUMP_ENV] = autotune_dir    # else none written: it compiles on every core, as a user's
    else:
        row_env.pop(xla_autotune.DUMP_ENV, None)
    code, killed = run_until(cmd, row_env, log, left, env[MARKER])
    took = time.monotonic() - t0
    staging.recover(results_dir)        # the record of a row whose run_all.py had to be SIGKILLed, prepared by it
    records = sorted(glob.glob(os.path.join(results_dir, "records", "*.json")))
    dumps = [(p, os.path.relpath(p, autotune_dir).replace(os.sep, "/"))
             for p in sorted(glob.glob(os.path.join(autotune_dir, "*", "*" + xla_autotune.SUFFIX)))]
    members = [(p, "records/" + os.path.basename(p)) for p in records]
    members += [(p, "autotune/" + n) for p, n in dumps]
    members += [(p, "notebooks/" + os.path.basename(p))
                for p in sorted(glob.glob(os.path.join(results_dir, "notebooks", "*.ipynb")))]
    members += [(p, "logs/" + os.path.basename(p)) for p in sorted(glob.glob(os.path.join(results_dir, "logs", "*")))]
    members.append((log, "logs/" + os.path.basename(log)))
    out.append_tar(members)
    if env.get(xla_autotune.RESULTS_ENV):
        for text in merge_dumps(dumps, env[xla_autotune.RESULTS_ENV]):
            out.log(clock, "%s: autotuning results %s" % (label, text))
    rec = None
    if records:
        try:
            with open(records[0]) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            rec = None
    values = dict(line, wall_s=took)
    if rec is not None:
        values.update((k, v) for k, v in record_columns(rec).items() if v is not None)
        values["wall_s"] = took
        skipped = (rec.get("options") or {}).get("skipped")
        if rec.get("status") == "ok" and skipped != SKIP.split(","):
            values["note"] = "the record's options.skipped is %r, not %s" % (skipped, SKIP)
    else:
        reason = last_line(log)
        values.update(status="skipped" if reason and "no selected row can run" in reason else "failed",
                      note=reason or "run_all.py exited with %s and wrote no record" % code)
    why = "by signal %d" % CURRENT["signum"] if CURRENT["signum"] is not None else "at the deadline"
    if killed and values.get("status") == "ok":    # the record was whole before: run_all.py was writing results.md
        values["note"] = "run_all.py stopped %s after %.0f s, its record already written" % (why, took)
    elif killed:
        values["status"] = "killed"
        values["note"] = "stopped %s after %.0f s%s" % (why, took, "; " + str(values.get("note"))
                                                        if values.get("note") else "")
    if run > 1:
        values["note"] = "run %d%s" % (run, "; " + str(values["note"]) if values.get("note") else "")
    out.tsv(values)
    earlier.append(values)
    out.log(clock, "%s: %s in %.0f s (exit %s)%s" % (label, values["status"], took, code,
                                                   ": " + str(values["note"]) if values.get("note") else ""))
    return values["status"]


# ---- the command line -----------------------------------------------------------------------------------------------
def rows_list(text: str) -> List[Tuple[str, str]]:
    """ROW:PRECISION[,ROW:PRECISION...]: each row a target, each precision fp32, tf32 or bf16, each pair once, or
    twice where the row runs XLA (its environment is :data:`XLA_ENV`)."""
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise argparse.ArgumentTypeError("no row given; expected ROW:PRECISION[,ROW:PRECISION...]")
    if "" in parts:
        raise argparse.ArgumentTypeError("%r has an empty item; expected ROW:PRECISION[,ROW:PRECISION...]" % text)
    rows = []
    for part in parts:
        target, sep, precision = part.partition(":")
        if not sep or target not in ALL_TARGETS or precision not in PRECISIONS:
            raise argparse.ArgumentTypeError(
                "%r: expected ROW:PRECISION, ROW one of %s, PRECISION one of %s" % (part, ", ".join(ALL_TARGETS),
                                                                                     ", ".join(PRECISIONS)))
        seen = rows.count((target, precision))
        if seen and ALL_TARGETS[target].env != XLA_ENV:
            raise argparse.ArgumentTypeError("%r names %s twice; name each row once (a JAX or Keras-on-JAX row may "
                                             "be named twice: its second run reads the first's autotuning results)"
                                             % (text, part))
        if seen > 1:
            raise argparse.ArgumentTypeError("%r names %s %d times; a row runs at most twice" % (text, part,
                                                                                               seen + 1))
        rows.append((target, precision))
    return rows


def estimate_override(text: str) -> Tuple[Tuple[str, str], int]:
    """ROW:PRECISION=SECONDS (--estimate)."""
    row, sep, seconds = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError("%r: expected ROW:PRECISION=SECONDS" % text)
    (pair,) = rows_list(row) if "," not in row else [None]
    if pair is None:
        raise argparse.ArgumentTypeError("%r: one ROW:PRECISION per --estimate" % text)
    return pair, validate.seconds(seconds)


def deadline_seconds(text: str) -> int:
    """--deadline-s: seconds (runner/validate.py), at least :data:`MIN_DEADLINE_S`."""
    value = validate.seconds(text)
    if value < MIN_DEADLINE_S:
        raise argparse.ArgumentTypeError("must be at least %d seconds (%d kept for the end, %d for the first step), "
                                         "got %r" % (MIN_DEADLINE_S, RESERVE_S, MIN_DEADLINE_S - RESERVE_S, text))
    return value


def scratch_error(scratch: str) -> Optional[str]:
    """Why ``--scratch`` cannot hold the rows' results directories, or None: a writable folder outside the
    checkout (links resolved: a link to the repository is the repository)."""
    real, root = os.path.realpath(scratch), os.path.realpath(ROOT)
    if real == root or real.startswith(root + os.sep):
        return ("--scratch %s is %s, %s the checkout %s: the rows' results directories would land among its "
                "files; name a folder outside it (default: a temporary folder)"
                % (scratch, real, "the root of" if real == root else "inside", root))
    return validate.results_dir_error("--scratch", scratch)


def build_parser() -> argparse.ArgumentParser:
    p = validate.OneLineParser(prog=PROG, description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--out", required=True, type=validate.non_empty("directory"),
                   help="the folder that comes back ($OUT): empty or new; the session writes %d files there (one "
                        "fewer without the latency step)"
                        % len(OUT_FILES))
    p.add_argument("--deadline-s", type=deadline_seconds, default=560, metavar="S",
                   help="seconds from the start by which the session has ended, at least %d (default 560, inside "
                        "a 600-s call)" % MIN_DEADLINE_S)
    p.add_argument("--rows", type=rows_list, default=None, metavar="ROW:PRECISION[,...]",
                   help="the rows in order (default: %s; those without a committed record on this card "
                        "first, a JAX row's counting once it read the card's autotuning results)" % DEFAULT_ROWS)
    p.add_argument("--estimate", type=estimate_override, action="append", default=[], metavar="ROW:PRECISION=S",
                   help="the estimate of a row in seconds, instead of the records' or the default's (repeatable)")
    p.add_argument("--preset", default=None, choices=sorted(PRESETS),
                   help="default: quick on the GPU, smoke with --dry-run")
    p.add_argument("--batch-size", type=validate.positive_int, default=None, metavar="N",
                   help="default: the preset's (quick: 32)")
    p.add_argument("--python", type=validate.non_empty("interpreter"), default=sys.executable, metavar="PATH",
                   help="the interpreter whose frameworks run the rows and the latency benchmark (default: this "
                        "one); it must run as a Python 3")
    p.add_argument("--wheelhouse", type=validate.non_empty("directory"), default=None, metavar="DIR",
                   help="wheels of what --python lacks to run the runner (papermill, ...): the rows then go through "
                        "tools/installed_offline.sh DIR PYTHON")
    p.add_argument("--scratch", type=validate.non_empty("directory"), default=None, metavar="DIR",
                   help="where the rows' results directories go, outside the checkout (default: a temporary folder, "
                        "removed at the end)")
    p.add_argument("--no-autotune-dump", action="store_true",
                   help="no row writes XLA's autotuning results (so the JAX rows compile on every core): a call after "
                        "one whose results were imported into results/autotune, to time the warm-up they give")
    p.add_argument("--no-latency", action="store_true",
                   help="no latency benchmark (no latency.json) even for a card without committed figures (default: "
                        "measured where results/latency has none for the card)")
    p.add_argument("--latency", action="store_true",
                   help="measure the latency figures even where results/latency has the card's")
    p.add_argument("--dry-run", action="store_true",
                   help="on the CPU: --device cpu, the smoke preset, the CPU records' estimates")
    return p


def errors_of(args) -> List[str]:
    """Every refusal of the options, the interpreter first (the first is the one line printed); nothing is
    started or written."""
    errors = [validate.python3_error("--python %s" % args.python, args.python)]
    out = os.path.abspath(args.out)
    problem = validate.results_dir_error("--out", args.out)
    if problem:
        errors.append(problem)
    elif os.path.isdir(out) and os.listdir(out):
        n = len(os.listdir(out))
        errors.append("--out %s holds %d entr%s already: the session writes its %d files into an empty or new "
                      "folder (what comes back is at most %d files)" % (out, n, "y" if n == 1 else "ies",
                                                                        len(OUT_FILES), MAX_OUT_FILES))
    if args.wheelhouse and not os.path.isdir(args.wheelhouse):
        errors.append("--wheelhouse %s: no such directory" % args.wheelhouse)
    if not args.wheelhouse:
        import importlib.util
        missing = [m for m in ("papermill", "nbformat", "ipykernel") if importlib.util.find_spec(m) is None]
        if missing:
            errors.append("without --wheelhouse the runner runs in this interpreter (%s), which lacks %s; give "
                          "--wheelhouse DIR with their wheels (tools/installed_offline.sh)" % (sys.executable,
                                                                                              ", ".join(missing)))
    rows = ["%s:%s" % tuple(r) for r in args.rows]
    repeated = validate.first_repeated(rows)
    if repeated is not None and args.no_autotune_dump:
        errors.append("--rows names %s twice, but with --no-autotune-dump its first run writes no autotuning results "
                      "for the second to read: the two runs would time the same thing; name it once" % repeated)
    named = [pair for pair, _ in args.estimate]
    twice = validate.first_repeated(named)
    if twice is not None:
        errors.append("--estimate %s:%s is given twice; give each row once" % twice)
    unused = ["%s:%s" % tuple(pair) for pair in named if "%s:%s" % tuple(pair) not in rows]
    if unused:
        errors.append("--estimate %s names a row the session does not run; its rows: %s"
                      % (unused[0], ",".join(dict.fromkeys(rows))))
    if args.scratch:
        errors.append(scratch_error(args.scratch))
    if args.latency and args.no_latency:
        errors.append("--latency and --no-latency: give one")
    return [e for e in errors if e]


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.preset = args.preset or ("smoke" if args.dry_run else "quick")
    default_rows = args.rows is None
    args.rows = args.rows or rows_list(DEFAULT_ROWS)
    errors = errors_of(args)
    gpus = [] if args.dry_run else envinfo.gpus()
    if not errors and not args.dry_run and not gpus:
        errors.append("nvidia-smi sees no GPU; on a machine without one, --dry-run runs the same on the CPU")
    if errors:
        return validate.refuse(PROG, errors[0])
    args.python = os.path.abspath(args.python) if os.path.isfile(args.python) else shutil.which(args.python)
    if args.wheelhouse:
        args.wheelhouse = os.path.abspath(args.wheelhouse)
    clock = Deadline(args.deadline_s)
    out = Out(os.path.abspath(args.out))
    scratch = os.path.abspath(args.scratch) if args.scratch else tempfile.mkdtemp(prefix="ds2-gpu-session-")
    os.makedirs(scratch, exist_ok=True)
    marker = uuid.uuid4().hex
    CURRENT.update(marker=marker, signum=None)
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{MARKER: marker})
    if not args.wheelhouse:
        env["DS2_RUNNER"] = "current"
    card = gpus[0]["name"] if gpus else envinfo.cpu_model()
    if default_rows:
        args.rows = default_session_rows(args.rows, card, args.preset,
                                         args.batch_size or get_preset(args.preset).batch_size, args.no_autotune_dump)
    env[xla_autotune.RESULTS_ENV] = session_autotune(card, scratch)
    statuses, runs = [], {}

    def on_signal(signum, frame):
        """The call's limit (the device tool's SIGTERM) or Ctrl-C: the row in flight is stopped here and then
        collected by run_row like a row stopped at the deadline (its record, notebook, logs and autotuning results
        into the tarball); no row starts after it."""
        CURRENT["signum"] = CURRENT["signum"] or signum
        out.log(clock, "stopped by signal %d: the row in flight is stopped and kept, no row starts after it" % signum)
        if CURRENT["proc"] is not None:
            stop(CURRENT["proc"], marker)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        out.log(clock, "session: %s, preset %s, deadline %d s (%d s kept for the end), rows %s; card %s; "
                       "interpreter %s; scratch %s" % ("dry run on the CPU" if args.dry_run else "GPU", args.preset,
                                                       args.deadline_s, RESERVE_S,
                                                       ",".join("%s:%s" % r for r in args.rows), card, args.python,
                                                       scratch))
        facts = {"session": {"dry_run": args.dry_run, "preset": args.preset, "batch_size": args.batch_size,
                             "deadline_s": args.deadline_s, "rows": ["%s:%s" % r for r in args.rows], "card": card,
                             "skip": SKIP, "wheelhouse": args.wheelhouse}}
        versions(args.python, "before", out, clock, facts)
        if CURRENT["signum"] is None:
            latency(args, out, clock, env, scratch, card)
        failed_as = None                  # the note of the last row, where it failed
        for target, precision in args.rows:
            if CURRENT["signum"] is not None:
                break
            statuses.append(run_row(args, target, precision, out, clock, env, scratch, card,
                                    runs.setdefault((target, precision), [])))
            note = runs[(target, precision)][-1].get("note") if runs[(target, precision)] else None
            if statuses[-1] == "failed" and note and note == failed_as:
                out.log(clock, "stopped: two rows in a row failed the same way (%s): the interpreter or the "
                               "wheelhouse, not a row; no row starts after them" % note)
                break
            failed_as = note if statuses[-1] == "failed" else None
        if CURRENT["signum"] is None:
            versions(args.python, "after", out, clock, facts)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    with open(out.path["summary.tsv"]) as f:
        print(f.read(), end="")
    started = [s for s in statuses if s is not None]
    out.log(clock, "done: %d of %d rows started, %d ok; %d files in %s" % (
        len(started), len(statuses), started.count("ok"), len(os.listdir(out.dir)), out.dir))
    if CURRENT["signum"] is not None:
        return 128 + CURRENT["signum"]
    return 0 if started and all(s == "ok" for s in started) else 1


if __name__ == "__main__":
    sys.exit(main())
