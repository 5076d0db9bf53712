"""The bootstrap over requests (bench/model/evidence/bootstrap.py): a stage judged again per draw as the campaign
judges it, a
sweep's bracket ends per draw, and a gain's interval from two deployments' draws, on stages whose requests are
known."""

import numpy as np
import pytest

from bench.model import bootstrap, gain_words
from bench.model.evidence.bootstrap import cell_gain, gain, stage_sample, sweep_draws

TTFT_BOUND = 1.0


def _stage(rate: float, late: int, n: int = 200, cut: int = 0, errored: int = 0) -> bootstrap.StageSample:
    """n requests: `late` of them past the TTFT bound, `cut` cut off, `errored` failed; 100 output tokens each."""
    ttft = np.full(n, 0.5)
    ttft[:late] = 2.0
    ok = np.ones(n, bool)
    cut_off = np.zeros(n, bool)
    cut_off[late:late + cut] = True
    ok[late:late + cut + errored] = False
    lat = np.stack([ttft, np.full(n, 0.01), ttft + 1], axis=1)
    return stage_sample(rate, ok, cut_off, lat, (TTFT_BOUND, None, None), np.full(n, 100.0), 1000.0)


def test_a_stage_far_from_its_bound_holds_in_every_draw_and_one_far_past_it_in_none():
    d = sweep_draws([_stage(1.0, late=0), _stage(2.0, late=100)], percentile=90, errors_ok=0.01)
    assert (d.low == 1.0).all() and (d.high == 2.0).all() and d.requests == 400
    assert bootstrap.interval(d.low, d.high) == (1.0, 2.0)  # the bracket: never narrower than the sweep looked


def test_a_stage_at_its_bound_flips_between_draws_and_the_rate_moves_between_bracket_ends():
    # 1.1: 20 of 200 late, exactly the p90's edge; it holds in some draws and misses in others
    d = sweep_draws([_stage(1.0, late=0), _stage(1.1, late=20), _stage(1.2, late=80)], 90, 0.01, seed=3)
    assert set(np.unique(d.low)) == {1.0, 1.1} and set(np.unique(d.high)) == {1.1, 1.2}
    assert 0.2 < np.mean(d.low == 1.1) < 0.8
    lo, hi = bootstrap.interval(d.low, d.high)
    assert (lo, hi) == (1.0, 1.2)
    # the same seed, the same draws
    again = sweep_draws([_stage(1.0, late=0), _stage(1.1, late=20), _stage(1.2, late=80)], 90, 0.01, seed=3)
    assert np.array_equal(d.low, again.low)


def test_cut_off_requests_are_misses_and_errors_past_the_allowed_share_fail_the_stage():
    cut = sweep_draws([_stage(1.0, late=0, cut=40)], 90, 0.01)
    assert (cut.low == 0).all()  # 20 % cut off: past every bound, the p90 misses
    failed = sweep_draws([_stage(1.0, late=0, errored=20)], 90, 0.01)
    assert (failed.low == 0).all()  # 10 % errored > 1 %


def test_the_judgement_on_the_sample_itself_matches_duckdbs_discrete_percentile():
    """quantile_disc's p90 of m values is the ceil(0.9 m)-th: with 20 of 200 late the p90 is on time, with 21 late
    it is not; the bootstrap's count rule agrees on the sample drawn once each."""
    for late, holds in ((20, True), (21, False)):
        s = _stage(1.0, late=late)
        w = np.ones((1, 200))
        judged = w @ s.judged
        allowed = judged - np.ceil(judged * 0.9 - 1e-9)
        assert bool(((w @ s.over) <= allowed[:, None]).all()) is holds


def test_goodput_and_output_tokens_per_second_at_each_draws_highest_rate():
    d = sweep_draws([_stage(1.0, late=5), _stage(2.0, late=150)], 90, 0.01)
    assert np.allclose(d.output_tps, 1000.0)  # every answer 100 tokens: the stage's rate in every draw
    assert 0.95 < d.goodput.mean() < 0.99  # 1 req/s x ~97.5 % within the SLO
    lo, hi = bootstrap.interval(d.goodput)
    assert lo < 0.975 < hi


