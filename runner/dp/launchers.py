"""The data-parallel launchers: how W processes of each framework start on one host, and on several
(runner/dp/hosts.py), with the table docs/data-parallel.md shows (:func:`launcher_table_markdown`).  Part of
``run_all.py --workers W`` (runner/dp/launch.py)."""
import json
import os
from collections import OrderedDict
from typing import Callable, Dict, List, Optional, Tuple

from runner.envs.definitions import mxnet_kernel_env
from runner.run.targets import ALL_TARGETS, MXNET_DP_MODES, Target


# ---- the launcher table -------------------------------------------------------------------------------
class Launcher:
    """How W processes of one framework are started on one host.

    ``kind``: "torchrun" (one torchrun process starts W workers), "mpiexec" (one mpiexec), "processes"
    (the runner starts W plain processes, with ``rank_env(rank, W, ports)`` their rank variables), or
    "single" (one process that drives W devices itself).  ``tested``: what has been run on this
    project's CPU machine through this launcher, in words.  ``multinode``: the multi-host form
    (documented, not run here).
    """

    def __init__(self, name: str, kind: str, backend: str, command: str, tested: str, multinode: str,
                 rank_env: Optional[Callable[[int, int, List[int]], Dict[str, str]]] = None, ports: int = 0,
                 extra_env: Optional[Callable[[str], Dict[str, str]]] = None, notes: str = ""):
        self.name = name
        self.kind = kind
        self.backend = backend
        self.command = command              # the command line, in words (README, --list)
        self.tested = tested
        self.multinode = multinode
        self.rank_env = rank_env            # (rank, world, ports) -> environment of that rank
        self.ports = ports                  # free loopback ports the launch needs
        self.extra_env = extra_env          # venv -> extra environment of every process
        self.notes = notes


def _torch_env(rank: int, world: int, ports: List[int], root: str = "127.0.0.1", addresses=None,
               local_rank: Optional[int] = None) -> Dict[str, str]:
    """torchrun's variables, set by hand: what ``init_process_group("gloo")`` (env://) reads.  On several hosts
    (runner/dp/hosts.py): ``root`` is host 0, ``addresses`` each rank's host, ``local_rank`` the rank on its host."""
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


def _ps_env(world: int, port: int, root: str = "127.0.0.1") -> Dict[str, str]:
    """What every process of an MXNet dist_sync run reads (ps-lite): the scheduler's address, the node counts."""
    return {"DMLC_PS_ROOT_URI": root, "DMLC_PS_ROOT_PORT": str(port), "DMLC_NUM_SERVER": "1",
            "DMLC_NUM_WORKER": str(world), "DMLC_NODE_HOST": root}


