"""The plan behind the Planner and the report: simulated rates that meet the SLO, and the arithmetic of GPUs and
cost on top of them."""

from __future__ import annotations

import math

from bench.model import simulate
from bench.model.plan import FIDELITY, Question, make_plan, search_rate


def test_search_rate_finds_a_rate_that_meets_the_slo_and_a_higher_one_that_does_not():
    q = Question(model="glm-4.6", gpu="h200", tp=8, kv_dtype="fp8_e4m3", workload="chat")
    dep, wl = q.deployment(), q.request_mix()
    p = search_rate(dep, wl, q.slo, "quick")
    assert p.rate_rps > 0 and p.limited_by in ("TTFT p90", "TPOT p90")
    n, seconds, _ = FIDELITY["quick"]
    at_best = simulate.run(dep, wl, p.rate_rps, n, min_seconds=seconds)
    assert q.slo.met(at_best) and at_best.output_tok_s == p.output_tps
    assert not q.slo.met(simulate.run(dep, wl, p.rate_rps * 1.5, n, min_seconds=seconds))


def test_plan_options_gpus_and_cost():
    q = Question(model="kimi-k2-thinking", gpu="h200", tp=8, kv_dtype="fp8_e4m3", weights="int4-g32",
                 workload="chat", target_rate_rps=25.0, price_per_gpu_hour=2.0)
    plan = make_plan(q)
    assert len(plan.options) == 4  # int4-g32 is what Kimi K2 Thinking ships: the same option as native
    assert [o.label for o in plan.options if o.chosen] == ["int4-g32 experts (native), fp8_e4m3 KV"]
    for o in plan.options:
        p = o.prediction
        assert o.instances_needed == math.ceil(25.0 / p.rate_rps)
        assert o.gpus_needed == 8 * o.instances_needed
        assert o.monthly_cost == o.gpus_needed * 2.0 * 730
        assert math.isclose(o.usd_per_m_output, 2.0 / 3600 * 8 / p.output_tps * 1e6)
    assert plan.recommended.gpus_needed == min(o.gpus_needed for o in plan.options)
    fp8_kv = {o.weights: o.capacity.kv_pool_tokens for o in plan.options if o.kv_dtype == "fp8_e4m3"}
    bf16_kv = {o.weights: o.capacity.kv_pool_tokens for o in plan.options if o.kv_dtype == "bf16"}
    assert all(abs(fp8_kv[w] - 2 * bf16_kv[w]) <= 2 for w in fp8_kv)
