"""``run_all.py --migrate``: every framework's trained model loaded into every other framework.

For each source target, the canonical weights its last completed ordinary run exported
(``<results>/weights/<record stem>.npz``, found through the record's ``export.path``); for each
destination target, its notebook TRIMMED to the code cells from the first one through the cell tagged
``rosetta:check``, plus the cell tagged ``rosetta:export`` (:func:`trim_notebook`) -- no training, no
timing: it builds the model, loads the source's file (``init_weights``), checks the first loss against
the NumPy reference of that file and exports again.  The trimmed notebook runs in the destination's
kernel with the parameters of a normal run plus ``init_weights`` and ``result_path`` =
``<results>/migration/records/<src>__<dst stem>.json``, so its export lands in
``<results>/migration/weights/`` (the export cell never writes the record itself).

The runner then writes the migration record ``<results>/migration/<src>__<dst stem>.json``
(atomically): the source file and its sha256, the destination's inference-mode logits of the check batch
against the SOURCE's own (max relative and absolute difference), the CTC loss of both (NumPy CTC), the
destination's inference check against the NumPy reference (its ``.export.json``), how far its re-export
is from the file it loaded, and for ``src == dst`` whether the round trip reproduces the logits within
:data:`ROUND_TRIP_ATOL`.  Every pair gets a record: "ok", "failed" or "skipped" with a one-line reason.

    python run_all.py --migrate                                  # every row of record, both ways
    python run_all.py --migrate --frameworks tensorflow,pytorch  # a 2 x 2 matrix
"""
import copy
import json
import os
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from common import envinfo, exports, reference, results
from common.data import DeepMarkIterator
from common.weights import load_weights

from runner.run import execute, staging
from runner import interrupt
from runner.base import ROOT, EnvError
from runner.envs.definitions import ENVS
from runner.run.targets import Target

MIGRATION_DIR = "migration"
#: the round trip framework -> canonical -> the same framework must give the same logits (max |difference|)
ROUND_TRIP_ATOL = 1e-5
CHECK_TAG = "rosetta:check"
EXPORT_TAG = "rosetta:export"
#: what a record of this module is (``kind``): results.md reads migration records from their own directory
KIND = "migration"

#: The BatchNorm running-variance convention each framework's export stores (the canonical format stores
#: what the framework keeps, as is).  The report measures the size of the difference; this only names it.
BN_CONVENTIONS = {
    "pytorch": "unbiased batch variance, r = 0.9 r + 0.1 batch (the canonical convention)",
    "tensorflow": "biased batch variance (Keras BatchNormalization), momentum 0.9 on the old value",
    "keras-jax": "biased batch variance (Keras BatchNormalization), momentum 0.9 on the old value",
    "keras-torch": "biased batch variance (Keras BatchNormalization), momentum 0.9 on the old value",
    "keras-tensorflow": "biased batch variance (Keras BatchNormalization), momentum 0.9 on the old value",
    "jax": "biased batch variance (Flax nnx.BatchNorm), momentum 0.9 on the old value",
    "mxnet": "biased batch variance (Gluon BatchNorm), momentum 0.9 on the old value",
    "cntk": "time constant: a minibatch of n frames weighs 1 - exp(-n/tau), the first one weighs 1; "
            "unbiased variance",
}


class MigrateError(ValueError):
    """A notebook that cannot be trimmed, or a source without an export; the message is one line."""


# ---- the trimmed notebook ------------------------------------------------------------------------------
def _tags(cell) -> List[str]:
    return list((cell.get("metadata") or {}).get("tags") or [])