LAUNCHERS = OrderedDict((l.name, l) for l in [
    Launcher("torchrun", "torchrun", "gloo (CPU) / nccl (CUDA), chosen by the notebook",
             "<venv>/bin/torchrun --standalone --nnodes 1 --nproc_per_node W --max-restarts 0 "
             "runner/dp/worker.py ... script.py",
             tested="tests/fixtures/dp_fixture.ipynb with collective='gloo' (torch.distributed all_reduce, "
                      "W=2, pytorch-cpu): ok, a failing rank, Ctrl-C; tests/fixtures/ddp_uneven.py (DDP, all-reduced "
                      "BatchNorm, uneven and empty shards = one process to 1e-15); the DS2 PyTorch notebook, W=2 on smoke "
                      "(DDP over gloo, AllReduceBatchNorm stand-in): 2 x 4 = 1 x 8 to 1.2e-7 in the first 10 losses "
                      "(fp32), 2.3e-16 over the whole epoch (fp64) (tests/test_dp_equivalence_pytorch.py)",
             multinode=("torchrun on every host: --nnodes N --node_rank R --rdzv_backend c10d --rdzv_endpoint HOST0:PORT "
                       "(is_host=1 on host 0) --local-addr HOST. Tested on 2 simulated hosts: the DS2 PyTorch "
                       "notebook, 2 x 4 = 1 x 8 to 7.2e-8 (tests/test_hosts.py)")),
    Launcher("tf_config", "processes", "MultiWorkerMirroredStrategy, RING (CPU) / NCCL (CUDA) collectives",
             "W x <venv>/bin/python runner/dp/worker.py ... script.py, each with TF_CONFIG = "
             "{cluster: {worker: [127.0.0.1:P0, ...]}, task: {type: worker, index: r}}",
             tested="tests/fixtures/dp_fixture.ipynb with collective='tf' (MWMS strategy.reduce SUM, W=2, "
                      "tensorflow-cpu); the DS2 TensorFlow notebook, W=2 on smoke (MWMS, custom tf.function step, "
                      "BatchNormalization(synchronized=True)): 2 x 4 = 1 x 8 to 1.2e-7 (tests/test_dp_equivalence_tensorflow.py)",
             multinode=("one process per slot, TF_CONFIG listing every worker's HOST:PORT. Tested on 2 simulated hosts: "
                       "the DS2 TensorFlow notebook, 2 x 4 = 1 x 8 to 1.2e-7 (tests/test_hosts.py, --full)"),
             rank_env=_tf_env, ports=-1),         # -1: one port per worker
    Launcher("jax", "processes", "jax.distributed (gloo collectives on CPU, NCCL on CUDA)",
             "W x <venv>/bin/python runner/dp/worker.py ... script.py, each with DS2_COORDINATOR="
             "JAX_COORDINATOR_ADDRESS=127.0.0.1:P, DS2_NUM_PROCESSES=W, DS2_PROCESS_ID=r; the notebook calls "
             "jax.distributed.initialize(DS2_COORDINATOR, num_processes, process_id)",
             tested="tests/fixtures/dp_fixture.ipynb with collective='jax' (jax.distributed.initialize, "
                      "process_allgather over gloo, W=2, jax-cpu); the DS2 Keras notebook on JAX, W=2 on smoke "
                      "(keras.distribution.DataParallel): 2 x 4 = 1 x 8 to 2.1e-7 (tests/test_dp_equivalence_keras.py); the DS2 "
                      "JAX notebook (NamedSharding over a 'data' mesh, batches W does not divide replicated): "
                      "2 x 4 = 1 x 8 to 1.2e-7 (tests/test_dp_equivalence_jax.py)",
             multinode=("one process per slot, DS2_COORDINATOR=HOST0:PORT, DS2_PROCESS_ID = the global rank. Tested on 2 "
                       "simulated hosts: the DS2 JAX notebook, 2 x 4 = 1 x 8 to 6.1e-8, and Keras on JAX, 1.8e-7 "
                       "(tests/test_hosts.py, --full)"),
             rank_env=_jax_env, ports=1),
    Launcher("mpiexec", "mpiexec", "OpenMPI (CNTK data_parallel_distributed_learner)",
             "mpiexec --allow-run-as-root --oversubscribe -n W -x LD_LIBRARY_PATH=<venv>/mpi-compat "
             "-x DS2_DP_RUN <venv>/bin/python runner/dp/worker.py ... script.py",
             tested="a standard-library script (ok, a failing rank) and tests/fixtures/dp_fixture.ipynb with "
                      "collective='cntk' (CNTK 2.7 mpicommunicator aggregate_in_place on Python 3.6, OpenMPI 4, W=2); "
                      "the DS2 CNTK notebook, W=2 on smoke (data_parallel_distributed_learner, BatchNorm statistics "
                      "all-reduced by an MPI UserFunction): 2 x 4 = 1 x 8 to 1.4e-7 (tests/test_dp_equivalence_cntk_mxnet.py)",
             multinode=("mpiexec --hostfile (host slots=N) on the launching host, ssh as OpenMPI's rsh agent, its TCP "
                       "traffic on the network that reaches host 0. Tested on 2 simulated hosts: the DS2 CNTK "
                       "notebook, 2 x 4 = 1 x 8 to 1.4e-7"),
             extra_env=_cntk_env),
    Launcher("single", "single", "one process driving W devices (MXNet kvstore 'device' over mx.cpu(0..W-1) "
                                 "or mx.gpu(0..W-1))",
             "<venv>/bin/python runner/dp/worker.py ... script.py (workers=W)",
             tested="the DS2 MXNet notebook, W=2 on smoke over mx.cpu(0), mx.cpu(1) (kvstore 'device', "
                      "SyncBatchNorm, one thread per device): 2 x 4 = 1 x 8 to 5.5e-7 (tests/test_dp_equivalence_cntk_mxnet.py); with "
                      "--mxnet-dp local (each device its own BatchNorm statistics) the reference of dist_sync",
             multinode="see mxnet_dist_sync", extra_env=_mxnet_env),
    Launcher("mxnet_dist_sync", "ps", "MXNet kvstore 'dist_sync' (ps-lite parameter server over TCP)",
             "W x <venv>/bin/python runner/dp/worker.py ... script.py (DMLC_ROLE=worker, RANK=r), then "
             "<venv>/bin/python -c 'import mxnet' with DMLC_ROLE=scheduler and DMLC_ROLE=server; every process "
             "DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=P DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=W "
             "DMLC_NODE_HOST=127.0.0.1 (run_all.py --mxnet-dp dist_sync)",
             tested="the DS2 MXNet notebook, W=2 on smoke (kvstore 'dist_sync', update_on_kvstore=False, "
                      "each worker its own BatchNorm statistics) against --mxnet-dp local (tests/test_dp_equivalence_cntk_mxnet.py)",
             multinode=("the ps-lite scheduler and a server on host 0, workers on every host (DMLC_PS_ROOT_URI=host 0, "
                       "DMLC_NODE_HOST = the host's own name). Tested on 2 simulated hosts: the DS2 MXNet notebook "
                       "(--mxnet-dp dist_sync), bit-identical to --mxnet-dp local"),
             extra_env=_mxnet_env),
    Launcher("python", "processes", "whatever the script initialises (torchrun's env:// variables are set)",
             "W x python runner/dp/worker.py ... script.py, each with RANK, WORLD_SIZE, LOCAL_RANK, "
             "MASTER_ADDR=127.0.0.1, MASTER_PORT=P",
             tested="the tests' standard-library fixture notebook (tests/fixtures/dp_fixture.ipynb)",
             multinode="the fault cases of tests/test_hosts.py on 2 simulated hosts (a host that never joins, a killed rank, Ctrl-C)", rank_env=_torch_env, ports=1),
])

