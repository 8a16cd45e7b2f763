"""Data-parallel runs: ``run_all.py --workers W`` (W > 1) -- one notebook, W processes, one record.

**One source.**  The notebook stays the only copy of each framework's model, loss and weight
loading.  The runner gives it its parameters with papermill's own API
(:func:`papermill.parameterize.parameterize_notebook`, the same injected cell a papermill run gets,
plus ``workers=W`` and the *global* batch size), exports the code cells with nbconvert's
``PythonExporter`` to ``results/.staging/<stem>.py``, and launches that script W times with the
framework's standard launcher (:data:`LAUNCHERS`).  The notebook's data-parallel code reads its rank
from the launcher's standard variables (:func:`common.parallel.world_from_env`), builds the shared
iterator with the global batch size and trains on its slice of every batch (``batch.shard(rank, W)``,
:func:`common.data.shard_bounds`); rank 0 alone writes the record to the staging path, with a
``distributed`` section (:func:`common.parallel.distributed_section`).

**What a data-parallel run leaves**: the record ``records/<stem>_w<W>.json``, whose ``run`` section
names the script (the "executed notebook" of a data-parallel run: the exported code, exactly what
ran) and the logs ``logs/<stem>_w<W>.rank<N>.log`` (every rank's stdout and stderr, the framework's
C++ output included) and ``logs/<stem>_w<W>.launcher.log`` (the launcher's own output).

**Failures.**  Every worker runs under ``runner/dp_worker.py``, which writes a status file (running /
ok / failed with a one-line reason).  The runner starts each launcher process in a new session
(its own process group) and polls: when any process exits non-zero, or the run passes its timeout,
or the runner itself is interrupted (Ctrl-C), it sends SIGTERM to every process group of the run and
to every process that carries the run's marker variable ``DS2_DP_RUN`` (torchrun starts its workers
in sessions of their own, so a process-group kill alone would miss them), waits :data:`GRACE_S` (5 s),
then SIGKILLs what is left: a framework that catches SIGTERM itself (JAX's preemption notifier, installed
by ``jax.distributed.initialize``) is never relied on to exit.  A second signal to the runner during that
clean-up SIGKILLs every process of the run at once (:func:`runner.interrupt.hard_stop`).

**A runner that dies.**  Should the runner itself be killed outright (SIGKILL, the OOM killer), its
processes end within about a second: each process it starts gets ``PR_SET_PDEATHSIG`` -- SIGKILL for a
worker or an MXNet ps-lite role it starts itself, SIGTERM for torchrun and mpiexec, which then stop their
workers -- and every worker (``runner/dp_worker.py``) also watches the runner's process
(``DS2_RUNNER_PID``) and kills itself once that is gone, whoever its parent is.  What such a run leaves in
``.staging/`` (rank 0's record, the status files) is removed by the next data-parallel run into the same
results directory (:func:`clean_stale_staging`).  The failed row's reason names the rank
and the last error line of its log.  A run whose every rank reported ok counts, even when a process
then dies at exit (a framework's teardown: gloo was seen to abort one rank's interpreter shutdown in
6 runs in 240): its record's ``run.teardown`` names the process, the signal and its last log line.

**Batch size.**  ``--batch-size b`` (default: the preset's) is the batch of *one worker*, DeepMark's
"per GPU" convention: the run trains on global batches of ``W*b`` and its record's ``batch_size`` is
the global ``W*b`` -- so it sits in the same results.md group as the single-worker run with
``--batch-size W*b``, the run it must equal (:func:`common.parallel.equivalence`, recorded as
``checks.equivalence`` when that record exists).

**Timeout.**  With ``--workers`` there are no cells: ``--timeout S`` bounds the whole run.
"""
import ast
import ctypes
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import OrderedDict
from typing import Callable, Dict, List, Optional

from common import envinfo, parallel, results
from common.parallel import process_start_time, runner_alive
from common.data import shard_sizes

from . import envs
from .bootstrap import ROOT, EnvError, env_python, last_error_line
from .targets import ENVS, Target, mxnet_kernel_env

WORKER = os.path.join(ROOT, "runner", "dp_worker.py")
#: the variable that marks every process of one data-parallel run (its value: the run's id)
MARKER = "DS2_DP_RUN"
#: seconds between SIGTERM and SIGKILL when a run is torn down
GRACE_S = 5.0
#: seconds a process may linger after every rank reported "ok" (a non-daemon thread, a shutdown barrier)
LINGER_S = 30.0
POLL_S = 0.1


# ---- the launcher table -------------------------------------------------------------------------------
class Launcher:
    """How W processes of one framework are started on one host.

    ``kind``: "torchrun" (one torchrun process starts W workers), "mpiexec" (one mpiexec), "processes"
    (the runner starts W plain processes, with ``rank_env(rank, W, ports)`` their rank variables), or
    "single" (one process that drives W devices itself).  ``ran_here``: what has been run on this
    project's CPU machine through this launcher, in words.  ``multinode``: the multi-host form
    (documented, not run here).
    """

    def __init__(self, name: str, kind: str, backend: str, command: str, ran_here: str, multinode: str,
                 rank_env: Optional[Callable[[int, int, List[int]], Dict[str, str]]] = None, ports: int = 0,
                 extra_env: Optional[Callable[[str], Dict[str, str]]] = None, notes: str = ""):
        self.name = name
        self.kind = kind
        self.backend = backend
        self.command = command              # the command line, in words (README, --list)
        self.ran_here = ran_here
        self.multinode = multinode
        self.rank_env = rank_env            # (rank, world, ports) -> environment of that rank
        self.ports = ports                  # free loopback ports the launch needs
        self.extra_env = extra_env          # venv -> extra environment of every process
        self.notes = notes


def _torch_env(rank: int, world: int, ports: List[int], root: str = "127.0.0.1", addresses=None,
               local_rank: Optional[int] = None) -> Dict[str, str]:
    """torchrun's variables, set by hand: what ``init_process_group("gloo")`` (env://) reads.  On several hosts
    (runner/hosts.py): ``root`` is host 0, ``addresses`` each rank's host, ``local_rank`` the rank on its host."""
    local = rank if local_rank is None else local_rank
    per_host = world if addresses is None else addresses.count(addresses[rank])
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(per_host),
            "MASTER_ADDR": root, "MASTER_PORT": str(ports[0])}


