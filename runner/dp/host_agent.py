"""What ``run_all.py --hosts`` runs on each host, over ssh: ``python runner/dp/host_agent.py SPEC``.

SPEC (base64 JSON) lists the processes of this host: the framework's own launcher (torchrun) or its workers,
each an argv and the variables to add to the environment.  The agent starts them, waits, and exits with the
first non-zero status (0 when all end well).  It is not a launcher: it adds no rendezvous or collective of its
own; it makes sure nothing of the run outlives the runner on this host:

- when its standard input reaches end-of-file -- the runner closed it, or the runner or the ssh connection died
  -- or it gets SIGTERM, SIGINT or SIGHUP, it sends SIGTERM to every process it started (their process groups)
  and to every process whose environment carries the run's marker (``DS2_DP_HOST_RUN``: torchrun starts its
  workers in sessions of their own), waits ``grace`` seconds and SIGKILLs what is left;
- its processes get a temporary folder of their own on this host (``TMPDIR``), removed with what they left there
  (torchrun's ``torchelastic_*`` logs, TensorFlow's AutoGraph sources) when the agent ends;
- before it starts them, it names the network interface that reaches the first host (``route_to``) in
  ``GLOO_SOCKET_IFNAME`` unless that is set: Gloo would otherwise bind the address the machine's hostname
  resolves to, which another host may not reach.

Standard library only, Python 3.6-compatible (CNTK's environment).
"""
import base64
import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

MARKER = "DS2_DP_HOST_RUN"
POLL_S = 0.1


def marked(value, name=MARKER):
    """Live processes (not zombies) whose initial environment holds name=value (a /proc scan), this one
    excepted."""
    needle = ("%s=%s" % (name, value)).encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open("/proc/%s/stat" % entry) as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    continue
        except (OSError, IndexError):
            continue
        out.append(int(entry))
    return out


def signal_all(procs, value, name, sig):
    """``sig`` to the process group of each of ``procs`` and to every marked process outside those groups: once
    to each (a runner that hears SIGTERM again during its clean-up stops at once and records nothing)."""
    groups = set()
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)           # its session = its process group
                groups.add(p.pid)
            except OSError:
                pass
    for pid in marked(value, name):
        try:
            if os.getpgid(pid) not in groups:   # a kernel or launcher in a session of its own
                os.kill(pid, sig)
        except OSError:
            pass


def _wait_all(procs, value, name, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline and (any(p.poll() is None for p in procs) or marked(value, name)):
        time.sleep(POLL_S)


def stop_all(procs, value, grace, name=MARKER):
    """SIGTERM to every process of ``procs`` (its process group) and to every process marked name=value, then
    SIGKILL to what is left after ``grace`` seconds -- also when a signal cuts the grace period short -- and up to
    ``grace`` seconds more for them to go (the children reaped).  The one way the project stops what a run started:
    the host agent, the data-parallel supervisor (runner/dp/supervisor.py) and the GPU session (tools/gpu_session.py)."""
    try:
        signal_all(procs, value, name, signal.SIGTERM)
        _wait_all(procs, value, name, grace)
    finally:
        signal_all(procs, value, name, signal.SIGKILL)
    _wait_all(procs, value, name, grace)


def interface_to(host, port=9):
    """The name of the local interface whose address routes to ``host`` (None when unknown)."""
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect((host, port))                   # no packet is sent: the kernel picks the route and source
        local = s.getsockname()[0]
        s.close()
        for _, name in socket.if_nameindex():
            probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
                if socket.inet_ntoa(packed[20:24]) == local:
                    return name
            except OSError:
                pass
            finally:
                probe.close()
    except (OSError, ValueError):
        pass
    return None


def main(argv):
    usage = "host_agent.py: error: expected one argument, SPEC (base64 JSON: marker, grace, route_to, processes)"
    if len(argv) != 1:
        sys.stderr.write(usage + "\n")
        return 2
    try:                                # the runner writes SPEC; anything else is one line, not a traceback
        spec = json.loads(base64.b64decode(argv[0], validate=True).decode())
        value, grace = spec["marker"], float(spec.get("grace", 5.0))
        if not isinstance(spec.get("processes"), list):
            raise ValueError("no list of processes")
    except (ValueError, TypeError, KeyError, AttributeError) as e:    # binascii.Error is a ValueError
        sys.stderr.write("%s; got %r (%s)\n" % (usage, argv[0][:40], str(e).splitlines()[0] if str(e) else
                                                 type(e).__name__))
        return 2
    base = dict(os.environ, **{MARKER: value})
    if spec.get("route_to") and "GLOO_SOCKET_IFNAME" not in base:
        name = interface_to(spec["route_to"])
        if name:
            base["GLOO_SOCKET_IFNAME"] = name
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    def watch_stdin():
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    base["TMPDIR"] = tempfile.mkdtemp(prefix="ds2-dp-")   # this host's folder for the run, under the host's own
    procs = []
    code = None
    try:
        for p in spec["processes"]:
            procs.append(subprocess.Popen(p["argv"], env=dict(base, **p.get("env", {})), cwd=p.get("cwd"),
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        while not stop.is_set():
            codes = [p.poll() for p in procs]
            bad = [c for c in codes if c not in (None, 0)]
            if bad:
                code = bad[0]
                break
            if all(c == 0 for c in codes):
                code = 0
                break
            time.sleep(POLL_S)
    finally:
        stop_all(procs, value, grace)
        shutil.rmtree(base["TMPDIR"], ignore_errors=True)
    if code is None:
        sys.stderr.write("[host_agent] stopped: every process of this host ended\n")
        return 143
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
