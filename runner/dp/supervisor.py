"""Starting, watching and stopping the W processes of one data-parallel run (:func:`launch`): on this host, or
on several over ssh (runner/dp/hosts.py); the failure reasons; the staging directory's ownership.  Nothing of a
run outlives it (runner/dp/launch.py's docstring, "Failures" and "A runner that dies")."""
import contextlib
import ctypes
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
import uuid
from typing import Dict, List, Optional

from common import results
from common.processes import process_start_time

from runner import interrupt
from runner.dp import host_agent
from runner.base import ROOT, last_error_line
from runner.dp.launchers import Launcher, _ps_env

WORKER = os.path.join(ROOT, "runner", "dp", "worker.py")
#: the variable that marks every process of one data-parallel run (its value: the run's id)
MARKER = "DS2_DP_RUN"
#: seconds between SIGTERM and SIGKILL when a run is torn down
GRACE_S = 5.0
#: seconds a process may linger after every rank reported "ok" (a non-daemon thread, a shutdown barrier)
LINGER_S = 30.0
POLL_S = 0.1


# ---- processes ------------------------------------------------------------------------------------
def free_ports(n: int) -> List[int]:
    """``n`` distinct free TCP ports on the loopback interface (bound, read, released together)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()
PR_SET_PDEATHSIG = 1


def _child_setup(sig=signal.SIGTERM):
    """In the child, before exec: get ``sig`` when the runner dies (Linux)."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, sig)


def _worker_setup():
    """A worker (or MXNet ps-lite role) the runner starts itself: SIGKILL when the runner dies -- a framework's
    SIGTERM handler must not keep it alive."""
    _child_setup(signal.SIGKILL)


def marked_processes(marker_value: str, name: str = MARKER) -> List[int]:
    """Live processes (not zombies) whose initial environment holds ``name=marker_value``: a /proc scan."""
    return host_agent.marked(marker_value, name)


def terminate(procs: List[subprocess.Popen], marker_value: str, grace: float = GRACE_S) -> None:
    """SIGTERM every process of the run, SIGKILL what is left after ``grace`` seconds, reap the children.
    A second Ctrl-C while this runs does not cut it short (it is ignored until the teardown is done)."""
    import threading
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        _terminate(procs, marker_value, grace)
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)


def _terminate(procs: List[subprocess.Popen], marker_value: str, grace: float) -> None:
    host_agent.stop_all(procs, marker_value, grace, name=MARKER)
    for p in procs:                              # reaped (stop_all polled them); a stuck one gets ``grace`` more
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass


class LaunchResult:
    def __init__(self, ok: bool, reason: Optional[str], returncodes: List[Optional[int]], statuses: Dict[int, dict],
                 wall_s: float, commands: List[str], teardown: Optional[str] = None):
        self.ok = ok
        self.reason = reason
        self.returncodes = returncodes
        self.statuses = statuses
        self.wall_s = wall_s
        self.commands = commands
        self.teardown = teardown   # every rank reported ok, then a process died at exit: what died, and how


def _read_statuses(status_prefix: str, world: int) -> Dict[int, dict]:
    out = {}
    for rank in range(world):
        try:
            with open("%s.rank%d.status.json" % (status_prefix, rank)) as f:
                out[rank] = json.load(f)
        except (OSError, ValueError):
            pass
    return out


def _log_line(log_prefix: str, rank: int) -> str:
    path = "%s.rank%d.log" % (log_prefix, rank)
    try:
        with open(path, errors="replace") as f:
            text = f.read()[-20000:]
    except OSError:
        return "no log"
    lines = [l for l in text.splitlines() if l.strip() and not l.startswith("[dp_worker]")]
    return results.one_line(last_error_line("\n".join(lines)), 200) if lines else "empty log"


def _role_log_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return results.one_line(last_error_line(f.read()[-20000:]), 200)
    except OSError:
        return "no log"


def _describe_code(code: Optional[int]) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return "killed by %s" % signal.Signals(-code).name
        except ValueError:
            return "killed by signal %d" % -code
    return "exit status %d" % code


_TORCHRUN_ROOT = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
_MPIEXEC_ROOT = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)")


