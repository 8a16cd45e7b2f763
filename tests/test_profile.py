"""common/profile.py: the trace arithmetic the notebooks share (own times of nested events, a compiled XLA
program's operations mapped back to the framework operations) and the reduction to categories."""
import pytest

from common.profile import CATEGORIES, hlo_op_names, jax_trace_events, self_times, time_shares, xspace_events


def test_self_times_subtract_nested_events_once():
    events = [("loop", 0, 100), ("body1", 10, 30), ("dot", 15, 10), ("body2", 50, 40), ("after", 100, 5)]
    own = dict(self_times(events, per_second=1))
    assert own == {"loop": 30, "body1": 20, "dot": 10, "body2": 40, "after": 5}
    assert sum(own.values()) == 105                      # the timeline's extent: nothing counted twice
    assert dict(self_times([("a", 0, 2e12)], per_second=1e12)) == {"a": 2.0}


def test_self_times_of_equal_starts_nest_the_longer_outside():
    own = self_times([("inner", 0, 4), ("outer", 0, 10)], per_second=1)
    assert dict(own) == {"outer": 6, "inner": 4}


HLO = """HloModule jit_train_step

%fused_computation (p0: f32[8,32]) -> f32[8,32] {
  %p0 = f32[8,32]{1,0} parameter(0)
  ROOT %maximum.1 = f32[8,32]{1,0} maximum(f32[8,32]{1,0} %p0, f32[8,32]{1,0} %p0), metadata={op_name="jit(train_step)/bd1/max"}
}

%body (p: (s32[], f32[8,32])) -> (s32[], f32[8,32]) {
  %p = (s32[], f32[8,32]{1,0}) parameter(0)
  %dot.3 = f32[8,32]{1,0} dot(f32[8,32]{1,0} %x, f32[32,32]{1,0} %u), metadata={op_name="jit(train_step)/bd1/dot_general"}
  ROOT %tuple = (s32[], f32[8,32]{1,0}) tuple(%i, %dot.3)
}

ENTRY %main.9 (a: f32[8,32]) -> f32[8,32] {
  %a = f32[8,32]{1,0} parameter(0)
  %fusion.2 = f32[8,32]{1,0} fusion(f32[8,32]{1,0} %a), kind=kLoop, calls=%fused_computation
  %while.4 = (s32[], f32[8,32]{1,0}) while(%t), condition=%cond, body=%body
  ROOT %conv.5 = f32[8,32]{1,0} convolution(%a, %a), metadata={op_name="jit(train_step)/conv1/conv_general_dilated"}
}
"""


def test_hlo_op_names_follow_metadata_and_called_computations():
    names = hlo_op_names(HLO)
    assert names["dot.3"] == "jit(train_step)/bd1/dot_general"
    assert names["conv.5"] == "jit(train_step)/conv1/conv_general_dilated"
    assert names["fusion.2"] == "jit(train_step)/bd1/max"        # a fusion: its computation's root
    assert names["while.4"] == "jit(train_step)/bd1/dot_general"  # a loop: its body's first named operation
    assert names["a"] == ""                                       # nothing to go by


HLO_UNNAMED = """HloModule jit_step

%inner (q: f32[8]) -> f32[8] {
  %q = f32[8]{0} parameter(0)
  ROOT %exp.1 = f32[8]{0} exponential(f32[8]{0} %q), metadata={op_name="jit(step)/ctc/exp"}
}

%outer (r: f32[8]) -> f32[8] {
  %r = f32[8]{0} parameter(0)
  ROOT %call.2 = f32[8]{0} call(f32[8]{0} %r), to_apply=%inner
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %ynn_fusion.7 = f32[8]{0} fusion(f32[8]{0} %a), kind=kCustom, calls=%outer
  %mul.3 = f32[8]{0} multiply(f32[8]{0} %a, f32[8]{0} %a), metadata={op_name="jit(step)/bd1_bn/mul"}
  %copy.9 = f32[8]{0} copy(f32[8]{0} %mul.3)
  ROOT %custom = f32[8]{0} custom-call(f32[8]{0} %a), called_computations={%inner}
}
"""


