"""FLOP accounting (computed from DS2Config, checked against counts written out by hand here), the
matmul-peak harness, the CPU's theoretical peak and the profile reducer."""
import pytest

from common import envinfo, flops
from common.data import DeepMarkIterator, epoch_audio_seconds
from common.profile import time_shares
from common.spec import DEEPMARK_SCALE, FULL_MODEL, SMOKE_MODEL, get_preset


def by_hand_full(t):
    """SPEC.md section 8, written out: forward MACs of one utterance of t frames, full model."""
    return (32 * 79 * (t // 2) * (5 * 20) + 32 * 75 * (t // 4) * (32 * 5 * 10)
            + 2 * (t // 4) * (2400 * 1760 + 1760 ** 2) + 6 * 2 * (t // 4) * (2 * 1760 ** 2)
            + (t // 4) * 1760 ** 2 + (t // 4) * 1760 * 29)


def by_hand_smoke(t):
    """The smoke model (4 conv filters, 2 bd layers, hidden 32): 4 x 75 = 300 RNN inputs."""
    return (4 * 79 * (t // 2) * (5 * 20) + 4 * 75 * (t // 4) * (4 * 5 * 10)
            + 2 * (t // 4) * (300 * 32 + 32 ** 2) + 2 * (t // 4) * (2 * 32 ** 2)
            + (t // 4) * 32 ** 2 + (t // 4) * 32 * 29)


@pytest.mark.parametrize("frames", [100, 800, 1500])
def test_forward_macs_equal_the_count_by_hand(frames):
    assert FULL_MODEL.forward_macs(frames) == by_hand_full(frames)
    assert SMOKE_MODEL.forward_macs(frames) == by_hand_smoke(frames)
    layers = SMOKE_MODEL.forward_macs_by_layer(frames)
    assert list(layers) == ["conv1", "conv2", "bd1.input", "bd1.recurrent", "bd2.input", "bd2.recurrent", "fc", "out"]
    assert layers["bd1.input"] == 2 * (frames // 4) * 300 * 32


def test_training_flops_per_audio_second_and_per_epoch():
    assert FULL_MODEL.train_flops(100) == 6 * by_hand_full(100) == pytest.approx(14.47e9, rel=1e-3)
    it = DeepMarkIterator(batch_size=32, scale=DEEPMARK_SCALE, seed=0)
    total = flops.pass_flops(FULL_MODEL, (it.batch(i) for i in range(len(it))))["total"]
    assert total == pytest.approx(14.47e9 * epoch_audio_seconds(DEEPMARK_SCALE), rel=1e-3)
    assert total == pytest.approx(1.10e16, rel=5e-3)


def test_pass_flops_of_the_smoke_iterator_per_length():
    it = DeepMarkIterator(batch_size=8, scale=1, seed=0)
    counted = flops.pass_flops(SMOKE_MODEL, it)
    assert list(counted["per_length"]) == [str(s) for s in range(1, 16)]
    share = [3, 10, 11, 13, 14, 13, 9, 8, 5, 4, 3, 2, 2, 2, 1]
    for s, n in zip(range(1, 16), share):
        assert counted["per_length"][str(s)] == 6 * by_hand_smoke(100 * s) * n
    assert counted["total"] == sum(counted["per_length"].values())


def test_matmul_shapes_are_the_models():
    shapes = flops.matmul_shapes(FULL_MODEL, batch_size=8, square=4096)
    assert shapes == {"square": (4096, 4096, 4096), "input": (200 * 8, 2400, 1760), "recurrent": (8, 1760, 1760)}
    assert get_preset("cpu").config == FULL_MODEL and get_preset("cpu").forward_repeats == 1


class FakeClock:
    """Each product takes 0.01 s; a sync costs nothing."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_measure_matmul_peak_times_enough_products_and_takes_the_median():
    clock = FakeClock()

    def make(m, k, n):
        def run():
            clock.now += 0.01
            return "result"
        return run

    synced = []
    peak = flops.measure_matmul_peak(make, synced.append, {"square": (100, 100, 100)}, repeats=3, min_time_s=0.2,
                                     clock=clock)
    assert peak["square"]["iterations"] in (20, 21) and peak["square"]["repeats"] == 3   # 0.2 / 0.01, rounded
    assert peak["square"]["flops_per_s"] == pytest.approx(2e6 / 0.01)
    assert synced == ["result"] * 7          # warm-up, 3 calibrations, 3 measurements: every one synchronised
    with pytest.raises(ValueError, match="repeats"):
        flops.measure_matmul_peak(make, synced.append, {}, repeats=0)


def test_one_slow_calibration_product_does_not_shorten_the_measurements():
    """The iterations per measurement come from the fastest calibration product: a first one 30 times slower (a page
    fault, a core stalled by its CPU quota) would otherwise make every measurement a single product."""
    clock = FakeClock()
    calls = []

    def make(m, k, n):
        def run():
            calls.append(1)
            clock.now += 0.3 if len(calls) == 2 else 0.01    # the warm-up, then a first calibration stalled past
                                                             # min_time_s (a throttled or busy core)
            return "result"
        return run

    peak = flops.measure_matmul_peak(make, lambda r: None, {"square": (100, 100, 100)}, repeats=3, min_time_s=0.2,
                                     clock=clock)
    assert peak["square"]["iterations"] in (20, 21)   # the slow one alone: 4
    assert peak["square"]["flops_per_s"] == pytest.approx(2e6 / 0.01)


def test_a_product_too_slow_for_the_budget_is_measured_fewer_times():
    """bf16 products on a CPU without bf16 instructions take seconds each: as many measurements as fit in the
    budget (at least one), and the entry says how many."""
    clock = FakeClock()

    def make(m, k, n):
        def run():
            clock.now += 0.9 if m == 1000 else 0.01
            return "result"
        return run

    synced = []
    peak = flops.measure_matmul_peak(make, synced.append, {"square": (1000, 1000, 1000), "small": (10, 10, 10)},
                                     repeats=5, min_time_s=0.2, clock=clock, budget_s=2.0)
    assert peak["square"]["iterations"] == 1 and peak["square"]["repeats"] == 2
    assert peak["square"]["flops_per_s"] == pytest.approx(2e9 / 0.9)
    assert peak["small"]["repeats"] == 5 and peak["small"]["iterations"] in (20, 21)   # 5 x 0.2 s fit: all 5
    assert len(synced) == (3 + 2) + (4 + 5)            # warm-up and calibrations (two of 0.9 s fill half the
                                                       # budget), then each measurement
    slower = flops.measure_matmul_peak(make, synced.append, {"square": (1000, 1000, 1000)}, repeats=5, clock=clock,
                                       budget_s=0.5)
    assert slower["square"]["repeats"] == 1


def test_flops_section_efficiency():
    class Step:
        def __init__(self, seconds, batch_size, step_s):
            self.seconds, self.batch_size, self.step_s = seconds, batch_size, step_s

    steps = [Step(1, 8, 0.5), Step(2, 4, 0.5)]
    peak = {"square": {"flops_per_s": 4e9}}
    sec = flops.flops_section(SMOKE_MODEL, steps, 1.0, peak)
    expected = 6 * (by_hand_smoke(100) * 8 + by_hand_smoke(200) * 4)
    assert sec["train"] == expected and sec["achieved_per_s"] == expected
    assert sec["efficiency"] == pytest.approx(expected / 4e9)
    assert sec["per_length"]["1"]["achieved_per_s"] == pytest.approx(6 * by_hand_smoke(100) * 8 / 0.5)
    assert flops.flops_section(SMOKE_MODEL, steps, 1.0, None)["efficiency"] is None


def test_sequential_share_and_shape_roofline():
    # two of the recurrent product's three training products wait for the previous time step
    t = 800
    assert flops.sequential_share(SMOKE_MODEL, t) == pytest.approx(2 / 3 * 4 * (t // 4) * 32 ** 2 / by_hand_smoke(t))
    assert flops.sequential_share(FULL_MODEL) == pytest.approx(2 / 3 * 14 * 200 * 1760 ** 2 / by_hand_full(800))
    assert flops.sequential_share(FULL_MODEL) == pytest.approx(0.2997, abs=1e-4)
    s = flops.sequential_share(FULL_MODEL)
    peak = {"square": {"flops_per_s": 300e9}, "input": {"flops_per_s": 250e9}, "recurrent": {"flops_per_s": 60e9}}
    roof = flops.shape_roofline(FULL_MODEL, peak)
    assert roof == pytest.approx(1 / (s / 60e9 + (1 - s) / 300e9))
    assert 60e9 < roof < 300e9
    peak["input"]["flops_per_s"] = 400e9                 # the larger of square and input carries the rest
    assert flops.shape_roofline(FULL_MODEL, peak) == pytest.approx(1 / (s / 60e9 + (1 - s) / 400e9))
    assert flops.shape_roofline(FULL_MODEL, {"square": {"flops_per_s": 300e9}}) is None
    assert flops.shape_roofline(FULL_MODEL, None) is None


def test_cpu_theoretical_peak_states_its_basis(monkeypatch):
    monkeypatch.setattr(envinfo, "cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.setattr(envinfo, "cpu_clock_hz", lambda: 3e9)
    monkeypatch.setattr(envinfo, "cpu_count", lambda: 2)
    peak = envinfo.cpu_theoretical_peak("fp32")
    assert peak["flops_per_s"] == 2 * 2 * 8 * 2 * 3e9 and peak["label"] == "theoretical"
    assert "AVX2" in peak["basis"] and envinfo.cpu_theoretical_peak("tf32") is None
    monkeypatch.setattr(envinfo, "cpu_flags", lambda: {"avx512f", "fma", "avx2", "amx_bf16"})
    assert envinfo.cpu_theoretical_peak("bf16")["flops_per_s"] == 2 * 1024 * 3e9


def test_time_shares():
    events = [("aten::convolution", 1.0), ("aten::rnn_relu", 2.0), ("aten::ctc_loss", 0.5), ("misc", 0.5)]
    rules = [("convolution", r"conv"), ("rnn", r"rnn"), ("ctc", r"ctc")]
    prof = time_shares(events, rules, tool="test", step_s=4.2)
    assert prof["seconds"]["rnn"] == 2.0 and prof["shares"]["convolution"] == pytest.approx(0.25)
    assert prof["largest_other"] == [["misc", 0.5]] and sum(prof["shares"].values()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown profile category"):
        time_shares(events, [("gpu", "x")], tool="t")