def root_cause(launcher_log: str) -> Optional[tuple]:
    """(rank, exit code) of the first rank that one launcher process (torchrun, mpiexec) saw die, from its
    log: torchrun's "Root Cause (first observed failure)" block, mpiexec's "process rank R ... exited on
    signal S"; None when the log names none."""
    try:
        with open(launcher_log, errors="replace") as f:
            text = f.read()[-50000:]
    except OSError:
        return None
    m = _TORCHRUN_ROOT.search(text)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = _MPIEXEC_ROOT.search(text)
    if m:
        return int(m.group(1)), -int(m.group(2))
    return None


def teardown_note(world: int, log_prefix: str, cause: Optional[tuple], returncodes: List[Optional[int]],
                  ps_roles: List[str]) -> str:
    """One line for a run whose every rank reported ok and whose processes then did not all exit cleanly:
    which process died at exit (``cause``, as :func:`failure_reason` takes it), how, and the last line of its
    log (e.g. gloo's "terminate called without an active exception" when one rank's interpreter shut down
    while another still held the process group)."""
    if cause is None:
        return "the launcher exited with %s" % _describe_code(returncodes[0] if returncodes else None)
    index, code = cause
    if index >= world:
        role = ps_roles[index - world] if index - world < len(ps_roles) else "process %d" % index
        return "the MXNet ps-lite %s died at exit (%s)" % (role, _describe_code(code))
    return "rank %d died at exit (%s): %s" % (index, _describe_code(code), _log_line(log_prefix, index))


def failure_reason(world: int, statuses: Dict[int, dict], log_prefix: str, launcher_log: str,
                   returncodes: List[Optional[int]], per_rank: bool, timed_out: Optional[float],
                   cause: Optional[tuple] = None) -> str:
    """One line: which rank failed first, and why (its status, else the last error line of its log).

    ``cause``: (process index, exit code) of the first process to die -- per-rank launchers: the first the
    runner saw exit non-zero, before the teardown killed the others (their codes then say SIGTERM, which is
    not the cause); torchrun and mpiexec: the rank their log names (:func:`root_cause`)."""
    failed = sorted((s for s in statuses.values() if s.get("status") == "failed"),
                    key=lambda s: s.get("finished") or 0)
    if timed_out is not None and not failed:
        running = [r for r in range(world) if statuses.get(r, {}).get("status") != "ok"]
        first = running[0] if running else 0
        return ("timed out after %g s (ranks still running: %s); rank %d's last log line: %s"
                % (timed_out, ", ".join(map(str, running)) or "none", first, _log_line(log_prefix, first)))
    if failed:
        s = failed[0]
        return "rank %d failed: %s" % (s["rank"], s.get("error") or _log_line(log_prefix, s["rank"]))
    unfinished = [r for r in range(world) if statuses.get(r, {}).get("status") != "ok"]
    if cause is not None and cause[0] < world and statuses.get(cause[0], {}).get("status") == "ok" and unfinished:
        # it had finished its work and died at exit; the teardown then stopped a rank that had not finished
        return ("rank %d died at exit (%s) after reporting ok, and rank %d was stopped before it finished: %s"
                % (cause[0], _describe_code(cause[1]), unfinished[0], _log_line(log_prefix, cause[0])))
    if per_rank and cause is not None:   # died without a "failed" status: a signal, os._exit, no dp_worker
        rank, code = cause
        return "rank %d died (%s): %s" % (rank, _describe_code(code), _log_line(log_prefix, rank))
    # one launcher process (torchrun, mpiexec): the ranks that never finished, else the launcher's own words
    for rank in range(world):
        if statuses.get(rank, {}).get("status") != "ok":
            state = "never started" if rank not in statuses else "died without finishing"
            return "rank %d %s (launcher %s): %s" % (rank, state, _describe_code(returncodes[0]),
                                                    _log_line(log_prefix, rank))
    if cause is not None:
        line = "rank %d %s: %s" % (cause[0], _describe_code(cause[1]), _log_line(log_prefix, cause[0]))
    else:
        try:
            with open(launcher_log, errors="replace") as f:
                line = last_error_line(f.read()[-20000:])
        except OSError:
            line = "no launcher log"
    return "the launcher failed (%s): %s" % (_describe_code(returncodes[0]), results.one_line(line, 200))


