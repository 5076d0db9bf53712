"""Locust users against the stub SSE server in its own process: timing, token counts, error kinds."""

import time

import pytest

from loadgen import users
from loadgen.users import ClosedLoopUser, OpenLoopUser
from tests.loadgen.conftest import drive, plan_config

ONE = {"name": "one", "type": "constant", "params": {"rate": 1, "duration": 1}}  # a single request at t0+0.5 s
CLOSED = {"name": "users", "type": "users", "params": {"users": 1, "duration": 1}}


def test_a_clock_read_straddling_a_preemption_is_taken_again(monkeypatch):
    """A request's timestamps are one time.time() plus perf_counter() deltas: a 1 ms preemption between the two reads
    put a client's first token 1.0 ms before the twin made it, so such a read is taken again."""
    perf = iter([10.0, 10.001, 20.0, 20.00001])  # the first pair straddles a 1 ms tick, the second does not
    walls = iter([1000.0, 2000.0])
    monkeypatch.setattr(users.time, "perf_counter", lambda: next(perf))
    monkeypatch.setattr(users.time, "time", lambda: next(walls))
    wall, start = users.clock_pair()
    assert wall == 2000.0 and start == pytest.approx(20.000005)


@pytest.mark.timing  # bounds of tens of ms: run alone (Makefile)
def test_streamed_request_times_tokens_and_gaps(stub_server):
    srv = stub_server("--token-delay", "0.02")
    recs = drive(OpenLoopUser, plan_config(srv.url, ONE, {"name": "t", "input": 16, "output": 5}), 2, 1.0)
    assert len(recs) == 1
    r = recs[0]
    assert r["status"] == "ok" and r["tokens_from"] == "usage" and r["completion_tokens"] == 5
    assert r["prompt_tokens"] == 8 and r["phase"] == "measured"
    # each gap is the stub's 20 ms give or take a late wake-up, which shortens the gap after it: the four together
    # keep the pace (with 0.015 s a gap, this test failed once in a timing run on 2026-12-03, the assertion not
    # kept, and passed in the seven runs after; a shortened gap is the likeliest on a noisy host)
    assert len(r["itl_s"]) == 4 and all(0.005 < g < 0.1 for g in r["itl_s"]) and 0.07 < sum(r["itl_s"]) < 0.2
    # one clock: due <= sent < first token < finished, and the durations agree with the timestamps
    assert r["scheduled_at"] <= r["sent_at"] < r["first_token_at"] < r["finished_at"]
    assert abs(r["ttft_s"] - (r["first_token_at"] - r["scheduled_at"])) < 1e-9
    assert abs(r["e2e_s"] - (r["finished_at"] - r["scheduled_at"])) < 1e-9
    assert abs(r["tpot_s"] - sum(r["itl_s"]) / 4) < 1e-6
    assert 0 <= r["dispatch_lag_s"] < 0.05
    assert r["e2e_s"] >= 0.08  # five tokens 20 ms apart, the first one after a 20 ms wait


@pytest.mark.timing  # bounds of tens of ms: run alone (Makefile)
def test_reasoning_tokens_count_as_first_token(stub_server):
    srv = stub_server("--token-delay", "0.03", "--reasoning", "3")
    r = drive(OpenLoopUser, plan_config(srv.url, ONE, {"name": "t", "input": 16, "output": 6}), 2, 1.0)[0]
    # the first reasoning delta arrives right away; content only after three more 30 ms gaps
    assert r["status"] == "ok" and r["ttft_s"] - r["dispatch_lag_s"] < 0.025
    assert len(r["itl_s"]) == 5


def test_without_usage_tokens_are_counted_chunks(stub_server):
    srv = stub_server("--no-usage")
    r = drive(OpenLoopUser, plan_config(srv.url, ONE, {"name": "t", "input": 16, "output": 7}), 2, 1.0)[0]
    assert r["status"] == "ok" and r["tokens_from"] == "chunks" and r["completion_tokens"] == 7
    assert r["prompt_tokens"] is None


def test_completions_api_and_non_streaming(stub_server):
    srv = stub_server()
    r = drive(OpenLoopUser, plan_config(srv.url, ONE, {"name": "t", "api": "completions", "input": 16,
                                                         "output": 3}), 2, 1.0)[0]
    assert r["status"] == "ok" and r["completion_tokens"] == 3 and r["ttft_s"] is not None
    r = drive(OpenLoopUser, plan_config(srv.url, ONE, stream=False), 2, 1.0)[0]
    assert r["status"] == "ok" and r["completion_tokens"] == 4 and r["first_token_at"] is None


def test_api_key_comes_from_the_named_env_var(stub_server, monkeypatch):
    srv = stub_server("--require-key", "s3cret")
    r = drive(OpenLoopUser, plan_config(srv.url, ONE), 2, 1.0)[0]
    assert r["error_kind"] == "http_401"
    monkeypatch.setenv("TEST_KEY", "s3cret")
    r = drive(OpenLoopUser, plan_config(srv.url, ONE, api_key_env="TEST_KEY"), 2, 1.0)[0]
    assert r["status"] == "ok" and "s3cret" not in repr(r)


