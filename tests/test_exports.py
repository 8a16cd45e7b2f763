"""common/exports.py: where an export goes and the checks section 11 of every notebook runs."""
import json
import os

import numpy as np
import pytest

from common import exports, reference
from common.checks import CheckFailed
from common.data import DeepMarkIterator
from common.spec import get_preset
from common.weights import canonical_state, load_state, save_weights

P = get_preset("smoke")
CFG = P.config


@pytest.fixture(scope="module")
def batch():
    return DeepMarkIterator(P.batch_size, P.scale, 0, n_freq=CFG.n_freq, n_classes=CFG.n_classes).batch(0)


@pytest.fixture(scope="module")
def state():
    s = canonical_state(CFG, 0)
    rng = np.random.RandomState(1)     # running statistics that are not the initial 0 / 1
    for name in CFG.running_stat_shapes():
        s[name] = (rng.uniform(-0.1, 0.1, s[name].shape) if name.endswith(".mean")
                   else rng.uniform(0.5, 2.0, s[name].shape)).astype(np.float32)
    return s


def test_export_paths_sit_beside_the_records(tmp_path):
    paths = exports.export_paths(str(tmp_path / "results" / "records" / "pytorch_smoke_fp32_bs8_cpu.json"))
    assert paths["weights"] == str(tmp_path / "results" / "weights" / "pytorch_smoke_fp32_bs8_cpu.npz")
    assert paths["logits"].endswith("pytorch_smoke_fp32_bs8_cpu.logits.npy")
    assert os.path.isdir(tmp_path / "results" / "weights")


def test_inference_check_passes_the_reference_and_fails_a_perturbed_model(state, batch):
    logits = reference.forward(state, batch.features, CFG, training=False).astype(np.float32)
    ok = exports.inference_check(logits, state, batch, CFG, "fp32")
    assert ok["ok"] and ok["logits_max_rel"] < 1e-6 and ok["loss_rel_diff"] < 1e-6
    # training-mode logits are not inference-mode logits: the check must see the difference
    train_logits = reference.forward(state, batch.features, CFG, training=True)
    with pytest.raises(CheckFailed, match="inference-mode check failed"):
        exports.inference_check(train_logits, state, batch, CFG, "fp32")
    # the running variance stored biased instead of unbiased (n/(n-1)) is caught at fp32
    biased = dict(state, **{"fc.bn.var": state["fc.bn.var"] * 0.99})
    with pytest.raises(CheckFailed):
        exports.inference_check(logits, biased, batch, CFG, "fp32")
    with pytest.raises(CheckFailed, match="shape"):
        exports.inference_check(logits[:, :1], state, batch, CFG, "fp32")


def test_train_loss_and_native_checks(state, batch, tmp_path):
    ref = reference.ds2_loss(state, batch.features, batch.labels, CFG)
    assert exports.train_loss_check(ref * (1 + 1e-6), state, batch, CFG, "fp32")["ok"]
    with pytest.raises(CheckFailed, match="training-mode loss"):
        exports.train_loss_check(ref * 1.01, state, batch, CFG, "fp32")
    logits = np.ones((3, 2, 29), np.float32)
    path = tmp_path / "m.pt"
    path.write_bytes(b"x")
    assert exports.native_check("torch.save(state_dict)", str(path), logits, logits)["ok"]
    with pytest.raises(CheckFailed, match="reloads with different logits"):
        exports.native_check("torch.save(state_dict)", str(path), logits, logits + 1e-3)


def test_export_section_round_trips_through_load_state(state, batch, tmp_path):
    paths = exports.export_paths(str(tmp_path / "records" / "x.json"))
    save_weights(paths["weights"], state)
    logits = reference.forward(state, batch.features, CFG, training=False)
    section = exports.export_section(paths, state, exports.inference_check(logits, state, batch, CFG, "fp32"))
    assert section["tensors"] == len(CFG.state_shapes()) and len(section["sha256"]) == 64
    assert set(load_state(paths["weights"], CFG)) == set(state)
    exports.write_export_info(paths, section)
    with open(paths["info"]) as f:
        assert json.load(f)["inference"]["ok"] is True


def test_fp64_is_a_control_precision_not_a_benchmark_one():
    from common.spec import check_precision
    with pytest.raises(ValueError):
        check_precision("fp64")
    assert check_precision("fp64", control=True) == "fp64"
