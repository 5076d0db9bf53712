"""The Planner page: each input moves the figures it should, and the figures are the plan's own."""

from __future__ import annotations

from bench.model import Question, capacity, catalog, make_plan
from tests.dashboard.apptest import metric, no_exception, page


def test_planner_shows_the_plan_and_follows_its_inputs():
    at = page("planner")
    no_exception(at)
    assert len(at.get("vega_lite_chart")) == 6
    # the defaults are Kimi K2 Thinking, 8 x H200, FP8 KV, native weights, chat, 10 req/s
    dep = capacity.Deployment(catalog.model("kimi-k2-thinking"), catalog.gpu("h200"), 8, kv_dtype="fp8_e4m3")
    assert metric(at, "KV pool tokens") == capacity.capacity(dep).kv_pool_tokens
    plan = make_plan(Question(model="kimi-k2-thinking", gpu="h200", tp=8, gpus=8, kv_dtype="fp8_e4m3",
                              context=dep.context_len, workload="chat", price_per_gpu_hour=3.79))
    assert metric(at, "Max rate in SLO") == round(plan.chosen.prediction.rate_rps, 2)
    gpus_10 = metric(at, "GPUs needed for 10 req/s")
    assert gpus_10 == plan.chosen.gpus_needed
    cost = metric(at, "$ per 1M output tokens")

    # BF16 KV: half the KV pool, same weights
    at.selectbox(key="kv_dtype").set_value("bf16").run()
    no_exception(at)
    bf16 = metric(at, "KV pool tokens")
    assert abs(bf16 * 2 - capacity.capacity(dep).kv_pool_tokens) <= 2
    assert metric(at, "Weights per GPU") == 76.2
    at.selectbox(key="kv_dtype").set_value("fp8_e4m3").run()

    # four times the load needs at least as many GPUs, and the monthly cost follows the GPUs
    at.number_input(key="target_rate").set_value(40.0).run()
    gpus_40 = metric(at, "GPUs needed for 40 req/s")
    assert gpus_40 >= gpus_10 and gpus_40 > 8
    assert metric(at, "Monthly cost for the target") == round(gpus_40 * 3.79 * 730)

    # the price scales the cost per token
    at.number_input(key="price_h200").set_value(7.58).run()
    assert abs(metric(at, "$ per 1M output tokens") - 2 * cost) < 0.002

    # another model: its own capacity and heading
    at.selectbox(key="model").set_value("glm-4.6").run()
    no_exception(at)
    glm = capacity.Deployment(catalog.model("glm-4.6"), catalog.gpu("h200"), 8, kv_dtype="fp8_e4m3")
    assert metric(at, "KV pool tokens") == capacity.capacity(glm).kv_pool_tokens
    assert any("GLM-4.6" in h.value for h in at.subheader)
    assert any("capbench sglang-launch" in c.value and "--tp 8" in c.value and "glm-4.6" in c.value.lower()
               for c in at.code)


def test_planner_says_what_is_wrong_with_bad_input():
    at = page("planner")
    at.selectbox(key="workload").set_value("custom").run()
    at.number_input(key="context_kimi-k2-thinking").set_value(1024).run()
    no_exception(at)
    assert any("exceed the context length 1024" in e.value for e in at.error)
