"""The notebooks' data-parallel refusals, at the cell that raises them: the TensorFlow notebook's ``xla`` variant
and the Keras notebook's torch and TensorFlow backends refuse ``workers > 1`` in their settings cell (section 2),
in one line, before the framework loads.

The settings cell runs in this interpreter without its framework (tests/notebook_cells.py), with the notebook's own
parameters, rank 0's environment from the row's launcher (runner/dp/launchers.py) and an ``os`` whose ``environ``
is a plain dict: a refusal raises ``ValueError`` having touched nothing and set no variable; the same cell with
``workers=1`` (and the row of record, or Keras on JAX, with ``workers=2``) passes every check and goes on to the
framework, which is not here (:class:`~tests.notebook_cells.Touched`).  The whole runs, a failed record with the
same line (tests/test_dp_equivalence_tensorflow.py, tests/test_dp_equivalence_keras.py), are in ``--full``."""
import types

import pytest

from common import compile_cache, envinfo
from runner.dp.launchers import LAUNCHERS, TARGET_LAUNCHERS
from tests.notebook_cells import Touched, parameters, run_cell, settings_names

TF, KERAS = "TensorFlow_DS2.ipynb", "Keras3_DS2.ipynb"
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
    """Run ``notebook``'s settings cell with its parameters and ``overrides``; the environment it set, and what
    stopped it (``None``: it ran to its end)."""
    environ = {}
    given = dict(parameters(notebook), **settings_names())
    given.update(overrides, os=types.SimpleNamespace(environ=environ))
    try:
        run_cell(notebook, "rosetta:settings", whole=whole, **given)
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
    """What tests/test_dp_equivalence_tensorflow.py::test_xla_variant_refuses_workers (--full) finds in the record."""
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
    """What tests/test_dp_equivalence_keras.py::test_keras_on_torch_and_tensorflow_refuse_workers_with_one_line
    (--full) finds in the record; ``whole``: no import of the cell runs before the refusal."""
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