def launcher_env(launcher: Launcher, venv: Optional[str]) -> dict:
    """The environment every process of a launch gets besides the runner's own: the launcher's name, unbuffered
    output and the launcher's own additions (a venv's library path). One source for :func:`launch` and
    ``--print-host-commands`` (runner/distributed.print_commands)."""
    env = {"DS2_LAUNCHER": launcher.name, "PYTHONUNBUFFERED": "1"}
    if launcher.extra_env and venv:
        env.update(launcher.extra_env(venv))
    return env


def worker_argv(log_prefix: str, status_prefix: str, script: str) -> List[str]:
    """The worker command after the interpreter: runner/dp/worker.py around the exported notebook."""
    return [WORKER, "--log-prefix", log_prefix, "--status-prefix", status_prefix, script]


def port_count(launcher: Launcher, world: int) -> int:
    """How many ports a launch of ``world`` workers needs: one per worker (``ports < 0``) or the launcher's count."""
    return world if launcher.ports < 0 else max(1, launcher.ports)


def launch(launcher: Launcher, python: str, script: str, world: int, log_prefix: str, status_prefix: str,
           cwd: str, timeout: Optional[float] = None, env: Optional[dict] = None, venv: Optional[str] = None,
           run_id: Optional[str] = None, announce=print, grace: float = GRACE_S,
           linger: float = LINGER_S, hosts=None, ssh_options: Optional[List[str]] = None,
           join_timeout: Optional[float] = None) -> LaunchResult:
    """Run ``script`` as ``world`` workers with ``launcher``; wait; tear everything down on any failure,
    a timeout or an interruption (which is re-raised after the teardown).  Never leaves a process behind.

    ``hosts`` (runner/dp/hosts.py): the processes start on those hosts over ssh (``ssh_options``), each host's under
    runner/dp/host_agent.py; a host none of whose processes has started within ``join_timeout`` s fails the run.

    A run whose every rank reported "ok" but whose processes have not exited ``linger`` seconds later
    (a non-daemon thread, a framework's shutdown barrier) is stopped and counts as ok, with a note.

    On this host the processes get a temporary folder of their own (``TMPDIR``), removed with everything in it when
    the launch ends however it ends: what they leave there (torchrun's ``torchelastic_*`` log folders, TensorFlow's
    AutoGraph sources, OpenMPI's session folder) goes with it. On several hosts each host's agent does the same there
    (runner/dp/host_agent.py); OpenMPI's route over ssh starts the other hosts' processes itself.

    The steps: plan the processes (:func:`_process_specs`), start and watch them (:func:`_start_and_watch`, whose
    ``finally`` stops them: no path out of it, a failure, a timeout or Ctrl-C, can skip the teardown), then what
    the run came to (:func:`_outcome`)."""
    run_id = run_id or uuid.uuid4().hex
    base_env = dict(os.environ if env is None else env)
    scratch = contextlib.nullcontext() if hosts else interrupt.temporary_folder("ds2-dp-", base_env.get("TMPDIR"))
    with scratch as tmp:
        if tmp:
            base_env["TMPDIR"] = tmp
        base_env[MARKER] = run_id
        base_env.update(launcher_env(launcher, venv))
        base_env["DS2_RUNNER_PID"] = str(os.getpid())     # runner/dp/worker.py ends itself when this process is gone
        base_env["DS2_RUNNER_START"] = process_start_time(os.getpid()) or ""
        ranks = 1 if launcher.kind == "single" else world   # processes with a rank (and a log and a status)
        for stale in range(ranks):
            for path in ("%s.rank%d.status.json" % (status_prefix, stale), "%s.rank%d.log" % (log_prefix, stale)):
                if os.path.exists(path):
                    os.remove(path)
        if hosts:
            from runner.dp import hosts as hosts_mod
            join_timeout = hosts_mod.JOIN_TIMEOUT_S if join_timeout is None else join_timeout
        specs, host_lines, ps_roles = _process_specs(launcher, python, worker_argv(log_prefix, status_prefix, script),
                                                     world, base_env, log_prefix, run_id, grace, cwd, hosts,
                                                     ssh_options, join_timeout)
        commands = host_lines or [" ".join(shlex.quote(a) for a in argv) for argv, _, _ in specs]
        t0 = time.time()
        procs, ended = _start_and_watch(specs, launcher, run_id, cwd, status_prefix, ranks, timeout, grace, linger,
                                        hosts, join_timeout)
        return _outcome(launcher, procs, ended, t0, commands, status_prefix, log_prefix, ranks, ps_roles, announce,
                        linger, hosts, join_timeout)