#: target (row of record) -> its launcher; variants use their row of record's.  A target that is not
#: here has no data-parallel route at all (a skipped row); one that is here still needs the notebook's
#: ``workers`` parameter.
TARGET_LAUNCHERS = OrderedDict([
    ("pytorch", "torchrun"),            # DDP; BatchNorm synchronised by an all-reduce subclass on CPU
    ("tensorflow", "tf_config"),        # MultiWorkerMirroredStrategy, BatchNormalization(synchronized=True)
    ("jax", "jax"),                     # jax.distributed + NamedSharding: global statistics under jit
    ("keras-jax", "jax"),               # keras.distribution.DataParallel on the JAX backend
    ("keras-tensorflow", "tf_config"),  # one process only (ONE_PROCESS_ROWS): keras.distribution is JAX-only
    ("keras-torch", "torchrun"),        # one process only (ONE_PROCESS_ROWS): keras.distribution is JAX-only
    ("cntk", "mpiexec"),
    ("mxnet", "single"),
])


#: rows of record whose notebook trains in one process only, and why (each says so in its settings cell, section 2)
ONE_PROCESS_ROWS = OrderedDict([
    ("keras-torch", "not offered on the torch backend: keras.distribution (Keras 3's data-parallel API) is JAX-only; "
                    "for data-parallel PyTorch use the PyTorch notebook (DDP under torchrun), or Keras on JAX"),
    ("keras-tensorflow", "not offered on the TensorFlow backend: keras.distribution is JAX-only, and Keras's training "
                         "step fails under MultiWorkerMirroredStrategy; use the TensorFlow notebook "
                         "(MultiWorkerMirroredStrategy), or Keras on JAX"),
])
#: rows of record whose variants train in one process only, and why
ONE_PROCESS_VARIANTS = {
    "pytorch": "the PyTorch notebook's data-parallel code wraps the eager model in DDP; its variants run with one worker",
    "tensorflow": "the TensorFlow notebook's variants have no data-parallel code (their step is not run under a "
                  "tf.distribute strategy); the row of record is the data-parallel one",
}
#: notebooks whose --profile profiles one process only, so that they refuse it with --workers
PROFILE_ONE_PROCESS = {"Keras3_DS2.ipynb": "the Keras notebook profiles one process's step"}


