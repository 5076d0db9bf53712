"""A campaign stage's predicted output tokens/s is the steady-state rate the deployment sustains at that offered
load, whatever the stage's length: the pd-demo twins (colocated and disaggregated, prefill-heavy answers that take
longer than a 3-second stage) predict within TOLERANCE of what 60-second stages predict; the replay's own
tokens-in-the-window figure does not (0 for the PD simulator, a fraction of the steady rate for the colocated one)."""

from dataclasses import replace

import pytest

from bench.campaign import load_campaign
from bench.campaign.predict import WARMUP_SHARE, answer_tokens, predicted_stage
from bench.campaign.stage import window_output_tps
from bench.model import load_workload, simulate

TOLERANCE = 0.05  # the served share's sampling noise; the mean answer is one figure for every stage
RATE = 0.5  # req/s: within pd-demo's SLO for both deployments (the colocated DP-attention one misses it at 1.0)


@pytest.mark.parametrize("name", ["colocated", "disaggregated"])
def test_a_3_second_stage_predicts_the_steady_rate_a_60_second_one_does(name):
    c = load_campaign("pd-demo")
    dep, load = c.deployment(name), c.loads[0]
    assert load.duration_s == 3
    short = predicted_stage(dep, load, RATE)
    long = predicted_stage(dep, replace(load, duration_s=60), RATE)
    assert short.meets and long.meets
    wl = load_workload(load.workload)
    steady = RATE * answer_tokens(wl, dep.deployment().context_len)
    assert short.summary["output_tps"] == pytest.approx(long.summary["output_tps"], rel=TOLERANCE)
    assert long.summary["output_tps"] == pytest.approx(steady, rel=TOLERANCE)


def test_the_colocated_replays_own_window_undercounts_a_short_stage():
    """Why the stage prediction does not read simulate.run's output_tok_s: a 3-second stage's window (7.5 s of
    virtual time at time_scale 2) holds the ramp of answers still being written."""
    c = load_campaign("pd-demo")
    dep, load = c.deployment("colocated"), c.loads[0]
    wl, d = load_workload(load.workload), dep.deployment()
    horizon = (1 + WARMUP_SHARE) * load.duration_s * dep.time_scale
    p = simulate.run(d, wl, RATE, 8, min_seconds=horizon)
    assert 0 < p.output_tok_s < 0.8 * RATE * answer_tokens(wl, d.context_len)


def test_a_measured_stage_counts_its_answers_per_second_of_its_window():
    """The measured side of the same figure: output tokens of the stage's measured requests per second of the window
    they were sent in, not of the span up to its last answer."""
    assert window_output_tps({"output_tokens": 600, "output_tps": 50.0}, 3.0) == 200.0
    assert window_output_tps({"output_tokens": None}, 3.0) == 0.0
