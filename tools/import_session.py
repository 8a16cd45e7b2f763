#!/usr/bin/env python3
"""Bring what a device session returned (``tools/gpu_session.py``'s ``session.tar``) into a results directory.

    python tools/import_session.py /work/.device/1/session.tar                     # into results/
    python tools/import_session.py session.tar --results-dir results/experiments/h200
    python -m runner.report                                                          # then results.md

Each record (``records/NAME.json``) goes to ``RESULTS/records/``, its executed notebook (``notebooks/NAME.ipynb``)
to ``RESULTS/notebooks/``, and the latency figures (``latency/rnn_latency.json``, ``benchmarks/rnn_latency.py``'s
output) to ``RESULTS/latency/<card>.json`` (the card's name in lower case, ``nvidia-h200.json``), where
``python -m runner.report`` finds them.  A record or a latency file of the same name is replaced: the newest run
of a row is its row, unless the record there (or an earlier one of the same name in the tarball) ran ok and the new
one did not, or started earlier (a tarball imported after a newer one): then the record there and its notebook
stay, and a line on stderr says so.  XLA's autotuning results (``autotune/jax-<jaxlib>/<card>.<row>.textproto``, written by the
JAX and Keras-on-JAX rows) are merged into ``RESULTS/autotune/jax-<jaxlib>/<card>.textproto``, where the notebooks
read them on that card (common/xla_autotune.py): every entry once, the file's own first; one that is not a whole
results file is left out, and a line on stderr says so.  The logs stay in the tarball (``results/logs`` is not
committed).

The records are the ones the runs wrote; one field changes: ``run.executed_notebook`` named the notebook in the
session's scratch folder on the device machine, and now names its copy here (relative to the checkout, as
``run_all.py`` writes it).  ``run.session`` says so: the tarball's name and the path the run wrote.

Exit status 0, 2 for bad input (one line, before anything is written): a missing or unreadable tarball, a member
outside ``records/``, ``notebooks/``, ``logs/``, ``latency/`` and ``autotune/jax-<jaxlib>/`` or with a path that
leaves its folder, a record that is not a run's record, a tarball with no record, latency figures or autotuning
results (a call killed before its first row ended returns an empty one).
"""
import json
import os
import sys
import tarfile
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common import xla_autotune  # noqa: E402
from common.envinfo import device_slug  # noqa: E402
from common.results import atomic_write_text  # noqa: E402
from runner import validate  # noqa: E402

PROG = "import_session.py"
#: the tarball's folders (tools/gpu_session.py writes these and no others)
FOLDERS = ("records", "notebooks", "logs", "latency", "autotune")


class Refused(Exception):
    pass


def kept_over(there: dict, incoming: dict) -> Optional[str]:
    """Why the record ``there`` stays instead of ``incoming`` of the same name (None: ``incoming`` replaces it): it
    ran ok and ``incoming`` did not, or ``incoming`` started earlier (ISO times in UTC compare as text)."""
    if there.get("status") == "ok" and incoming.get("status") != "ok":
        return "it ran ok and the run imported now is %s (%s)" % (incoming.get("status"), incoming.get("error"))
    started_there, started = (there.get("run") or {}).get("started"), (incoming.get("run") or {}).get("started")
    if isinstance(started_there, str) and isinstance(started, str) and started < started_there:
        return "it started at %s, the run imported now at %s" % (started_there, started)
    return None


def notebook_of(rec: dict, name: Optional[str] = None) -> Optional[str]:
    """The file name of the record's executed notebook, where it names one; else, given the record's file ``name``,
    the notebook of that stem (the name run_all.py gives it)."""
    there = (rec.get("run") or {}).get("executed_notebook")
    if isinstance(there, str) and there:
        return os.path.basename(there)
    return name[:-len(".json")] + ".ipynb" if name else None


