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
