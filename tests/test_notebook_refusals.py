"""The notebooks' data-parallel refusals, at the cell that raises them: the TensorFlow notebook's ``xla`` variant
and the Keras notebook's torch and TensorFlow backends refuse ``workers > 1`` in their settings cell (section 2),
in one line, before the framework loads; and run_all.py's list of the rows that train in one process only
(runner/dp/launchers.py, which it skips before anything starts) is the rows whose notebook refuses.

The settings cell runs in this interpreter without its framework (tests/notebook_cells.py), with the notebook's own
parameters, rank 0's environment from the row's launcher (runner/dp/launchers.py) and an ``os`` whose ``environ``
is a plain dict: a refusal raises ``ValueError`` having touched nothing and set no variable; the same cell with
``workers=1`` (and the row of record, or Keras on JAX, with ``workers=2``) passes every check and goes on to the
framework, which is not here (:class:`~tests.notebook_cells.Touched`).  Through run_all.py these rows never reach
their notebook: it skips them before anything starts (tests/test_run_all.py)."""
import types

import pytest

from common import compile_cache, envinfo
from runner.dp.launchers import LAUNCHERS, TARGET_LAUNCHERS, one_process_reason
from runner.run.targets import ALL_TARGETS
from tests.notebook_cells import Touched, parameters, run_cell, settings_names

TF, KERAS = "TensorFlow_DS2.ipynb", "Keras3_DS2.ipynb"
#: a GPU as nvidia-smi lists it (common/envinfo.py gpus()), for the rows that run on one only
CARD = envinfo.parse_gpus("NVIDIA H200, 580.159.04, 143771, 9.0")[0]
#: every variable by which common.parallel.world_from_env finds a launcher
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "DS2_PROCESS_ID", "DS2_NUM_PROCESSES", "DS2_LOCAL_RANK",
                    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK",
                    "PMI_SIZE", "MPI_LOCALRANKID", "TF_CONFIG")


@pytest.fixture
def launched(monkeypatch):
    """``launched(row, workers)``: this process is rank 0 of ``workers`` as ``run_all.py --workers`` starts
    ``row`` (one process: no launcher's variables at all)."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def launch(row, workers):
        if workers > 1:     # torchrun sets its variables itself: the ones the plain-process launcher sets by hand
            rank_env = LAUNCHERS[TARGET_LAUNCHERS[row]].rank_env or LAUNCHERS["python"].rank_env
            for name, value in rank_env(0, workers, [29500 + i for i in range(workers)]).items():
                monkeypatch.setenv(name, value)
    return launch


def settings(notebook, whole=True, **overrides):
    """Run ``notebook``'s settings cell (its first, where it has two) with its parameters and ``overrides``; the
    environment it set, and what stopped it (``None``: it ran to its end)."""
    environ = {}
    given = dict(parameters(notebook), **settings_names())
    given.update(overrides, os=types.SimpleNamespace(environ=environ))
    try:
        run_cell(notebook, "rosetta:settings", whole=whole, first=True, **given)
    except Exception as e:
        return environ, e
    return environ, None


def assert_refused_in_one_line(environ, stop, *words):
    assert isinstance(stop, ValueError), repr(stop)       # not Touched: nothing of the framework is reached
    assert "\n" not in str(stop), str(stop)
    for w in words:
        assert w in str(stop), (w, str(stop))
    assert environ == {}, environ                          # and no variable the framework reads is set yet


# ---- TensorFlow: the xla variant has no data-parallel code --------------------------------------------------------
def test_tensorflow_xla_refuses_two_workers_in_one_line_before_tensorflow_loads(launched):
    launched("tensorflow", 2)
    environ, stop = settings(TF, variant="xla", workers=2, batch_size=4)
    assert_refused_in_one_line(environ, stop, "variant 'xla' has no data-parallel code", "variant '')")


@pytest.mark.parametrize("variant, workers, touched", [
    ("xla", 1, "compile_cache.tf_xla_flags"),   # on a CPU: XLA's compilation cache first
    ("", 1, "tf.config"),
    ("", 2, "tf.config"),                        # the row of record is the data-parallel one
], ids=["xla-1", "graph-1", "graph-2"])
def test_tensorflow_settings_accept_what_they_do_not_refuse(launched, variant, workers, touched):
    launched("tensorflow", workers)
    environ, stop = settings(TF, variant=variant, workers=workers, device="cpu")
    assert isinstance(stop, Touched) and str(stop) == touched, repr(stop)


# ---- Keras 3: keras.distribution is JAX-only -----------------------------------------------------------------------
@pytest.mark.parametrize("backend, says, instead", [
    ("torch", "not offered on the torch backend", "PyTorch notebook (DDP"),
    ("tensorflow", "not offered on the TensorFlow backend", "TensorFlow notebook (MultiWorkerMirroredStrategy"),
], ids=["torch", "tensorflow"])
def test_keras_on_torch_and_tensorflow_refuses_two_workers_in_one_line_before_keras_loads(launched, backend, says,
                                                                                          instead):
    """``whole``: no import of the cell runs before the refusal."""
    launched("keras-" + backend, 2)
    environ, stop = settings(KERAS, backend=backend, workers=2, batch_size=4)
    assert_refused_in_one_line(environ, stop, "workers=2: " + says, "JAX-only", instead, "backend='jax'")


@pytest.mark.parametrize("backend, workers", [("torch", 1), ("tensorflow", 1), ("jax", 1), ("jax", 2)])
def test_keras_settings_accept_what_they_do_not_refuse(launched, backend, workers):
    """Every check passes and the cell picks the backend, then reaches Keras (its imports left out here)."""
    launched("keras-" + backend, workers)
    environ, stop = settings(KERAS, whole=False, backend=backend, workers=workers, compile_cache=compile_cache)
    assert isinstance(stop, Touched) and str(stop) == "keras.backend", repr(stop)
    expected = {"KERAS_BACKEND": backend}
    if backend == "jax" and not envinfo.gpus():           # smoke on a CPU: XLA compiles fast (section 2)
        expected["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
    assert environ == expected, environ


# ---- run_all.py skips, before anything starts, exactly the rows whose notebook refuses workers > 1 ----------------
@pytest.mark.parametrize("profile", [False, True], ids=["plain", "profile"])
@pytest.mark.parametrize("target", list(ALL_TARGETS))
def test_the_rows_run_all_skips_with_workers_are_the_rows_whose_notebook_refuses_them(launched, target, profile):
    """A refusal is a ``ValueError`` of the settings cell (on the device the row runs on: a GPU that nvidia-smi lists
    for the rows that need one); a row it lets through goes on to its framework (:class:`~tests.notebook_cells.Touched`:
    the cell's imports are left out) or to the cell's end."""
    row = ALL_TARGETS[target]
    launched(row.row_of_record, 2)
    gpu = {"device": "cuda", "nvidia_smi_gpus": lambda: [CARD]} if row.gpu_only else {"device": "cpu"}
    environ, stop = settings(row.notebook, whole=False, workers=2, profile=profile, compile_cache=compile_cache,
                             **dict(gpu, **row.parameters))
    reason = one_process_reason(row, profile)
    assert isinstance(stop, ValueError) == (reason is not None), (target, repr(stop), reason)
    assert stop is None or isinstance(stop, (ValueError, Touched)), repr(stop)
    if reason is not None:
        assert reason.startswith(target + (" with --profile" if "profile" in str(stop) else "") +
                                 " trains in one process only (--workers 1): "), reason
