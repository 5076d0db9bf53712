"""A/B on the same problems: is B's pass rate lower than A's, by how much, and does a gate hold?

Each problem was answered by both endpoints, so the outcomes are paired: only the discordant problems (one passed,
the other failed) carry information about the difference. The difference B - A is given in points (percentage
points of pass rate) with a 90 % interval by Agresti and Min's adjusted Wald for paired proportions (half a problem
added to each cell of the 2x2 table: Biometrics 61(2), 2005), which stays honest when few problems disagree (with
none, it is wide at small N, not [0, 0]); the two-sided p-value is McNemar's exact test, scipy.stats.binomtest on
the discordant pairs. A gate "no drop larger than D points" passes when the whole interval lies above -D, fails
when the whole interval lies below -D, and is otherwise inconclusive, with about how many more problems would
decide at the same spread (the interval narrows as 1/sqrt(N)).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.90
Z = statistics.NormalDist().inv_cdf(0.5 + LEVEL / 2)


@dataclass(frozen=True)
class Paired:
    n: int  # problems both endpoints answered (errors on either side are left out)
    a_passed: int
    b_passed: int
    a_only: int  # A passed, B failed
    b_only: int  # B passed, A failed
    diff: float  # B - A, points
    low: float  # 90 % interval of the difference, points
    high: float
    p_value: float  # McNemar exact, two-sided
    method: str = "paired: Agresti-Min 90 % interval, McNemar exact p"

    @property
    def a_rate(self) -> float:
        return 100 * self.a_passed / self.n if self.n else math.nan

    @property
    def b_rate(self) -> float:
        return 100 * self.b_passed / self.n if self.n else math.nan

    def said(self) -> str:
        """'-0.6 points [-2.4, +1.2]' as every report writes a difference."""
        return f"{self.diff:+.1f} points [{self.low:+.1f}, {self.high:+.1f}]"


def paired_difference(a: Sequence[bool], b: Sequence[bool]) -> Paired:
    """The paired comparison of two endpoints' outcomes on the same problems, in the same order."""
    if len(a) != len(b):
        raise ValueError(f"paired outcomes of different lengths: {len(a)} and {len(b)}")
    n = len(a)
    a_only = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    b_only = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    a_passed, b_passed = sum(map(bool, a)), sum(map(bool, b))
    if n == 0:
        return Paired(0, 0, 0, 0, 0, math.nan, math.nan, math.nan, math.nan)
    diff = (b_passed - a_passed) / n
    c, d, m = b_only + 0.5, a_only + 0.5, n + 2  # Agresti-Min: half a problem in each cell
    adj = (c - d) / m
    se = math.sqrt(max((c + d) - (c - d) ** 2 / m, 0.0)) / m
    discordant = a_only + b_only
    from scipy import stats  # here: `import bench.model` stays quick

    p = stats.binomtest(b_only, discordant, 0.5).pvalue if discordant else 1.0
    return Paired(n, a_passed, b_passed, a_only, b_only, 100 * diff, 100 * (adj - Z * se), 100 * (adj + Z * se),
                  float(p))


@dataclass(frozen=True)
class Verdict:
    status: str  # passed | failed | inconclusive
    words: str
    more_problems: int | None = None  # inconclusive: about how many more problems would decide


def drop_gate(p: Paired, max_drop: float = 2.0) -> Verdict:
    """'No drop larger than max_drop points': passed when the interval excludes such a drop, failed when it holds
    nothing else, otherwise inconclusive with about how many more problems would decide."""
    bar = -abs(max_drop)
    if p.n == 0:
        return Verdict("inconclusive", "inconclusive: no problem was answered by both endpoints")
    if p.low > bar:
        return Verdict("passed", f"passed: {p.said()} excludes a drop larger than {abs(bar):g} points")
    if p.high < bar:
        return Verdict("failed", f"failed: {p.said()} holds only drops larger than {abs(bar):g} points")
    centre, half = (p.low + p.high) / 2, (p.high - p.low) / 2
    gap = abs(centre - bar)
    if gap < 1e-9 or half <= 0:
        return Verdict("inconclusive", f"inconclusive: {p.said()} is centred on the {abs(bar):g}-point bar; no "
                                       "number of problems would decide at this difference")
    more = max(1, math.ceil(p.n * (half / gap) ** 2) - p.n)
    return Verdict("inconclusive", f"inconclusive: {p.said()} straddles -{abs(bar):g} points; about {more:,} more "
                                   "problems would decide at the same spread", more)
