import dataclasses

import pytest

from common.spec import (DEEPMARK_SCALE, FULL_MODEL, LABEL_LENGTHS, LENGTH_SHARE_PERCENT, LOSS_RTOL, PRECISIONS,
                         PRESETS, DS2Config, check_precision, get_preset)


def test_full_model_parameter_count_is_canonical():
    assert FULL_MODEL.param_count == 92244637
    assert FULL_MODEL.extra_rnn_biases == 24640


def test_parameter_count_is_derived_from_the_config():
    # one more bd layer adds BN(1760) x2 + W, U, b for two directions
    bigger = dataclasses.replace(FULL_MODEL, rnn_layers=8)
    h = 1760
    assert bigger.param_count - FULL_MODEL.param_count == 2 * h + 2 * (h * h + h * h + h)


def test_derived_shapes_of_the_full_model():
    c = FULL_MODEL
    assert (c.freq_after_conv1, c.freq_after_conv2) == (79, 75)
    assert c.rnn_input_width == 2400
    assert c.time_stride == 4
    for frames in range(100, 1501, 100):
        assert c.time_after_conv1(frames) == frames // 2
        assert c.output_length(frames) == frames // 4


def test_flops_per_audio_second():
    assert FULL_MODEL.forward_flops_per_audio_second == pytest.approx(4.82e9, rel=2e-3)
    assert FULL_MODEL.train_flops_per_audio_second == pytest.approx(14.5e9, rel=3e-3)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        FULL_MODEL.rnn_hidden = 10


def test_presets_follow_the_spec():
    assert set(PRESETS) == {"deepmark", "quick", "smoke", "cpu"}
    assert get_preset("cpu").config == FULL_MODEL and (get_preset("cpu").scale, get_preset("cpu").batch_size) == (1, 8)
    assert get_preset("deepmark").config == FULL_MODEL and get_preset("deepmark").scale == DEEPMARK_SCALE
    assert get_preset("quick").config == FULL_MODEL and get_preset("quick").scale == 64
    smoke = get_preset("smoke").config
    assert (smoke.rnn_hidden, smoke.conv_channels, smoke.rnn_layers) == (32, 4, 2)
    assert get_preset("smoke").scale == 1
    # same structure: everything but the widths and depth is the full model's
    same = dataclasses.replace(smoke, rnn_hidden=1760, fc_hidden=1760, conv_channels=32, rnn_layers=7)
    assert same == FULL_MODEL


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown preset 'huge'.*deepmark, quick, smoke"):
        get_preset("huge")


@pytest.mark.parametrize("batch_size", [0, -3, 2.5, True, "8"])
def test_bad_batch_size_is_refused(batch_size):
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        get_preset("smoke").with_overrides(batch_size=batch_size)


def test_overrides():
    p = get_preset("quick").with_overrides(batch_size=16, scale=2)
    assert (p.batch_size, p.scale, p.config) == (16, 2, FULL_MODEL)
    with pytest.raises(ValueError, match="scale must be a positive integer"):
        get_preset("quick").with_overrides(scale=0)


def test_precisions():
    assert PRECISIONS == ("fp32", "tf32", "bf16")
    assert LOSS_RTOL["fp32"] == 1e-4
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        check_precision("fp8")


def test_tables():
    assert sum(LENGTH_SHARE_PERCENT) == 100
    assert len(LENGTH_SHARE_PERCENT) == len(LABEL_LENGTHS) == 15
    # every label fits the output length T/4 = 25 steps per second, with room for repeated
    # symbols (CTC needs a blank between two equal labels; 1 in 28 neighbours repeat)
    for seconds, label_length in zip(range(1, 16), LABEL_LENGTHS):
        assert label_length * 1.2 < FULL_MODEL.output_length(100 * seconds)


def test_config_round_trips_through_a_dict():
    assert DS2Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in FULL_MODEL.to_dict().items()}) \
        == FULL_MODEL
