"""`capbench run` against the twin (in its own process): rate accuracy over 3000 Poisson arrivals, the store against
Locust's own counts, and the client's TTFT against the twin's server-side timestamps."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import httpx
import numpy as np
import pytest

from bench.runner import RunOptions, run
from bench.twin import Target
from loadgen.users import OpenLoopUser
from tests import host
from tests.bench.test_runner import rows
from tests.loadgen.conftest import drive, plan_config

pytestmark = pytest.mark.timing  # the send rate to 2 %, first-token times to the ms: run alone (Makefile)

TWIN = "twin:kimi-k2-thinking@h200x8,kv=fp8_e4m3,time_scale=10"
# 3000 arrivals, the sample the rate checks need, sent at 150 req/s for 20 s (it was 50 req/s for a minute)
RATE, DURATION = 150, 20
LIGHT = {"name": "light", "type": "synthetic", "input": {"dist": "uniform", "min": 64, "max": 256},
         "output": {"dist": "uniform", "min": 8, "max": 24}}


def test_poisson_3000_arrivals_hit_the_rate_and_the_store_matches_locust(tmp_db, tmp_path):
    wl = tmp_path / "light.yaml"
    wl.write_text(json.dumps(LIGHT))
    [res] = run(RunOptions(target=TWIN, profile="poisson", overrides={"rate": RATE, "duration": DURATION},
                           workload=str(wl), db=tmp_db, live=False, seed=7))
    assert res.status == "completed"
    stored = rows(tmp_db, res.run_id)
    assert len(stored) == RATE * DURATION == 3000 == res.locust_requests == res.records == res.rows_written
    assert res.locust_failures == sum(r["status"] != "ok" for r in stored) == 0
    assert res.summary["achieved_rate_rps"] == pytest.approx(RATE, rel=0.02)
    assert res.summary["throughput_rps"] == pytest.approx(RATE, rel=0.02)
    assert all(r["tokens_from"] == "usage" for r in stored)
    con = duckdb.connect(str(tmp_db), read_only=True)  # the twin's /metrics, scraped by the recorder meanwhile
    scrapes = con.execute("SELECT count(*) FROM server_samples WHERE run_id = ? AND metric = 'sglang:num_running_reqs'",
                          [res.run_id]).fetchone()[0]
    con.close()
    assert scrapes >= DURATION  # every 500 ms asked; a 2.5x slower day gave 29 in 20 s: at least one a second


def _first_token_delivery_ms(rate: float) -> np.ndarray:
    """Client first-token time minus the twin's first-token time, both time.time(), for one short run."""
    target = Target(TWIN)
    try:
        cfg = plan_config(target.url, {"name": "p", "type": "poisson", "params": {"rate": rate, "duration": 3}},
                          LIGHT, model="moonshotai/Kimi-K2-Thinking", duration_s=3.0, connections=400)
        records = drive(OpenLoopUser, cfg, 300, 3.5)
        assert len(records) == 3 * rate and all(r["status"] == "ok" for r in records)
        with httpx.Client(base_url=target.url) as http:
            server = [http.get(f"/capbench/requests/{ctx['server_request_id']}").json() for ctx in records.contexts]
    finally:
        target.close()
    return np.array([r["first_token_at"] - s["first_token"] for r, s in zip(records, server, strict=True)]) * 1000


def test_client_first_token_time_matches_the_twins():
    """At 100 req/s the client's first-token timestamp agrees with the twin's own (taken when the twin hands the first
    token to the socket): never earlier (one clock), median under 1 ms, p95 under 5 ms. The issue's goal is a p99
    under 1 ms; on the 2-core machines here the twin and the client share the cores, so that goal is reported, not
    asserted: the printed figures are the measurement. Of 300 requests the p99 is the third worst, one preemption
    burst away from any bound: eight quiet runs here (2026-12-07) gave p50 0.42-0.58 ms, p95 1.41-2.57 ms, p99
    1.81-4.13 ms and a worst of 2.1-14.4 ms, and CI once measured p99 5.9 ms with p50 0.63 ms on a host it had just
    found quiet; so the tail is bounded at p95 (15th worst). A client that stamped the first token late (after the
    body, or at the next buffer flush) would sit a decode step or more behind: milliseconds at the median. The host's
    noise is measured before and after the run and the noisier reading widens the bounds (tests/host.py): its slowdown
    scales the client's own work, four pipe round trips' p99 join the tail."""
    before = host.measure()
    d = _first_token_delivery_ms(100)
    after = host.measure()
    noise = max(before, after, key=lambda n: (not n.quiet, n.slowdown + n.wake_p99_ms))
    p50, p95, p99 = (float(np.percentile(d, q)) for q in (50, 95, 99))
    slow = max(1.0, noise.slowdown)
    p50_bound, p95_bound = (1.0, 5.0) if noise.quiet else (slow + noise.wake_p99_ms, 5.0 * slow + 4 * noise.wake_p99_ms)
    print(f"first-token delivery, client - twin: p50 {p50:.3f} ms, p95 {p95:.3f} ms, p99 {p99:.3f} ms, worst "
          f"{d.max():.3f} ms (goal: p99 < 1 ms); {noise}; bounds p50 < {p50_bound:.2f} ms, p95 < {p95_bound:.2f} ms")
    assert d.min() > -0.05  # the client never sees a token before the server made it: one clock
    assert p50 < p50_bound and p95 < p95_bound, f"p50 {p50:.3f} ms, p95 {p95:.3f} ms; {noise}"


