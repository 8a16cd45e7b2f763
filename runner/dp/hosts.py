"""Data-parallel training across machines: ``run_all.py --workers W --hosts HOSTFILE``.

The hostfile has one ``host[:slots]`` per line (MPI's convention; ``#`` starts a comment): ``slots`` processes
run on that host (default 1), and W is their sum.  Each engine's own multi-node launcher starts them
(:func:`host_processes`):

- torchrun on every host: ``--nnodes N --node_rank R --rdzv_backend c10d --rdzv_endpoint HOST0:PORT`` (host 0
  holds the rendezvous store: ``is_host=1``; ``--local-addr`` is the host's address from the hostfile);
- TensorFlow: one process per slot with ``TF_CONFIG`` listing every worker's ``HOST:PORT``;
- JAX: one process per slot, ``jax.distributed`` with its coordinator on host 0 (``DS2_COORDINATOR``);
- CNTK: ``mpiexec --hostfile`` on the launching host (OpenMPI starts its daemons over ssh);
- MXNet ``dist_sync``: the ps-lite scheduler and a server on host 0, workers everywhere (``DMLC_*``).

Every host's processes start over ``ssh`` (options of ``--ssh``; password-less keys, as MPI assumes) under
``runner/dp/host_agent.py``, which ends them all when the runner closes the connection or dies.  The working tree,
its environments and the results directory are assumed to be at the same path on every host (a shared
filesystem, or a copy); the preflight (:func:`preflight`) checks each host over ssh before training starts.
``--print-host-commands`` prints each host's command instead of running it (for a Slurm or Kubernetes job).

A host *joins* when one of its processes has started (its status file names the host); one that has not within
``--join-timeout`` seconds fails the run with one line naming it.
"""
import base64
import json
import os
import re
import shlex
import signal
import subprocess
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

from runner.base import ROOT

AGENT = os.path.join(ROOT, "runner", "dp", "host_agent.py")
#: the variable that marks every process an agent starts (runner/dp/host_agent.py MARKER)
AGENT_MARKER = "DS2_DP_HOST_RUN"
#: seconds within which every host must have started a process (run_all.py --join-timeout)
JOIN_TIMEOUT_S = 60.0
#: the multi-host launch of each launcher (runner/dp/launch.py LAUNCHERS), in words; None: not supported
MULTI_HOST = {"torchrun": "torchrun on every host, c10d rendezvous on host 0",
              "tf_config": "one process per slot, TF_CONFIG listing every worker",
              "jax": "one process per slot, jax.distributed coordinator on host 0",
              "python": "one process per slot, torchrun's env:// variables (tests)",
              "mpiexec": "mpiexec --hostfile on the launching host",
              "mxnet_dist_sync": "ps-lite scheduler and server on host 0, workers on every host"}


class HostsError(ValueError):
    """A bad hostfile or host set-up: one line."""


class Host:
    def __init__(self, name: str, slots: int):
        self.name, self.slots = name, slots

    def to_dict(self) -> dict:
        return OrderedDict([("host", self.name), ("processes", self.slots)])


def parse_hostfile(path: str) -> List[Host]:
    """The hosts of ``path``: one ``host[:slots]`` per line; HostsError with one line for anything else."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise HostsError("--hosts %s: %s" % (path, e.strerror or e))
    hosts = []
    for n, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        m = re.match(r"^([A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:]+\])(?::(\d+))?$", text)
        if not m or (m.group(2) is not None and int(m.group(2)) < 1):
            raise HostsError("--hosts %s, line %d: expected host[:slots] (slots >= 1), got %r" % (path, n, text))
        if any(h.name == m.group(1) for h in hosts):
            raise HostsError("--hosts %s, line %d: host %s listed twice" % (path, n, m.group(1)))
        hosts.append(Host(m.group(1), int(m.group(2) or 1)))
    if len(hosts) < 2:
        raise HostsError("--hosts %s: %d host(s); multi-host training needs 2 or more (one host: drop --hosts)"
                         % (path, len(hosts)))
    return hosts


def check_workers(hosts: List[Host], workers: int) -> Optional[str]:
    total = sum(h.slots for h in hosts)
    if workers != total:
        return ("--workers %d, but the hostfile's slots add up to %d (%s): W is the number of processes on all "
                "hosts" % (workers, total, ", ".join("%s:%d" % (h.name, h.slots) for h in hosts)))
    return None


def rank_hosts(hosts: List[Host]) -> List[Tuple[int, Host, int]]:
    """(global rank, its host, its local rank), ranks numbered host by host in the hostfile's order."""
    out, rank = [], 0
    for h in hosts:
        for local in range(h.slots):
            out.append((rank, h, local))
            rank += 1
    return out