def _process_specs(launcher: Launcher, python: str, worker: List[str], world: int, base_env: dict, log_prefix: str,
                   run_id: str, grace: float, cwd: str, hosts, ssh_options, join_timeout):
    """The processes a launch starts: ([(argv, env, stdout path)], each host's lines (several hosts), the MXNet
    ps-lite roles started after the W workers)."""
    launcher_log = log_prefix + ".launcher.log"
    ps_roles = []                                          # kind "ps": the processes after the W workers
    specs = []   # (argv, env, stdout path)
    host_lines = []
    if hosts and launcher.kind == "mpiexec":       # OpenMPI starts the other hosts' processes itself, over ssh
        from runner.dp import hosts as hosts_mod
        base_env["DS2_HOST_OF_RANK"] = ",".join(h.name for _, h, _ in hosts_mod.rank_hosts(hosts))
        argv = hosts_mod.mpiexec_argv(hosts, world, ssh_options or [], log_prefix + ".hostfile", join_timeout)
        for name in sorted(set(["LD_LIBRARY_PATH", MARKER, "DS2_LAUNCHER", "PYTHONUNBUFFERED", "DS2_HOST_OF_RANK"])
                           & set(base_env)):
            argv += ["-x", name]
        specs.append((argv + [python] + worker, base_env, launcher_log))
    elif hosts:
        from runner.dp import hosts as hosts_mod
        local_only = (MARKER, "DS2_RUNNER_PID", "DS2_RUNNER_START")     # the agent watches the connection instead
        additions = {k: v for k, v in base_env.items() if os.environ.get(k) != v and k not in local_only}
        ports = free_ports(port_count(launcher, world))
        per_host = hosts_mod.host_processes(launcher, hosts, python, worker, additions, ports, run_id, join_timeout)
        for i, (name, processes) in enumerate(per_host.items()):
            # a marker per host: an agent stops its own host's processes only (simulated hosts share one PID space)
            spec = hosts_mod.agent_spec(processes, "%s-%d" % (run_id, i), hosts[0].name, grace)
            argv = hosts_mod.ssh_argv(ssh_options or [], name, hosts_mod.remote_command(python, spec, cwd),
                                      join_timeout)
            specs.append((argv, base_env, "%s.host%d.log" % (log_prefix, i)))
            host_lines += ["%s: %s" % (name, line) for line in hosts_mod.printable(processes, cwd)]
    elif launcher.kind == "torchrun":
        torchrun = os.path.join(os.path.dirname(python), "torchrun")
        argv = [torchrun, "--standalone", "--nnodes", "1", "--nproc_per_node", str(world), "--max-restarts", "0"] \
            + worker
        specs.append((argv, base_env, launcher_log))
    elif launcher.kind == "mpiexec":
        argv = ["mpiexec", "--allow-run-as-root", "--oversubscribe", "-n", str(world)]
        for name in sorted(set(["LD_LIBRARY_PATH", MARKER, "DS2_LAUNCHER", "PYTHONUNBUFFERED", "DS2_RUNNER_PID",
                                "DS2_RUNNER_START"]) & set(base_env)):
            argv += ["-x", name]
        specs.append((argv + [python] + worker, base_env, launcher_log))
    elif launcher.kind == "single":
        specs.append(([python] + worker, base_env, launcher_log))
    elif launcher.kind == "ps":      # MXNet dist_sync: W workers, then the ps-lite scheduler and one server
        ps = _ps_env(world, free_ports(1)[0])
        for rank in range(world):
            rank_env = dict(base_env, DMLC_ROLE="worker", RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                            **ps)
            specs.append(([python] + worker, rank_env, "%s.rank%d.log" % (log_prefix, rank)))
        for role in ("scheduler", "server"):   # `import mxnet` with DMLC_ROLE=scheduler|server serves, then exits
            ps_roles.append(role)
            specs.append(([python, "-c", "import mxnet"], dict(base_env, DMLC_ROLE=role, **ps),
                          "%s.%s.log" % (log_prefix, role)))
    elif launcher.kind == "processes":
        ports = free_ports(world if launcher.ports < 0 else launcher.ports)
        for rank in range(world):
            rank_env = dict(base_env, **launcher.rank_env(rank, world, ports))
            specs.append(([python] + worker, rank_env, "%s.rank%d.log" % (log_prefix, rank)))
    else:
        raise ValueError("unknown launcher kind %r" % launcher.kind)
    return specs, host_lines, ps_roles