def trim_notebook(nb, name: str = "the notebook"):
    """A copy of ``nb`` (an nbformat v4 notebook) with only its code cells from the first one through the
    cell tagged ``rosetta:check``, then the cell tagged ``rosetta:export``, in that order, after one
    markdown cell saying what this is.  Outputs and execution counts are cleared.  Raises
    :class:`MigrateError` when a tag is missing, repeated, or the export cell comes before the check."""
    cells = nb["cells"]
    where = {}
    for tag in (CHECK_TAG, EXPORT_TAG):
        hits = [i for i, c in enumerate(cells) if tag in _tags(c)]
        if not hits:
            raise MigrateError("%s has no cell tagged %s (section %s)" % (
                name, tag, "6b" if tag == CHECK_TAG else "11 Export"))
        if len(hits) > 1:
            raise MigrateError("%s has %d cells tagged %s, expected one" % (name, len(hits), tag))
        if cells[hits[0]]["cell_type"] != "code":
            raise MigrateError("%s: the cell tagged %s is not a code cell" % (name, tag))
        where[tag] = hits[0]
    if where[EXPORT_TAG] < where[CHECK_TAG]:
        raise MigrateError("%s: its export cell comes before its check cell" % name)
    kept = [c for c in cells[:where[CHECK_TAG] + 1] if c["cell_type"] == "code"] + [cells[where[EXPORT_TAG]]]
    out = copy.deepcopy(nb)
    header = {"cell_type": "markdown", "metadata": {"tags": ["migration:header"]},
              "source": "# Migration run of %s\n\nGenerated by `run_all.py --migrate` (runner/migrate.py): the "
                        "notebook's code cells from the first through section 6b (`%s`), then section 11 "
                        "(`%s`), run with `init_weights` = another framework's export. No training."
                        % (name, CHECK_TAG, EXPORT_TAG)}
    out["cells"] = [header] + [copy.deepcopy(c) for c in kept]
    if any("id" in c for c in kept):
        header["id"] = "migration-header"
    for c in out["cells"]:
        if c["cell_type"] == "code":
            c["outputs"], c["execution_count"] = [], None
    import nbformat
    return nbformat.from_dict(out)


def write_trimmed(notebook_path: str, out_path: str) -> str:
    """Read ``notebook_path``, trim it (:func:`trim_notebook`) and write it to ``out_path``."""
    import nbformat
    nb = nbformat.read(notebook_path, as_version=4)
    trimmed = trim_notebook(nb, os.path.relpath(notebook_path, ROOT))
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp = out_path + ".partial"
    nbformat.write(trimmed, tmp)
    os.replace(tmp, out_path)
    return out_path


# ---- where things are ----------------------------------------------------------------------------------
def migration_stem(source: Target, destination: Target, opts: "execute.RunOptions") -> str:
    """``<src>__<destination's record stem>``, e.g. ``tensorflow__pytorch_smoke_fp32_bs8_cpu``."""
    return "%s__%s" % (source.name, execute.record_stem(destination, opts))


def migration_dir(results_dir: str) -> str:
    return os.path.join(results_dir, MIGRATION_DIR)


def repo_path(path: Optional[str]) -> Optional[str]:
    """A path from a record (relative to the repository root, or absolute) as an absolute path."""
    if not path:
        return None
    return path if os.path.isabs(path) else os.path.join(ROOT, path)