def test_capped_run_holds_the_cap_and_stores_the_wait(tmp_db, tmp_path):
    """`capbench run --max-concurrency 2` against a twin 10x faster than its GPUs, offered 60 req/s (6 in model
    time): never more than 2 in flight, the wait for a slot stored apart from TTFT."""
    wl = tmp_path / "light.yaml"
    wl.write_text(json.dumps(LIGHT))
    [res] = run(RunOptions(target=TWIN, profile="poisson", overrides={"rate": 60, "duration": 2, "max_concurrency": 2},
                           workload=str(wl), db=tmp_db, live=False, seed=7, quiet=True))
    stored = rows(tmp_db, res.run_id)
    assert res.status == "completed" and len(stored) == 120 and all(r["status"] == "ok" for r in stored)
    for r in stored:
        assert sum(1 for o in stored if o["sent_at"] <= r["sent_at"] < o["finished_at"]) <= 2
        assert r["ttft_s"] + r["slot_wait_s"] == pytest.approx(r["first_token_at"] - r["scheduled_at"], abs=1e-6)
    assert sum(r["slot_wait_s"] > 0.005 for r in stored) >= 10  # the queue formed in the client...
    waits = sorted(r["slot_wait_s"] for r in stored)
    assert res.summary["slot_wait_p99"] == pytest.approx(float(np.quantile(waits, 0.99)), rel=1e-6)
    con = duckdb.connect(str(tmp_db), read_only=True)
    running = con.execute("SELECT max(value) FROM server_samples WHERE run_id = ? AND "
                          "metric = 'sglang:num_running_reqs'", [res.run_id]).fetchone()[0]
    con.close()
    assert running is None or running <= 2  # ...not in the server


ROOT = Path(__file__).resolve().parents[2]


def test_a_twin_that_cannot_keep_its_modelled_pace_says_so(tmp_path):
    """A twin 3000x faster than its GPUs cannot keep up on any host: its stages and its cell say that its latencies
    are this host's CPU. The same twin at the GPUs' own pace loses a small fraction of that (alone, nothing; on a
    loaded host its process too is kept off the CPU for milliseconds, which it counts as well: so a timing test)."""
    f = tmp_path / "c.yaml"
    # TTFT 2 s: the hurried twin's host lag shows as ~10 s TTFT p90 (3.3 ms x 3000), a clear miss on any host (at
    # 10 s it missed or met by a hair, and its rerun came and went with the host's speed); the calm one's is ~0.2 s
    f.write_text("name: t\nslo: \"ttft=2s,tpot=200ms\"\ndeployments:\n"
                 '  - {name: hurried, twin: "glm-4.6@h200x8,time_scale=3000"}\n'
                 '  - {name: calm, twin: "glm-4.6@h200x8,time_scale=1"}\n'
                 "loads:\n  - {name: a, workload: chat, profile: users, users: 2, duration: 1.5}\n")
    db = tmp_path / "c.duckdb"
    out = subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", "campaign", str(f), "--db",
                          str(db)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [x for x in out.stdout.splitlines() + out.stderr.splitlines() if "req/s:" in x or "goodput" in x]
    hurried = [x for x in lines if "hurried/a" in x]
    assert hurried and all("behind its modelled pace" in x for x in hurried[:1]), lines
    with duckdb.connect(str(db), read_only=True) as con:
        rows = dict(con.execute("SELECT cell, result FROM campaign_cells").fetchall())
        runs = dict(con.execute("SELECT label, count(*) FROM runs WHERE label LIKE 'campaign %' GROUP BY label")
                    .fetchall())
    hurried_share = json.loads(rows["hurried/a"])["twin_behind"]
    calm = json.loads(rows["calm/a"])
    # the hurried stage measured its host, so it was measured once more (both runs kept), and said so
    said = out.stdout.splitlines() + out.stderr.splitlines()
    assert sum("hurried/a: measured again: the twin fell behind" in x for x in said) == 1, said
    assert runs["campaign hurried/a"] == 2 and json.loads(rows["hurried/a"])["points"][0]["reruns"] == 1
    assert runs["campaign calm/a"] == 1 + calm["points"][0]["reruns"]
    assert hurried_share > 0.05 and calm["points"][0]["completed"] > 0
    assert calm["twin_behind"] < hurried_share / 3, (calm["twin_behind"], hurried_share)


