"""A disaggregated deployment in virtual time (bench/model/pd_simulate.py), which a PD twin's campaign prediction
uses: at low load its TTFT is the prefill, the KV transfer and the router; it delivers what it is offered below
saturation; the built-in pd-demo campaign names a 16-GPU disaggregated twin and predicts it with this."""

import math

import pytest

from bench.campaign import load_campaign
from bench.model import disagg, interconnect, pd_simulate, workload


def test_low_load_ttft_is_prefill_plus_transfer_plus_router_and_throughput_follows_the_offer():
    shape = disagg.Shape("kimi-k2-thinking", "h200", 8, 8, "fp8_e4m3")
    wl = workload.fixed_workload(4000, 100)
    p = pd_simulate.run(shape, wl, 0.5, 100, min_seconds=120)
    prefill = disagg.PDPerfModel(shape, "prefill")
    transfer = interconnect.kv_transfer_s(prefill.dep.gpu, disagg.kv_bytes(shape, 4000))
    pairs = 4000 * 4001 / 2  # a lone request prefills on one DP-attention group of the prefill instance
    alone = prefill.step_time(0, 0, 4000, pairs, 4000, busiest=(4000, pairs)) + transfer + 1e-3
    assert p.rejected == 0 and p.retractions == 0
    assert p.ttft_p50 == pytest.approx(alone, rel=0.1)
    assert p.output_tok_s == pytest.approx(0.5 * 100, rel=0.25)
    assert p.tpot_p50 < 0.05


def test_past_the_prefill_instances_capacity_ttft_grows_without_bound():
    shape = disagg.Shape("kimi-k2-thinking", "h200", 8, 8, "fp8_e4m3")
    wl = workload.fixed_workload(8000, 50)
    low, high = (pd_simulate.run(shape, wl, r, 100, min_seconds=60) for r in (0.5, 20.0))
    assert high.ttft_p90 > 10 * low.ttft_p90
    assert math.isfinite(high.output_tok_s) and high.output_tok_s < 20.0 * 50


def test_the_pd_demo_campaign_names_a_disaggregated_twin():
    c = load_campaign("pd-demo")
    pd = c.deployment("disaggregated")
    assert pd.gpus == 16 and pd.pd_shape() == disagg.Shape("kimi-k2-thinking", "h200", 8, 8, "fp8_e4m3")
    assert c.deployment("colocated").pd_shape() is None and c.deployment("colocated").gpus == 8
