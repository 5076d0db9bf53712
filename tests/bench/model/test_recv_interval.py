"""--scheduler-recv-interval: SGLang takes new requests in every N decode steps (recv_skipper.py), so a request that
arrives while others decode waits for the next multiple of N; after a prefill step or while idle it is taken at once."""

import pytest

from bench.model import Deployment, PerfModel, Request, Scheduler, catalog
from bench.model.evidence.corpus import _flag_int, load
from bench.model.fits.capacity import capacity


def _scheduler(recv_interval: int) -> Scheduler:
    dep = Deployment(catalog.model("kimi-k2-thinking"), catalog.gpu("h200"), 8)
    cap = capacity(dep, with_ratios=False)
    return Scheduler(PerfModel(dep), cap.kv_pool_tokens_total, cap.max_running_requests, 8192, 16,
                     recv_interval=recv_interval)


def _late_arrival_ttft(recv_interval: int, arrive_in_step: float) -> tuple[float, float]:
    """One request decodes from t=0; a second arrives `arrive_in_step` decode steps after the first's prefill.
    Returns (the second's TTFT, one decode step's duration)."""
    sched = _scheduler(recv_interval)
    first = Request("a", prompt_len=100, max_new=500, arrival=0.0)
    late = Request("b", prompt_len=100, max_new=50, arrival=-1.0)
    sched.submit(first)
    t, decode_s = 0.0, 0.0
    while late.first_token is None:
        due = first.first_token + arrive_in_step * decode_s if decode_s else None
        if late.arrival < 0 and due is not None and t >= due:  # submitted at the step boundary after it arrives
            late.arrival = due
            sched.submit(late)
        step = sched.plan()
        if not step.prefill:
            decode_s = step.duration
        t += step.duration
        sched.commit(step, t)
    return late.first_token - late.arrival, decode_s


def test_a_request_arriving_mid_decode_waits_for_the_next_receive():
    ttft1, d = _late_arrival_ttft(1, 1.5)  # taken in after decode step 2
    ttft10, _ = _late_arrival_ttft(10, 1.5)  # taken in after decode step 10: 8 steps later
    assert ttft10 - ttft1 == pytest.approx(8 * d, rel=0.03)
    ttft10_late, _ = _late_arrival_ttft(10, 9.5)  # arrives during step 10: no extra wait
    assert ttft10_late == pytest.approx(ttft1, rel=0.03)


def test_an_idle_server_takes_a_burst_at_once():
    ttfts = {}
    for n in (1, 30):
        sched = _scheduler(n)
        reqs = [Request(str(i), prompt_len=200, max_new=20, arrival=0.0) for i in range(64)]
        for r in reqs:
            sched.submit(r)
        t = 0.0
        while (step := sched.plan()) is not None:
            t += step.duration
            sched.commit(step, t)
        assert sched.stats["finished"] == 64
        ttfts[n] = sorted(r.first_token for r in reqs)
    assert ttfts[30] == ttfts[1]


def test_the_flag_is_read_from_the_cases_launch_flags():
    assert _flag_int(["--stream-interval 30", "--scheduler-recv-interval 10"], "--scheduler-recv-interval") == 10
    assert _flag_int(["--scheduler-recv-interval=30"], "--scheduler-recv-interval") == 30
    assert _flag_int(["--stream-interval 30"], "--scheduler-recv-interval") is None
    intervals = {c.key: c.recv_interval for c in load()}
    assert intervals["inferencex-pr-3363/b200-tp8-dsr1-c64-1k1k"] == 30
    assert intervals["inferencex-pr-3173/h200-tp8-dsr1-c64-1k1k"] == 1