def one_process_why(target: Target, profile: bool = False) -> Optional[Tuple[str, str]]:
    """(the row as it is refused: its name, and " with --profile" where only ``profile`` makes it so; why) where
    ``target`` does not train with ``--workers`` W > 1 (its notebook refuses ``workers > 1``), else None."""
    why, given = ONE_PROCESS_ROWS.get(target.row_of_record), ""
    if why is None and target.variant_of in ONE_PROCESS_VARIANTS:
        why = "variant %s: %s" % (target.parameters.get("variant", target.name),
                                  ONE_PROCESS_VARIANTS[target.variant_of])
    if why is None and profile:
        why, given = PROFILE_ONE_PROCESS.get(target.notebook), " with --profile"
    return (target.name + given, why) if why else None


def one_process_reason(target: Target, profile: bool = False) -> Optional[str]:
    """Why ``target`` does not train with ``--workers`` W > 1 (``profile``: with ``--profile``), in one line, or
    None: run_all.py then skips the row before anything starts (tests/test_notebook_refusals.py holds these rows equal
    to the ones whose notebook refuses ``workers > 1`` itself)."""
    found = one_process_why(target, profile)
    return "%s trains in one process only (--workers 1): %s" % found if found else None


def launcher_for(target: Target) -> Optional[Launcher]:
    name = TARGET_LAUNCHERS.get(target.row_of_record)
    return LAUNCHERS[name] if name else None


def launcher_table_markdown() -> str:
    """The launcher table and, under it, each launcher's command, what ran here and its multi-node form
    (docs/data-parallel.md is written from it)."""
    rows = ["| Launcher | Targets | Kind |", "|---|---|---|"]
    notes = []
    for l in LAUNCHERS.values():
        targets = ", ".join(t for t, n in TARGET_LAUNCHERS.items() if n == l.name and t not in ONE_PROCESS_ROWS) or \
            ", ".join("%s (--mxnet-dp %s)" % (t, m) for t in ("mxnet",) for m, spec in MXNET_DP_MODES.items()
                      if spec["launcher"] == l.name) or "tests"
        rows.append("| %s | %s | %s |" % (l.name, targets, l.kind))
        notes.append("- **%s**: `%s`\n  - Tested: %s\n  - Several hosts (`--hosts`): %s" % (
            l.name, l.command, l.tested, l.multinode))
    alone = ["- **%s**: %s" % found for found in (one_process_why(t, profile=True) for t in ALL_TARGETS.values())
             if found]
    return ("\n".join(rows) + "\n\n" + "\n".join(notes) + "\n\nRows that train in one process only: with `--workers` "
            "W > 1 run_all.py skips them (a `skipped` row with the reason) before anything starts:\n\n"
            + "\n".join(alone) + "\n")
