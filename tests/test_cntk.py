"""CNTK without CNTK: the per-frame CTC labels, the environment detection and setup, and what the
notebook receives.  These run everywhere; the notebook itself runs in tests/test_notebooks.py when
an interpreter for CNTK is given (--cntk-python, DS2_CNTK_PYTHON) or found (runner.envs.cntk_python) and is
skipped otherwise."""
import ast
import json
import os
import stat

import numpy as np
import pytest

from common.data import DeepMarkIterator
from common.labels import frame_labels
from common.spec import FRAMES_PER_SECOND, LABEL_LENGTHS, UTTERANCE_SECONDS, get_preset
from runner.envs import framework_envs
from runner.run import execute
from runner.envs import gpu_preflight
from runner.run import targets
from runner.envs import definitions
from runner.envs.bootstrap import STAMP, read_stamp
from runner.base import EnvError
from tests.conftest import ROOT
from tests.notebook_cells import parameters

SMOKE = get_preset("smoke")


# ---- per-frame labels for C.labels_to_graph ------------------------------------------------------
def decode(encoded):
    """What labels_to_graph reads: a label starts in every frame whose maximum is 2."""
    return [[int(np.argmax(frame)) for frame in utterance if frame.max() == 2] for utterance in encoded]


def test_frame_labels_encoding():
    labels = np.array([[1, 2, 2], [3, 1, 4]], dtype=np.int32)
    e = frame_labels(labels, 5, 6)
    assert e.shape == (2, 5, 6) and e.dtype == np.float32
    assert decode(e) == labels.tolist()                      # repeated labels stay two labels
    assert ((e != 0).sum(axis=-1) == 1).all()                # one class per frame
    assert e[0, 3:, 2].tolist() == [1, 1] and e[1, 3:, 4].tolist() == [1, 1]   # the last label continues
    assert e[0, 1, 2] == e[0, 2, 2] == 2


def test_frame_labels_when_labels_fill_every_frame():
    e = frame_labels(np.array([[5, 6]]), 2, 7)
    assert decode(e) == [[5, 6]] and e.max(axis=-1).tolist() == [[2, 2]]


