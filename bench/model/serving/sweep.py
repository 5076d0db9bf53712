"""`capbench simulate --sweep`: the grid of Poisson rates a curve draws, and the answer at its top, the highest rate
within the SLO, from the one search `capbench plan` uses (rate.search_rate), so both print the same rate."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from bench.model.fits.capacity import Deployment
from bench.model.serving import simulate
from bench.model.serving.rate import search_rate, within_slo
from bench.model.serving.simulate import GRID, MIN_SECONDS, Sweep, run
from bench.model.serving.slo import Slo
from bench.model.serving.workload import Workload
from bench.model.step.calibration import Efficiency

EXTEND = 6  # grid points past 1.5x the all-at-once rate while the SLO still holds


def sweep(dep: Deployment, wl: Workload, slo: Slo, n: int = 1000, seed: int = 0, eff: Efficiency | None = None,
          progress: Callable[[], None] | None = None, min_seconds: float = MIN_SECONDS) -> Sweep:
    """All requests at once (its achieved rate scales the grid), then GRID x that rate (extended by 1.5x steps while
    the SLO holds); the best point is the simulation at search_rate's answer, with this sweep's requests and seed."""
    tick = progress or (lambda: None)
    sat = run(dep, wl, math.inf, n, seed, eff)
    sat.meets_slo = within_slo(sat, slo)
    points = []
    for frac in GRID:
        points.append(_at(dep, wl, slo, sat.achieved_rps * frac, n, seed, eff, min_seconds))
        tick()
    rate = points[-1].rate
    for _ in range(EXTEND):  # steady state can outrun the all-at-once run: go on until the SLO breaks
        if not points[-1].meets_slo:
            break
        rate *= 1.5
        points.append(_at(dep, wl, slo, rate, n, seed, eff, min_seconds))
    answer = search_rate(dep, wl, slo, eff, tick)
    if answer is None or answer.rate_rps <= 0:
        return Sweep(dep.kv_dtype, sat, points, None, None, slo)
    best = _at(dep, wl, slo, answer.rate_rps, n, seed, eff, min_seconds)
    return Sweep(dep.kv_dtype, sat, points, answer.rate_rps, best, slo)


def _at(dep: Deployment, wl: Workload, slo: Slo, rate: float, n: int, seed: int, eff: Efficiency | None,
        min_seconds: float) -> simulate.Point:
    p = run(dep, wl, rate, n, seed, eff, min_seconds)
    p.meets_slo = within_slo(p, slo)
    return p


def compare_kv(dep: Deployment, wl: Workload, slo: Slo, n: int = 1000, seed: int = 0,
               eff: Efficiency | None = None, progress: Callable[[], None] | None = None,
               min_seconds: float = MIN_SECONDS) -> list[Sweep]:
    return [sweep(replace(dep, kv_dtype=kv), wl, slo, n, seed, eff, progress, min_seconds=min_seconds)
            for kv in ("bf16", "fp8_e4m3")]