def _tf_env(rank: int, world: int, ports: List[int], root: str = "127.0.0.1", addresses=None,
            local_rank: Optional[int] = None) -> Dict[str, str]:
    addresses = addresses or ["127.0.0.1"] * world
    config = {"cluster": {"worker": ["%s:%d" % (a, p) for a, p in zip(addresses, ports)]},
              "task": {"type": "worker", "index": rank}}
    return {"TF_CONFIG": json.dumps(config)}


def _jax_env(rank: int, world: int, ports: List[int], root: str = "127.0.0.1", addresses=None,
             local_rank: Optional[int] = None) -> Dict[str, str]:
    address = "%s:%d" % (root, ports[0])
    return {"DS2_COORDINATOR": address, "JAX_COORDINATOR_ADDRESS": address, "DS2_NUM_PROCESSES": str(world),
            "DS2_PROCESS_ID": str(rank), "DS2_LOCAL_RANK": str(rank if local_rank is None else local_rank)}


def _cntk_env(venv: str) -> Dict[str, str]:
    return {"LD_LIBRARY_PATH": os.path.join(venv, "mpi-compat")}


def _mxnet_env(venv: str) -> Dict[str, str]:
    """The MXNet kernel's environment (the CUDA 11 wheels' library path of a GPU build; nothing on a CPU), with the
    kernel spec's ``${LD_LIBRARY_PATH}`` expanded for a plain process."""
    env = mxnet_kernel_env(venv)
    if "LD_LIBRARY_PATH" in env:
        env["LD_LIBRARY_PATH"] = env["LD_LIBRARY_PATH"].replace(
            "${LD_LIBRARY_PATH}", os.environ.get("LD_LIBRARY_PATH", "")).rstrip(os.pathsep)
    return env


#: MXNet's data-parallel modes (``run_all.py --workers W --mxnet-dp MODE``): the notebook's ``kvstore`` and
#: ``sync_batchnorm`` parameters, the launcher, the record name's suffix and the run each must equal
MXNET_DP_MODES = OrderedDict([
    ("sync", {"parameters": {}, "launcher": "single", "suffix": "", "reference": "single-worker",
              "doc": "one process, W devices, kvstore 'device', SyncBatchNorm: equals one worker with batch W*b"}),
    ("local", {"parameters": {"kvstore": "device", "sync_batchnorm": False}, "launcher": "single",
               "suffix": "_localbn", "reference": None,
               "doc": "one process, W devices, kvstore 'device', each device its own BatchNorm statistics: the "
                      "reference of dist_sync (its first loss is checked against the NumPy reference per share)"}),
    ("dist_sync", {"parameters": {"kvstore": "dist_sync", "sync_batchnorm": False}, "launcher": "mxnet_dist_sync",
                   "suffix": "_dist_sync", "reference": "local",
                   "doc": "W worker processes + a ps-lite scheduler + a server, kvstore 'dist_sync', each process its "
                          "own BatchNorm statistics (MXNet 1.9 cannot synchronise them across processes): equals "
                          "'local'"}),
])


def _ps_env(world: int, port: int, root: str = "127.0.0.1") -> Dict[str, str]:
    """What every process of an MXNet dist_sync run reads (ps-lite): the scheduler's address, the node counts."""
    return {"DMLC_PS_ROOT_URI": root, "DMLC_PS_ROOT_PORT": str(port), "DMLC_NUM_SERVER": "1",
            "DMLC_NUM_WORKER": str(world), "DMLC_NODE_HOST": root}


