"""How noisy this host is right now, for the tests that bound latencies to the millisecond.

CI's machines are sometimes 2-3x slower than usual and lose the CPU for milliseconds at a time (steal, a 1 ms
scheduler tick). A timing test asserts its product claim on a quiet host and, on a noisy one, a bound widened by
what the host itself measured a moment before (still far tighter than any real regression): it prints which.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

LOOP_REFERENCE_S = 0.13  # 2e6 Python additions on these machines' quiet days (1.6 s for 1e7 on the slow one)
ECHO = "import os\nwhile True:\n    b = os.read(0, 1)\n    if not b:\n        break\n    os.write(1, b)\n"


@dataclass(frozen=True)
class HostNoise:
    slowdown: float  # Python's speed against a quiet day's (1.0 = as fast)
    wake_p50_ms: float  # a round trip to another process through a pipe: two wake-ups
    wake_p99_ms: float

    @property
    def quiet(self) -> bool:
        return self.slowdown < 1.3 and self.wake_p99_ms < 1.0

    def __str__(self) -> str:
        return (f"host {'quiet' if self.quiet else 'noisy'}: Python x{self.slowdown:.2f} slower than a quiet day, "
                f"a pipe round trip p50 {self.wake_p50_ms:.3f} ms, p99 {self.wake_p99_ms:.3f} ms")


def measure(trips: int = 300) -> HostNoise:
    best = float("inf")
    for _ in range(3):
        t, s = time.perf_counter(), 0
        for i in range(2_000_000):
            s += i
        best = min(best, time.perf_counter() - t)
    # pipes of our own, blocking (a gevent-patched process's subprocess pipes are not): to the echo and back
    to_echo, from_us = os.pipe()
    to_us, from_echo = os.pipe()
    echo = subprocess.Popen([sys.executable, "-c", ECHO], stdin=to_echo, stdout=from_echo)
    os.close(to_echo)
    os.close(from_echo)
    rtt = []
    try:
        os.write(from_us, b"x")
        os.read(to_us, 1)  # started
        for _ in range(trips):
            t = time.perf_counter()
            os.write(from_us, b"x")
            os.read(to_us, 1)
            rtt.append(time.perf_counter() - t)
            time.sleep(0.002)
    finally:
        echo.kill()  # not EOF: a gevent-patched process's child may hold our end too
        echo.wait(timeout=10)
        os.close(from_us)
        os.close(to_us)
    ms = np.array(rtt) * 1e3
    return HostNoise(best / LOOP_REFERENCE_S, float(np.percentile(ms, 50)), float(np.percentile(ms, 99)))
