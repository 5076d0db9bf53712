"""The disaggregated answer's interval (bench/model/pd/interval.py): each role's rate band is the colocated one
stretched to hold every published PD case of its phase, and the answer's GPUs, $ and latencies follow from it."""

import math
from functools import cache
from types import SimpleNamespace

import pytest

from bench.model import Plan, Question, interval, parse_slo
from bench.model.pd import interval as pd_interval
from bench.model.pd import versus as pd_versus
from bench.report import pd as pd_report


@cache
def _versus() -> pd_versus.Versus:
    q = Question(model="kimi-k2-thinking", gpu="h200", tp=8, kv_dtype="fp8_e4m3", workload="chat",
                 slo=parse_slo("ttft=2s,tpot=50ms,p=90"), target_rate_rps=10.0)
    return pd_versus.compare(Plan(q, [], 0), max_nodes=2)  # the PD side alone


def test_each_role_band_holds_every_published_pd_case_and_the_colocated_band():
    d = _versus().disaggregated
    bands = pd_interval.role_bands(d)
    res = pd_interval.residuals()
    assert len(res["prefill"]) >= 4 and len(res["decode"]) >= 2
    for phase, (lo, hi) in bands.items():
        assert lo < 1 < hi
        assert all(math.log(lo) <= r <= math.log(hi) for r in res[phase]), (phase, res[phase], lo, hi)
    tps = interval.band("output_tok_s", interval.regime(d.shape.model, d.shape.gpu, d.shape.weights,
                                                        d.batch_per_rank))
    assert bands["decode"][0] <= tps.low and bands["decode"][1] >= tps.high


def test_the_answer_lies_inside_its_interval_and_the_pessimistic_end_buys_more():
    v = _versus()
    d, iv = v.disaggregated, v.interval
    assert iv is not None and "not calibrated" in iv["method"]
    lo, hi = iv["gpus_needed"]
    assert lo <= d.gpus_needed <= hi and hi > lo
    assert iv["monthly_cost"][0] <= d.monthly_cost <= iv["monthly_cost"][1]
    assert iv["monthly_cost"][1] == pytest.approx(hi * d.price * interval.HOURS_PER_MONTH)
    assert iv["usd_per_m_output"][0] <= d.usd_per_m_output <= iv["usd_per_m_output"][1]
    for key, point in (("ttft_s", d.ttft_s), ("tpot_s", d.tpot_s), ("prefill_rps", d.prefill_rps),
                       ("decode_rps", d.decode_rps)):
        assert iv[key][0] < point < iv[key][1], key
    assert v.to_json()["disaggregated_interval"] is iv


def test_the_plan_says_the_bounds_and_that_they_are_not_calibrated():
    v = _versus()
    lines = pd_report.versus_lines(v)
    said = [x for x in lines if x.startswith("Disaggregated, optimistic to pessimistic end")]
    assert len(said) == 1 and f"({v.interval['gpus_needed'][0]}-{v.interval['gpus_needed'][1]} GPUs)" in said[0]
    assert any("too few to calibrate" in x for x in lines)
    row = next(r for r in pd_report.versus_rows(v) if r[""] == "disaggregated")
    assert row["$ / month, interval"].endswith("(not calibrated)")


def test_overlapping_monthly_costs_are_said_not_to_decide():
    def colocated(lo: float, hi: float) -> SimpleNamespace:
        return SimpleNamespace(interval=lambda: {"monthly_cost": (lo, hi)})

    pd = {"monthly_cost": (100_000.0, 200_000.0)}
    assert "does not decide" in pd_versus._overlap(colocated(150_000, 300_000), pd)[0]
    assert "do not overlap" in pd_versus._overlap(colocated(20_000, 90_000), pd)[0]
    assert pd_versus._overlap(None, pd) == [] and pd_versus._overlap(colocated(1, 2), None) == []
