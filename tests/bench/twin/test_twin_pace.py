"""The twin's scheduler loop keeps its modelled pace through the short stalls of a shared host (it makes them up on
its next steps) and owns up to the long ones (bench/twin/server.py, CATCH_UP_S)."""

import threading
import time

import httpx
import pytest

from bench.twin import TwinConfig, serve_in_thread
from bench.twin.server import CATCH_UP_S

TOKENS = 200


def _answer(handle, stalls_s: list[float]) -> tuple[float, float]:
    """Wall seconds of one non-streamed answer of TOKENS tokens into an emptied cache, the twin's loop held off the
    CPU for each of `stalls_s` (spread over the answer); and the wall seconds the loop reported lost meanwhile."""
    httpx.post(handle.url + "/flush_cache", timeout=10)
    behind0 = handle.twin.behind_s

    def stall() -> None:
        for k, s in enumerate(stalls_s):
            time.sleep(0.15 if k == 0 else 0.2)
            handle.loop.call_soon_threadsafe(time.sleep, s)  # the loop's thread does nothing else meanwhile

    t = threading.Thread(target=stall)
    began = time.perf_counter()
    t.start()
    r = httpx.post(handle.url + "/v1/completions", timeout=30, json={
        "model": "x", "prompt": "word " * 2000, "max_tokens": TOKENS, "ignore_eos": True})
    took = time.perf_counter() - began
    t.join()
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == TOKENS
    return took, handle.twin.behind_s - behind0


@pytest.mark.timing
def test_short_stalls_are_made_up_and_a_long_one_is_not():
    """Three 12 ms stalls (a 2-core host shared with the load generator has many): the answer is done when it would
    have been without them, give or take the scheduler's own jitter, and nothing is reported lost. With the 5 ms
    limit this loop had before, each was lost: 36 ms later, and a 30x twin's modelled clock ran 5-9 % slow in a
    campaign stage. An 80 ms stall is past CATCH_UP_S: the loop does not rush 80 ms of steps out at once, and the
    lost time is reported (a campaign stage then says its latencies are the host's CPU)."""
    assert 0.012 < CATCH_UP_S < 0.080
    with serve_in_thread(TwinConfig(model="glm-4.6", time_scale=4)) as h:
        calm = sorted(_answer(h, [])[0] for _ in range(3))[1]
        took, lost = _answer(h, [0.012, 0.012, 0.012])
        assert took > 0.6, took  # the answer outlasts the stalls: they fell inside it
        print(f"answer alone {calm * 1e3:.0f} ms, with 3 x 12 ms stalls {took * 1e3:.0f} ms, lost {lost * 1e3:.1f} ms")
        assert lost < 0.005 and took - calm < 0.020, (took, calm, lost)
        took_long, lost_long = _answer(h, [0.080])
        print(f"with one 80 ms stall {took_long * 1e3:.0f} ms, lost {lost_long * 1e3:.1f} ms")
        assert lost_long > 0.070 and took_long - calm > 0.060, (took_long, calm, lost_long)