LAUNCHERS = OrderedDict((l.name, l) for l in [
    Launcher("torchrun", "torchrun", "gloo (CPU) / nccl (CUDA), chosen by the notebook",
             "<venv>/bin/torchrun --standalone --nnodes 1 --nproc_per_node W --max-restarts 0 "
             "runner/dp_worker.py ... script.py",
             ran_here="yes: tests/fixtures/dp_fixture.ipynb with collective='gloo' (torch.distributed all_reduce, "
                      "W=2, pytorch-cpu): ok, a failing rank, Ctrl-C; tests/fixtures/ddp_uneven.py (DDP, all-reduced "
                      "BatchNorm, uneven and empty shards = one process to 1e-15); the DS2 PyTorch notebook, W=2 on smoke "
                      "(DDP over gloo, AllReduceBatchNorm stand-in): 2 x 4 = 1 x 8 to 5e-7 in the first 10 losses "
                      "(fp32), 2e-15 over the whole epoch (fp64) (tests/test_s2_pytorch.py)",
             multinode="on every host: torchrun --nnodes N --node_rank R --nproc_per_node G "
                       "--rdzv_backend c10d --rdzv_endpoint HOST0:29400 --rdzv_id JOB script.py (not run here)"),
    Launcher("tf_config", "processes", "MultiWorkerMirroredStrategy, RING (CPU) / NCCL (CUDA) collectives",
             "W x <venv>/bin/python runner/dp_worker.py ... script.py, each with TF_CONFIG = "
             "{cluster: {worker: [127.0.0.1:P0, ...]}, task: {type: worker, index: r}}",
             ran_here="yes: tests/fixtures/dp_fixture.ipynb with collective='tf' (MWMS strategy.reduce SUM, W=2, "
                      "tensorflow-cpu); the DS2 TensorFlow notebook, W=2 on smoke (MWMS, custom tf.function step, "
                      "BatchNormalization(synchronized=True)): 2 x 4 = 1 x 8 to 1.9e-7 (tests/test_s2_tensorflow.py)",
             multinode="one process per host (or per GPU) with TF_CONFIG listing every worker's HOST:PORT "
                       "and its own index (not run here)",
             rank_env=_tf_env, ports=-1),         # -1: one port per worker
    Launcher("jax", "processes", "jax.distributed (gloo collectives on CPU, NCCL on CUDA)",
             "W x <venv>/bin/python runner/dp_worker.py ... script.py, each with DS2_COORDINATOR="
             "JAX_COORDINATOR_ADDRESS=127.0.0.1:P, DS2_NUM_PROCESSES=W, DS2_PROCESS_ID=r; the notebook calls "
             "jax.distributed.initialize(DS2_COORDINATOR, num_processes, process_id)",
             ran_here="yes: tests/fixtures/dp_fixture.ipynb with collective='jax' (jax.distributed.initialize, "
                      "process_allgather over gloo, W=2, jax-cpu); the DS2 Keras notebook on JAX, W=2 on smoke "
                      "(keras.distribution.DataParallel): 2 x 4 = 1 x 8 to 9.9e-8 (tests/test_s2_keras.py); the DS2 "
                      "JAX notebook (NamedSharding over a 'data' mesh, batches W does not divide replicated): "
                      "2 x 4 = 1 x 8 to 1.6e-7 (tests/test_s2_jax.py)",
             multinode="one process per host, DS2_COORDINATOR=HOST0:PORT on every host, DS2_PROCESS_ID = the "
                       "host's index (not run here)",
             rank_env=_jax_env, ports=1),
    Launcher("mpiexec", "mpiexec", "OpenMPI (CNTK data_parallel_distributed_learner)",
             "mpiexec --allow-run-as-root --oversubscribe -n W -x LD_LIBRARY_PATH=<venv>/mpi-compat "
             "-x DS2_DP_RUN <venv>/bin/python runner/dp_worker.py ... script.py",
             ran_here="yes: a standard-library script (ok, a failing rank) and tests/fixtures/dp_fixture.ipynb with "
                      "collective='cntk' (CNTK 2.7 mpicommunicator aggregate_in_place on Python 3.6, OpenMPI 4, W=2); "
                      "the DS2 CNTK notebook, W=2 on smoke (data_parallel_distributed_learner, BatchNorm statistics "
                      "all-reduced by an MPI UserFunction): 2 x 4 = 1 x 8 to 1e-7 (tests/test_dp16.py)",
             multinode="mpiexec --hostfile HOSTS -n N ... (a hostfile line per host: 'host slots=G'; "
                       "password-less ssh between hosts) (not run here)",
             extra_env=_cntk_env),
    Launcher("single", "single", "one process driving W devices (MXNet kvstore 'device' over mx.cpu(0..W-1) "
                                 "or mx.gpu(0..W-1))",
             "<venv>/bin/python runner/dp_worker.py ... script.py (workers=W)",
             ran_here="yes: the DS2 MXNet notebook, W=2 on smoke over mx.cpu(0), mx.cpu(1) (kvstore 'device', "
                      "SyncBatchNorm, one thread per device): 2 x 4 = 1 x 8 to 1e-7 (tests/test_dp16.py); with "
                      "--mxnet-dp local (each device its own BatchNorm statistics) the reference of dist_sync",
             multinode="see mxnet_dist_sync", extra_env=_mxnet_env),
    Launcher("mxnet_dist_sync", "ps", "MXNet kvstore 'dist_sync' (ps-lite parameter server over TCP)",
             "W x <venv>/bin/python runner/dp_worker.py ... script.py (DMLC_ROLE=worker, RANK=r), then "
             "<venv>/bin/python -c 'import mxnet' with DMLC_ROLE=scheduler and DMLC_ROLE=server; every process "
             "DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=P DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=W "
             "DMLC_NODE_HOST=127.0.0.1 (run_all.py --mxnet-dp dist_sync)",
             ran_here="yes: the DS2 MXNet notebook, W=2 on smoke (kvstore 'dist_sync', update_on_kvstore=False, "
                      "each worker its own BatchNorm statistics) against --mxnet-dp local (tests/test_dp16.py)",
             multinode="the scheduler on host0 (DMLC_ROLE=scheduler, DMLC_PS_ROOT_URI=host0, DMLC_PS_ROOT_PORT=P), "
                       "servers and workers on every host with the same DMLC_* variables and DMLC_NODE_HOST = the "
                       "host's own address; MXNet's tools/launch.py does this over ssh but fails on Python >= 3.9 "
                       "(Thread.isAlive) (not run here)",
             extra_env=_mxnet_env),
    Launcher("python", "processes", "whatever the script initialises (torchrun's env:// variables are set)",
             "W x python runner/dp_worker.py ... script.py, each with RANK, WORLD_SIZE, LOCAL_RANK, "
             "MASTER_ADDR=127.0.0.1, MASTER_PORT=P",
             ran_here="yes: the tests' standard-library fixture notebook (tests/fixtures/dp_fixture.ipynb)",
             multinode="not applicable (tests only)", rank_env=_torch_env, ports=1),
])

#: target (row of record) -> its launcher; variants use their row of record's.  A target that is not
#: here has no data-parallel route at all (a skipped row); one that is here still needs the notebook's
#: ``workers`` parameter.
TARGET_LAUNCHERS = OrderedDict([
    ("pytorch", "torchrun"),            # DDP; BatchNorm synchronised by an all-reduce subclass on CPU
    ("tensorflow", "tf_config"),        # MultiWorkerMirroredStrategy, BatchNormalization(synchronized=True)
    ("jax", "jax"),                     # jax.distributed + NamedSharding: global statistics under jit
    ("keras-jax", "jax"),               # keras.distribution.DataParallel on the JAX backend
    ("keras-tensorflow", "tf_config"),  # the notebook refuses workers > 1: keras.distribution is JAX-only
    ("keras-torch", "torchrun"),        # the notebook refuses workers > 1: keras.distribution is JAX-only
    ("cntk", "mpiexec"),                # issue #16
    ("mxnet", "single"),                # issue #16
])


def launcher_for(target: Target) -> Optional[Launcher]:
    name = TARGET_LAUNCHERS.get(target.row_of_record)
    return LAUNCHERS[name] if name else None