def test_a_gain_between_deployments_spans_both_brackets_and_says_when_it_is_not_distinguishable():
    a = sweep_draws([_stage(2.0, 0), _stage(2.1, 100)], 90, 0.01, seed=1)
    b = sweep_draws([_stage(1.0, 0), _stage(1.05, 100)], 90, 0.01, seed=2)
    lo, hi = gain(a.low, a.high, b.low, b.high)
    assert lo == pytest.approx(2.0 / 1.05) and hi == pytest.approx(2.1 / 1.0)
    assert gain(a.low, a.high, np.zeros(1000), np.zeros(1000)) is None  # the baseline never held: no upper end
    cell = {"measured_rps": 1.0, "boot_low": [1.0] * 100, "boot_high": [1.2] * 100, "boot_requests": 400}
    base = {"measured_rps": 1.0, "boot_low": [0.9] * 100, "boot_high": [1.1] * 100, "boot_requests": 380}
    g = cell_gain(cell, base)
    assert g.value == 1.0 and g.low == pytest.approx(1.0 / 1.1) and g.high == pytest.approx(1.2 / 0.9)
    assert "bootstrap over 400 and 380 requests" in g.method
    assert gain_words(g) == "not distinguishable from no gain"
    assert "[" in g.stated(".2f", "x") and "bootstrap" in g.stated(".2f", "x")
    assert "paired" not in g.method
    paired = cell_gain({**cell, "boot_paired": True}, {**base, "boot_paired": True})
    assert paired.method.endswith("paired: both were sent the same requests")
    assert "paired" not in cell_gain({**cell, "boot_paired": True}, base).method  # one side's own: not paired


def test_with_repeats_the_interval_is_the_wider_of_the_bootstrap_and_the_t_interval():
    cell = {"measured_rps": 2.0, "repeats_rps": [1.6, 2.4], "boot_low": [2.0] * 10, "boot_high": [2.1] * 10}
    base = {"measured_rps": 1.0, "repeats_rps": [1.0, 1.0], "boot_low": [1.0] * 10, "boot_high": [1.05] * 10}
    g = cell_gain(cell, base)
    assert g.method.startswith("the wider of 90 % t interval")
    assert g.low < 2.0 / 1.05 and g.high > 2.1  # the repeats' spread is the wider here


def test_many_draws_stay_fast():
    import time

    stages = [_stage(1.0 + k / 10, late=10 + 5 * k, n=1000) for k in range(8)]
    t0 = time.perf_counter()
    sweep_draws(stages, 90, 0.01)
    assert time.perf_counter() - t0 < 5.0  # 8 stages x 1000 requests x 1000 draws, vectorised


def _shared(rate: float, ttft: np.ndarray, seed: int | None) -> bootstrap.StageSample:
    """Stage of the requests `ttft` (one each, in order), sent as the prompts of `seed` (None: its own)."""
    n = len(ttft)
    lat = np.stack([ttft, np.full(n, 0.01), ttft + 1], axis=1)
    return stage_sample(rate, np.ones(n, bool), np.zeros(n, bool), lat, (TTFT_BOUND, None, None),
                        np.full(n, 100.0), 1000.0, np.arange(n), seed)


def test_stages_that_sent_the_same_requests_are_resampled_alike_so_a_faster_one_never_holds_alone():
    # the same 60 requests at two rates, each a little later at the higher one; both at the p90's edge
    rng = np.random.default_rng(7)
    ttft = rng.uniform(0.2, 1.09, 60)  # its p90 near the bound
    slow, fast = ttft, ttft * 1.02
    def holds(seed):
        return [bootstrap._judge(_shared(r, t, seed), 90, 0.01, np.random.default_rng(k), 2000, 2)[0]
                for k, (r, t) in enumerate(((1.0, slow), (1.05, fast)))]

    (s0, f0), (s1, f1) = holds(0), holds(None)
    assert 0.1 < s0.mean() < 0.9 and 0.1 < f0.mean() < 0.9  # both flip between draws
    assert not (f0 & ~s0).any()  # paired: in no draw does the faster stage hold where the slower one missed
    assert (f1 & ~s1).mean() > 0.05  # resampled apart, in many
    w0 = bootstrap.weights(_shared(1.0, slow, 0), np.random.default_rng(0), 50, boot_seed=2)
    w1 = bootstrap.weights(_shared(1.05, np.concatenate([fast, fast[:10]]), 0), np.random.default_rng(1), 50, 2)
    assert np.array_equal(w0, w1[:, :60])  # request j weighs alike in both, whatever the stages' counts


def test_a_paired_gain_is_narrower_than_one_of_the_same_stages_drawn_apart():
    # two deployments sent the same 80 requests; the faster serves each at 1.2x the other's rate as the other does
    base = np.random.default_rng(11).uniform(0.2, 1.09, 80)  # its p90 near the bound at the middle stage

    def ends(seed):
        cell = [_shared(r, base * f, seed) for r, f in ((1.0, 0.95), (1.05, 1.0), (1.1, 1.05))]
        b = sweep_draws(cell, 90, 0.01, seed=4)
        a = sweep_draws([_shared(s.rate * 1.2, base * f, seed) for s, f in zip(cell, (0.95, 1.0, 1.05), strict=True)],
                        90, 0.01, seed=4 if seed is not None else 5)
        return gain(a.low, a.high, b.low, b.high)

    paired, apart = ends(0), ends(None)
    assert paired[0] <= 1.2 <= paired[1] and apart[0] <= 1.2 <= apart[1]
    assert paired[1] / paired[0] < apart[1] / apart[0]
