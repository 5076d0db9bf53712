"""The client's clock: sleeping until a request is due, reading wall and monotonic time as one instant, and a
concurrency cap's slots (arrivals wait in line)."""

from __future__ import annotations

import time
from collections import deque

import gevent
from gevent.event import Event


class Slots:
    """At most n requests in flight; an arrival that finds none free waits, and slots go to the waiters in arrival
    order. A freed slot is handed to the first waiter directly: gevent's Semaphore lets whoever asks next take a slot
    freed before its waiter wakes (a later arrival would jump the queue); asyncio's, which bench_serving uses, does
    not."""

    def __init__(self, n: int):
        self.free = n
        self.waiting: deque[Event] = deque()

    def take(self) -> bool:
        """Take a slot, waiting in line if none is free; True when one was free at once."""
        if self.free > 0 and not self.waiting:
            self.free -= 1
            return True
        turn = Event()
        self.waiting.append(turn)
        try:
            turn.wait()
        except BaseException:  # killed while waiting: leave the line, or hand on the slot it was just given
            if turn.is_set():
                self.give()
            else:
                self.waiting.remove(turn)
            raise
        return False

    def give(self) -> None:
        if self.waiting:
            self.waiting.popleft().set()
        else:
            self.free += 1


def _slots(cap: int | None, workers: int, index: int) -> Slots | None:
    """This process's share of the run's concurrency cap (the cap split evenly over the worker processes)."""
    if not cap:
        return None
    return Slots(max(1, int(cap) // workers + (1 if index < int(cap) % workers else 0)))


SPIN_S = 0.001  # libev rounds a timer's wait up to whole milliseconds: the last one is spent yielding instead


def clock_pair() -> tuple[float, float]:
    """time.time() and perf_counter() of one instant. Every timestamp of a request is the pair's time.time() plus a
    perf_counter() delta, so a preemption between the two reads (a busy host's 1 ms scheduler tick) would move them
    all, the first token to before the server made it; a read that straddles one is taken again."""
    for _ in range(5):
        before = time.perf_counter()
        wall = time.time()
        after = time.perf_counter()
        if after - before < 50e-6:
            break
    return wall, (before + after) / 2


def wait_until(due: float) -> None:
    """Sleep until `due` (time.time()) to within tens of microseconds on an idle machine: a gevent timer to about a
    millisecond before, then yields to the other greenlets (gevent.sleep(0)) until the time has come."""
    if (delay := due - time.time() - SPIN_S) > 0:
        gevent.sleep(delay)
    while time.time() < due:
        gevent.sleep(0)