def find_export(source: Target, opts: "execute.RunOptions", hash_file: bool = True) -> dict:
    """The export of ``source``'s last ordinary run with this run's preset, precision, batch size and
    device: {"record", "record_path", "weights", "logits", "sha256"}.  Raises :class:`MigrateError` with
    the reason (one line) when there is none, or when the record is a skipped run (``skipped`` key).
    ``hash_file=False``: whether the files are there, without reading the weights (``sha256`` None, unchecked)."""
    stem = execute.record_stem(source, opts)
    record_path = os.path.join(opts.results_dir, "records", stem + ".json")
    hint = "run python run_all.py --frameworks %s%s first" % (source.name, _run_hint(opts))
    if not os.path.exists(record_path):
        raise MigrateError("no export of %s: no record %s; %s" % (source.name, os.path.basename(record_path), hint))
    try:
        rec = results.read_record(record_path)
    except (OSError, ValueError) as e:
        raise MigrateError("no export of %s: its record %s cannot be read (%s); %s"
                           % (source.name, os.path.basename(record_path), results.one_line(str(e)), hint))
    if rec["status"] == "skipped":
        err = MigrateError("%s did not run here: %s" % (source.name, rec.get("error")))
        err.skipped = True
        raise err
    if rec["status"] != "ok":
        raise MigrateError("no export of %s: its last run failed (%s); %s" % (source.name, rec.get("error"), hint))
    export = rec.get("export") or {}
    weights = repo_path(export.get("path"))
    if export.get("status") == "skipped":          # run_all.py --skip export,onnx: no file was written
        raise MigrateError("no export of %s: its last run skipped it (%s); %s" % (source.name, export.get("reason"),
                                                                                  hint))
    if not weights:
        raise MigrateError("no export of %s: its record has no export section (a notebook without section 11?); %s"
                           % (source.name, hint))
    if not os.path.exists(weights):                    # the record was made in another checkout: look beside it
        beside = exports.export_paths(record_path)["weights"]
        if os.path.exists(beside):
            weights = beside
        else:
            raise MigrateError("no export of %s: %s is missing; %s" % (source.name, export.get("path"), hint))
    logits = repo_path(export.get("logits_path"))
    if not logits or not os.path.exists(logits):
        logits = os.path.splitext(weights)[0] + ".logits.npy"
    if not os.path.exists(logits):
        raise MigrateError("no export of %s: its logits file %s is missing; %s"
                           % (source.name, export.get("logits_path"), hint))
    sha = exports.file_sha256(weights) if hash_file else None
    if hash_file and export.get("sha256") and sha != export["sha256"]:
        raise MigrateError("the export of %s (%s) changed since its record was written (sha256 differs); %s"
                           % (source.name, os.path.relpath(weights, ROOT) if weights.startswith(ROOT) else weights,
                              hint))
    return {"record": rec, "record_path": record_path, "weights": weights, "logits": logits, "sha256": sha}


def _run_hint(opts) -> str:
    p = opts.preset
    hint = " --preset %s" % p.name
    if opts.precision != "fp32":
        hint += " --precision %s" % opts.precision
    from common.spec import get_preset
    if p.batch_size != get_preset(p.name).batch_size:
        hint += " --batch-size %d" % p.batch_size
    return hint


def check_batch(opts: "execute.RunOptions"):
    """The check batch every notebook uses (``train_data.batch(0)``)."""
    p = opts.preset
    return DeepMarkIterator(p.batch_size, p.scale, opts.seed, n_freq=p.config.n_freq,
                            n_classes=p.config.n_classes, lengths=p.lengths).batch(0)


# ---- one cell of the matrix ----------------------------------------------------------------------------
def compare(source_logits, dest_logits, labels, blank: int, same: bool) -> dict:
    """The migration record's numbers: logits of the destination against the source's, the NumPy CTC loss
    of both, and for the diagonal the round trip."""
    diff = exports.logit_difference(dest_logits, source_logits)
    src_loss = float(reference.ctc_loss(np.asarray(source_logits, np.float64), labels, blank=blank).mean())
    dst_loss = float(reference.ctc_loss(np.asarray(dest_logits, np.float64), labels, blank=blank).mean())
    out = {"logits": {"max_abs": diff["max_abs"], "max_rel": diff["max_rel"]},
           "loss": {"source": src_loss, "destination": dst_loss, "abs_diff": abs(dst_loss - src_loss),
                    "rel_diff": abs(dst_loss - src_loss) / abs(src_loss) if src_loss else abs(dst_loss)}}
    out["round_trip"] = ({"max_abs": diff["max_abs"], "atol": ROUND_TRIP_ATOL, "ok": diff["max_abs"] <= ROUND_TRIP_ATOL}
                         if same else None)
    return out


