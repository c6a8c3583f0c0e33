"""The generation deadline: the earlier of Lambda's remaining time and the API deadline counted
from when API Gateway received the request, less the margin."""
from __future__ import annotations

import pytest

from function.deadline import compute
from function.settings import FunctionSettings


class Ctx:
    def __init__(self, ms):
        self.ms = ms

    def get_remaining_time_in_millis(self):
        return self.ms


def test_lambda_remaining_time_wins_when_shorter():
    d = compute(Ctx(5000), None, 100.0, now_mono=100.0, now_wall=1000.0)
    assert d.source == "lambda" and abs(d.at - (100.0 + 5.0 - 0.5)) < 1e-9


def test_api_deadline_counts_from_api_gateway_receipt():
    # the request reached API Gateway 3 s ago (a cold start): 10 - 3 - 0.5 left
    d = compute(Ctx(900_000), 997_000, 100.0, api_deadline_s=10.0, now_mono=100.0, now_wall=1000.0)
    assert d.source == "api" and abs(d.at - (100.0 + 7.0 - 0.5)) < 1e-6


def test_untrusted_timestamps_fall_back_to_handler_start():
    for epoch_ms in (500_000, 2_000_000):             # 500 s old / in the future
        d = compute(Ctx(900_000), epoch_ms, 100.0, api_deadline_s=10.0, now_mono=101.0, now_wall=1000.0)
        assert abs(d.at - (100.0 + 10.0 - 0.5)) < 1e-9


def test_default_and_margin_from_the_environment():
    s = FunctionSettings.from_env({"DEADLINE_MARGIN_S": "1"})
    d = compute(None, None, 0.0, api_deadline_s=s.api_deadline_s, margin_s=s.deadline_margin_s,
                now_mono=0.0, now_wall=0.0)
    assert d.at == 27.0 and d.source == "api"


@pytest.mark.parametrize("bad", ["garbage", "0", "-3"])
def test_an_invalid_api_deadline_is_an_error_naming_the_variable(bad):
    with pytest.raises(ValueError, match=r"API_DEADLINE_S=.* is invalid: set it to a number > 0"):
        FunctionSettings.from_env({"API_DEADLINE_S": bad})