def test_hlo_op_names_for_operations_a_compiler_pass_left_unnamed():
    names = hlo_op_names(HLO_UNNAMED)
    assert names["ynn_fusion.7"] == "jit(step)/ctc/exp"      # its computation names nothing: what that one calls
    assert names["copy.9"] == "jit(step)/bd1_bn/mul"         # a copy: the operation whose value it moves
    assert names["custom"] == "jit(step)/ctc/exp"            # called_computations
    assert names["a"] == ""


def test_time_shares_first_matching_rule_wins_and_other_lists_the_rest():
    events = [("bd1_bn/x", 1.0), ("bd1/MatMul", 3.0), ("conv1/Conv2D", 2.0), ("reshape", 4.0)]
    p = time_shares(events, [("batchnorm", r"_bn/"), ("rnn", r"bd\d"), ("convolution", r"conv")], tool="t",
                    step_s=11.0)
    assert list(p["seconds"]) == list(CATEGORIES)
    assert p["seconds"]["batchnorm"] == 1.0 and p["seconds"]["rnn"] == 3.0 and p["seconds"]["other"] == 4.0
    assert p["shares"]["other"] == pytest.approx(0.4) and p["profiled_s"] == 10.0
    assert p["largest_other"] == [["reshape", 4.0]]
    with pytest.raises(ValueError, match="unknown profile category 'gru'"):
        time_shares(events, [("gru", "x")], tool="t")


def _ns(**kw):
    from types import SimpleNamespace
    return SimpleNamespace(**kw)


def test_jax_trace_events_name_each_xla_operation_by_its_origin_and_prefer_the_device():
    ev = lambda op, start, dur: _ns(stats=[("hlo_op", op)], start_ns=start, duration_ns=dur)
    host = _ns(name="/host:CPU", lines=[_ns(name="thunks", events=[ev("while.4", 0, 100), ev("dot.3", 10, 60)]),
                                        _ns(name="python", events=[_ns(stats=[], start_ns=0, duration_ns=5)])])
    names = {"while.4": "jit(step)/bd1/while", "dot.3": "jit(step)/bd1/dot_general"}
    assert dict(jax_trace_events([host], names)) == pytest.approx(
        {"while.4 jit(step)/bd1/while": 40e-9, "dot.3 jit(step)/bd1/dot_general": 60e-9})
    device = _ns(name="/device:GPU:0", lines=[_ns(name="XLA Ops", events=[ev("fusion.1", 0, 7)]),
                                              _ns(name="Streams", events=[ev("fusion.1", 0, 7)])])
    assert jax_trace_events([host, device], names) == [("fusion.1 ", 7e-9)]   # the device's ops only, once


def test_xspace_events_read_cpu_kernels_by_own_time_and_name_gpu_kernels_by_their_op():
    meta = {1: _ns(name="bd1/MatMul:MatMul"), 2: _ns(name="bd1/while:While"), 3: _ns(name="Executor::Run"),
            4: _ns(name="volta_sgemm")}
    ev = lambda m, off, dur, stats=(): _ns(metadata_id=m, offset_ps=off, duration_ps=dur, stats=list(stats))
    cpu = _ns(name="/host:CPU", event_metadata=meta, stat_metadata={},
              lines=[_ns(name="tf_Compute/1", events=[ev(2, 0, 10e12), ev(1, 2e12, 3e12), ev(3, 20e12, 1e12)]),
                     _ns(name="python", events=[ev(1, 0, 9e12)])])
    assert dict(xspace_events(_ns(planes=[cpu]), False, 99.0)) == {"bd1/while:While": 7.0, "bd1/MatMul:MatMul": 3.0}
    gpu = _ns(name="/device:GPU:0", event_metadata=meta, stat_metadata={7: _ns(name="tf_op")},
              lines=[_ns(name="stream", events=[ev(4, 0, 2e12, [_ns(metadata_id=7, str_value="bd1/MatMul")])])])
    assert xspace_events(_ns(planes=[cpu, gpu]), True, 99.0) == [("bd1/MatMul volta_sgemm", 2.0)]
    xla = _ns(name="/host:CPU", event_metadata=meta, stat_metadata={}, lines=[_ns(name="python", events=[])])
    assert xspace_events(_ns(planes=[xla]), False, 1.5) == [
        ("XLA program (the whole step; the trace holds no per-kernel events)", 1.5)]