def reexport_difference(loaded: Dict[str, np.ndarray], exported: Dict[str, np.ndarray]) -> dict:
    """How far the destination's export (of the model it loaded, untrained) is from the file it loaded:
    the largest |difference| over every tensor, and the tensor where it is (0: load and export are exact
    inverses)."""
    worst, where = 0.0, None
    for name, a in loaded.items():
        b = exported.get(name)
        if b is None or b.shape != a.shape:
            return {"max_abs": None, "tensor": name, "error": "missing or reshaped in the re-export"}
        d = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
        if d > worst or where is None:
            worst, where = d, name
    return {"max_abs": worst, "tensor": where}


def _base(source: Target, destination: Target, opts) -> dict:
    p = opts.preset
    return {"schema_version": results.SCHEMA_VERSION, "kind": KIND, "status": "ok", "error": None,
            "target": "%s__%s" % (source.name, destination.name), "framework": destination.label.split(" (")[0],
            "source": source.name, "destination": destination.name, "preset": p.name, "precision": opts.precision,
            "batch_size": p.batch_size, "scale": p.scale, "seed": opts.seed,
            "device": {"type": opts.device, "name": (opts.gpu or {}).get("name") if opts.device == "cuda"
                       else envinfo.cpu_model()}}


def _rel(path: Optional[str]) -> Optional[str]:
    if not path:
        return None
    path = os.path.abspath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def kernel_for(target: Target, opts: "execute.RunOptions", announce=print) -> Tuple[Optional[str], Optional[tuple]]:
    """(kernel name, None) when ``target``'s notebook can run here, else (None, (status, reason)) -- the
    same decisions as an ordinary run (runner/run/execute.py ``can_run`` and the environment)."""
    decision, status, reason = execute.can_run(target, opts)
    if reason:
        return None, (status, reason)
    env = ENVS[target.env]
    if env.needs and env.name in opts.found:
        why = env.needs()
        if why:
            return None, ("skipped", "environment %s: %s" % (env.name, why))
    try:
        return execute.prepare_kernel(env, opts, decision.build if decision else None, announce), None
    except EnvError as e:
        missing = env.needs_python and env.name not in opts.pythons
        return None, ("skipped" if missing else "failed", "environment %s: %s" % (env.name, e))


