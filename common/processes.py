"""Which process: a pid and its start time name one process, even after the pid is reused.  How a run's workers
notice that their runner died, and how a run tells the files and folders of a runner that no longer runs from a
live one's.  A pid says nothing on another machine, or in another container's pid namespace that shares the
folder: :func:`host_id` tells them apart, and what another host made is never taken for dead.  Standard library
only; runs on Python 3.6 and before the runner's environment exists."""
import hashlib
import os
import socket
from typing import Optional


def process_start_time(pid: int) -> Optional[str]:
    """``pid``'s start time in clock ticks since boot (/proc/PID/stat, field 22), or None: with the pid, it
    names one process even after the pid is reused."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def runner_alive(pid: int, start: Optional[str]) -> bool:
    """Whether the process ``pid`` that started at ``start`` (:func:`process_start_time`; None: any) still runs:
    how a worker (``runner/dp/worker.py``, ``DS2_RUNNER_PID``/``DS2_RUNNER_START``) notices that its runner died."""
    now = process_start_time(pid)
    if now is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True
        return start is None          # no /proc: the pid exists
    return start is None or now == start


def host_id() -> str:
    """Eight hex digits that name this host (of its host name: a container has its own), for the names of what a
    runner leaves in a folder another host or container may share."""
    return hashlib.sha1(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]