@pytest.mark.parametrize("labels, n_frames, message", [
    (np.ones((2, 4), np.int32), 3, "do not fit"),
    (np.full((1, 2), 29), 5, "must lie in 0..28"),
    (np.array([1, 2, 3]), 5, "shape (N, L)"),
    (np.zeros((2, 0), np.int32), 5, "shape (N, L)"),
])
def test_frame_labels_refuses_bad_input(labels, n_frames, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        frame_labels(labels, n_frames, 29)


def test_every_deepmark_transcript_fits_its_output_frames():
    cfg = SMOKE.config
    for seconds, length in zip(UTTERANCE_SECONDS, LABEL_LENGTHS):
        assert length <= cfg.output_length(seconds * FRAMES_PER_SECOND)


def test_frame_labels_of_the_smoke_pass_round_trip():
    cfg = SMOKE.config
    for batch in DeepMarkIterator(SMOKE.batch_size, SMOKE.scale, seed=0):
        e = frame_labels(batch.labels, cfg.output_length(batch.frames), cfg.n_classes)
        assert e.shape == (batch.batch_size, batch.frames // 4, cfg.n_classes)
        assert decode(e) == batch.labels.tolist()


def test_output_frames_per_second_of_audio():
    """The notebook's BatchNorm time constant uses output frames = audio seconds x 25 (T/4)."""
    cfg = SMOKE.config
    for preset in ("smoke", "deepmark"):
        p = get_preset(preset)
        it = DeepMarkIterator(p.batch_size, p.scale, seed=0)
        frames = sum(b.batch_size * cfg.output_length(b.frames) for b in map(it.batch, range(len(it))))
        assert frames == it.audio_seconds * cfg.output_length(FRAMES_PER_SECOND)


# ---- environment detection and setup ---------------------------------------------------------------
@pytest.fixture
def libdir(tmp_path, monkeypatch):
    d = tmp_path / "lib"
    d.mkdir()
    monkeypatch.setattr(definitions, "MPI_LIBDIRS", [str(d)])
    return d


def test_cntk_needs_openmpi(libdir):
    reason = definitions.cntk_needs()
    assert "libmpi.so.40" in reason and "libmpi_cxx.so.40" in reason and "apt-get install libopenmpi3" in reason
    (libdir / "libmpi.so.40").write_text("")
    assert "libmpi_cxx.so.40" in definitions.cntk_needs() and "libmpi.so.40," not in definitions.cntk_needs()
    (libdir / "libmpi_cxx.so.40").write_text("")
    assert definitions.cntk_needs() is None
    assert definitions.cntk_mpi_libraries() == {"libmpi.so.12": str(libdir / "libmpi.so.40"),
                                            "libmpi_cxx.so.1": str(libdir / "libmpi_cxx.so.40")}


def test_cntk_prefers_openmpi_110_when_present(libdir):
    for name in ("libmpi.so.12", "libmpi_cxx.so.1", "libmpi.so.40", "libmpi_cxx.so.40"):
        (libdir / name).write_text("")
    assert definitions.cntk_needs() is None
    assert definitions.cntk_mpi_libraries() == {"libmpi.so.12": str(libdir / "libmpi.so.12"),
                                            "libmpi_cxx.so.1": str(libdir / "libmpi_cxx.so.1")}


def fake_venv(tmp_path, script):
    """A directory that looks like a virtual environment whose python runs ``script`` (sh)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text("#!/bin/sh\n" + script)
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return venv


def test_cntk_post_create_links_the_old_sonames_and_imports_cntk(tmp_path, libdir, monkeypatch):
    monkeypatch.setattr(definitions, "DRIVER_DIRS", [])       # a machine without driver directories to add
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    for name in ("libmpi.so.40", "libmpi_cxx.so.40"):
        (libdir / name).write_text("")
    log = tmp_path / "calls"
    venv = fake_venv(tmp_path, 'echo "$LD_LIBRARY_PATH $*" >> %s\n' % log)
    for _ in range(2):                                   # idempotent: a rebuild replaces the links
        definitions.cntk_post_create(str(venv))
    compat = venv / "mpi-compat"
    assert os.readlink(str(compat / "libmpi.so.12")) == str(libdir / "libmpi.so.40")
    assert os.readlink(str(compat / "libmpi_cxx.so.1")) == str(libdir / "libmpi_cxx.so.40")
    assert log.read_text().splitlines()[-1] == "%s -c import cntk" % compat   # the import sees the links
    assert definitions.cntk_kernel_env(str(venv)) == {"LD_LIBRARY_PATH": str(compat), "CUDA_CACHE_MAXSIZE": str(4 << 30)}


def test_cntk_post_create_reports_a_failing_import(tmp_path, libdir):
    for name in ("libmpi.so.40", "libmpi_cxx.so.40"):
        (libdir / name).write_text("")
    venv = fake_venv(tmp_path, 'echo "ImportError: libpython3.6m.so.1.0: cannot open shared object file" >&2\n'
                               'exit 1\n')
    with pytest.raises(EnvError, match="import cntk fails .*libpython3.6m.so.1.0: cannot open"):
        definitions.cntk_post_create(str(venv))


def test_failed_post_create_leaves_no_ready_environment(tmp_path, monkeypatch):
    """The environment is stamped only after its post-create hook succeeded, so the next run rebuilds it."""
    monkeypatch.setattr(framework_envs, "ENVS_DIR", str(tmp_path))
    monkeypatch.setattr(framework_envs, "python_version", lambda python: "3.6.15")

    def create(path, req, base, stamp, log, pip="pip", wheelhouse=None):
        os.makedirs(os.path.join(path, "bin"))
        open(os.path.join(path, "bin", "python"), "w").close()
        with open(os.path.join(path, STAMP), "w") as f:
            json.dump(stamp, f)
        assert pip == "pip==21.3.1"

    def broken(venv):
        raise EnvError("import cntk fails")

    monkeypatch.setattr(framework_envs, "create_venv", create)
    env = definitions.ENVS["cntk"]
    monkeypatch.setattr(env, "needs", lambda: None)
    monkeypatch.setattr(env, "post_create", broken)
    python = str(tmp_path / "python3.6")
    open(python, "w").close()
    with pytest.raises(EnvError, match="import cntk fails"):
        framework_envs.ensure(env, "cpu", python)
    assert read_stamp(framework_envs.env_path(env, "cpu", python)) == {}
    assert framework_envs.status(env, "cpu", python) == "outdated"


def test_cntk_environment_needs_python_36(tmp_path, monkeypatch):
    env = definitions.ENVS["cntk"]
    monkeypatch.setattr(env, "needs", lambda: None)
    monkeypatch.setattr(framework_envs, "python_version", lambda python: "3.11.7")
    python = str(tmp_path / "python3")
    open(python, "w").close()
    with pytest.raises(EnvError, match=r"CNTK 2.7 needs Python 3.6; .* is Python 3.11.7"):
        framework_envs.ensure(env, "cpu", python)
    with pytest.raises(EnvError, match="--cntk-python"):
        framework_envs.ensure(env, "cpu", None)


@pytest.mark.parametrize("cc, how", [(None, None), ("3.0", "sass"), ("6.0", "sass"), ("7.0", "sass"), ("7.5", "sass"),
                                     ("8.0", "jit"), ("8.6", "jit"), ("9.0", "jit"), ("12.0", "jit")])
def test_cntk_runs_natively_up_to_turing_and_through_ptx_jit_beyond(cc, how):
    """Read from the cntk-gpu 2.7.post2 wheel (runner/envs/gpu_preflight.py): SASS up to sm_70 (which runs on 7.x
    GPUs, Turing included) and PTX for compute_70, which the driver compiles for any newer GPU."""
    decision = gpu_preflight.decide("cntk", {"name": "GPU", "driver": "580.65.06", "compute_capability": cc or ""})
    assert decision.runs and decision.build.name == "cu100" and decision.how == how


def test_cntk_below_its_oldest_code_or_driver_is_refused():
    kepler = gpu_preflight.decide("cntk", {"name": "GPU", "driver": "470.256.02", "compute_capability": "2.1"})
    assert not kepler.runs and "sm_21" in kepler.reason
    old = gpu_preflight.decide("cntk", {"name": "GPU", "driver": "396.26", "compute_capability": "7.0"})
    assert not old.runs and "needs NVIDIA driver >= 410.48" in old.reason


def test_cntk_precisions():
    unsupported = targets.TARGETS["cntk"].unsupported_gpu_precisions
    assert "fp32" not in unsupported
    for precision in ("tf32", "bf16"):
        assert "fp32 only" in unsupported[precision]


def test_pins_are_python_36_wheels():
    for device, wheel in (("cpu", "cntk==2.7.post2"), ("cuda", "cntk-gpu==2.7.post2")):
        with open(definitions.ENVS["cntk"].requirements(device)) as f:
            pins = [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]
        assert wheel in pins and "numpy==1.19.5" in pins and "dataclasses==0.8" in pins


# ---- what the notebook receives ----------------------------------------------------------------------
def notebook(name):
    with open(os.path.join(ROOT, "notebooks", name)) as f:
        return json.load(f)


def test_notebook_declares_every_parameter_run_all_passes():
    cntk = targets.TARGETS["cntk"]
    opts = execute.RunOptions(SMOKE, "fp32", 0, "cpu", "/tmp/results")
    passed = execute.notebook_parameters(cntk, opts, "/tmp/results/.staging/x.json")
    declared = parameters(cntk.notebook)
    assert set(passed) <= set(declared), set(passed) - set(declared)
    assert declared["target"] == "cntk" and declared["precision"] == "fp32" and declared["fused_rnn"] is None
    assert passed["target"] == "cntk" and passed["preset"] == "smoke" and passed["batch_size"] == 8


def test_notebook_has_the_reference_sections():
    def tags(nb):      # the steps in order; a step may span consecutive cells (CNTK's model: two)
        out = []
        for t in (t for c in nb["cells"] for t in c.get("metadata", {}).get("tags", []) if t.startswith("rosetta:")):
            if not out or out[-1] != t:
                out.append(t)
        return out
    mine, reference = notebook("CNTK_DS2.ipynb"), notebook("PyTorch_DS2.ipynb")
    assert tags(mine) == tags(reference)
    assert all(not c.get("outputs") and not c.get("execution_count") for c in mine["cells"] if c["cell_type"] == "code")


def test_common_is_python_36_syntax():
    """CNTK's kernel imports common/ under Python 3.6."""
    directory = os.path.join(ROOT, "common")
    for name in sorted(os.listdir(directory)):
        if name.endswith(".py"):
            with open(os.path.join(directory, name)) as f:
                source = f.read()
            ast.parse(source, name, feature_version=(3, 6))
            assert "from __future__ import annotations" not in source, name