def run_pair(source: Target, destination: Target, opts: "execute.RunOptions", kernel: Optional[str],
             kernel_problem: Optional[tuple] = None, announce=print) -> dict:
    """One cell of the matrix: write and return its migration record.  A signal stops the kernel, the
    record says "failed" with the reason, and :class:`~runner.interrupt.Interrupted` goes on."""
    stem = migration_stem(source, destination, opts)
    mdir = migration_dir(opts.results_dir)
    record_path = os.path.join(mdir, stem + ".json")
    result_path = os.path.join(mdir, "records", stem + ".json")     # what the notebook is told; it writes beside
    paths = exports.export_paths(result_path)                       # -> <results>/migration/weights/<stem>.*
    notebook_in = os.path.join(mdir, ".staging", stem + ".ipynb")
    notebook_out = os.path.join(mdir, "notebooks", stem + ".ipynb")
    partial_nb = notebook_out[:-len(".ipynb")] + ".partial.ipynb"
    kernel_log = os.path.join(mdir, "logs", stem + ".kernel.log")
    rec = _base(source, destination, opts)
    rec["run"] = {"started": results.utc_now(), "command": opts.command, "git_commit": execute.git_commit(),
                  "notebook": "notebooks/" + destination.notebook}
    written = []

    def finish(status: str, reason: Optional[str] = None, **fields) -> dict:
        rec.update(fields)
        rec["status"] = status
        rec["error"] = results.one_line(reason) if reason else None
        rec["run"]["finished"] = results.utc_now()
        with interrupt.deferred():
            results.write_record(record_path, rec)
            written.append(rec)
        if status == "ok":
            announce("  ok: logits max rel. diff %.1e vs %s's own, loss rel. diff %.1e%s"
                     % (rec["logits"]["max_rel"], source.name, rec["loss"]["rel_diff"],
                        ", round trip max abs %.1e" % rec["round_trip"]["max_abs"] if rec.get("round_trip") else ""))
        else:
            announce("  %s: %s" % (status, rec["error"]))
        return rec

    for d in ("notebooks", "logs", ".staging"):
        os.makedirs(os.path.join(mdir, d), exist_ok=True)
    for stale in filter(os.path.exists, (record_path, paths["info"], paths["logits"], paths["weights"])):
        os.remove(stale)
    staging.recover(mdir, records="")                   # the pairs of a runner killed outright
    staging.claim(os.path.join(mdir, ".staging"), stem, lambda status, reason: dict(rec, status=status, error=reason))
    try:
        # 1. the source's export
        try:
            src = find_export(source, opts)
        except MigrateError as e:
            return finish("skipped" if getattr(e, "skipped", False) else "failed", str(e))
        rec.update(source_file=_rel(src["weights"]), source_sha256=src["sha256"], source_record=_rel(src["record_path"]),
                   source_logits=_rel(src["logits"]))
        # 2. the destination can run here?
        if kernel_problem:
            return finish(*kernel_problem)
        try:
            write_trimmed(destination.notebook_path, notebook_in)
        except (MigrateError, OSError, ValueError) as e:
            return finish("failed", str(e))
        # 3. the trimmed notebook
        parameters = execute.notebook_parameters(destination, opts, result_path)
        parameters.pop("profile", None)
        parameters["init_weights"] = src["weights"]
        if os.path.exists(kernel_log):
            os.remove(kernel_log)
        t0 = time.time()
        error = execute.run_papermill(notebook_in, partial_nb, parameters, kernel,
                                      os.path.dirname(destination.notebook_path), opts, kernel_log)
        with interrupt.deferred():
            executed = staging.keep_executed(partial_nb, notebook_out)
            rec["run"].update(executed_notebook=_rel(executed), wall_s=time.time() - t0)
            if os.path.exists(notebook_in):
                os.remove(notebook_in)
            if error is not None:
                return finish("failed", execute.papermill_reason(error, opts.timeout))
            return _evaluate(rec, src, source, destination, opts, paths, finish)
    except interrupt.Interrupted as e:
        interrupt.reap_kernels()
        staging.keep_executed(partial_nb, notebook_out)
        if not written:
            finish("failed", e.reason)
        raise
    finally:
        staging.release(os.path.join(mdir, ".staging"), stem)