def _one_fault(stub_server, fault: str, **cfg) -> dict:
    srv = stub_server("--faults", f"{fault}=1.0", "--tokens", "6", "--token-delay", "0.005")
    recs = drive(OpenLoopUser, plan_config(srv.url, ONE, {"name": "t", "input": 8, "output": 6}, **cfg), 2, 1.5)
    assert len(recs) == 1
    assert recs[0]["status"] == "error"
    return recs[0]


@pytest.mark.timing  # bounds of tens of ms: run alone (Makefile)
def test_error_kinds(stub_server):
    assert _one_fault(stub_server, "http_500")["error_kind"] == "http_500"
    assert _one_fault(stub_server, "malformed")["error_kind"] == "malformed_stream"
    assert _one_fault(stub_server, "close")["error_kind"] == "early_close"
    assert _one_fault(stub_server, "reset")["error_kind"] == "early_close"
    stalled = _one_fault(stub_server, "stall", timeout_s=0.4)
    assert stalled["error_kind"] == "timeout" and stalled["first_token_at"] is not None
    assert 0.4 <= stalled["e2e_s"] - stalled["dispatch_lag_s"] < 0.6


def test_connect_error_when_nothing_listens(stub_server):
    srv = stub_server()
    srv.kill()
    r = drive(OpenLoopUser, plan_config(srv.url, ONE), 2, 0.8)[0]
    assert r["status"] == "error" and r["error_kind"] == "connect"


@pytest.mark.timing  # bounds of tens of ms: run alone (Makefile)
def test_open_loop_sends_on_schedule_whatever_the_server_does(stub_server):
    """Coordinated omission: with every response taking 0.5 s, 20 req/s still go out at 20 req/s."""
    srv = stub_server("--token-delay", "0.1", "--tokens", "5")
    prof = {"name": "c", "type": "constant", "params": {"rate": 20, "duration": 1.0}}
    recs = drive(OpenLoopUser, plan_config(srv.url, prof, {"name": "t", "input": 8, "output": 5}), 40, 1.8)
    assert len(recs) == 20
    sent = sorted(r["sent_at"] for r in recs)
    assert sent[-1] - sent[0] < 1.0  # all sent within the second, although each takes 0.5 s
    assert max(r["dispatch_lag_s"] for r in recs) < 0.05
    assert len({r["request_id"] for r in recs}) == 20


def test_closed_loop_waits_for_each_answer(stub_server):
    srv = stub_server("--token-delay", "0.05", "--tokens", "4")
    cfg = plan_config(srv.url, CLOSED, {"name": "t", "input": 8, "output": 4}, duration_s=1.0)
    cfg["t0"] = time.time()
    recs = drive(ClosedLoopUser, cfg, 1, 1.3)
    ok = sorted((r for r in recs if r["status"] == "ok"), key=lambda r: r["sent_at"])
    assert 3 <= len(ok) <= 6  # ~0.2 s each, one at a time, for about a second
    for a, b in zip(ok, ok[1:], strict=False):
        assert b["sent_at"] >= a["finished_at"] - 1e-3
    assert all(r["dispatch_lag_s"] == 0 for r in ok)


