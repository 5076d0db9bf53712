"""The sweep to saturation on a server whose limit is known: up by the factor while the SLO holds and goodput
rises, down when even the first rate misses, then bisection between the last rate within the SLO and the first
past it; and the model's answer to the same sweep for a twin."""

import math

from bench.campaign import parse_campaign
from bench.campaign.predict import predicted
from bench.campaign.run import _search
from bench.campaign.stage import Stage
from bench.sweep import sweep


def _sweep(load, stage, start):
    from dataclasses import replace

    found = sweep(stage, replace(_search(load), start=start))
    return found.stages, found.best, found.why

SPEC = """
name: s
slo: "ttft=30s,tpot=300ms"
duration: 3
deployments:
  - {{name: b, twin: "kimi-k2-thinking@h200x8,kv=bf16,mem_fraction=0.6,time_scale=10"}}
  - {{name: f, twin: "kimi-k2-thinking@h200x8,kv=fp8_e4m3,mem_fraction=0.6,time_scale=10"}}
loads:
  - {{name: x, workload: campaign-long-context, sweep: {sweep}}}
"""


def _load(sweep: str):
    return parse_campaign(SPEC.format(sweep=sweep)).loads[0]


def _server(limit: float, plateau: float = math.inf):
    """Meets the SLO up to `limit` req/s; serves at most `plateau` req/s within it (goodput stops rising)."""
    def stage(rate: float) -> Stage:
        attained = min(1.0, plateau / rate)
        return Stage(rate, f"run@{rate:.3f}", {"slo_attainment": attained}, rate <= limit, "" if rate <= limit else "x")
    return stage


def test_up_until_the_slo_breaks_then_bisect():
    stages, best, why = _sweep(_load("{start: 0.5, factor: 1.5, refine: 2}"), _server(1.0), 0.5)
    rates = [s.rate for s in stages]
    mid = math.sqrt(0.75 * 1.125)  # 0.919: holds; then sqrt(0.919 * 1.125) = 1.017: misses
    assert rates[:3] == [0.5, 0.75, 1.125] and math.isclose(rates[3], mid)
    assert len(rates) == 5 and math.isclose(rates[4], math.sqrt(mid * 1.125))
    assert best.rate == rates[3] and "SLO broke at 1.12" in why


def test_down_when_the_first_rate_misses():
    stages, best, _ = _sweep(_load("{start: 4, factor: 2, refine: 0}"), _server(1.0), 4.0)
    assert [s.rate for s in stages] == [4.0, 2.0, 1.0] and best.rate == 1.0


def test_stops_where_goodput_stops_rising():
    stages, best, why = _sweep(_load("{start: 1, factor: 2, refine: 0, min_gain: 0.05}"), _server(100, 3.0), 1.0)
    # goodput 1, 2, 3 (4 req/s, 75 % within the SLO), then 3 again at 8 req/s
    assert [s.rate for s in stages] == [1.0, 2.0, 4.0, 8.0] and best.rate == 4.0
    assert "goodput stopped rising at 8" in why


def test_the_model_answers_the_same_sweep_and_fp8_kv_gains_when_the_pool_binds():
    c = parse_campaign(SPEC.format(sweep="{start: 0.2, factor: 1.25, refine: 1}"))
    base, fp8 = (predicted(d, c.loads[0], _search(c.loads[0])) for d in c.deployments)
    assert 0 < base["predicted_rps"] < fp8["predicted_rps"]  # the pool binds: twice the tokens serve more
    assert base["predicted_usd_per_m"] > fp8["predicted_usd_per_m"] > 0
    for cell in (base, fp8):  # the predicted column carries the plan's 80 % interval (bench/model/evidence/interval.py)
        assert cell["predicted_rps_low"] < cell["predicted_rps"] < cell["predicted_rps_high"]


def test_the_demo_campaign_is_kv_bound_in_the_model():
    """The built-in demo's loads are sized so the KV pool binds within its short stages: the model's FP8 KV gain at
    saturation is well above 1x for both models on both loads (what the measured gain is compared against): 1.27-1.6x
    with the shipped stage lengths (the agentic stages' 22.5 modelled seconds leave the least time to fill the pool)."""
    from bench.campaign import load_campaign

    c = load_campaign("demo")
    for load in c.loads:
        for fp8 in (d for d in c.deployments if d.baseline):
            base = predicted(c.deployment(fp8.baseline), load, _search(load))["predicted_rps"]
            gain = predicted(fp8, load, _search(load))["predicted_rps"] / base
            assert gain >= 1.2, (fp8.name, load.name, gain)


def test_the_bracket_closes_to_five_percent():
    """Default refinement: bisect until the first rate past the SLO is within 5 % of the last within it."""
    from bench.sweep import Search

    for limit in (0.37, 1.0, 2.9):
        found = sweep(_server(limit), Search(start=0.5, factor=1.25, max_stages=20))
        assert found.best.rate <= limit < found.past and found.bracket <= 0.05, (limit, found.bracket)
    capped = sweep(_server(2.9), Search(start=0.5, factor=1.25, max_stages=4))
    assert capped.past is None and capped.bracket is None and capped.why == "search limit"  # a lower bound only


def test_a_lowest_rate_that_held_only_just_gets_an_anchor_a_factor_below():
    """Without a rate that surely holds, a bootstrap over the requests has no lower end for the figure: when the
    lowest stage held only just (not `sure`), the sweep runs one more a factor below it, and only then."""
    from bench.sweep import Search

    def server(limit: float, shaky: float):
        def stage(rate: float) -> Stage:
            return Stage(rate, "", {"slo_attainment": 1.0}, rate <= limit, "", sure=abs(rate - shaky) > 1e-9)
        return stage

    found = sweep(server(1.05, shaky=1.0), Search(start=1.0, factor=1.1, refine=1, min_gain=0))
    assert [round(s.rate, 4) for s in found.stages] == [1.0, 1.1, round(math.sqrt(1.1), 4), round(1 / 1.1, 4)]
    assert math.isclose(found.best.rate, math.sqrt(1.1)) and found.past == 1.1  # the anchor changes no figure
    plain = sweep(server(1.05, shaky=-1), Search(start=1.0, factor=1.1, refine=1, min_gain=0))
    assert len(plain.stages) == 3  # the lowest held surely: no anchor
    off = sweep(server(1.05, shaky=1.0), Search(start=1.0, factor=1.1, refine=1, min_gain=0, anchor=False))
    assert len(off.stages) == 3


def test_a_stage_one_request_from_its_bound_is_not_sure_one_far_from_it_is():
    import numpy as np

    from bench.model import bootstrap

    def sample(over: int, n: int = 20) -> bootstrap.StageSample:
        ttft = np.array([40.0] * over + [5.0] * (n - over))  # TTFT bound 30 s; p90 of 20 allows 2 past it
        lat = np.stack([ttft, np.full(n, 0.05), np.full(n, 60.0)], axis=1)
        ok = np.ones(n, bool)
        return bootstrap.stage_sample(1.0, ok, ~ok, lat, (30.0, 0.3, None), np.full(n, 100.0), 100.0)

    marginal = bootstrap.verdict_share(sample(2), 90, 0.01, meets=True)
    clear = bootstrap.verdict_share(sample(0), 90, 0.01, meets=True)
    assert marginal < bootstrap.SURE <= clear == 1.0
    assert 0.5 < marginal < 0.8  # P(Binomial(20, 0.1) <= 2) = 0.68
