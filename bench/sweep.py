"""The sweep to saturation: the one search for the highest rate within the SLO (a campaign's sweep, its model's
answer to the same sweep, and `capbench run --profile sweep` (bench/load_sweep.py) use it).

Offer rates start, start x factor, ... while each stage meets the SLO and goodput (offered rate x share within the
SLO) keeps rising by min_gain; if even the first rate misses, go down by the factor until one holds. Then bisect
(geometric mean) between the last rate within the SLO and the first past it until that bracket is at most
`resolution` wide (5 %: a gain between two deployments then moves in steps of at most 5 %, not the factor's 25 %),
or `refine` bisections were made. A ladder (a list of rates) replaces start x factor^k on the way up. The figure
is the last rate within the SLO; the bracket says how fine it is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class StagePoint(Protocol):
    rate: float
    meets: bool
    why: str
    sure: bool  # its verdict would stand on a resample of its requests (a measured stage; a modelled one always)

    @property
    def goodput(self) -> float: ...


@dataclass(frozen=True)
class Search:
    start: float
    factor: float = 1.5
    max_stages: int = 8
    refine: int = 6  # most bisections
    min_gain: float = 0.05
    resolution: float = 0.05  # bisect until the first rate past the SLO is within this of the last within it
    ladder: tuple[float, ...] = ()  # rates to climb instead of start x factor^k (capbench run's `rates`/`factors`)
    anchor: bool = True  # one more stage a factor below the lowest one when that held only just (not `sure`)


@dataclass
class Found:
    stages: list
    best: StagePoint | None  # the highest rate within the SLO
    past: float | None  # the lowest rate found past it (None: not found within max_stages)
    why: str  # what stopped the search

    @property
    def bracket(self) -> float | None:
        """How wide the bracket is: past / best - 1 (None when one end is missing)."""
        return self.past / self.best.rate - 1 if self.best is not None and self.past else None


def sweep(stage: Callable[[float], StagePoint], search: Search) -> Found:
    stages: list = []
    best: StagePoint | None = None
    bad: float | None = None
    why = "search limit"
    rate = search.ladder[0] if search.ladder else search.start
    while len(stages) < search.max_stages:
        s = stage(rate)
        stages.append(s)
        if not s.meets:
            bad, why = rate, f"SLO broke at {rate:.3g} req/s ({s.why})"
            if best is not None or search.ladder:
                break  # a ladder's first rung already misses: nothing below it was asked for
            rate /= search.factor  # even the first rate misses: go down until one holds
            continue
        if best is not None and s.goodput < best.goodput * (1 + search.min_gain):
            bad, why = rate, f"goodput stopped rising at {rate:.3g} req/s"
            break
        best = s
        if bad is not None:
            break  # came down from a miss to a rate that holds
        if search.ladder:
            if len(stages) >= len(search.ladder):
                break
            rate = search.ladder[len(stages)]
        else:
            rate *= search.factor
    made = 0
    while (best is not None and bad is not None and bad > best.rate * (1 + search.resolution)
           and made < search.refine):
        mid = math.sqrt(best.rate * bad)
        s = stage(mid)
        stages.append(s)
        made += 1
        if s.meets and s.goodput >= best.goodput:
            best = s
        else:
            bad = mid
    lowest = min(stages, key=lambda x: x.rate)
    if best is not None and lowest.meets and not lowest.sure and search.anchor:
        # the lowest rate held only just: one rate a factor below anchors the figure's interval (without a rate
        # that surely holds, a bootstrap over the requests cannot give its lower end)
        stages.append(stage(lowest.rate / search.factor))
    return Found(stages, best, bad if best is not None and bad is not None and bad > best.rate else None, why)