def read_session(tar_path: str) -> Tuple[Dict[str, dict], Dict[str, bytes], List[dict], List[Tuple[str, str]]]:
    """(record name -> record, notebook name -> bytes, latency reports, the autotuning results as (their path under
    ``autotune/``, text) each) from the tarball; :class:`Refused` for anything :func:`main`'s docstring names as bad
    input.  A row run twice has two records of one name: the later one, unless :func:`kept_over` keeps the earlier
    (its notebook too: a row's members follow its record)."""
    records, notebooks, latency, autotune = {}, {}, [], []
    passed_over = set()                   # notebooks of records an earlier one of the same name was kept over
    try:
        tar = tarfile.open(tar_path, "r")
    except (OSError, tarfile.TarError) as e:
        raise Refused("%s: not a readable tarball (%s)" % (tar_path, e))
    with tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            tuned = parts[0] == "autotune" and xla_autotune.card_file_of("/".join(parts[1:]))
            if (member.name.startswith("/") or ".." in parts or parts[0] not in FOLDERS or not member.isfile()
                    or (len(parts) != 2 if parts[0] != "autotune" else not tuned)):
                raise Refused("%s: member %r is not a file directly under %s, or autotune/jax-VERSION/CARD.ROW"
                              ".textproto: not a device session's tarball"
                              % (tar_path, member.name, ", ".join(f + "/" for f in FOLDERS[:-1])))
            folder, name = parts[0], parts[-1]
            if folder == "logs":
                continue
            data = tar.extractfile(member).read()
            if folder == "notebooks":
                if name in passed_over:
                    passed_over.discard(name)
                else:
                    notebooks[name] = data
                continue
            if folder == "autotune":
                autotune.append(("/".join(parts[1:]), data.decode("utf-8", "replace")))
                continue
            try:
                doc = json.loads(data.decode("utf-8"))
            except ValueError as e:
                raise Refused("%s: %s is not JSON (%s)" % (tar_path, member.name, e))
            if folder == "records":
                if not (isinstance(doc, dict) and isinstance(doc.get("run"), dict) and doc.get("target")
                        and name.endswith(".json")):
                    raise Refused("%s: %s is not a run's record (no target or run section)" % (tar_path,
                                                                                            member.name))
                why = kept_over(records[name], doc) if name in records else None
                if why:
                    print("%s: %s: the tarball's earlier run of this row stays: %s" % (PROG, name, why),
                          file=sys.stderr)
                    passed_over.add(notebook_of(doc, name))
                    continue
                records[name] = doc
            else:
                if not (isinstance(doc, dict) and isinstance((doc.get("device") or {}).get("name"), str)):
                    raise Refused("%s: %s names no device (device.name): not benchmarks/rnn_latency.py's output"
                                  % (tar_path, member.name))
                latency.append(doc)
    if not records and not latency and not autotune:
        raise Refused("%s holds no record, no latency figures and no autotuning results: nothing to import"
                      % tar_path)
    return records, notebooks, latency, autotune


def import_session(tar_path: str, results_dir: str) -> Tuple[List[str], List[str]]:
    """Write the tarball's records, notebooks, latency figures and autotuning results under ``results_dir``;
    (the paths written, the autotuning results left out and why)."""
    records, notebooks, latency, autotune = read_session(tar_path)
    results_dir = os.path.abspath(results_dir)
    written = []
    for name in sorted(records):
        path = os.path.join(results_dir, "records", name)
        try:
            with open(path) as f:
                there = json.load(f)
        except (OSError, ValueError):
            continue                                      # none there, or not a record: the tarball's is written
        why = kept_over(there, records[name]) if isinstance(there, dict) else None
        if why:
            print("%s: %s: the record there stays: %s" % (PROG, os.path.relpath(path, ROOT), why), file=sys.stderr)
            notebooks.pop(notebook_of(records.pop(name), name), None)
    for name, data in sorted(notebooks.items()):
        path = os.path.join(results_dir, "notebooks", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_text(path, data.decode("utf-8"))
        written.append(path)
    for name, rec in sorted(records.items()):
        run = rec["run"]
        there = run.get("executed_notebook")
        base = notebook_of(rec)
        if base in notebooks:
            run["executed_notebook"] = os.path.relpath(os.path.join(results_dir, "notebooks", base), ROOT)
        run["session"] = {"tarball": os.path.basename(tar_path), "executed_notebook_there": there}
        path = os.path.join(results_dir, "records", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_text(path, json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
        written.append(path)
    for report in latency:
        path = os.path.join(results_dir, "latency", device_slug(report["device"]["name"]) + ".json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_text(path, json.dumps(report, indent=1) + "\n")
        written.append(path)
    paths, left_out = xla_autotune.merge_into(os.path.join(results_dir, "autotune"), autotune)
    written += paths
    return written, left_out


def main(argv=None) -> int:
    p = validate.OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("tarball", type=validate.non_empty("tarball"), help="a device session's session.tar")
    p.add_argument("--results-dir", default=os.path.join(ROOT, "results"), type=validate.non_empty("directory"),
                   help="where the records, notebooks and latency figures go (default: results/)")
    args = p.parse_args(argv)
    problem = validate.results_dir_error("--results-dir", args.results_dir)
    if problem:
        return validate.refuse(PROG, problem)
    if not os.path.isfile(args.tarball):
        return validate.refuse(PROG, "%s: %s" % (args.tarball, "no such file" if not os.path.exists(args.tarball) else
                                                 "not a regular file: name the session's session.tar"))
    try:
        written, left_out = import_session(args.tarball, args.results_dir)
    except Refused as e:
        return validate.refuse(PROG, str(e))
    for path in written:
        print(os.path.relpath(path, ROOT))
    for why in left_out:
        print("%s: autotuning results left out: %s" % (PROG, why), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
