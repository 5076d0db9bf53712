"""Arrivals as benchmark clients send them: open-loop Poisson, closed-loop at a concurrency, and both together (a
rate with a concurrency cap: requests wait on the client's semaphore), through the real scheduler."""

import subprocess
import sys

from bench.model import Deployment, catalog
from bench.model.serving.simulate import BLOCK, make_scheduler, play, run
from bench.model.serving.workload import fixed_workload, make_requests

DEP = Deployment(catalog.model("glm-4.5-air"), catalog.gpu("h100-sxm"), 4, kv_dtype="fp8_e4m3")
WL = fixed_workload(1000, 200)


def played(rate: float, concurrency: int | None, paced: bool, n: int = 120):
    sched = make_scheduler(DEP)
    reqs = make_requests(WL, rate, n, 0, BLOCK, sched.pool)
    due = [r.arrival for r in reqs]
    play(sched, reqs, concurrency, paced)
    return sched, reqs, due


def in_flight_at(reqs, t: float) -> int:
    return sum(1 for r in reqs if r.arrival <= t < r.finish)


def test_a_cap_with_a_rate_holds_requests_until_a_slot_frees():
    _, reqs, due = played(50.0, 8, paced=True)
    assert all(r.state == "done" for r in reqs)
    assert all(r.arrival >= d - 1e-12 for r, d in zip(reqs, due, strict=True))  # never sent before it is due
    assert max(in_flight_at(reqs, r.arrival) for r in reqs) <= 8
    assert sum(r.arrival > d + 1e-9 for r, d in zip(reqs, due, strict=True)) > len(reqs) // 2  # 50 req/s > capacity


def test_a_cap_above_the_load_is_the_open_loop():
    _, capped, _ = played(0.5, 10_000, paced=True, n=40)
    _, open_loop, _ = played(0.5, None, paced=False, n=40)
    assert [r.first_token for r in capped] == [r.first_token for r in open_loop]


def test_a_cap_sheds_the_queue_in_front_of_the_first_token():
    # 200 req/s: far past what the instance serves (on the kernel tables it drains 50 req/s of these in seconds)
    fast = run(DEP, WL, 200.0, 300, min_seconds=5)
    capped = run(DEP, WL, 200.0, 300, min_seconds=5, concurrency=8)
    assert capped.ttft_p50 < fast.ttft_p50 / 3  # the queue waits in the client, not the server
    assert capped.output_tok_s < fast.output_tok_s


def test_simulate_cli_takes_a_cap_and_refuses_a_bad_one():
    cli = [sys.executable, "-c", "from bench.cli import main; main()", "simulate", "--model", "glm-4.5-air",
           "--gpu", "h100-sxm", "--tp", "4", "--input-len", "1000", "--output-len", "200", "--rate", "20",
           "--num-requests", "50", "--min-seconds", "5", "--json"]
    ok = subprocess.run([*cli, "--max-concurrency", "4"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-1000:]
    bad = subprocess.run([*cli, "--max-concurrency", "0"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--max-concurrency must be >= 1" in bad.stderr + bad.stdout
    assert "Traceback" not in bad.stderr
