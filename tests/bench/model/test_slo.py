"""One SLO, written once, read the same by goodput (per request) and by the rate search (percentiles)."""

import pytest

from bench.errors import BadInput
from bench.model import Slo, parse_slo
from bench.model.serving.simulate import Point


def point(**p) -> Point:
    base = dict(rate=1.0, achieved_rps=1.0, output_tok_s=1.0, ttft_p50=0.5, ttft_p90=1.0, ttft_p99=3.0,
                tpot_p50=0.02, tpot_p90=0.04, tpot_p99=0.08, e2e_p50=5.0, e2e_p90=10.0, e2e_p99=40.0,
                cache_hit_rate=0.0, mean_running=1.0, retractions=0, rejected=0, usd_per_million=1.0)
    return Point(**{**base, **p})


def test_the_syntax_in_any_order_with_units():
    s = parse_slo("e2e=30s,p=99,tpot=50ms,ttft=2")
    assert s == Slo(ttft_s=2.0, tpot_s=0.05, e2e_s=30.0, percentile=99)
    assert parse_slo(s.text()) == s
    assert parse_slo("ttft=1.5s") == Slo(ttft_s=1.5)  # unset bounds stay unset; p defaults to 90
    assert parse_slo(None) == parse_slo("") == Slo() and not Slo().bounded


@pytest.mark.parametrize("bad", ["ttft=fast", "tpot=1,p=95", "x=1", "ttft", "ttft=0s", "tpot=-5ms", "p=ninety"])
def test_bad_slo_is_one_clear_error(bad):
    with pytest.raises(BadInput, match="SLO|slo|duration"):
        parse_slo(bad)


def test_a_request_meets_it_when_every_set_bound_holds():
    s = parse_slo("ttft=2s,tpot=50ms,e2e=30s")
    assert s.met_by_request(1.9, 0.049, 29.0)
    assert not s.met_by_request(2.1, 0.01, 1.0)
    assert not s.met_by_request(1.0, 0.051, 1.0)
    assert not s.met_by_request(1.0, 0.01, 31.0)
    assert s.met_by_request(1.0, None, 1.0)  # a one-token answer has no TPOT
    assert parse_slo("ttft=2s").met_by_request(1.0, 9.9, 999.0)


def test_a_load_meets_it_at_its_percentile():
    s = parse_slo("ttft=2s,tpot=50ms")
    assert s.met(point()) and not parse_slo("ttft=2s,tpot=50ms,p=99").met(point())
    assert not parse_slo("ttft=2s,tpot=50ms,e2e=20s,p=99").met(point(ttft_p99=1.0, tpot_p99=0.04))
    assert parse_slo("e2e=20s").met(point()) and not parse_slo("e2e=9s").met(point())


def test_scaled_for_a_faster_twin():
    assert parse_slo("ttft=2s,tpot=40ms,p=99").scaled(4) == Slo(ttft_s=0.5, tpot_s=0.01, percentile=99)