def host_processes(launcher, hosts: List[Host], python: str, worker: List[str], base_env: Dict[str, str],
                   ports: List[int], run_id: str, join_timeout: float) -> "OrderedDict[str, List[dict]]":
    """{host: [{"argv", "env"}]}: what runs on each host (under runner/dp/host_agent.py) for ``launcher``.
    ``ports``: free ports for host 0's services (rendezvous, coordinator, TF workers)."""
    world = sum(h.slots for h in hosts)
    root = hosts[0].name
    out = OrderedDict((h.name, []) for h in hosts)
    if launcher.kind == "torchrun":
        if len(set(h.slots for h in hosts)) != 1:
            raise HostsError("torchrun starts the same number of processes on every host (--nproc_per_node); "
                             "the hostfile has %s" % ", ".join("%s:%d" % (h.name, h.slots) for h in hosts))
        torchrun = os.path.join(os.path.dirname(python), "torchrun")
        for i, h in enumerate(hosts):
            argv = [torchrun, "--nnodes", str(len(hosts)), "--node_rank", str(i), "--nproc_per_node", str(h.slots),
                    "--rdzv_backend", "c10d", "--rdzv_endpoint", "%s:%d" % (root, ports[0]), "--rdzv_id", run_id,
                    "--rdzv_conf", "join_timeout=%d,is_host=%d" % (max(1, int(join_timeout)), int(i == 0)),
                    "--local-addr", h.name, "--max-restarts", "0"] + worker
            out[h.name].append({"argv": argv, "env": dict(base_env, DS2_HOST=h.name)})
    elif launcher.kind == "processes":
        addresses = [h.name for _, h, _ in rank_hosts(hosts)]
        for rank, h, local in rank_hosts(hosts):
            env = dict(base_env, DS2_HOST=h.name, **launcher.rank_env(rank, world, ports, root=root,
                                                                      addresses=addresses, local_rank=local))
            out[h.name].append({"argv": [python] + worker, "env": env})
    elif launcher.kind == "ps":
        from runner.dp.launchers import _ps_env
        ps = _ps_env(world, ports[0], root=root)
        for rank, h, local in rank_hosts(hosts):
            env = dict(base_env, DS2_HOST=h.name, DMLC_ROLE="worker", DMLC_NODE_HOST=h.name, RANK=str(rank),
                       WORLD_SIZE=str(world), LOCAL_RANK=str(local))
            out[h.name].append({"argv": [python] + worker, "env": dict(ps, **env)})
        for role in ("scheduler", "server"):
            out[root].append({"argv": [python, "-c", "import mxnet"],
                              "env": dict(ps, **dict(base_env, DS2_HOST=root, DMLC_ROLE=role, DMLC_NODE_HOST=root))})
    else:
        raise HostsError("the %s launcher has no multi-host form here" % launcher.name)
    return out


def mpiexec_argv(hosts: List[Host], world: int, ssh_options: List[str], hostfile: str,
                 connect_timeout: float) -> List[str]:
    """OpenMPI's own multi-host start, from the launching host: its hostfile (``host slots=N``), ssh as its remote
    agent, and its TCP traffic on the network that reaches host 0 (when ``ip`` can tell which)."""
    from common.results import atomic_write_text
    atomic_write_text(hostfile, "".join("%s slots=%d\n" % (h.name, h.slots) for h in hosts))
    argv = ["mpiexec", "--allow-run-as-root", "--hostfile", hostfile, "-n", str(world), "--map-by", "slot",
            "--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args",
            " ".join(ssh_options + ["-o", "ConnectTimeout=%d" % max(1, int(connect_timeout))])]
    network = network_to(hosts[0].name)
    if network:
        argv += ["--mca", "btl_tcp_if_include", network, "--mca", "oob_tcp_if_include", network]
    return argv