def _answer_through_stalls(target: Target, stalls_s: list[float], answer_s: float = 0.6) -> tuple[float, float]:
    """Wall seconds of one non-streamed answer of 200 tokens into an emptied cache while the twin's process is held
    off the CPU (SIGSTOP ... SIGCONT, what a busy host does to it) for each of `stalls_s`, spread over the first 90 %
    of an answer expected to take `answer_s`; and the wall seconds the twin reported lost meanwhile
    (/get_server_info's behind_s)."""
    from bench.campaign.stage import twin_behind_s

    httpx.post(target.url + "/flush_cache", timeout=10)
    behind0 = twin_behind_s(target.url)

    gap = 0.9 * answer_s / (len(stalls_s) + 1)

    def stall() -> None:
        for s in stalls_s:
            time.sleep(gap)
            os.kill(target.proc.pid, signal.SIGSTOP)
            time.sleep(s)
            os.kill(target.proc.pid, signal.SIGCONT)

    t = threading.Thread(target=stall)
    began = time.perf_counter()
    t.start()
    r = httpx.post(target.url + "/v1/completions", timeout=30, json={
        "model": "x", "prompt": "word " * 2000, "max_tokens": 200, "ignore_eos": True})
    took = time.perf_counter() - began
    t.join()
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 200
    return took, twin_behind_s(target.url) - behind0


def test_a_twin_makes_up_short_stalls_and_counts_a_long_one():
    """Three 12 ms stalls (a 2-core host shared with the load generator has many): the answer is done when it would
    have been without them, give or take the scheduler's own jitter, and nothing is reported lost. With the 5 ms
    limit the twin's loop had before (bench/twin/server.py, CATCH_UP_S), each was lost: about 36 ms later, and a 30x
    twin's modelled clock ran 5-9 % slow in a campaign stage. An 80 ms stall is past CATCH_UP_S: the loop does not
    rush 80 ms of steps out at once, and the lost time is reported (a campaign stage then says its latencies are
    the host's CPU)."""
    from bench.twin.server import CATCH_UP_S

    assert 0.012 < CATCH_UP_S < 0.080
    target = Target("twin:glm-4.6@h200x8,time_scale=4")
    try:
        noise = host.measure()
        # the fastest of three: a busy host only ever adds to an answer's time (a median of three read 746 ms in a
        # CI run where the answer through three short stalls took 724 ms)
        calm = min(_answer_through_stalls(target, [])[0] for _ in range(3))
        stalls = [0.012, 0.012, 0.012]
        took, lost = _answer_through_stalls(target, stalls, calm)
        print(f"answer alone {calm * 1e3:.0f} ms, with 3 x 12 ms stalls {took * 1e3:.0f} ms, lost {lost * 1e3:.1f} ms")
        # the answer outlasts the stalls: they fell inside it (the last ends at 0.9 x calm + the stalls' own time;
        # the modelled answer's length follows the performance model: 584 ms in one CI run, 746 in another)
        assert took > 0.9 * calm * len(stalls) / (len(stalls) + 1) + sum(stalls), (took, calm)
        late = 0.020 if noise.quiet else 0.020 * max(1.0, noise.slowdown) + 4 * noise.wake_p99_ms / 1e3
        assert lost < 0.005 and took - calm < late, (took, calm, lost, str(noise))
        took_long, lost_long = _answer_through_stalls(target, [0.080], calm)
        print(f"with one 80 ms stall {took_long * 1e3:.0f} ms, lost {lost_long * 1e3:.1f} ms; {noise}")
        assert lost_long > 0.070 and took_long - calm > 0.060, (took_long, calm, lost_long, str(noise))
    finally:
        target.close()
