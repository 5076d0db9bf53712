"""The client's concurrency cap in front of a disaggregated deployment (bench/model/pd/simulate.py), as
bench_serving's --max-concurrency plays it: one count of requests in flight across every prefill and decode
instance; closed loop without a rate, paced with one (a request waits for a slot, and the wait is slot_wait_*)."""

import math

import pytest

from bench.model import workload
from bench.model.pd import disagg
from bench.model.pd import simulate as pd_simulate

SHAPE = disagg.Shape("kimi-k2-thinking", "h200", 8, 8, "fp8_e4m3")
WL = workload.fixed_workload(4000, 100)


@pytest.mark.parametrize("rate, instances", [(math.inf, (1, 1)), (2.0, (1, 1)), (3.0, (2, 2))])
def test_a_cap_far_above_the_load_changes_nothing(rate, instances):
    free = pd_simulate.run(SHAPE, WL, rate, 60, min_seconds=60, instances=instances)
    capped = pd_simulate.run(SHAPE, WL, rate, 60, min_seconds=60, instances=instances, concurrency=10**6)
    assert capped.to_dict() == free.to_dict()


def test_a_cap_of_one_in_closed_loop_serves_one_request_at_a_time():
    """Little's law with one in flight: requests/s is 1 / E2E; every decode step is a batch of one, so TPOT is the
    decode instance's step at batch 1 (the uncapped burst batches, and its steps are longer)."""
    one = pd_simulate.run(SHAPE, WL, math.inf, 60, concurrency=1)
    burst = pd_simulate.run(SHAPE, WL, math.inf, 60)
    assert one.rejected == 0 and one.slot_wait_p99 == 0.0  # closed loop: nothing is due before it is sent
    assert one.achieved_rps == pytest.approx(1 / one.e2e_p50, rel=0.05)
    assert one.e2e_p99 == pytest.approx(one.e2e_p50, rel=0.01)  # alone every time: the same latency
    step = disagg.PDPerfModel(SHAPE, "decode").step_time(1, 4000 + 50)
    assert one.tpot_p50 == pytest.approx(step, rel=0.02) and burst.tpot_p50 > 1.5 * step
    assert 0 < one.mean_running <= 1.0 < burst.mean_running
    assert burst.achieved_rps > 2 * one.achieved_rps


def test_a_paced_load_past_the_cap_waits_for_slots_and_delivers_what_the_cap_allows():
    """Cap 2: at rates past what two in flight serve, the output is flat at Little's law's cap / E2E x answer and the
    slot waits grow with the rate; well below, nobody waits; uncapped, the same rates are served."""
    cap = 2
    closed = pd_simulate.run(SHAPE, WL, math.inf, 60, concurrency=cap)
    low, high, higher = (pd_simulate.run(SHAPE, WL, f * closed.achieved_rps, 100, min_seconds=60, concurrency=cap)
                         for f in (0.1, 2.0, 4.0))
    assert low.slot_wait_p90 < 0.01 * low.e2e_p50
    assert low.output_tok_s == pytest.approx(0.1 * closed.achieved_rps * 100, rel=0.3)
    assert 0 < high.slot_wait_p50 < higher.slot_wait_p50 and high.slot_wait_p99 > high.slot_wait_p50
    for p in (high, higher):
        assert p.output_tok_s == pytest.approx(cap / p.e2e_p50 * 100, rel=0.05)
    assert higher.output_tok_s == pytest.approx(high.output_tok_s, rel=0.05)
    free = pd_simulate.run(SHAPE, WL, 4.0 * closed.achieved_rps, 100, min_seconds=60)
    assert free.slot_wait_p99 == 0.0 and free.output_tok_s > 2 * higher.output_tok_s


def test_the_cap_counts_requests_in_flight_across_every_instance():
    """Two prefill and two decode instances behind one client: cap 1 still serves one request at a time (the same
    Little's law figure as one instance of each), not one per instance."""
    two = pd_simulate.run(SHAPE, WL, math.inf, 40, concurrency=1, instances=(2, 2))
    one = pd_simulate.run(SHAPE, WL, math.inf, 40, concurrency=1)
    assert two.achieved_rps == pytest.approx(1 / two.e2e_p50, rel=0.05)
    assert two.achieved_rps == pytest.approx(one.achieved_rps, rel=0.02) and 0 < two.mean_running <= 1.0
