"""How sure a measured figure is: 90 % intervals from repeated runs, and a gain's interval between two deployments.

A figure from N repeats is their mean with Student's t interval (90 %, two-sided); a gain a/b of two deployments
measured independently is exp(mean log a - mean log b) with the t interval of that difference (Welch's standard
error, the smaller side's degrees of freedom: conservative). One run gives no interval: the words say so. A gain
whose interval contains 1.0x is "not distinguishable" from no gain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LEVEL = 90
TWIN_BEHIND_OK = 0.05  # a twin that lost more of a stage's wall time than the sweep's 5 % resolution measured its host
# Student's t, 95th percentile (a two-sided 90 % interval), by degrees of freedom; the normal's beyond 30
T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812,
       12: 1.782, 15: 1.753, 20: 1.725, 30: 1.697}


def t95(df: int) -> float:
    if df >= 30:
        return 1.645 if df > 120 else 1.697
    return T95.get(df) or T95[max(k for k in T95 if k <= df)]


@dataclass(frozen=True)
class Interval:
    value: float
    low: float | None  # None: one run, no interval
    high: float | None
    n: int
    method: str

    @property
    def half_width(self) -> float | None:
        """The larger side, as a share of the value (+-10 % is 0.10)."""
        if self.low is None or self.high is None or not self.value:
            return None
        return max(self.high - self.value, self.value - self.low) / self.value

    def stated(self, spec: str = ".3g", suffix: str = "") -> str:
        """The figure, its interval and how it was found: "1.32x [1.21x-1.45x] (90 % bootstrap over 412 requests)"."""
        if self.low is None or self.high is None:
            return self.text(spec, suffix)
        return f"{self.text(spec, suffix)} ({self.method})"

    def text(self, spec: str = ".3g", suffix: str = "") -> str:
        if self.low is None or self.high is None:
            return f"{self.value:{spec}}{suffix} (1 run: no interval)"
        return f"{self.value:{spec}}{suffix} [{self.low:{spec}}-{self.high:{spec}}]"


def mean_interval(values: list[float]) -> Interval:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return Interval(mean, None, None, n, "one run")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    h = t95(n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - h, mean + h, n, f"{LEVEL} % t interval over {n} repeats")


def gain_interval(a: list[float], b: list[float]) -> Interval | None:
    """a / b, each from its repeats; None when either side has a zero (no rate within the SLO)."""
    if not a or not b or min(a) <= 0 or min(b) <= 0:
        return None
    la, lb = [math.log(v) for v in a], [math.log(v) for v in b]
    d = sum(la) / len(la) - sum(lb) / len(lb)
    if len(a) < 2 or len(b) < 2:
        return Interval(math.exp(d), None, None, min(len(a), len(b)), "one run")

    def var(xs: list[float]) -> float:
        m = sum(xs) / len(xs)
        return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)

    se = math.sqrt(var(la) / len(la) + var(lb) / len(lb))
    h = t95(min(len(a), len(b)) - 1) * se
    return Interval(math.exp(d), math.exp(d - h), math.exp(d + h), min(len(a), len(b)),
                    f"{LEVEL} % t interval of the log ratio over {len(a)} and {len(b)} repeats")


def gain_words(g: Interval | None) -> str:
    """What a gain's interval lets one say."""
    if g is None:
        return "no gain: a side has no rate within the SLO"
    if g.low is None or g.high is None:
        return "one run each: not known how sure (add repeats)" if g.method == "one run" else \
            f"not known how sure ({g.method})"
    if g.low <= 1.0 <= g.high:
        return "not distinguishable from no gain"
    return "a gain" if g.low > 1.0 else "a loss"


def behind_said(share: float | None) -> str:
    """A stage on a twin that fell more than TWIN_BEHIND_OK of its time behind, in words ("" when it kept up)."""
    if share is None or share <= TWIN_BEHIND_OK:
        return ""
    return (f"the twin fell {share:.0%} of the stage behind its modelled pace (this host's CPU, not the modelled "
            "GPU): its latencies are overstated, its rate understated")
