"""Data-parallel facts every notebook shares: who am I, how the loss is weighted, how a run is
proven equal to one worker.  Standard library + NumPy, no framework import; runs on Python 3.6.

* :func:`world_from_env` -- rank, world size and local rank from whichever launcher started this
  process (torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, ``TF_CONFIG``, ``DS2_PROCESS_ID``/
  ``DS2_NUM_PROCESSES``/``DS2_COORDINATOR`` for JAX and Keras-on-JAX, OpenMPI's ``OMPI_COMM_WORLD_*``
  for CNTK); one process with no launcher is rank 0 of 1.
* :func:`local_loss_scale` -- the factor on a worker's *summed* per-utterance loss that makes W workers
  exactly one worker with the global batch (the rule is documented at :func:`common.data.shard_bounds`).
* :func:`param_summary` -- a float64 fingerprint of the trained parameters for the record
  (``checks.param_summary``), comparable across runs with a tolerance (a hash is not).
* :func:`equivalence` -- the data-parallel check: the W-worker record against the single-worker record
  with the global batch size (first K = 10 losses, warm-up first, within 1e-5 relative; the parameter
  summaries after the epoch, when both records have one, within :data:`PARAM_RTOL`; the same data checksum).
* :func:`distributed_section` -- what rank 0 writes into the record's ``distributed`` section.

**The contract of a notebook's data-parallel code** (what ``run_all.py --workers W`` expects; the
runner's side is :mod:`runner.dp.launch`):

1. a ``workers = 1`` line in the tagged ``parameters`` cell (its presence is how the runner knows the
   notebook has data-parallel code); the runner passes ``workers=W`` and ``batch_size`` = the *global*
   batch W*b, and starts W processes (or, for the "single" launcher, one process that drives W devices);
2. ``world = world_from_env()``; initialise the framework's engine from the launcher's variables
   (``init_process_group("gloo"|"nccl")`` under torchrun; ``MultiWorkerMirroredStrategy()`` reads
   ``TF_CONFIG``; ``jax.distributed.initialize(os.environ["DS2_COORDINATOR"], W, rank)``; CNTK's
   ``Communicator`` under mpiexec); on a GPU, device ``world.local_rank``;
3. build the iterator with the global batch size, exactly as the single-worker notebook does, and
   iterate it whole: ``timer.epoch(train_step, train_data)``; inside ``train_step(batch)`` take
   ``mine = batch.shard(world.rank, W)`` -- the timer then counts global utterances (global throughput)
   and ``train_data.checksum`` is the global one on every worker;
4. local loss = sum of ``mine``'s per-utterance CTC losses x :func:`local_loss_scale`; gradients
   all-reduced by the engine; BatchNorm statistics all-reduced as (sum, sum of squared deviations,
   count) over the global batch; an empty ``mine`` still joins every collective with zeros;
   ``train_step`` returns the *global* loss (all-reduced), so the losses compare with one worker;
5. only rank 0 (``world.is_chief``) writes the record (``result_path``), with
   ``distributed=distributed_section(world, launcher, backend, P.batch_size, sync_batchnorm, reduction)``
   and, when it can, ``checks["param_summary"] = param_summary(canonical state after training)``;
6. the model, loss and weight loading stay the notebook's own cells: the data-parallel code wraps them
   (DDP around the model, a strategy scope around its construction, shardings on its inputs), it
   never copies them.
"""
import json
import os
from typing import Dict, Iterable, Optional, Tuple

import numpy as np

#: losses compared between the W-worker run and the single-worker run
EQUIVALENCE_STEPS = 10
#: their largest allowed relative difference (SPEC.md section 8)
EQUIVALENCE_RTOL = 1e-5
#: largest allowed relative difference of the parameter summaries after the WHOLE epoch: float32 rounding
#: of a different summation order (a synchronized BatchNorm's, an all-reduce's) grows with every step --
#: measured on the smoke preset (12 steps), 2 x 4 against 1 x 8: 4e-10 (CNTK over MPI) to 1e-6 (MXNet
#: SyncBatchNorm) for six rows; per-device BatchNorm statistics (MXNet ``local``) 3.4e-4.  Set when the smoke
#: epoch had 42 steps over 15 lengths and amplified rounding: MXNet 2.6e-5, CNTK 3.9e-5, and a single-process
#: CNTK run from weights moved by ONE float32 step 2.1e-5 away; a longer epoch than smoke's needs the room.
PARAM_RTOL = 1e-4


class World(tuple):
    """(rank, world_size, local_rank, source): ``source`` names where the numbers came from."""
    __slots__ = ()

    def __new__(cls, rank: int, world_size: int, local_rank: int, source: str):
        return tuple.__new__(cls, (rank, world_size, local_rank, source))

    rank = property(lambda self: self[0])
    world_size = property(lambda self: self[1])
    local_rank = property(lambda self: self[2])
    source = property(lambda self: self[3])

    @property
    def is_chief(self) -> bool:
        """Rank 0: the process that writes the record."""
        return self[0] == 0

    def __repr__(self):
        return "World(rank=%d, world_size=%d, local_rank=%d, source=%r)" % self