def _evaluate(rec, src, source, destination, opts, paths, finish) -> dict:
    """The numbers of a completed trimmed run; the record's status follows from them."""
    try:
        with open(paths["info"]) as f:
            info = json.load(f)
        dest_logits = np.load(paths["logits"])
        source_logits = np.load(src["logits"])
    except (OSError, ValueError) as e:
        return finish("failed", "the export cell of %s left no complete export (%s)" % (destination.name,
                                                                                        results.one_line(str(e))))
    rec["destination_export"] = _rel(paths["info"])
    rec["inference"] = info.get("inference")
    rec["native"] = info.get("native")
    rec["train_loss"] = info.get("train_loss")
    loaded = info.get("init_weights")
    if not loaded or os.path.abspath(repo_path(loaded)) != os.path.abspath(src["weights"]):
        return finish("failed", "%s ignored init_weights: its export says it started from %s, not %s (does its "
                                "section 5 load init_weights?)" % (destination.name, loaded, _rel(src["weights"])))
    batch = check_batch(opts)
    try:
        numbers = compare(source_logits, dest_logits, batch.labels, opts.preset.config.blank,
                          same=source.name == destination.name)
    except Exception as e:    # shapes that differ (CheckFailed), a broken file
        return finish("failed", "logits of %s and %s cannot be compared: %s" % (source.name, destination.name,
                                                                              results.one_line(str(e))))
    rec.update(numbers)
    rtol = 2 * exports.LOGIT_RTOL[opts.precision]
    rec["logits"]["rtol"] = rtol
    try:
        rec["reexport"] = reexport_difference(load_weights(src["weights"]), load_weights(paths["weights"]))
    except (OSError, ValueError) as e:
        rec["reexport"] = {"max_abs": None, "error": results.one_line(str(e))}
    if not (rec["inference"] or {}).get("ok"):
        return finish("failed", "%s's inference check of the loaded export did not pass" % destination.name)
    if rec["logits"]["max_rel"] > rtol:
        # both sides passed their check against the NumPy reference within LOGIT_RTOL: beyond twice that, the
        # destination did not compute with the source's weights, or the source's logits file is not its weights'
        re = rec["reexport"]
        why = ("its re-export differs from the file it loaded by %.3g at %s: does its section 5 load init_weights?"
               % (re["max_abs"], re.get("tensor")) if (re.get("max_abs") or 0) > 1e-6
               else "the source's logits file does not belong to its weights file")
        return finish("failed", "%s's logits differ from %s's own by %.3g relative (> %.0e; each was checked within "
                                "%.0e of the NumPy reference): %s" % (destination.name, source.name,
                                                                      rec["logits"]["max_rel"], rtol, rtol / 2, why))
    if rec["round_trip"] is not None and not rec["round_trip"]["ok"]:
        return finish("failed", "round trip %s -> canonical -> %s changes the logits by %.3g (> %.0e)"
                      % (source.name, destination.name, rec["round_trip"]["max_abs"], ROUND_TRIP_ATOL))
    return finish("ok")


# ---- the matrix ----------------------------------------------------------------------------------------
def nothing_to_migrate(sources: List[Target], runs: List["execute.RunOptions"]) -> Optional[str]:
    """Why ``--migrate`` has nothing to do, before anything is made: no selected source has an export for any of
    ``runs`` (precision and batch size) in the results directory; else None.  A source that has none while
    another has is a failed pair of the matrix, as before."""
    first = None
    for opts in runs:
        for source in sources:
            try:
                find_export(source, opts, hash_file=False)   # the pair reads and checks the file later
                return None
            except MigrateError as e:
                first = first or str(e)
    return "--migrate: no selected source has an export in %s (%s)" % (
        os.path.join(runs[0].results_dir, "records"), first) if first else None


def run_matrix(targets: List[Target], opts: "execute.RunOptions", announce=print,
               kernel_for: Callable = kernel_for, destinations: Optional[List[Target]] = None) -> List[dict]:
    """Every source of ``targets`` x every destination of ``destinations`` (default: ``targets``), destination
    by destination: each destination's environment is prepared once.  Returns the records; an interruption
    writes the current pair's record and goes on to the caller."""
    out = []
    destinations = targets if destinations is None else destinations
    n = len(targets) * len(destinations)
    i = 0
    for destination in destinations:
        kernel, problem = None, None
        for source in targets:
            i += 1
            announce("[%d/%d] %s -> %s, %s, batch %d" % (i, n, source.name, destination.name, opts.precision,
                                                        opts.preset.batch_size))
            if kernel is None and problem is None:
                kernel, problem = kernel_for(destination, opts, announce)
            out.append(run_pair(source, destination, opts, kernel, problem, announce=announce))
    return out


def read_migration_records(results_dir: str) -> List[dict]:
    """The migration records of ``results_dir`` (``<results>/migration/*.json``), sorted by name."""
    d = migration_dir(results_dir)
    if not os.path.isdir(d):
        return []
    out = []
    for name in sorted(os.listdir(d)):
        if name.endswith(".json") and not name.startswith("."):
            try:
                rec = results.read_record(os.path.join(d, name))
            except (OSError, ValueError):
                continue
            if rec.get("kind") == KIND:
                out.append(rec)
    return out