def test_plain_locustfile(stub_server):
    """loadgen stays usable as a plain locustfile: `locust -f loadgen/locustfile.py ...`."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.loadgen.conftest import ROOT

    srv = stub_server()
    locust = str(Path(sys.executable).parent / "locust")
    # -t 15s: the 1 s schedule, its answers, and a slow machine's start of ten users
    proc = subprocess.run([locust, "-f", "loadgen/locustfile.py", "--headless", "--host", srv.url, "--model", "m",
                           "--cb-profile", "constant", "--cb-rate", "10", "--cb-duration", "1", "-u", "10", "-r",
                           "10", "-t", "15s", "--only-summary", "OpenLoopUser"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() + proc.stderr.splitlines() if "synthetic:chat" in x)
    assert line.split()[2] == "10" and line.split()[3].startswith("0")  # 10 requests, 0 failures


class _Buffered:
    """Just enough of a geventhttpclient response whose whole body has arrived (what responses.read_line reads)."""

    block_size = 4096
    message_complete = True
    _sock = None

    def __init__(self, data: bytes):
        self._body_buffer = bytearray(data)


def _sse(sep: bytes, *events: str) -> bytes:
    return b"".join(e.encode().replace(b"\n", sep[: len(sep) // 2]) + sep for e in events)


@pytest.mark.parametrize("sep", [b"\n\n", b"\r\n\r\n"])
def test_sse_parsing_line_endings_comments_and_usage(sep):
    from loadgen.responses import Stream

    s = Stream(time.perf_counter())
    s.read_sse(_Buffered(_sse(sep, ": keep-alive", 'event: message\ndata: {"choices":[{"delta":{"role":"assistant"}}]}',
                              'data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}',
                              'data: {"choices":[{"delta":{"content":"a"}}]}',
                              'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}',
                              "data: [DONE]")))
    assert s.chunks == 2 and len(s.gaps) == 1 and s.usage["completion_tokens"] == 2


@pytest.mark.parametrize("events,kind", [
    (['data: {"choices":[{"delta":{"content":"a"}}]}'], "early_close"),
    (["data: {nope"], "malformed_stream"),
    (['data: {"error":{"message":"overloaded"}}'], "stream_error"),
])
def test_sse_failures(events, kind):
    from loadgen.responses import RequestFailed, Stream

    with pytest.raises(RequestFailed) as e:
        Stream(time.perf_counter()).read_sse(_Buffered(_sse(b"\n\n", *events)))
    assert e.value.kind == kind


def test_concurrency_cap_queues_arrivals_in_the_client_as_bench_serving_does(stub_server):
    """20 req/s for 0.5 s with at most 2 in flight, each answer ~0.2 s: the arrivals keep their schedule, wait in
    arrival order for a slot, never more than 2 in flight; latencies count from the slot (bench_serving starts its
    clock inside its semaphore), the wait is slot_wait_s."""
    srv = stub_server("--token-delay", "0.05", "--tokens", "4")
    prof = {"name": "c", "type": "constant", "params": {"rate": 20, "duration": 0.5, "max_concurrency": 2}}
    recs = drive(OpenLoopUser, plan_config(srv.url, prof, {"name": "t", "input": 8, "output": 4}), 16, 1.7)
    ok = sorted((r for r in recs if r["status"] == "ok"), key=lambda r: r["sent_at"])
    assert len(ok) == 10
    for r in ok:  # at most 2 in flight when each was sent
        assert sum(1 for o in ok if o["sent_at"] <= r["sent_at"] < o["finished_at"]) <= 2
    assert [int(r["request_id"]) for r in ok] == sorted(int(r["request_id"]) for r in ok)  # in arrival order
    waits = [r["slot_wait_s"] for r in ok]
    assert waits[0] < 0.1 and waits[-1] > 0.3  # the last waited for the eight before it, two at a time
    for r in ok:  # identities, not bounds in ms: this test is not run alone (a busy host only shifts the clocks)
        due = r["scheduled_at"] + r["slot_wait_s"]
        assert r["sent_at"] - r["scheduled_at"] == pytest.approx(r["slot_wait_s"] + r["dispatch_lag_s"], abs=1e-6)
        assert r["ttft_s"] == pytest.approx(r["first_token_at"] - due, abs=1e-6)  # the answer alone, not the wait
        assert r["e2e_s"] == pytest.approx(r["finished_at"] - due, abs=1e-6)
        assert 0 <= r["dispatch_lag_s"] < 0.1


def test_slots_go_to_the_waiters_in_arrival_order():
    """A slot freed while others wait goes to the first of them, never to whoever asks next (gevent's own Semaphore
    would let the releasing greenlet take it straight back)."""
    import gevent

    from loadgen.users import Slots

    slots, order = Slots(1), []
    assert slots.take()

    def wait(name: str) -> None:
        slots.take()
        order.append(name)
        slots.give()

    waiters = [gevent.spawn(wait, n) for n in ("second", "third")]
    gevent.sleep(0)
    slots.give()
    assert not slots.take()  # the holder asks again at once: it queues behind the two
    order.append("first again")
    slots.give()
    gevent.joinall(waiters, timeout=1)
    assert order == ["second", "third", "first again"] and slots.free == 1 and not slots.waiting
    killed = gevent.spawn(slots.take)
    assert slots.take() and slots.free == 0  # the one free slot
    gevent.sleep(0)
    killed.kill()
    assert not slots.waiting  # a waiter killed in line leaves it


def test_a_nested_plans_measured_requests_are_the_workloads_first_whatever_its_warmup():
    from loadgen import workloads
    from loadgen.users import Plan

    wl = {"name": "agents", "type": "agentic_coding", "loop": "open", "system_tokens": 64, "concurrent_sessions": 4,
          "turns": 3,
          "input": 32, "output": 8, "tool_output": 32}
    prompts = {}
    for rate in (20.0, 26.0):
        prof = {"name": "poisson", "type": "poisson", "params": {"rate": rate, "duration": 2.0, "nested": True}}
        plan = Plan(plan_config("http://127.0.0.1:9", prof, wl, warmup_s=1.0))
        assert plan.warm_count == round(rate)
        prompts[rate] = [plan.request(i).body for i in range(plan.total)]
        warm, measured = prompts[rate][:plan.warm_count], prompts[rate][plan.warm_count:]
        assert measured[:40] == [workloads.from_dict(plan.config["workload"]).request(j).body for j in range(40)]
        assert not any(w in measured for w in warm)  # a warm-up request is never one of the measured ones
    assert prompts[20.0][20:] == prompts[26.0][26:26 + 40]  # the same measured requests at either rate
