import io
import math

import pytest

from common.data import DeepMarkIterator
from common.timing import BenchmarkTimer


class FakeDevice:
    """A clock that a fake step advances by a known cost: 2 ms per second of audio + 1 ms."""

    def __init__(self):
        self.now = 0.0
        self.synced = 0

    def clock(self):
        return self.now

    def step(self, batch):
        self.now += 1e-3 + 2e-3 * batch.audio_seconds
        return 10.0 / (1 + batch.index)   # a "loss" tensor

    def forward(self, batch):
        self.now += 1e-3 * batch.seconds
        return "logits"

    def sync(self, out):
        self.synced += 1


def run(it, device):
    timer = BenchmarkTimer(sync=device.sync, clock=device.clock)
    timer.warmup(device.step, it.warmup_batches())
    timer.epoch(device.step, it, out=io.StringIO())
    timer.forward(device.forward, it.one_batch_per_length(), repeats=3)
    return timer


def test_protocol_numbers_are_consistent():
    it = DeepMarkIterator(batch_size=8, scale=1, seed=0)
    dev = FakeDevice()
    timer = run(it, dev)
    s = timer.summary(projected_scale=1280)
    t, losses = s["timing"], s["losses"]
    assert t["warmup_steps"] == len(it.shapes()) == len(losses["warmup"])
    assert t["warmup_s"] == pytest.approx(sum(1e-3 + 2e-3 * b.audio_seconds for b in it.warmup_batches()))
    assert t["steps"] == len(it) and t["utterances"] == 100 and t["audio_seconds"] == 594
    assert t["train_s"] == pytest.approx(len(it) * 1e-3 + 2e-3 * 594)
    assert t["audio_s_per_s"] == pytest.approx(t["audio_seconds"] / t["train_s"])
    assert t["utterances_per_s"] == pytest.approx(100 / t["train_s"])
    assert t["step_ms_median"] <= t["step_ms_p90"]
    # per length: 2 s utterances come as batches of 8 and 2 -> 1 + 2*16 = 33 ms and 1 + 2*4 = 9 ms
    two = t["per_length"]["2"]
    assert (two["steps"], two["utterances"]) == (2, 10)
    assert two["mean_ms"] == pytest.approx(21.0) and two["forward_ms"] == pytest.approx(2.0)
    assert t["forward_ms"]["15"] == pytest.approx(15.0)
    # projection: time per utterance of each length x its full-epoch count
    projected = sum(p["train_s"] / p["utterances"] * 1280 * share for p, share in
                    zip(t["per_length"].values(), [3, 10, 11, 13, 14, 13, 9, 8, 5, 4, 3, 2, 2, 2, 1]))
    assert t["projected_epoch_s"] == pytest.approx(projected)
    assert losses["first"] == losses["train"][0] == 10.0 and losses["last"] == losses["train"][-1]
    # every timed call was synchronised: warm-up + pass + 3 repeats x 15 lengths
    assert dev.synced == len(it.shapes()) + len(it) + 45


def test_sync_happens_inside_the_timed_region():
    it = DeepMarkIterator(batch_size=8, scale=1, seed=0)
    dev = FakeDevice()

    def slow_sync(out):       # the device finishes only when synchronised: that time must count
        dev.now += 0.5
    timer = BenchmarkTimer(sync=slow_sync, clock=dev.clock)
    timer.epoch(dev.step, it, out=io.StringIO())
    assert timer.train_s >= 0.5 * len(it)
    assert min(s.step_s for s in timer.steps) >= 0.5


def test_non_finite_loss_stops_the_run():
    it = DeepMarkIterator(batch_size=8, scale=1, seed=0)
    timer = BenchmarkTimer(sync=lambda out: None)
    with pytest.raises(FloatingPointError, match="loss is nan"):
        timer.epoch(lambda b: math.nan, it, out=io.StringIO())


def test_partial_pass_is_not_projected():
    it = DeepMarkIterator(batch_size=8, scale=1, seed=0)
    dev = FakeDevice()
    timer = BenchmarkTimer(sync=dev.sync, clock=dev.clock)
    timer.epoch(dev.step, list(it)[:3], out=io.StringIO())
    assert timer.summary()["timing"]["projected_epoch_s"] is None


