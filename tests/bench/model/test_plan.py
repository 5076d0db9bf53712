"""The plan behind `capbench plan`, the Planner and the report: the converged rate within the SLO, the search over
deployments, and the arithmetic of GPUs and cost on top."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from bench.model import Question, catalog, formats, load_workload, make_plan, rate, simulate
from bench.model.advice.option import HOURS_PER_MONTH


def test_search_rate_converges_and_is_the_highest_rate_within_the_slo():
    q = Question(model="glm-4.6", gpu="h200", tp=8, kv_dtype="fp8_e4m3", workload="chat")
    dep, wl = q.deployment(), q.request_mix()
    p = rate.search_rate(dep, wl, q.slo)
    assert p.rate_rps > 0 and p.limited_by in ("TTFT p90", "TPOT p90") and p.converged
    # doubling the horizon once more moves the answer by under 5 %
    again = rate._search(dep, wl, q.slo, rate.load_efficiency(dep.gpu.id), 2 * rate.START_REQUESTS * p.horizon_s /
                         rate.START_HORIZON_S, 2 * p.horizon_s, p.rate_rps, lambda: None)
    assert again.rate_rps == pytest.approx(p.rate_rps, rel=0.05)
    n, h = int(rate.START_REQUESTS * p.horizon_s / rate.START_HORIZON_S), p.horizon_s
    at_best = simulate.run(dep, wl, p.rate_rps, n, min_seconds=h)
    assert q.slo.met(at_best) and at_best.output_tok_s == p.output_tps
    assert not q.slo.met(simulate.run(dep, wl, p.rate_rps * 1.5, n, min_seconds=h))
    assert rate.search_rate(dep, wl, q.slo) == p  # cached: the same answer, asked again


def test_a_concurrency_cap_lowers_the_rate_and_its_wait_counts_in_ttft():
    q = Question(model="glm-4.6", gpu="h200", tp=8, kv_dtype="fp8_e4m3", workload="chat", max_concurrency=16)
    dep, wl = q.deployment(), q.request_mix()
    free, capped = rate.search_rate(dep, wl, q.slo), rate.search_rate(dep, wl, q.slo, cap=16)
    assert 0 < capped.rate_rps < free.rate_rps and capped.batch <= 16
    n = int(rate.START_REQUESTS * capped.horizon_s / rate.START_HORIZON_S)
    above = simulate.run(dep, wl, capped.rate_rps * 1.5, n, min_seconds=capped.horizon_s, concurrency=16)
    assert above.slot_wait_p90 > 0 and not q.slo.met(rate.waited(above, q.slo))
    assert "at most 16 requests in flight to each instance" in q.describe_cap()
    assert rate.search_rate(dep, wl, q.slo, cap=16) == capped and rate._key(dep, wl, q.slo, rate.load_efficiency(
        "h200"), 16) != rate._key(dep, wl, q.slo, rate.load_efficiency("h200"))


def test_no_rate_meets_an_slo_the_prompt_alone_breaks():
    q = Question(model="glm-4.6", gpu="h200", tp=8, workload="long-context")
    p = rate.search_rate(q.deployment(), load_workload("long-context"), replace(q.slo, ttft_s=0.5))
    assert p.rate_rps == 0 and p.limited_by.startswith("TTFT") and p.converged


@pytest.fixture(scope="module")
def kimi_plan():
    q = Question(model="kimi-k2-thinking", gpu="h200", tp=8, kv_dtype="fp8_e4m3", weights="native",
                 workload="chat", target_rate_rps=25.0, price_per_gpu_hour=2.0, search_gpus=("h200",))
    return make_plan(q, workers=2)


def test_the_search_sizes_everything_and_says_why_each_lost(kimi_plan):
    plan = kimi_plan
    tps = {o.config.tp for o in plan.options}
    assert tps == {1, 2, 4, 8, 16}  # tp within a node and across two
    assert {(o.config.dp > 1, o.config.ep > 1) for o in plan.options if o.config.tp == 8} == {
        (False, False), (True, False), (False, True), (True, True)}
    small = [o for o in plan.options if o.config.tp <= 4]
    assert small and all(o.rejected_because.startswith("the weights do not fit") for o in small)
    assert all(o.rejected_because or o.recommended or o.simulated for o in plan.options)
    assert plan.chosen.simulated  # your configuration is always simulated


def test_option_arithmetic(kimi_plan):
    for o in kimi_plan.simulated:
        if not o.serves:
            continue
        p = o.prediction
        assert o.instances_needed == math.ceil(25.0 / p.rate_rps - 1e-9)
        assert o.gpus_needed == o.tp * o.instances_needed
        assert o.monthly_cost == o.gpus_needed * 2.0 * HOURS_PER_MONTH
        assert math.isclose(o.usd_per_m_output, 2.0 / 3600 * o.tp / p.output_tps * 1e6)
    rec = kimi_plan.recommended
    assert rec.monthly_cost == min(o.monthly_cost for o in kimi_plan.simulated if o.serves)


def test_the_recommendation_meets_the_slo_at_the_target_load_and_not_at_1_5x_per_instance(kimi_plan):
    q, rec = kimi_plan.question, kimi_plan.recommended
    dep, wl = rec.config.deployment(q.model), q.request_mix()
    h = rec.prediction.horizon_s
    n = int(rate.START_REQUESTS * h / rate.START_HORIZON_S)
    per_instance = q.target_rate_rps / rec.instances_needed
    assert q.slo.met(simulate.run(dep, wl, per_instance, n, min_seconds=h))
    assert not q.slo.met(simulate.run(dep, wl, 1.5 * rec.prediction.rate_rps, n, min_seconds=h))


def test_fp8_kv_never_holds_fewer_long_sequences(kimi_plan):
    by = {(o.config.tp, o.config.dp, o.config.ep, o.weights): {} for o in kimi_plan.options}
    for o in kimi_plan.options:
        by[(o.config.tp, o.config.dp, o.config.ep, o.weights)][o.kv_dtype] = o.capacity
    for caps in by.values():
        if len(caps) == 2 and caps["bf16"].fits:
            fp8, bf16 = caps["fp8_e4m3"], caps["bf16"]
            assert fp8.max_concurrent_sequences_at_context >= bf16.max_concurrent_sequences_at_context
            # each DP rank's pool rounds down to a whole page (FP8 MLA on Hopper runs flashmla: pages of 64)
            slack = 2 * fp8.dp * max(fp8.page_size, bf16.page_size)
            assert abs(fp8.kv_pool_tokens_total - 2 * bf16.kv_pool_tokens_total) <= slack


def test_pareto_fronts_hold_only_undominated_options(kimi_plan):
    serving = [o for o in kimi_plan.simulated if o.serves]
    front = [o for o in serving if o.pareto]
    assert front
    for o in front:
        assert not any(x.output_tps_per_gpu > o.output_tps_per_gpu and x.prediction.tps_per_user >
                       o.prediction.tps_per_user for x in serving)


def test_four_way_is_one_parallelism(kimi_plan):
    four = kimi_plan.four_way()
    assert len({(o.config.gpu, o.config.tp, o.config.dp, o.config.ep) for o in four}) == 1
    # the expert formats H200 serves Kimi K2 Thinking in that fit this parallelism, at both KV dtypes
    searched = set(formats.searched(catalog.model("kimi-k2-thinking"), catalog.gpu("h200")))
    assert {o.kv_dtype for o in four} == {"bf16", "fp8_e4m3"}
    assert {"native"} < {o.weights for o in four} <= searched
    assert four[0].kv_dtype == "bf16" and four[0].weights == "native"


def test_a_recommendation_whose_rate_did_not_converge_says_so_in_its_risks(kimi_plan):
    """The headline (the CLI's first screen, the Planner's and the report's) names a rate the search did not settle
    on: doubling the simulated arrivals still moved it by more than 5 %."""
    from bench.model.answer import make_headline

    rec = kimi_plan.recommended
    assert rec.prediction.converged
    assert not any("not converged" in r for r in make_headline(kimi_plan).risks)
    kept = rec.prediction
    try:
        rec.prediction = replace(kept, converged=False, change=0.11, horizon_s=960.0)
        said = [r for r in make_headline(kimi_plan).risks if "not converged" in r]
        assert said == ["its rate within the SLO moved 11% when the simulated arrivals last doubled (to 960 s): not "
                        "converged, so measure it before buying"]
    finally:
        rec.prediction = kept