def network_to(host: str) -> Optional[str]:
    """The network (CIDR) of the local interface that routes to ``host``, from iproute2; None when unknown."""
    import ipaddress
    try:
        route = subprocess.run(["ip", "-o", "route", "get", host], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               universal_newlines=True, timeout=10).stdout
        dev = re.search(r"\bdev (\S+)", route).group(1)
        addr = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", dev], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, universal_newlines=True, timeout=10).stdout
        cidr = re.search(r"\binet (\S+)", addr).group(1)
        return str(ipaddress.ip_interface(cidr).network)
    except (OSError, subprocess.SubprocessError, AttributeError, ValueError):
        return None


def agent_spec(processes: List[dict], marker: str, route_to: str, grace: float) -> str:
    spec = {"marker": marker, "grace": grace, "route_to": route_to, "processes": processes}
    return base64.b64encode(json.dumps(spec, sort_keys=True).encode()).decode()


def remote_command(python: str, spec: str, cwd: str) -> str:
    """The shell command ssh runs on a host: the agent, in the same directory as here."""
    return "cd %s && exec %s %s %s" % (shlex.quote(cwd), shlex.quote(python), shlex.quote(AGENT), spec)


def ssh_argv(ssh_options: List[str], host: str, command: str, connect_timeout: float) -> List[str]:
    return ["ssh"] + ssh_options + ["-o", "ConnectTimeout=%d" % max(1, int(connect_timeout)), "-T", host, command]


def printable(processes: List[dict], cwd: str) -> List[str]:
    """Each process of a host as one shell line: cd, the variables, the command."""
    lines = []
    for p in processes:
        env = " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in sorted(p["env"].items()))
        lines.append("cd %s && env %s %s" % (shlex.quote(cwd), env, " ".join(shlex.quote(a) for a in p["argv"])))
    return lines


def _kill_group(p: subprocess.Popen) -> None:
    """SIGKILL ``p``'s process group (``p`` leads it), reap ``p``, and stop reading its output after 2 s at most."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        p.kill()
    try:
        p.communicate(timeout=2)
    except subprocess.TimeoutExpired:       # a child that left the group still holds the pipe: stop reading it
        p.stdout.close()
        p.wait()


def preflight(hosts: List[Host], ssh_options: List[str], python: str, paths: List[str], timeout: float) -> None:
    """Every host answers over ssh and sees ``python`` and ``paths`` (the tree, the script) at the same place;
    HostsError naming the first host that does not."""
    check = " && ".join(["test -x %s" % shlex.quote(python)] + ["test -e %s" % shlex.quote(p) for p in paths]
                        + ["echo ds2-host-ok"])
    import time
    t0 = time.time()
    # each ssh in its own process group: on a timeout the group goes, with what ssh started (a ProxyCommand, which
    # would otherwise hold the output pipe open, and this runner waiting on it, for as long as it lives)
    procs = [(h, subprocess.Popen(ssh_argv(ssh_options, h.name, check, timeout), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                                  start_new_session=True))
             for h in hosts]
    problems = []
    for h, p in procs:
        try:
            out, _ = p.communicate(timeout=timeout + 5)
        except subprocess.TimeoutExpired:
            _kill_group(p)
            problems.append("host %s did not join within %g s (--join-timeout): no answer over ssh" % (h.name, timeout))
            continue
        if "ds2-host-ok" not in out:
            last = [l for l in out.strip().splitlines() if l.strip()]
            if p.returncode == 255 and time.time() - t0 >= timeout - 0.5:     # ssh's ConnectTimeout is the bound
                problems.append("host %s did not join within %g s (--join-timeout): ssh: %s"
                                % (h.name, timeout, last[-1] if last else "exit 255"))
            elif p.returncode == 255:
                problems.append("host %s did not join: ssh failed: %s" % (h.name, last[-1] if last else "exit 255"))
            else:
                problems.append("host %s does not have %s at the same path (a shared filesystem or a copy of "
                                "the tree and its environments is needed)" % (h.name, " or ".join([python] + paths)))
    if problems:
        raise HostsError(problems[0])


def not_joined(hosts: List[Host], statuses: Dict[int, dict]) -> List[str]:
    """The hosts none of whose processes has written a status file yet."""
    joined = set(s.get("ds2_host") for s in statuses.values())
    return [h.name for h in hosts if h.name not in joined]
