"""A row's files in ``<results-dir>/.staging/`` while it runs, and what a runner killed outright leaves there.

While a row runs (a notebook, or a data-parallel run's script), ``.staging/<stem>.owner`` names its runner (pid and
start time, :mod:`common.processes`) and ``.staging/<stem>.killed.json`` holds the failed record the row gets if
that runner ends with no time to write one (SIGKILL, a restart of the machine): :func:`claim`.  When the row ends,
however it ends, both go with the row's other transient files there (the record the notebook or rank 0 wrote, the
ranks' status files): :func:`release`.  The next run into the same results directory, or ``python -m runner.report``
on it (:func:`recover`), finds the rows whose runner no longer runs: it writes their prepared record (results.md
then says the row did not finish, where a previous run's record would have stood for it), keeps the part of the
notebook that ran under its final name, and removes the rest.  A live runner's files are left alone."""
import glob
import os
from typing import Callable, List, Optional

from common import results
from common.processes import host_id, process_start_time, runner_alive
from runner.base import ROOT

OWNER = ".owner"
KILLED = ".killed.json"


def killed_reason(pid: int) -> str:
    """The reason in the record of a row whose runner ended while it ran (runner/report/records.py STOPPED)."""
    return ("the runner (pid %d) ended while this row ran, with no time to record why (SIGKILL, a restart of the "
            "machine); found by the next run" % pid)


def claim(staging: str, stem: str, failed: Callable[[str, str], dict]) -> None:
    """Mark ``stem`` in ``staging`` as this runner's, with the record ``failed("failed", reason)`` (the row's
    failed record, as its runner writes one) as what the next run writes should this runner be killed outright."""
    pid = os.getpid()
    os.makedirs(staging, exist_ok=True)
    results.atomic_write_text(os.path.join(staging, stem + OWNER),
                              "%d %s %s\n" % (pid, process_start_time(pid) or "-", host_id()))
    rec = failed("failed", killed_reason(pid))
    rec["run"] = dict(rec.get("run") or {}, finished=None)          # it has not finished; when it ended is unknown
    results.write_record(os.path.join(staging, stem + KILLED), rec)


def release(staging: str, stem: str) -> List[str]:
    """Remove ``stem``'s transient files from ``staging``: its owner and prepared record, the record the notebook or
    rank 0 wrote, the ranks' status files and any unfinished atomic write (its exported script stays: a run of the
    same stem rewrites it).  Returns the paths removed."""
    removed = []
    base = os.path.join(glob.escape(staging), glob.escape(stem))
    for path in [os.path.join(staging, stem + n) for n in (".json", OWNER, KILLED)] + \
            glob.glob(base + ".rank*.status.json") + glob.glob(base + ".*.partial"):
        try:
            os.remove(path)
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed


def owner_alive(owner: str) -> bool:
    """Whether the runner an ``<stem>.owner`` file (``PID START HOST``) names still runs: an unreadable one names
    none; one of another host or container (a results directory they share) is taken to run."""
    try:
        with open(owner) as f:
            fields = f.read().split()
        pid = int(fields[0])
    except (OSError, ValueError, IndexError):
        return False
    start = fields[1] if len(fields) > 1 else "-"
    host = fields[2] if len(fields) > 2 else ""        # an owner file written before hosts were named: this host's
    if host and host != host_id():
        return True
    return runner_alive(pid, None if start == "-" else start)


def recover(results_dir: str, records: str = "records") -> List[str]:
    """Each row in ``<results_dir>/.staging`` whose runner no longer runs: its prepared record written to
    ``<results_dir>/<records>/`` (with the part of its notebook that ran, kept under its final name in
    ``notebooks/``), its transient files removed.  Returns the records written."""
    staging = os.path.join(results_dir, ".staging")
    written = []
    if not os.path.isdir(staging):
        return written
    for name in sorted(os.listdir(staging)):
        if not name.endswith(OWNER) or owner_alive(os.path.join(staging, name)):
            continue
        stem = name[:-len(OWNER)]
        try:
            rec = results.read_record(os.path.join(staging, stem + KILLED))
        except (OSError, ValueError):        # killed before it was written: there is nothing to say
            rec = None
        if rec is not None:
            notebooks = os.path.join(results_dir, "notebooks")
            executed = keep_executed(os.path.join(notebooks, stem + ".partial.ipynb"),
                                     os.path.join(notebooks, stem + ".ipynb"))
            rec["run"] = dict(rec.get("run") or {}, found_by_the_next_run=results.utc_now())
            if executed:
                rec["run"]["executed_notebook"] = os.path.relpath(executed, ROOT)
            written.append(results.write_record(os.path.join(results_dir, records, stem + ".json"), rec))
        release(staging, stem)
    return written


def keep_executed(partial: str, final: str) -> Optional[str]:
    """Move the executed notebook to its final name; one that is not a whole notebook (a write cut
    short) is removed.  Returns the final path, or None when this run left no notebook.  Where nbformat is not
    installed (a device session's interpreter) nothing can check it: it is left as it is."""
    if not os.path.exists(partial):
        return None
    try:
        import nbformat
    except ImportError:
        return None
    try:
        nbformat.read(partial, as_version=4)
    except Exception:
        os.remove(partial)
        return None
    os.replace(partial, final)
    return final
