"""Waits in closed form, for the analytic PD model (disagg.py): a prefill queue (M/M/1), and a client's
concurrency cap in front of an instance: requests arrive as a Poisson stream, wait in the client for one of `slots`
free slots, and hold it for `hold_s` (first token, then every output token). That wait counts in the TTFT the SLO
judges, as the simulated colocated search counts it (rate.py)."""

from __future__ import annotations

import math


def mm1_wait_quantile(service_s: float, rho: float, q: float) -> float:
    """The q-quantile of the wait in an M/M/1 queue at utilization rho with this mean service time."""
    if rho <= 1 - q:
        return 0.0
    return service_s / (1 - rho) * math.log(rho / (1 - q))


def slot_wait_quantile(rate: float, slots: int, hold_s: float, q: float) -> float:
    """The q-quantile of the wait for a slot: M/M/c (Erlang C). A hold closer to constant waits less, so this
    errs long."""
    a = rate * hold_s
    if a >= slots:
        return math.inf
    b = 1.0  # Erlang B by its stable recursion, then C from it
    for k in range(1, slots + 1):
        b = a * b / (k + a * b)
    c = slots * b / (slots - a * (1 - b))
    if c <= 1 - q:
        return 0.0
    return math.log(c / (1 - q)) / (slots / hold_s - rate)


def capped_rate(slots: int, hold_s: float, ttft_s: float, ttft_bound: float | None, q: float) -> float:
    """The highest rate at which the wait for a slot plus the instance's own TTFT stays within the bound (just under
    slots / hold_s without one)."""
    top = slots / hold_s * 0.999
    if ttft_bound is None:
        return top
    if ttft_s > ttft_bound:  # no wait at all is already too late
        return 0.0
    lo, hi = 0.0, top
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ttft_s + slot_wait_quantile(mid, slots, hold_s, q) <= ttft_bound else (lo, mid)
    return lo