def _start_and_watch(specs, launcher: Launcher, run_id: str, cwd: str, status_prefix: str, ranks: int,
                     timeout: Optional[float], grace: float, linger: float, hosts, join_timeout):
    """Start every process of ``specs`` and watch them until one fails, all end, the timeout passes, a host has not
    joined, or every rank reported ok and a process lingers; then stop them all, whatever happened (the
    ``finally``).  Returns (the processes, {"first_exit", "timed_out", "missing_hosts", "lingered"})."""
    if hosts:
        from runner.dp import hosts as hosts_mod
    procs = []   # type: List[subprocess.Popen]
    # a second signal: SIGKILL to all
    interrupt.track_run(run_id, lambda sig: host_agent.signal_all(procs, run_id, MARKER, sig))
    # torchrun and mpiexec stop their workers on SIGTERM; what the runner starts itself gets SIGKILL; an ssh client
    # that ends closes the connection, and the host's agent stops every process of that host
    preexec = _child_setup if launcher.kind in ("torchrun", "mpiexec") or hosts else _worker_setup
    t0 = time.time()
    timed_out = None
    first_exit = None
    all_ok_since = None
    lingered = False
    next_status_read = 0.0
    missing_hosts = None                     # hosts that had not joined when --join-timeout passed
    try:
        for argv, proc_env, out_path in specs:
            with open(out_path, "a") as out:
                procs.append(subprocess.Popen(argv, cwd=cwd, env=proc_env, stdout=out, stderr=subprocess.STDOUT,
                                              stdin=subprocess.PIPE if hosts else subprocess.DEVNULL,
                                              start_new_session=True, preexec_fn=preexec))
        while True:
            codes = [p.poll() for p in procs]
            bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                first_exit = bad[0]
                break                                   # a worker (or the launcher) failed: stop them all
            if all(c == 0 for c in codes):
                break
            if timeout is not None and time.time() - t0 > timeout:
                timed_out = timeout
                break
            now = time.time()
            if now >= next_status_read:           # every rank done, yet a process lingers?
                next_status_read = now + 1.0
                done = _read_statuses(status_prefix, ranks)
                if hosts and now - t0 > join_timeout and hosts_mod.not_joined(hosts, done):
                    missing_hosts = hosts_mod.not_joined(hosts, done)
                    break
                if all(done.get(r, {}).get("status") == "ok" for r in range(ranks)):
                    all_ok_since = all_ok_since or now
                    if now - all_ok_since > linger:
                        lingered = True
                        break
            time.sleep(POLL_S)
    finally:   # success, failure, timeout, KeyboardInterrupt alike: nothing of the run survives this
        try:
            if hosts and launcher.kind != "mpiexec":
                close_connections(procs, grace)
            terminate(procs, run_id, grace)
        finally:
            interrupt.untrack_run(run_id)
    return procs, {"first_exit": first_exit, "timed_out": timed_out, "missing_hosts": missing_hosts,
                   "lingered": lingered}


