"""Prefill/decode disaggregation (bench/model/pd/disagg.py): the properties the issue asks for, checked over random
shapes and workloads, and what the model answers for the published configurations."""

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bench.model import interconnect
from bench.model.pd import disagg
from bench.model.pd import search as pd_search
from bench.model.serving.slo import Slo

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODELS = st.sampled_from(["kimi-k2-thinking", "deepseek-v3", "glm-4.6"])
GPUS = st.sampled_from(["h200", "h100-sxm"])


def shape_of(model, gpu, decode_nodes, kv):
    per = 8
    return disagg.Shape(model, gpu, per, per * decode_nodes, kv)


@SETTINGS
@given(MODELS, GPUS, st.sampled_from([1, 2, 4, 8]), st.sampled_from(["bf16", "fp8_e4m3"]),
       st.integers(100, 30000), st.integers(8, 4000), st.floats(0.02, 0.3))
def test_a_decode_rank_never_holds_more_kv_than_its_pool(model, gpu, nodes, kv, prompt, output, tpot):
    shape = shape_of(model, gpu, nodes, kv)
    ln = disagg.Lengths(prompt, 0, output, prompt + output)
    a = disagg.evaluate(shape, ln, Slo(tpot_s=tpot), 10.0)
    pool = disagg.decode_pool(shape)
    if a.serves:
        assert a.batch_per_rank >= 1
        assert a.batch_per_rank * (prompt + output) <= pool.tokens_per_rank
        assert a.kv_tokens_per_rank <= a.kv_pool_per_rank == pool.tokens_per_rank
        assert a.batch_per_rank <= pool.max_running_per_rank
    elif pool.fits and pool.tokens_per_rank >= prompt + output:
        assert a.rejected_because  # every refusal says why


@SETTINGS
@given(st.integers(1, 8), st.integers(1, 16), st.integers(500, 20000), st.integers(16, 2000))
def test_more_decode_instances_never_lower_predicted_decode_throughput(p, d, prompt, output):
    shape = disagg.Shape("kimi-k2-thinking", "h200", 8, 16)
    a = disagg.evaluate(shape, disagg.Lengths(prompt, 0, output, prompt + output), Slo(tpot_s=0.1), 10.0)
    assume(a.serves)
    rates = [a.served(p, k)[1] for k in range(d, d + 4)]
    assert all(x <= y for x, y in zip(rates, rates[1:], strict=False))
    # and the instance counts for a higher target never shrink
    more = disagg.evaluate(shape, a.lengths, Slo(tpot_s=0.1), 40.0)
    assert more.decode_instances >= a.decode_instances and more.prefill_instances >= a.prefill_instances


@SETTINGS
@given(MODELS, GPUS, st.sampled_from([1, 2]), st.integers(2000, 16000), st.integers(16, 256), st.floats(0.03, 0.2))
def test_with_free_transfer_pd_is_not_worse_than_colocated_on_a_prefill_heavy_load(model, gpu, nodes, prompt,
                                                                                      output, tpot):
    """No transfer or router cost, and PD's own nature (no interference): its GPUs per request/s at the ideal
    P:D ratio are no more than one colocated instance's of the same size, time-sharing both phases."""
    g = 8 * nodes
    shape = disagg.Shape(model, gpu, g, g, "fp8_e4m3")
    ln = disagg.Lengths(prompt, 0, output, prompt + output)
    slo = Slo(tpot_s=tpot)
    rate, share = pd_search.colocated_rps(shape, ln, slo)
    assume(rate > 0)
    pd = disagg.evaluate(shape, ln, slo, 10.0, transfer=False)
    assert pd.serves
    assert pd.gpus_per_rps <= g / rate * (1 + 1e-9)
    assert pd.transfer_s == 0


def test_transfer_costs_what_the_nic_moves():
    shape = disagg.Shape("kimi-k2-thinking", "h200", 8, 8, "fp8_e4m3")
    ln = disagg.Lengths(32000, 0, 500, 32500)
    a = disagg.evaluate(shape, ln, Slo(ttft_s=30, tpot_s=0.1), 1.0)
    b = disagg.evaluate(shape, ln, Slo(ttft_s=30, tpot_s=0.1), 1.0, transfer=False)
    # MLA latent, FP8: (512 + 64) * 61 bytes a token
    assert disagg.kv_bytes(shape, 1) == 576 * 61
    assert a.transfer_s == pytest.approx(32000 * 576 * 61 / (50e9 * 0.8) + 1e-3)
    assert a.ttft_s >= b.ttft_s - 1e-9 and b.transfer_s == 0  # both at the TTFT bound when the prefill binds


def test_deepep_low_latency_reproduces_its_own_table():
    """Bytes / the published bandwidth gives the published latency at DeepEP's own conditions (H800 links)."""
    t = interconnect.facts()["deepep"]["low_latency"]
    for ep, us in t["dispatch_us"].items():
        bytes_ = 128 * 8 * 7168
        assert bytes_ / (t["dispatch_gbps"][ep] * 1e9) * 1e6 == pytest.approx(us, rel=0.08)


def test_wider_ep_costs_more_all_to_all_past_one_node():
    from bench.model import catalog

    g = catalog.gpu("h200")
    one = interconnect.all_to_all_s(g, 8, 128, 7168, 8, "low_latency")
    many = [interconnect.all_to_all_s(g, ep, 128, 7168, 8, "low_latency") for ep in (16, 32, 64, 128)]
    assert one < many[0] and many == sorted(many)
    assert interconnect.all_to_all_s(g, 1, 128, 7168, 8, "normal") == 0


def test_eplb_redundant_experts_match_the_published_counts():
    assert disagg.redundant_experts(256, 72) == 32  # LMSYS: 256 + 32 = 288 on 72 GPUs
    assert disagg.redundant_experts(384, 96) == 96  # Mooncake: 96 redundant experts on 96 decode GPUs
    # and they cost KV: the pool with EPLB is smaller
    with_eplb = disagg.decode_pool(disagg.Shape("kimi-k2-thinking", "h200", 8, 32))
    without = disagg.decode_pool(disagg.Shape("kimi-k2-thinking", "h200", 8, 32, eplb=False))
    assert with_eplb.tokens_per_rank < without.tokens_per_rank


def test_a_shape_that_cannot_hold_the_longest_request_is_refused_with_why():
    shape = disagg.Shape("kimi-k2-thinking", "h100-sxm", 16, 16, "bf16")
    a = disagg.evaluate(shape, disagg.Lengths(1000, 0, 100, 10_000_000), Slo(tpot_s=0.1), 1.0)
    assert not a.serves and "longest request" in a.rejected_because
    assert a.monthly_cost is None and a.usd_per_m_output is None and math.isinf(a.gpus_per_rps)


def test_non_power_of_two_wide_ep_is_a_deployment_only_with_dp_and_ep_over_all_gpus():
    from bench.errors import BadInput
    from bench.model import Deployment, catalog

    Deployment(catalog.model("deepseek-v3"), catalog.gpu("h100-sxm"), 72, 72, ep=72)
    with pytest.raises(BadInput):
        Deployment(catalog.model("deepseek-v3"), catalog.gpu("h100-sxm"), 72, 1, ep=72)
