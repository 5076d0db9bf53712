"""A disaggregated deployment in virtual time (bench/model/pd/simulate.py), which a PD twin's campaign prediction
uses: at low load its TTFT is the prefill, the KV transfer and the router; it delivers what it is offered below
saturation; the built-in pd-demo campaign names a 16-GPU disaggregated twin and predicts it with this."""

import math

import pytest

from bench.campaign import load_campaign
from bench.model import interconnect, workload
from bench.model.pd import disagg
from bench.model.pd import simulate as pd_simulate


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


def test_p_prefill_and_d_decode_instances_each_take_their_share_of_the_load():
    """2P:2D at twice the rate is 1P:1D at the rate, twice over (the router deals requests in turn, so each
    instance's arrivals are smoother than Poisson: latencies no worse); 3 prefill instances take a load past one
    prefill instance's capacity with TTFT back near its idle value."""
    shape = disagg.Shape("kimi-k2-thinking", "h200", 8, 8, "fp8_e4m3")
    wl = workload.fixed_workload(4000, 100)
    one = pd_simulate.run(shape, wl, 2.0, 100, min_seconds=60)
    two = pd_simulate.run(shape, wl, 4.0, 100, min_seconds=60, instances=(2, 2))
    assert two.rejected == 0 and two.output_tok_s == pytest.approx(2 * one.output_tok_s, rel=0.15)
    assert two.ttft_p50 <= one.ttft_p50 * 1.1 and two.tpot_p50 == pytest.approx(one.tpot_p50, rel=0.25)
    assert two.usd_per_million == pytest.approx(one.usd_per_million, rel=0.15)  # twice the GPUs, twice the tokens
    heavy = workload.fixed_workload(8000, 50)
    idle = pd_simulate.run(shape, heavy, 0.5, 100, min_seconds=60)
    over, three = (pd_simulate.run(shape, heavy, 8.0, 100, min_seconds=60, instances=(p, 1)) for p in (1, 3))
    assert over.ttft_p90 > 10 * idle.ttft_p90 and three.ttft_p90 < 3 * idle.ttft_p90


def test_a_replay_window_shorter_than_an_answer_still_counts_the_tokens_made_in_it():
    """A 3-second stage of a twin at time_scale 2 (7.5 s of virtual time with its warm-up) ends before any of its
    1000-token answers does: the tokens made inside the window are still counted (they were 0)."""
    shape = disagg.Shape("kimi-k2-thinking", "h200", 8, 8, "fp8_e4m3")
    p = pd_simulate.run(shape, workload.fixed_workload(8000, 1000), 1.0, 8, min_seconds=7.5)
    assert p.e2e_p50 > 7.5 and p.output_tok_s > 0
