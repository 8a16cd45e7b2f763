"""Ctrl-C and SIGTERM: stop a run within seconds, and leave it tidy.

A terminal's Ctrl-C (SIGINT) and ``timeout``/``kill`` (SIGTERM) reach run_all.py; the Jupyter kernel
runs in a session of its own and hears neither.  :func:`install` turns both signals into
:class:`Interrupted`, raised where the run is -- except inside :func:`deferred` blocks (a notebook
being executed, a record or results.md being written), where the handler only stops the kernels
that are running (papermill then saves what ran and returns promptly with an error) and the
exception is raised when the block ends.  Should that take longer than :data:`GRACE_S`, it is raised
anyway.  A second signal during the clean-up exits at once, but first sends SIGKILL to every kernel's
process group and to every process of a data-parallel run in progress (:func:`track_run`): a framework
that catches SIGTERM itself (JAX's preemption notifier does, once ``jax.distributed`` is initialised)
cannot outlive the runner that way; then the temporary folders of what it started are removed
(:func:`temporary_folder`).  What a runner killed outright (SIGKILL, the OOM killer) left there, the next
run's :func:`temporary_folder` removes: each folder's name says which runner made it.

Standard library only (and :mod:`common.processes`, itself standard library only).
"""
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from typing import List, Optional

from common.processes import host_id, process_start_time, runner_alive

GRACE_S = 10
REASONS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}

_state = {"signum": None, "deferring": 0}
_kernels = {}   # key -> process group of a running Jupyter kernel
_runs = {}      # key -> callable(sig) that signals every process of a data-parallel run
_folders = set()   # the temporary folders of the processes started (temporary_folder)


class Interrupted(KeyboardInterrupt):
    """The run got SIGINT or SIGTERM.  A KeyboardInterrupt, so that code written for Ctrl-C (asyncio's
    loops, a launcher's teardown) treats SIGTERM the same way."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def reason(self) -> str:
        """A record's reason: "interrupted (SIGINT)", "terminated (SIGTERM)"."""
        return "%s (%s)" % (REASONS.get(self.signum, "stopped"), signal.Signals(self.signum).name)

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def install() -> dict:
    """Handle SIGINT and SIGTERM from now on; returns the previous handlers (for :func:`restore`)."""
    _state["signum"] = None
    return {sig: signal.signal(sig, _handler) for sig in REASONS}


def restore(previous: dict) -> None:
    """The handlers before :func:`install`; after a stop by a signal, ours stay until the process exits, so that
    another signal on the way out (interpreter shutdown can take a second) still exits with 128 + the first."""
    if _state["signum"] is not None:
        return
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def exit_if_stopped(status: int) -> None:
    """After a run a signal stopped: exit now with ``status`` (output flushed), skipping the interpreter's shutdown,
    which resets Python's signal handlers -- a further signal then would kill the process by its default action
    (exit status -15) instead of the 128 + first signal the run reports."""
    if _state["signum"] is None:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def pending():
    """The signal received so far, or None."""
    return _state["signum"]


def _handler(signum, frame):
    if _state["signum"] is not None:            # a second signal: no more clean-up, but nothing left behind
        hard_stop()
        os.write(2, ("run_all.py: %s again during the clean-up; stopped at once\n"
                     % signal.Signals(signum).name).encode())
        os._exit(128 + _state["signum"])
    _state["signum"] = signum
    kill_kernels(signal.SIGTERM)
    if _state["deferring"]:
        signal.signal(signal.SIGALRM, _grace_over)
        signal.alarm(GRACE_S)
        return
    raise Interrupted(signum)


def _grace_over(signum, frame):
    raise Interrupted(_state["signum"])


def raise_if_signalled() -> None:
    """Raise :class:`Interrupted` if a signal came."""
    if _state["signum"] is not None:
        signal.alarm(0)
        raise Interrupted(_state["signum"])


@contextlib.contextmanager
def deferred():
    """A block a signal does not cut short (it stops the kernels instead); the signal is raised after it."""
    _state["deferring"] += 1
    try:
        yield
    finally:
        _state["deferring"] -= 1
    if not _state["deferring"]:
        raise_if_signalled()