def test_summary_needs_a_pass_and_repeats_must_be_positive():
    timer = BenchmarkTimer(sync=lambda out: None)
    with pytest.raises(RuntimeError, match="no timed pass"):
        timer.summary()
    with pytest.raises(ValueError, match="repeats"):
        timer.forward(lambda b: None, [], repeats=0)


def test_progress_lines():
    it = DeepMarkIterator(batch_size=8, scale=1, seed=0)
    dev = FakeDevice()
    out = io.StringIO()
    BenchmarkTimer(sync=dev.sync, clock=dev.clock).epoch(dev.step, it, out=out, log_every=10)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("step 10/21") and lines[-1].startswith("step 21/21")
    assert "s of audio per second" in lines[-1]


def test_training_peak_memory_is_taken_when_the_timed_pass_ends(monkeypatch):
    """The record's memory.host_peak_rss_training_bytes: the process's peak RSS read once, when the timed pass
    ends, before the forward timing, the peak measurement, the export and a profile can add to it."""
    import common.timing
    peaks = iter([5 << 30, 9 << 30])                   # what ru_maxrss says at each reading
    monkeypatch.setattr(common.timing, "host_peak_rss_bytes", lambda: next(peaks))
    it = DeepMarkIterator(batch_size=8, scale=1, seed=0)
    timer = run(it, FakeDevice())                      # warm-up, timed pass, forward timing
    assert timer.training_peak_rss == 5 << 30          # read at the end of the pass, and only there
    assert next(peaks) == 9 << 30


def test_forward_without_a_budget_times_every_length_repeats_times():
    it = DeepMarkIterator(batch_size=8, scale=1, seed=0)
    timer = run(it, FakeDevice())
    t = timer.summary()["timing"]
    assert t["forward_budget_s"] is None and t["forward_repeats"] == 3
    assert t["forward_counts"] == {str(s): 3 for s in range(1, 16)}


def test_forward_budget_times_each_length_once_then_stops():
    """A budget bounds the forward timing by time: the first round over the lengths always runs whole (here it
    alone outlasts the budget: 1 + 2 + ... + 15 = 120 ms of fake forward passes against 50 ms), then nothing."""
    it = DeepMarkIterator(batch_size=8, scale=1, seed=0)
    dev = FakeDevice()
    timer = BenchmarkTimer(sync=dev.sync, clock=dev.clock)
    ms = timer.forward(dev.forward, it.one_batch_per_length(), repeats=3, budget_s=0.05)
    assert list(ms) == list(range(1, 16)) and ms[15] == pytest.approx(15.0)
    assert dict(timer.forward_counts) == {s: 1 for s in range(1, 16)} and dev.synced == 15
    assert timer.forward_repeats == 3 and timer.forward_budget_s == 0.05


def test_forward_budget_goes_round_the_lengths_until_it_is_spent():
    """After the first round a timing starts only while the budget lasts: with 128 ms, the second round stops
    after the 1-4 s lengths (120 + 1 + 2 + 3 = 126 ms before the 4 s one starts, 130 after it); a generous
    budget gives every length `repeats`."""
    it = DeepMarkIterator(batch_size=8, scale=1, seed=0)
    dev = FakeDevice()
    timer = BenchmarkTimer(sync=dev.sync, clock=dev.clock)
    timer.forward(dev.forward, it.one_batch_per_length(), repeats=3, budget_s=0.128)
    assert dict(timer.forward_counts) == {s: 2 if s <= 4 else 1 for s in range(1, 16)}
    dev = FakeDevice()
    timer = BenchmarkTimer(sync=dev.sync, clock=dev.clock)
    timer.forward(dev.forward, it.one_batch_per_length(), repeats=3, budget_s=10.0)
    assert set(timer.forward_counts.values()) == {3} and dev.synced == 45


@pytest.mark.parametrize("budget", [-1.0, float("nan"), float("inf"), "5", True])
def test_forward_budget_must_be_seconds(budget):
    with pytest.raises(ValueError, match="budget_s"):
        BenchmarkTimer(sync=lambda out: None).forward(lambda b: None, [], budget_s=budget)
