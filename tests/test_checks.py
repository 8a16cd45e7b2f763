import math

import pytest

from common.checks import CheckFailed, check_checksum, check_loss, check_param_count
from common.spec import FULL_MODEL, SMOKE_MODEL


def test_loss_check_passes_within_tolerance():
    r = check_loss(65.0001, 65.0, "fp32")
    assert r["ok"] and r["rel_diff"] == pytest.approx(1e-4 / 65, rel=1e-3) and r["rtol"] == 1e-4


@pytest.mark.parametrize("value", [65.1, math.nan, math.inf, -65.0])
def test_loss_check_fails_loudly(value):
    with pytest.raises(CheckFailed, match="first-loss check failed"):
        check_loss(value, 65.0, "fp32")


def test_loss_tolerance_follows_precision():
    assert check_loss(65.3, 65.0, "tf32")["ok"]
    with pytest.raises(CheckFailed):
        check_loss(65.3, 65.0, "fp32")


def test_param_count_check():
    assert check_param_count(92244637, FULL_MODEL, two_rnn_biases=False)["ok"]
    r = check_param_count(92244637 + 24640, FULL_MODEL, two_rnn_biases=True)
    assert r["ok"] and r["extra_rnn_biases"] == 24640
    with pytest.raises(CheckFailed, match="expected 92269277"):
        check_param_count(92244637, FULL_MODEL, two_rnn_biases=True)
    with pytest.raises(CheckFailed):
        check_param_count(SMOKE_MODEL.param_count + 1, SMOKE_MODEL, two_rnn_biases=False)


def test_checksum_check():
    assert check_checksum("ab", "ab")["ok"]
    with pytest.raises(CheckFailed, match="checksum"):
        check_checksum(None, "ab")