def track_kernel(key, pgid: int) -> None:
    """A kernel was started (its own process group); stop it at once if a signal already came."""
    _kernels[key] = pgid
    if _state["signum"] is not None:
        kill_kernels(signal.SIGTERM)


def untrack_kernel(key) -> None:
    _kernels.pop(key, None)


def track_run(key, signal_all) -> None:
    """A data-parallel run started: ``signal_all(sig)`` sends ``sig`` to every process of it (its launchers'
    process groups and every process carrying its marker).  :func:`hard_stop` calls it with SIGKILL."""
    _runs[key] = signal_all


def untrack_run(key) -> None:
    _runs.pop(key, None)


@contextlib.contextmanager
def temporary_folder(prefix: str, parent: Optional[str] = None):
    """A new folder (in ``parent``, else the temporary folder) for the temporary files of processes the runner
    starts (their ``TMPDIR``: a notebook's kernel, a data-parallel run, an install command), removed with what they
    left there when the block ends, however it ends, and by :func:`hard_stop` after a second signal's SIGKILL.
    Its name, ``<prefix><host>.<pid>.<start>-<random>``, names this runner (:mod:`common.processes`): the folders
    of ``prefix`` that runners of this host which no longer run left in ``parent`` are removed first
    (:func:`remove_stale_folders`)."""
    parent = parent or tempfile.gettempdir()
    remove_stale_folders(prefix, parent)
    pid = os.getpid()
    path = tempfile.mkdtemp(prefix="%s%s.%d.%s-" % (prefix, host_id(), pid, process_start_time(pid) or "0"),
                            dir=parent)
    _folders.add(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        _folders.discard(path)


def remove_stale_folders(prefix: str, parent: str) -> List[str]:
    """Remove the folders ``<prefix><host>.<pid>.<start>-*`` in ``parent`` (:func:`temporary_folder`) of this host
    whose runner no longer runs (killed outright: nothing of it could remove them); a live runner's folders, another
    host's or container's, and names of another form are left alone.  Returns the paths removed."""
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    here = host_id()
    for name in names:
        if not name.startswith(prefix):
            continue
        host, pid, start = (name[len(prefix):].split("-", 1)[0].split(".") + ["", "", ""])[:3]
        if host != here or not (pid.isdigit() and start.isdigit()):
            continue
        if runner_alive(int(pid), None if start == "0" else start):
            continue
        path = os.path.join(parent, name)
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.append(path)
    return removed


def hard_stop() -> None:
    """SIGKILL to every tracked kernel and every process of every tracked data-parallel run, then their temporary
    folders removed: what a second signal does before the runner exits at once.  Takes milliseconds (a scan of
    /proc per run)."""
    kill_kernels(signal.SIGKILL)
    for signal_all in list(_runs.values()):
        try:
            signal_all(signal.SIGKILL)
        except Exception:   # noqa: B902 -- on the way out: the other runs still get theirs
            pass
    for path in list(_folders):
        shutil.rmtree(path, ignore_errors=True)


def kill_kernels(sig=signal.SIGTERM) -> None:
    for pgid in list(_kernels.values()):
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass


def reap_kernels(wait_s: float = 5.0) -> None:
    """Make sure no tracked kernel (or anything it started) is left: SIGTERM, then SIGKILL."""
    import time
    if not _kernels:
        return
    kill_kernels(signal.SIGTERM)
    deadline = time.time() + wait_s
    while time.time() < deadline and any(_group_alive(g) for g in _kernels.values()):
        time.sleep(0.05)
    kill_kernels(signal.SIGKILL)
    _kernels.clear()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except OSError:
        return False
    # a kernel that died but was not waited for yet is a zombie of this process: reap it
    try:
        pid, _ = os.waitpid(pgid, os.WNOHANG)
        return pid == 0
    except ChildProcessError:
        return True


def stderr_line(text: str) -> None:
    sys.stdout.flush()
    print(text, file=sys.stderr, flush=True)
