"""One worker of a data-parallel run: ``python runner/dp/worker.py --log-prefix P --status-prefix S script.py``.

What every launcher of :mod:`runner.dp.launch` starts (torchrun, mpiexec, or the runner itself, once
per rank), in the framework's environment.  Standard library only and Python 3.6-compatible (CNTK's
interpreter); it imports nothing of the framework and nothing of ``runner`` (it runs by path).

1. Finds its rank from the launcher's standard variables (:func:`common.parallel.world_from_env`).
2. Sends its own stdout and stderr -- file descriptors 1 and 2, so the framework's C++ logs too -- to
   ``<P>.rank<N>.log``.
3. Runs the exported notebook ``script.py`` as ``__main__`` (cwd: the notebook's directory, as
   papermill runs it).
4. Writes ``<S>.rank<N>.status.json``: {"status": "running"} when it starts, then "ok", or "failed"
   with a one-line reason (the exception, or the SystemExit code).  A worker killed by a signal
   leaves "running": the runner reads that as "killed".
5. Watches the runner (``DS2_RUNNER_PID``, ``DS2_RUNNER_START``) from a daemon thread, every
   :data:`WATCH_S` seconds: once the runner is gone (SIGKILLed, say by the OOM killer), the worker
   SIGKILLs itself -- whoever its parent is (torchrun, mpiexec, the runner), and whatever the framework
   does with SIGTERM.
"""
import json
import os
import signal
import sys
import threading
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # runner/dp/worker.py


def _write_json(path, obj):
    tmp = "%s.%d.partial" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _one_line(text, limit=300):
    for line in (text or "").strip().splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[:limit - 1] + "\u2026"
    return "no message"


#: seconds between two looks at the runner's process
WATCH_S = 0.5


def watch_runner(runner_alive, env=None):
    """Start the daemon thread that ends this process once the runner in ``env`` is gone; returns it, or None
    when no runner is named (a worker started by hand)."""
    env = os.environ if env is None else env
    try:
        pid = int(env.get("DS2_RUNNER_PID", ""))
    except ValueError:
        return None
    start = env.get("DS2_RUNNER_START") or None

    def watch():
        while runner_alive(pid, start):
            time.sleep(WATCH_S)
        sys.stderr.write("[dp_worker] the runner (pid %d) is gone: this worker stops\n" % pid)
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="ds2-runner-watch", daemon=True)
    thread.start()
    return thread


def _host_of_rank(rank):
    """The hostfile's name of this rank's host when the launcher (mpiexec) places ranks host by host."""
    names = [n for n in os.environ.get("DS2_HOST_OF_RANK", "").split(",") if n]
    return names[rank] if rank < len(names) else None


def main(argv):
    args = list(argv)
    prefixes = {}
    while len(args) > 1 and args[0] in ("--log-prefix", "--status-prefix"):
        prefixes[args[0]] = args[1]
        args = args[2:]
    if len(args) < 1 or set(prefixes) != {"--log-prefix", "--status-prefix"} or \
            not all(p.strip() and os.path.basename(p) for p in prefixes.values()):
        sys.stderr.write("worker.py: error: expected --log-prefix P --status-prefix S script.py [args], each prefix a "
                         "path that ends in a name (got %s)\n" % " ".join(argv)[:200])
        return 2
    script = os.path.abspath(args[0])

    # as ``python script.py`` would: the script's directory first, not runner/dp/ (whose module names --
    # launch, hosts, worker -- must not shadow anything the notebook imports)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    sys.path.insert(0, os.path.dirname(script))
    sys.path.append(ROOT)
    from common.parallel import world_from_env
    from common.processes import runner_alive
    watch_runner(runner_alive)
    world = world_from_env()
    rank = world.rank

    log_path = "%s.rank%d.log" % (prefixes["--log-prefix"], rank)
    status_path = "%s.rank%d.status.json" % (prefixes["--status-prefix"], rank)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # line-buffered text streams on the redirected descriptors
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)

    status = {"rank": rank, "world_size": world.world_size, "source": world.source, "pid": os.getpid(),
              "host": os.uname()[1], "ds2_host": os.environ.get("DS2_HOST") or _host_of_rank(rank), "started": time.time(),
              "status": "running"}
    _write_json(status_path, status)
    print("[dp_worker] rank %d of %d (%s), host %s, pid %d, script %s" % (rank, world.world_size, world.source,
                                                                       os.uname()[1], os.getpid(), script))
    code = 0
    try:
        sys.argv = [script] + args[1:]
        import runpy
        runpy.run_path(script, run_name="__main__")
        status.update(status="ok")
    except SystemExit as e:
        if e.code in (None, 0):
            status.update(status="ok")
        else:
            code = e.code if isinstance(e.code, int) else 1
            status.update(status="failed", error="SystemExit: %s" % _one_line(str(e.code)))
    except BaseException as e:  # noqa: B902 -- every failure, KeyboardInterrupt too, is a failed worker
        traceback.print_exc()
        code = 1
        status.update(status="failed", error="%s: %s" % (type(e).__name__, _one_line(str(e))))
    status["finished"] = time.time()
    status["exit_code"] = code
    sys.stdout.flush()
    sys.stderr.flush()
    _write_json(status_path, status)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