def _int(env, name) -> Optional[int]:
    value = env.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError("environment variable %s=%r is not an integer" % (name, value))


def world_from_env(env: Optional[Dict[str, str]] = None) -> World:
    """Rank, world size and local rank of this process, from its launcher's standard variables.

    Looked up in this order: ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (torchrun, and the runner's
    plain-process launcher); ``DS2_PROCESS_ID``/``DS2_NUM_PROCESSES`` (the runner's JAX launcher);
    ``TF_CONFIG`` (the task index among the workers of its cluster); ``OMPI_COMM_WORLD_RANK``/
    ``OMPI_COMM_WORLD_SIZE``/``OMPI_COMM_WORLD_LOCAL_RANK`` (mpiexec); ``PMI_RANK``/``PMI_SIZE`` (other MPIs).
    None of them: rank 0 of 1 (a single process, or a notebook run by papermill).
    """
    env = os.environ if env is None else env
    for rank_var, size_var, local_var, source in (
            ("RANK", "WORLD_SIZE", "LOCAL_RANK", "RANK"),
            ("DS2_PROCESS_ID", "DS2_NUM_PROCESSES", "DS2_LOCAL_RANK", "DS2_PROCESS_ID"),
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_RANK"),
            ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI_RANK")):
        rank, size = _int(env, rank_var), _int(env, size_var)
        if rank is None and size is None:
            continue
        if rank is None or size is None:
            raise ValueError("%s and %s must be set together" % (rank_var, size_var))
        local = _int(env, local_var)
        return _checked(World(rank, size, rank if local is None else local, source))
    if env.get("TF_CONFIG"):
        try:
            config = json.loads(env["TF_CONFIG"])
            workers = config["cluster"]["worker"]
            task = config["task"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError("TF_CONFIG is not a cluster with workers and a task: %s" % e)
        if task.get("type") not in ("worker", "chief"):
            raise ValueError("TF_CONFIG task type %r: the notebooks run workers only" % (task.get("type"),))
        index = int(task.get("index", 0))
        return _checked(World(index, len(workers), index, "TF_CONFIG"))
    return World(0, 1, 0, "single")


def _checked(world: World) -> World:
    if world.world_size < 1 or not 0 <= world.rank < world.world_size:
        raise ValueError("rank %d is not in a world of %d processes" % (world.rank, world.world_size))
    return world


def local_loss_scale(global_batch: int, world_size: int, engine_reduces: str = "sum") -> float:
    """Factor on this worker's **sum** of per-utterance losses (0 for an empty share) that makes the
    all-reduced gradient the single-worker gradient of the global batch's mean loss.

    ``engine_reduces``: what the framework's gradient all-reduce does with the W gradients -- "sum"
    (MXNet kvstore, CNTK's distributed learner, tf.distribute, a hand-written all-reduce SUM) gives
    ``1 / global_batch``; "mean" (PyTorch DDP) gives ``world_size / global_batch``.
    """
    if global_batch < 1 or world_size < 1:
        raise ValueError("global_batch and world_size must be positive, got %r, %r" % (global_batch, world_size))
    if engine_reduces == "sum":
        return 1.0 / global_batch
    if engine_reduces == "mean":
        return float(world_size) / global_batch
    raise ValueError("engine_reduces is 'sum' or 'mean', got %r" % (engine_reduces,))


def param_summary(named_arrays) -> dict:
    """A float64 fingerprint of parameters (e.g. the canonical state after training): the count and
    the sum, sum of absolute values and sum of squares over every element, names in sorted order.
    Two runs that trained alike agree to rounding; a hash would differ in the last bit."""
    items = sorted(named_arrays.items() if hasattr(named_arrays, "items") else named_arrays)
    count, total, total_abs, total_sq = 0, 0.0, 0.0, 0.0
    for _, value in items:
        a = np.asarray(value, dtype=np.float64)
        count += a.size
        total += float(a.sum())
        total_abs += float(np.abs(a).sum())
        total_sq += float(np.square(a).sum())
    return {"count": count, "sum": total, "sum_abs": total_abs, "sum_sq": total_sq, "tensors": len(items)}


def distributed_section(world: World, launcher: str, backend: str, global_batch: int,
                        sync_batchnorm: str, gradient_reduction: str, **extra) -> dict:
    """The record's ``distributed`` section as rank 0 writes it; the runner adds the launch facts.

    ``backend``: the engine's communication backend as the framework reports it ("gloo", "nccl",
    "RING", "kvstore dist_sync", "OpenMPI 4.1.4"); ``sync_batchnorm``: the mechanism that makes
    BatchNorm statistics global (e.g. "BatchNorm subclass, all_reduce of [sum, count] then squared
    deviations"); ``gradient_reduction``: "sum" or "mean" and how the loss is scaled.
    """
    from .data import shard_sizes
    section = {"world_size": world.world_size, "rank_source": world.source, "launcher": launcher,
               "backend": backend, "global_batch": global_batch,
               "per_worker_batch": max(shard_sizes(global_batch, world.world_size)),
               "sync_batchnorm": sync_batchnorm, "gradient_reduction": gradient_reduction}
    section.update(extra)
    return section


# ---- equivalence: W workers x b  ==  1 worker x W*b ----------------------------------------------
def first_losses(record: dict, k: int = EQUIVALENCE_STEPS) -> np.ndarray:
    """The first ``k`` training losses of a record: warm-up steps first, then the timed pass."""
    losses = record.get("losses") or {}
    seq = list(losses.get("warmup") or []) + list(losses.get("train") or [])
    return np.asarray(seq[:k], dtype=np.float64)


def _max_rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.size == 0:
        raise ValueError("nothing to compare: shapes %s and %s" % (a.shape, b.shape))
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return float("inf")
    denom = np.maximum(np.abs(b), np.finfo(np.float64).tiny)
    return float(np.max(np.abs(a - b) / denom))


def same_benchmark(a: dict, b: dict) -> Tuple[bool, str]:
    """Whether two records ran the same data with the same model: preset, scale, seed, *global* batch
    size and precision; the reason when not."""
    for key in ("preset", "scale", "seed", "batch_size", "precision"):
        if a.get(key) != b.get(key):
            return False, "%s differs: %r vs %r" % (key, a.get(key), b.get(key))
    return True, ""


def equivalence(distributed: dict, single: dict, k: int = EQUIVALENCE_STEPS,
                rtol: float = EQUIVALENCE_RTOL, param_rtol: float = PARAM_RTOL) -> dict:
    """The record field ``checks.equivalence`` of a W-worker record against the single-worker record
    with the same global batch: max relative difference of the first ``k`` losses (warm-up first;
    ``rel_diff``, within ``rtol``), of the parameter summaries after the epoch when both records have
    one (``checks.param_summary``; ``param_rel_diff``, within ``param_rtol``), the data checksums, and
    ``ok`` when all hold."""
    ok_same, why = same_benchmark(distributed, single)
    out = {"reference_target": single.get("target"), "reference_world_size":
           (single.get("distributed") or {}).get("world_size", 1), "k": k, "rtol": rtol}
    if not ok_same:
        out.update(ok=False, error="not the same benchmark: " + why)
        return out
    mine, theirs = first_losses(distributed, k), first_losses(single, k)
    n = min(len(mine), len(theirs))
    if n == 0:
        out.update(ok=False, error="a record has no losses")
        return out
    out["steps_compared"] = n
    out["loss_rel_diff"] = _max_rel(mine[:n], theirs[:n])
    ps_a = (distributed.get("checks") or {}).get("param_summary")
    ps_b = (single.get("checks") or {}).get("param_summary")
    if ps_a and ps_b:
        keys = ("sum_abs", "sum_sq")   # the plain sum can be near 0: compared absolutely below
        out["param_rel_diff"] = _max_rel([ps_a[k_] for k_ in keys], [ps_b[k_] for k_ in keys])
        out["param_sum_abs_diff"] = abs(ps_a["sum"] - ps_b["sum"]) / max(ps_b["sum_abs"], 1e-300)
        out["param_count_equal"] = ps_a.get("count") == ps_b.get("count")
    else:
        out["param_rel_diff"] = None
    ck_a = (distributed.get("data") or {}).get("checksum")
    ck_b = (single.get("data") or {}).get("checksum")
    out["checksum_equal"] = ck_a is not None and ck_a == ck_b
    worst = out["loss_rel_diff"]
    params = [v for v in (out["param_rel_diff"], out.get("param_sum_abs_diff")) if v is not None]
    worst_params = max(params) if params else None
    out["rel_diff"] = worst                 # the losses' (the issue's criterion); parameters on their own
    out["param_rtol"] = param_rtol
    out["ok"] = bool(worst <= rtol and (worst_params is None or worst_params <= param_rtol)
                     and out["checksum_equal"] and out.get("param_count_equal", True) and n == k)
    if not out["ok"]:
        reasons = []
        if worst > rtol:
            reasons.append("max relative difference %.2e > %.0e" % (worst, rtol))
        if worst_params is not None and worst_params > param_rtol:
            reasons.append("parameter summaries differ by %.2e > %.0e after the epoch" % (worst_params, param_rtol))
        if not out["checksum_equal"]:
            reasons.append("data checksums differ")
        if not out.get("param_count_equal", True):
            reasons.append("parameter counts differ")
        if n != k:
            reasons.append("only %d of %d losses to compare" % (n, k))
        out["error"] = "; ".join(reasons)
    return out
