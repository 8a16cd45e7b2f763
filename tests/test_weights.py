import numpy as np
import pytest

from common.spec import FULL_MODEL, SMOKE_MODEL
from common.weights import canonical_weights, count, load_weights, param_count, save_weights


@pytest.fixture(scope="module")
def full():
    return canonical_weights(FULL_MODEL, seed=0)


def test_param_count():
    assert param_count(FULL_MODEL) == 92244637
    assert count(canonical_weights(SMOKE_MODEL)) == param_count(SMOKE_MODEL)


def test_names_and_shapes_of_the_spec(full):
    expect = {
        "conv1.weight": (32, 1, 5, 20), "conv2.weight": (32, 32, 5, 10),
        "conv1.bn.gamma": (32,), "conv2.bn.beta": (32,),
        "bd1.bn.gamma": (2400,), "bd1.fwd.W": (1760, 2400), "bd1.bwd.U": (1760, 1760), "bd1.fwd.b": (1760,),
        "bd7.bn.beta": (1760,), "bd7.bwd.W": (1760, 1760),
        "fc.bn.gamma": (1760,), "fc.W": (1760, 1760), "fc.b": (1760,), "out.W": (29, 1760), "out.b": (29,),
    }
    for name, shape in expect.items():
        assert full[name].shape == shape, name
    assert "bd8.fwd.W" not in full
    assert len(full) == 6 + 7 * 8 + 6
    assert count(full) == 92244637
    assert all(a.dtype == np.float32 for a in full.values())


def test_init(full):
    for name, fan_in in [("conv1.weight", 100), ("conv2.weight", 32 * 50), ("bd1.fwd.W", 2400),
                         ("bd3.bwd.U", 1760), ("fc.W", 1760), ("out.W", 1760)]:
        a = full[name]
        bound = 1 / np.sqrt(fan_in)
        assert np.abs(a).max() <= bound * (1 + 1e-6), name
        assert np.abs(a).max() > 0.95 * bound, name                       # uniform over the whole range
        assert abs(float(a.mean())) < 0.05 * bound, name
    for name, a in full.items():
        if name.endswith(".gamma"):
            assert np.all(a == 1), name
        elif name.endswith((".beta", ".b")):
            assert np.all(a == 0), name


def test_seeded():
    a, b, c = (canonical_weights(SMOKE_MODEL, seed=s) for s in (1, 1, 2))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["bd1.fwd.W"], c["bd1.fwd.W"])


def test_npz_round_trip(tmp_path):
    w = canonical_weights(SMOKE_MODEL, seed=3)
    path = str(tmp_path / "w.npz")
    save_weights(path, w)
    back = load_weights(path)
    assert list(back) == list(w)
    assert all(np.array_equal(back[k], w[k]) and back[k].dtype == w[k].dtype for k in w)
    assert not list(tmp_path.glob("*.partial"))


def test_canonical_state_adds_running_statistics():
    from common.weights import canonical_state
    state = canonical_state(SMOKE_MODEL, seed=0)
    assert set(state) == set(SMOKE_MODEL.state_shapes())
    assert set(state) - set(SMOKE_MODEL.param_shapes()) == {n + s for n in SMOKE_MODEL.bn_names() for s in (".mean", ".var")}
    assert np.all(state["bd1.bn.mean"] == 0) and np.all(state["fc.bn.var"] == 1)
    assert state["bd1.bn.var"].shape == (SMOKE_MODEL.rnn_input_width,)
    assert count({k: v for k, v in state.items() if k in SMOKE_MODEL.param_shapes()}) == param_count(SMOKE_MODEL)


@pytest.mark.parametrize("damage, message", [
    ("missing_file", "does not exist"),
    ("garbage", "is not a NumPy .npz archive"),
    ("drop", "lacks conv1.weight"),
    ("extra", "has bd9.fwd.W, which is not a canonical name"),
    ("shape", "another preset's widths"),
    ("dtype", "is float64, the canonical format is float32"),
])
def test_load_state_refuses_a_mismatched_file_in_one_line(tmp_path, damage, message):
    import dataclasses
    from common.weights import WeightsError, canonical_state, load_state
    state = canonical_state(SMOKE_MODEL, seed=0)
    config = SMOKE_MODEL
    path = str(tmp_path / "w.npz")
    if damage == "drop":
        del state["conv1.weight"]
    elif damage == "extra":
        state["bd9.fwd.W"] = state["bd1.fwd.W"]
    elif damage == "shape":
        config = dataclasses.replace(SMOKE_MODEL, rnn_hidden=16, fc_hidden=16)
    elif damage == "dtype":
        state["out.b"] = state["out.b"].astype(np.float64)
    if damage == "garbage":
        with open(path, "wb") as f:
            f.write(b"not a zip file")
    elif damage != "missing_file":
        save_weights(path, state)
    with pytest.raises(WeightsError) as err:
        load_state(path, config)
    assert message in str(err.value) and path in str(err.value) and "\n" not in str(err.value)


def test_load_state_round_trip(tmp_path):
    from common.weights import canonical_state, load_state
    state = canonical_state(SMOKE_MODEL, seed=1)
    path = str(tmp_path / "w.npz")
    save_weights(path, state)
    back = load_state(path, SMOKE_MODEL)
    assert set(back) == set(state) and all(np.array_equal(back[k], state[k]) for k in state)