# ---- the notebook: its parameters, and the script exported from it -------------------------------
def notebook_parameter_names(path: str) -> List[str]:
    """Names assigned in the notebook's cell tagged ``parameters`` (empty when it has none)."""
    import nbformat
    nb = nbformat.read(path, as_version=4)
    names = []
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            try:
                tree = ast.parse(cell.source)
            except SyntaxError:
                continue
            for node in tree.body:
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, ast.AnnAssign) else []
                names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def export_script(notebook: str, parameters: dict, script: str, header: str = "") -> str:
    """``notebook`` with ``parameters`` injected by papermill, its code cells as one Python script."""
    import nbformat
    from nbconvert import PythonExporter
    from papermill.parameterize import parameterize_notebook
    nb = nbformat.read(notebook, as_version=4)
    for cell in nb.cells:                          # what papermill's execute_notebook prepares first
        cell.metadata.setdefault("tags", [])
    nb.metadata.setdefault("papermill", {})
    nb = parameterize_notebook(nb, parameters, report_mode=False, language="python")
    body, _ = PythonExporter().from_notebook_node(nb)
    text = "".join("# %s\n" % line for line in header.splitlines()) + body
    results.atomic_write_text(script, text)
    return script


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
    needle = ("%s=%s" % (name, marker_value)).encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open("/proc/%d/stat" % pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            pids.append(pid)
    return pids


def _signal_all(procs: List[subprocess.Popen], marker_value: str, sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)          # its session = its process group
            except OSError:
                pass
    for pid in marked_processes(marker_value):
        try:
            os.kill(pid, sig)
        except OSError:
            pass


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
    try:
        _signal_all(procs, marker_value, signal.SIGTERM)
        deadline = time.time() + grace
        while time.time() < deadline:
            if all(p.poll() is not None for p in procs) and not marked_processes(marker_value):
                break
            time.sleep(POLL_S)
    finally:          # a signal that cuts the grace period short (SIGTERM to the runner) still gets here
        _signal_all(procs, marker_value, signal.SIGKILL)
    for p in procs:
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.time() + grace
    while marked_processes(marker_value) and time.time() < deadline:   # orphans: killed, reaped by init
        time.sleep(POLL_S)


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


def launch(launcher: Launcher, python: str, script: str, world: int, log_prefix: str, status_prefix: str,
           cwd: str, timeout: Optional[float] = None, env: Optional[dict] = None, venv: Optional[str] = None,
           run_id: Optional[str] = None, announce=print, grace: float = GRACE_S,
           linger: float = LINGER_S, hosts=None, ssh_options: Optional[List[str]] = None,
           join_timeout: Optional[float] = None) -> LaunchResult:
    """Run ``script`` as ``world`` workers with ``launcher``; wait; tear everything down on any failure,
    a timeout or an interruption (which is re-raised after the teardown).  Never leaves a process behind.

    ``hosts`` (runner/hosts.py): the processes start on those hosts over ssh (``ssh_options``), each host's under
    runner/host_agent.py; a host none of whose processes has started within ``join_timeout`` s fails the run.

    A run whose every rank reported "ok" but whose processes have not exited ``linger`` seconds later
    (a non-daemon thread, a framework's shutdown barrier) is stopped and counts as ok, with a note."""
    run_id = run_id or uuid.uuid4().hex
    base_env = dict(os.environ if env is None else env)
    base_env[MARKER] = run_id
    base_env["DS2_LAUNCHER"] = launcher.name
    base_env["PYTHONUNBUFFERED"] = "1"
    base_env["DS2_RUNNER_PID"] = str(os.getpid())         # dp_worker.py ends itself when this process is gone
    base_env["DS2_RUNNER_START"] = process_start_time(os.getpid()) or ""
    if launcher.extra_env and venv:
        base_env.update(launcher.extra_env(venv))
    ranks = 1 if launcher.kind == "single" else world     # processes with a rank (and a log and a status)
    ps_roles = []                                          # kind "ps": the processes after the W workers
    for stale in range(ranks):
        for path in ("%s.rank%d.status.json" % (status_prefix, stale), "%s.rank%d.log" % (log_prefix, stale)):
            if os.path.exists(path):
                os.remove(path)
    worker = [WORKER, "--log-prefix", log_prefix, "--status-prefix", status_prefix, script]
    launcher_log = log_prefix + ".launcher.log"

    specs = []   # (argv, env, stdout path)
    host_lines = []
    if hosts and launcher.kind == "mpiexec":       # OpenMPI starts the other hosts' processes itself, over ssh
        from . import hosts as hosts_mod
        join_timeout = hosts_mod.JOIN_TIMEOUT_S if join_timeout is None else join_timeout
        base_env["DS2_HOST_OF_RANK"] = ",".join(h.name for _, h, _ in hosts_mod.rank_hosts(hosts))
        argv = hosts_mod.mpiexec_argv(hosts, world, ssh_options or [], log_prefix + ".hostfile", join_timeout)
        for name in sorted(set(["LD_LIBRARY_PATH", MARKER, "DS2_LAUNCHER", "PYTHONUNBUFFERED", "DS2_HOST_OF_RANK"])
                           & set(base_env)):
            argv += ["-x", name]
        specs.append((argv + [python] + worker, base_env, launcher_log))
    elif hosts:
        from . import hosts as hosts_mod
        join_timeout = hosts_mod.JOIN_TIMEOUT_S if join_timeout is None else join_timeout
        local_only = (MARKER, "DS2_RUNNER_PID", "DS2_RUNNER_START")     # the agent watches the connection instead
        additions = {k: v for k, v in base_env.items() if os.environ.get(k) != v and k not in local_only}
        ports = free_ports(world if launcher.ports < 0 else max(1, launcher.ports))
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
    commands = host_lines or [" ".join(shlex.quote(a) for a in argv) for argv, _, _ in specs]

    procs = []   # type: List[subprocess.Popen]
    from . import interrupt
    interrupt.track_run(run_id, lambda sig: _signal_all(procs, run_id, sig))   # a second signal: SIGKILL to all
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


# ---- one target, W workers: the record -----------------------------------------------------------------
def _global_opts(opts, workers: int):
    """``opts`` with the preset's batch size multiplied by ``workers`` (the per-worker batch stays b)."""
    import copy
    g = copy.copy(opts)
    g.preset = opts.preset.with_overrides(batch_size=opts.preset.batch_size * workers)
    return g


def record_stem(target: Target, opts, workers: int, mxnet_dp: str = "sync", n_hosts: int = 1) -> str:
    """The single-worker stem of the *global* batch, plus ``_w<W>`` (an MXNet mode's suffix; ``_h<N>`` on N
    hosts)."""
    from .execute import record_stem as single_stem
    return single_stem(target, _global_opts(opts, workers)) + "_w%d" % workers + MXNET_DP_MODES[mxnet_dp]["suffix"] \
        + ("_h%d" % n_hosts if n_hosts > 1 else "")


def no_dp_reason(target: Target, launcher: Optional[Launcher] = None) -> Optional[str]:
    """Why ``target`` cannot run data-parallel (from its notebook and the launcher table), or None."""
    if (launcher or launcher_for(target)) is None:
        return "no data-parallel launcher is defined for %s (runner/distributed.py)" % target.name
    if not os.path.exists(target.notebook_path):
        return None   # reported as a missing notebook
    if "workers" not in notebook_parameter_names(target.notebook_path):
        return ("the %s notebook has no data-parallel code yet (no 'workers' parameter; issue #15)"
                % target.label.split(" (")[0])
    return None


def run_target(target: Target, opts, workers: int, announce=print, python: Optional[str] = None,
               launcher: Optional[Launcher] = None, grace: float = GRACE_S, mxnet_dp: str = "sync",
               hosts=None, ssh_options: Optional[List[str]] = None, join_timeout: Optional[float] = None,
               print_host_commands: bool = False) -> dict:
    """Run ``target`` with ``workers`` processes and write its record (``<stem>_w<W>.json``); returns it.

    ``python`` / ``launcher`` override the target's environment interpreter and launcher (the tests run
    a standard-library fixture notebook in the runner's own interpreter with the "python" launcher).
    ``mxnet_dp``: MXNet's mode (:data:`MXNET_DP_MODES`; "sync" for every other framework).
    ``hosts``, ``ssh_options``, ``join_timeout``: several hosts (runner/hosts.py); ``print_host_commands``: print
    each host's command instead of running it (returns None).
    """
    from . import execute
    if workers < 2:
        raise ValueError("run_target runs 2 or more workers; one worker is execute.run_target")
    mode = MXNET_DP_MODES[mxnet_dp]
    started = results.utc_now()
    gopts = _global_opts(opts, workers)
    stem = record_stem(target, opts, workers, mxnet_dp, len(hosts or []))
    dirs = {k: os.path.join(opts.results_dir, k) for k in ("records", ".staging", "logs")}
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
    clean_stale_staging(dirs[".staging"])          # what a killed runner left
    record_path = os.path.join(dirs["records"], stem + ".json")
    staged = os.path.join(dirs[".staging"], stem + ".json")
    script = os.path.join(dirs[".staging"], stem + ".py")
    log_prefix = os.path.join(dirs["logs"], stem)
    status_prefix = os.path.join(dirs[".staging"], stem)
    if launcher is None and mxnet_dp != "sync" and target.row_of_record == "mxnet":
        launcher = LAUNCHERS[mode["launcher"]]
    launcher = launcher or launcher_for(target)
    decision = None                 # the GPU preflight's, once can_run has been asked (below)
    per_worker = opts.preset.batch_size
    section = OrderedDict([("world_size", workers), ("launcher", launcher.name if launcher else None),
                           ("per_worker_batch", per_worker), ("global_batch", per_worker * workers),
                           ("shards", None)])
    if target.row_of_record == "mxnet":
        section["mxnet_dp"] = mxnet_dp
    if hosts:
        section["hosts"] = [h.to_dict() for h in hosts]

    def rel(path):
        return os.path.relpath(path, ROOT)

    def run_section(extra=None):
        info = execute._run_info(target, gopts, started, None, decision)
        info.update(script=rel(script) if os.path.exists(script) else None,
                    logs=[rel("%s.rank%d.log" % (log_prefix, r))
                          for r in range(1 if launcher is not None and launcher.kind == "single" else workers)],
                    launcher_log=rel(log_prefix + ".launcher.log"))
        info["executed_notebook"] = info["script"]
        info.update(extra or {})
        return info

    def finish(status: str, reason: str, extra=None) -> dict:
        rec = results.failed_record(target.name, status, reason, **execute._base_fields(target, gopts))
        rec["environment"] = envinfo.collect()
        rec["distributed"] = dict(section)
        rec["run"] = run_section(extra)
        results.write_record(record_path, execute.mark_as_is(rec, target, opts))
        announce("  %s: %s" % (status, rec["error"]))
        return rec

    # 1. can it run data-parallel here at all?
    if mxnet_dp != "sync" and target.row_of_record != "mxnet":
        return finish("skipped", "--mxnet-dp %s is a mode of MXNet's data-parallel code, not of %s" % (mxnet_dp,
                                                                                                target.name))
    if launcher is None:
        return finish("skipped", "no data-parallel launcher is defined for %s (runner/distributed.py)" % target.name)
    decision, status, why = execute.can_run(target, opts)
    if why:
        return finish(status, why)
    reason = no_dp_reason(target, launcher)
    if reason:
        return finish("skipped", reason)
    if hosts:
        from . import hosts as hosts_mod
        if launcher.kind not in ("torchrun", "processes", "ps", "mpiexec"):
            return finish("skipped", "the %s launcher is not run on several hosts here (%s)"
                          % (launcher.name, hosts_mod.MULTI_HOST.get(launcher.name, "no multi-host form")))
    if opts.device == "cuda" and not hosts:     # each host's GPUs are its own
        visible = len(envinfo.gpus())
        if visible < workers:     # one GPU per worker (torchrun LOCAL_RANK, MWMS, JAX, mpiexec) or per device (MXNet)
            return finish("skipped", "%d workers need %d GPUs; %d visible" % (workers, workers, visible))
    if launcher.kind == "mpiexec" and not _which("mpiexec"):
        return finish("skipped", "mpiexec not found: install OpenMPI (Debian/Ubuntu: apt-get install openmpi-bin)")
    # 2. its environment
    venv = None
    if python is not None and os.path.exists(os.path.join(os.path.dirname(os.path.dirname(python)), "pyvenv.cfg")):
        venv = os.path.dirname(os.path.dirname(python))       # an interpreter given by hand: still its venv's env
    if python is None and target.env in opts.installed:     # --use-installed: the interpreter as it is
        python = opts.installed[target.env]
    if python is None:
        env = ENVS[target.env]
        try:
            envs.ensure(env, opts.device, opts.pythons.get(env.name), announce=announce,
                        build=decision.build if decision else None, wheelhouse=opts.wheelhouse)
        except EnvError as e:
            missing = env.needs_python and env.name not in opts.pythons
            return finish("skipped" if missing else "failed", "environment %s: %s" % (env.name, e))
        venv = envs.env_path(env, opts.device, opts.pythons.get(env.name), decision.build if decision else None)
        python = env_python(venv)
    if launcher.kind == "torchrun" and not os.path.exists(os.path.join(os.path.dirname(python), "torchrun")):
        return finish("failed", "torchrun not found next to %s" % python)
    # 3. the script: the notebook, parameterised, as code
    parameters = dict(execute.notebook_parameters(target, gopts, staged), workers=workers, **mode["parameters"])
    for path in (staged, script):
        if os.path.exists(path):
            os.remove(path)
    header = ("Generated by run_all.py --workers %d from %s: the notebook's code cells with papermill's "
              "injected parameters.\nLaunched with %s; do not edit (edit the notebook)."
              % (workers, rel(target.notebook_path), launcher.name))
    try:
        export_script(target.notebook_path, parameters, script, header)
    except Exception as e:  # nbformat/nbconvert/papermill errors: one line
        return finish("failed", "cannot export the notebook to a script: %s: %s"
                      % (type(e).__name__, results.one_line(str(e))))
    # 4. the launch
    if print_host_commands:
        return print_commands(launcher, hosts, python, venv, script, workers, log_prefix, status_prefix, target,
                              join_timeout)
    if hosts:
        try:
            hosts_mod.preflight(hosts, ssh_options or [], python, [ROOT, script],
                                hosts_mod.JOIN_TIMEOUT_S if join_timeout is None else join_timeout)
        except hosts_mod.HostsError as e:
            return finish("failed", str(e))
    announce("  %d workers via %s%s" % (workers, launcher.name, " on %d hosts (%s)" % (
        len(hosts), ", ".join("%s:%d" % (h.name, h.slots) for h in hosts)) if hosts else ""))
    claim_staging(status_prefix)
    try:
        res = launch(launcher, python, script, workers, log_prefix, status_prefix,
                     cwd=os.path.dirname(target.notebook_path), timeout=opts.timeout, venv=venv,
                     announce=announce, grace=grace, hosts=hosts, ssh_options=ssh_options, join_timeout=join_timeout)
    except KeyboardInterrupt as e:     # run_all.py's SIGINT/SIGTERM (runner.interrupt) say which
        release_staging(status_prefix, workers)
        finish("failed", getattr(e, "reason", "interrupted by the user"))
        raise
    except OSError as e:
        release_staging(status_prefix, workers)
        return finish("failed", "cannot start the %s launcher: %s" % (launcher.name, e))
    extra = {"launch_commands": res.commands, "wall_s": res.wall_s,
             "ranks": {str(r): {k: st.get(k) for k in ("status", "exit_code", "error", "pid")}
                       for r, st in sorted(res.statuses.items())},
             "returncodes": res.returncodes}
    if res.teardown:
        extra["teardown"] = "every rank reported ok; then " + res.teardown
    _clean_statuses(status_prefix, workers)
    if not res.ok:
        release_staging(status_prefix, workers)
        return finish("failed", res.reason, extra)
    # 5. rank 0's record, checked and completed
    try:
        rec = results.read_record(staged)
    except (OSError, ValueError) as e:
        release_staging(status_prefix, workers)
        return finish("failed", "rank 0 wrote no valid record: %s" % e, extra)
    release_staging(status_prefix, workers)
    expected = execute.expected_checksum(gopts.preset, opts.seed)
    got = (rec.get("data") or {}).get("checksum")
    rec.setdefault("checks", {})["checksum"] = {"checksum": got, "expected": expected, "ok": got == expected}
    notebook_section = rec.get("distributed") or {}
    section.update(notebook_section)
    section.update(world_size=workers, launcher=launcher.name, per_worker_batch=per_worker,
                   global_batch=per_worker * workers,
                   backend=notebook_section.get("backend"), notebook_world_size=notebook_section.get("world_size"),
                   shards={"sizes_of_a_full_batch": shard_sizes(per_worker * workers, workers)})
    rec["distributed"] = section
    rec["row_of_record"] = target.row_of_record
    rec["run"] = dict(rec.get("run", {}), **run_section(extra))
    problems = []
    if got != expected:
        problems.append("data checksum %s differs from the runner's %s" % (got, expected))
    if notebook_section.get("world_size") != workers:
        problems.append("rank 0 reports world size %r, not the %d workers launched (its record has no "
                        "distributed section from common.parallel.distributed_section?)"
                        % (notebook_section.get("world_size"), workers))
    if rec.get("batch_size") != per_worker * workers:
        problems.append("rank 0's record has batch size %r, not the global %d" % (rec.get("batch_size"),
                                                                                 per_worker * workers))
    # 6. the equivalence with one worker and the global batch (MXNet dist_sync: with its 'local' run), when that
    #    record exists
    if mode["reference"] is None:
        rec["checks"]["equivalence"] = {"ok": None, "note": "each device its own BatchNorm statistics: not one "
                                        "worker's computation; the reference of --mxnet-dp dist_sync"}
    else:
        single_path = os.path.join(dirs["records"], (execute.record_stem(target, gopts) if mode["reference"] ==
                                                     "single-worker" else record_stem(target, opts, workers,
                                                                                      mode["reference"])) + ".json")
        rec["checks"]["equivalence"] = equivalence_with(rec, single_path)
    eq = rec["checks"]["equivalence"]
    if eq.get("ok") is False:
        problems.append("not equivalent to the single-worker run %s: %s" % (eq.get("reference"), eq.get("error")))
    if problems and rec.get("status") == "ok":
        rec["status"], rec["error"] = "failed", results.one_line(problems[0])
    results.write_record(record_path, execute.mark_as_is(rec, target, opts))
    if rec["status"] == "ok":
        t = rec.get("timing") or {}
        announce("  ok: %d workers, %.1f s of audio per second; equivalence with 1 worker: %s"
                 % (workers, t.get("audio_s_per_s", float("nan")),
                    "rel. diff %.1e" % eq["rel_diff"] if eq.get("rel_diff") is not None else eq.get("note")))
    else:
        announce("  %s: %s" % (rec["status"], rec["error"]))
    return rec


def print_commands(launcher, hosts, python, venv, script, workers, log_prefix, status_prefix, target,
                   join_timeout) -> None:
    """``--print-host-commands``: each host's processes as shell lines, for a job script (Slurm, Kubernetes)."""
    from . import hosts as hosts_mod
    env = {"DS2_LAUNCHER": launcher.name, "PYTHONUNBUFFERED": "1"}
    if launcher.extra_env and venv:
        env.update(launcher.extra_env(venv))
    worker = [WORKER, "--log-prefix", log_prefix, "--status-prefix", status_prefix, script]
    ports = [29400 + i for i in range(workers if launcher.ports < 0 else max(1, launcher.ports))]
    per_host = hosts_mod.host_processes(launcher, hosts, python, worker, env, ports, "ds2-" + uuid.uuid4().hex[:8],
                                        hosts_mod.JOIN_TIMEOUT_S if join_timeout is None else join_timeout)
    print("# %s on %d hosts: run each host's lines on that host (rank 0 writes its record to %s)"
          % (target.name, len(hosts), os.path.relpath(status_prefix + ".json", ROOT)))
    for name, processes in per_host.items():
        for line in hosts_mod.printable(processes, os.path.dirname(target.notebook_path)):
            print("%s\t%s" % (name, line))
    return None


def equivalence_with(rec: dict, single_path: str) -> dict:
    """``checks.equivalence`` of a W-worker record against the single-worker record at ``single_path``."""
    reference = os.path.relpath(single_path, ROOT)
    if not os.path.exists(single_path):
        d = rec.get("distributed") or {}
        if d.get("mxnet_dp") == "dist_sync":
            return {"reference": reference, "ok": None,
                    "note": "no --mxnet-dp local record yet: run_all.py --frameworks %s --workers %s --batch-size %s "
                            "--mxnet-dp local (same preset, scale, seed) records it"
                            % (rec.get("target"), d.get("world_size"), d.get("per_worker_batch"))}
        return {"reference": reference, "ok": None,
                "note": "no single-worker record with the global batch yet: run_all.py --frameworks %s "
                        "--batch-size %s (same preset, scale, seed) records one" % (rec.get("target"),
                                                                                   rec.get("batch_size"))}
    try:
        single = results.read_record(single_path)
    except (OSError, ValueError) as e:
        return {"reference": reference, "ok": None, "note": "unreadable: %s" % e}
    if single.get("status") != "ok":
        return {"reference": reference, "ok": None, "note": "the single-worker run is %s" % single.get("status")}
    out = parallel.equivalence(rec, single)
    out["reference"] = reference
    return out


def _clean_statuses(status_prefix: str, world: int) -> None:
    for rank in range(world):
        path = "%s.rank%d.status.json" % (status_prefix, rank)
        if os.path.exists(path):
            os.remove(path)


OWNER = ".owner"


def claim_staging(status_prefix: str) -> str:
    """``<stem>.owner`` in ``.staging/``: this runner's pid and start time, while its run's transient files (rank 0's
    record, the status files) are there.  Removed with them when the run ends (:func:`release_staging`)."""
    path = status_prefix + OWNER
    results.atomic_write_text(path, "%d %s\n" % (os.getpid(), process_start_time(os.getpid()) or ""))
    return path


def release_staging(status_prefix: str, world: int) -> None:
    _clean_statuses(status_prefix, world)
    for path in (status_prefix + ".json", status_prefix + OWNER):
        if os.path.exists(path):
            os.remove(path)


def clean_stale_staging(staging: str) -> List[str]:
    """Remove what runs whose runner died (SIGKILL, the OOM killer) left in ``staging``: each ``<stem>.owner``
    whose process is gone, with that stem's record and status files (its exported script stays: a run of the
    same stem rewrites it).  A live runner's files are left alone.  Returns the paths removed."""
    removed = []
    if not os.path.isdir(staging):
        return removed
    for name in sorted(os.listdir(staging)):
        if not name.endswith(OWNER):
            continue
        owner = os.path.join(staging, name)
        try:
            with open(owner) as f:
                fields = f.read().split()
            pid, start = int(fields[0]), (fields[1] if len(fields) > 1 else None)
        except (OSError, ValueError, IndexError):
            pid, start = None, None
        if pid is not None and runner_alive(pid, start):
            continue
        stem = name[:-len(OWNER)]
        for other in os.listdir(staging):
            if other == stem + ".json" or (other.startswith(stem + ".rank") and other.endswith(".status.json")) \
                    or (other.startswith(stem + ".") and other.endswith(".partial")):
                os.remove(os.path.join(staging, other))
                removed.append(os.path.join(staging, other))
        os.remove(owner)
        removed.append(owner)
    return removed


def _which(name: str) -> Optional[str]:
    import shutil
    return shutil.which(name)


def launcher_table_markdown() -> str:
    """The launcher table and, under it, each launcher's command, what ran here and its multi-node form
    (docs/data-parallel.md is written from it)."""
    rows = ["| Launcher | Targets | Kind |", "|---|---|---|"]
    notes = []
    for l in LAUNCHERS.values():
        targets = ", ".join(t for t, n in TARGET_LAUNCHERS.items() if n == l.name) or \
            ", ".join("%s (--mxnet-dp %s)" % (t, m) for t in ("mxnet",) for m, spec in MXNET_DP_MODES.items()
                      if spec["launcher"] == l.name) or "tests"
        rows.append("| %s | %s | %s |" % (l.name, targets, l.kind))
        notes.append("- **%s**: `%s`\n  - Run here: %s\n  - Multi-node (not run here): %s" % (
            l.name, l.command, l.ran_here, l.multinode))
    return "\n".join(rows) + "\n\n" + "\n".join(notes) + "\n"


# ---- results.md: W workers against one -------------------------------------------------------------------
def single_worker_twin(rec: dict, records: List[dict]) -> Optional[dict]:
    """The completed single-worker record ``rec`` (W workers) must equal: same target, preset, scale,
    seed, precision, device and *global* batch size."""
    keys = ("target", "preset", "scale", "seed", "precision", "batch_size")
    for other in records:
        if other.get("status") == "ok" and (other.get("distributed") or {}).get("world_size", 1) == 1 and \
                all(other.get(k) == rec.get(k) for k in keys) and \
                (other.get("device") or {}).get("name") == (rec.get("device") or {}).get("name"):
            return other
    return None


def equivalence_twin(rec: dict, records: List[dict]) -> Optional[dict]:
    """The completed record ``rec`` must equal: one worker with the global batch, or -- MXNet dist_sync -- the
    one-process run with each device's own BatchNorm statistics (``--mxnet-dp local``) of the same world size."""
    d = rec.get("distributed") or {}
    mode = d.get("mxnet_dp", "sync")
    if MXNET_DP_MODES.get(mode, {}).get("reference") == "single-worker":
        return single_worker_twin(rec, records)
    if mode != "dist_sync":
        return None
    keys = ("target", "preset", "scale", "seed", "precision", "batch_size")
    for other in records:
        o = other.get("distributed") or {}
        if other.get("status") == "ok" and o.get("mxnet_dp") == "local" and o.get("world_size") == d.get("world_size") \
                and all(other.get(k) == rec.get(k) for k in keys) and \
                (other.get("device") or {}).get("name") == (rec.get("device") or {}).get("name"):
            return other
    return None


def equivalence_rows(records: List[dict]) -> List[OrderedDict]:
    """One row per data-parallel record: how it ran, and its equivalence with one worker (computed here
    from the records, so a single-worker run made after the W-worker run counts too)."""
    rows = []
    for rec in records:
        d = rec.get("distributed") or {}
        if d.get("world_size", 1) < 2:
            continue
        twin = equivalence_twin(rec, records) if rec.get("status") == "ok" else None
        eq = parallel.equivalence(rec, twin) if twin else {}
        speed = (rec.get("timing") or {}).get("audio_s_per_s")
        speed1 = ((twin or {}).get("timing") or {}).get("audio_s_per_s")
        rows.append(OrderedDict([
            ("Row", "%s %s%s" % (rec["target"], rec.get("precision") or "",
                                 " (%s)" % d["mxnet_dp"] if d.get("mxnet_dp", "sync") != "sync" else "")),
            ("Status", rec["status"]),
            ("Workers", d.get("world_size")),
            ("Hosts", "%d hosts (%s)" % (len(d["hosts"]), ", ".join("%s:%s" % (h["host"], h["processes"])
                                                                    for h in d["hosts"])) if d.get("hosts") else "1"),
            ("Launcher", d.get("launcher")), ("Backend", d.get("backend")),
            ("Batch per worker / global", "%s / %s" % (d.get("per_worker_batch"), d.get("global_batch"))),
            ("BatchNorm sync", d.get("sync_batchnorm")),
            ("Audio s/s", speed), ("1 worker audio s/s", speed1),
            ("Max rel. diff, first %d losses" % parallel.EQUIVALENCE_STEPS, eq.get("loss_rel_diff")),
            ("Params rel. diff", eq.get("param_rel_diff")),
            ("Equivalent", ("pass" if eq["ok"] else "FAIL: " + eq.get("error", "")) if eq else
             ("the reference of dist_sync (each device its own BatchNorm statistics)" if d.get("mxnet_dp") == "local"
              else "no --mxnet-dp local record of %d workers" % d.get("world_size", 0)
              if d.get("mxnet_dp") == "dist_sync" else "no single-worker record with batch %s" % rec.get("batch_size"))
             if rec["status"] == "ok" else "%s: %s" % (rec["status"], rec.get("error"))),
        ]))
    return rows


def report_section(records: List[dict], md_table) -> List[str]:
    """results.md's data-parallel section (empty when no record ran with more than one worker)."""
    rows = equivalence_rows(records)
    if not rows:
        return []
    return ["## Data-parallel: W workers against one", "",
            "Each run with `--workers W` (per-worker batch b) against the single-worker run with batch W*b on "
            "the same benchmark and device: the largest relative difference of the first %d training losses "
            "(warm-up first), within %.0e, and of the trained parameters' summary after the epoch, within %.0e "
            "(float32 rounding grows over the epoch). The audio s/s columns are the scaling table: W workers "
            "against one; on a CPU the W processes share the same cores, so they prove the plumbing, not GPU "
            "scaling." % (parallel.EQUIVALENCE_STEPS, parallel.EQUIVALENCE_RTOL, parallel.PARAM_RTOL), "",
            md_table(rows, {"Audio s/s": "{:.1f}", "1 worker audio s/s": "{:.1f}",
                            "Max rel. diff, first %d losses" % parallel.EQUIVALENCE_STEPS: "{:.1e}",
                            "Params rel. diff": "{:.1e}"})]


def main() -> int:
    """``python -m runner.distributed``: the launcher table, and which targets can run data-parallel now."""
    from .targets import ALL_TARGETS
    print(launcher_table_markdown())
    for target in ALL_TARGETS.values():
        launcher = launcher_for(target)
        print("%-22s %-10s %s" % (target.name, launcher.name if launcher else "-",
                                  no_dp_reason(target) or "ready: the notebook has a 'workers' parameter"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