def _outcome(launcher: Launcher, procs, ended: dict, t0: float, commands: List[str], status_prefix: str,
             log_prefix: str, ranks: int, ps_roles: List[str], announce, linger: float, hosts,
             join_timeout) -> LaunchResult:
    """What the run came to, from the exit codes and the ranks' status files: ok, or the reason it failed (the
    rank, the host, the ps-lite role, the root cause in the launcher's log); a note on a teardown after success."""
    first_exit, timed_out, missing_hosts, lingered = (ended[k] for k in ("first_exit", "timed_out", "missing_hosts",
                                                                         "lingered"))
    launcher_log = log_prefix + ".launcher.log"
    codes = [p.returncode for p in procs]
    statuses = _read_statuses(status_prefix, ranks)
    # the run counts when every rank reported ok: its work is done and its files written.  A process that then
    # lingers is stopped; one that dies at exit (a framework's teardown) is named in ``teardown``
    ok = timed_out is None and missing_hosts is None and \
        all(statuses.get(r, {}).get("status") == "ok" for r in range(ranks))
    if hosts and launcher.kind != "mpiexec":
        reason = None if ok else host_failure_reason(hosts, ranks, statuses, log_prefix, codes, first_exit,
                                                     timed_out, missing_hosts, join_timeout)
        teardown = None
        if ok and any(c != 0 for c in codes):
            teardown = "the processes of %s exited %s" % (", ".join(h.name for h, c in zip(hosts, codes) if c != 0),
                                                           ", ".join(_describe_code(c) for c in codes if c != 0))
            announce("  note: every rank finished and reported ok; then %s" % teardown)
        return LaunchResult(ok, reason, codes, statuses, time.time() - t0, commands, teardown)
    per_rank = launcher.kind in ("processes", "ps")
    cause = first_exit if per_rank else root_cause(launcher_log) if any(c != 0 for c in codes) else None
    teardown = None
    if ok and lingered:
        announce("  note: every rank finished, but processes lingered %g s after it; stopped them" % linger)
    elif ok and any(c != 0 for c in codes):
        teardown = teardown_note(ranks, log_prefix, cause, codes, ps_roles)
        announce("  note: every rank finished and reported ok; then %s" % teardown)
    reason = None if ok else failure_reason(ranks, statuses, log_prefix, launcher_log, codes, per_rank, timed_out,
                                            cause)
    if missing_hosts:
        reason = host_failure_reason(hosts, ranks, statuses, log_prefix, codes, first_exit, timed_out, missing_hosts,
                                     join_timeout).split("; its connection:")[0]
    if not ok and first_exit is not None and first_exit[0] >= ranks and ps_roles and \
            not any(s.get("status") == "failed" for s in statuses.values()):
        role = ps_roles[first_exit[0] - ranks]
        reason = "the MXNet ps-lite %s died (%s): %s" % (role, _describe_code(first_exit[1]),
                                                         _role_log_line("%s.%s.log" % (log_prefix, role)))
    return LaunchResult(ok, reason, codes, statuses, time.time() - t0, commands, teardown)


def close_connections(procs: List[subprocess.Popen], grace: float) -> None:
    """Close every host's ssh connection (its agent then stops that host's processes) and wait for the agents to
    report back, at most ``grace`` + 5 s; what is still connected after that gets the usual teardown."""
    for p in procs:
        try:
            if p.stdin:
                p.stdin.close()
        except OSError:
            pass
    deadline = time.time() + grace + 5
    while time.time() < deadline and any(p.poll() is None for p in procs):
        time.sleep(POLL_S)


def host_failure_reason(hosts, ranks: int, statuses: Dict[int, dict], log_prefix: str, codes: List[Optional[int]],
                        first_exit, timed_out, missing_hosts, join_timeout: float) -> str:
    """One line: the host that did not join, the rank that failed (and its host), or the host whose connection
    or processes ended first."""
    if missing_hosts:
        return ("host %s did not join within %g s (--join-timeout): none of its processes started; its connection: "
                "%s" % (", ".join(missing_hosts), join_timeout,
                        _role_log_line("%s.host%d.log" % (log_prefix, [h.name for h in hosts].index(missing_hosts[0])))))
    failed = sorted(r for r, st in statuses.items() if st.get("status") == "failed")
    if failed:
        st = statuses[failed[0]]
        return "rank %d (host %s) failed: %s" % (failed[0], st.get("ds2_host"), st.get("error") or "no message")
    if timed_out is not None:
        return "timed out after %g s (--timeout)" % timed_out
    if first_exit is not None:
        i, code = first_exit
        line = _role_log_line("%s.host%d.log" % (log_prefix, i))
        if code == 255:
            return "host %s did not join: ssh failed: %s" % (hosts[i].name, line)
        gone = [r for r in range(ranks) if statuses.get(r, {}).get("status") == "running"
                and statuses[r].get("ds2_host") == hosts[i].name]
        return "the processes of host %s ended (%s)%s: %s" % (
            hosts[i].name, _describe_code(code), "; rank %s never reported" % ", ".join(map(str, gone)) if gone else "",
            line)
    return "a rank did not report ok"


def _which(name: str) -> Optional[str]:
    import shutil
    return shutil.which(name)
