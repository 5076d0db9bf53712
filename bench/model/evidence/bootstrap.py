"""How sure one sweep is: a bootstrap over the requests of its stages (90 %, percentile method).

Each stage's requests are resampled with replacement (DRAWS times, seeded) and the stage judged again as
bench/campaign/stage.py judges it: the p-th percentile of each bound from the judged requests (a cut-off one past
every bound), and at most RUN_ERRORS_OK of them errored. Per draw, the sweep's highest rate within the SLO is the
highest rate that holds below the lowest one that misses, and the first rate past it is that lowest miss: the two
bracket ends the figure can move between. The rate's interval runs from the 5th percentile of the lower end to the
95th of the upper one, so it is never narrower than the bracket (the sweep did not look inside it): that is how a
rate from one bracket gets an interval. The stages are judged on the SLO alone here; the sweep's own stop when goodput
stops rising is not replayed. Goodput (rate x share within the SLO) and $ per 1M output tokens (at that stage's
output tokens/s) are taken at each draw's highest rate within the SLO. A gain a/b takes both deployments' draws
side by side: lower end a_low / b_high, upper end a_high / b_low, again 5th and 95th percentiles.

Stages that sent the same requests (a campaign's sweep: common requests, bench/campaign/run.py) are resampled
alike: a draw weighs request j the same (Poisson(1) weights from the prompts' seed and j) in every stage and every
deployment it was sent to, so the draws keep what the design holds fixed (a faster stage never holds on requests
on which a slower one missed; a gain compares the deployments on the same requests). Stages with requests of their
own are resampled apart (multinomial).

What it does not see: run-to-run differences that a request's resampling cannot show (a server's warm-up, a noisy
host). With repeats, the interval is the wider of this one (each draw the mean over repeats) and the t interval
over the repeats (bench/model/evidence/confidence.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bench.model.evidence.confidence import Interval, gain_interval

LEVEL = 90
DRAWS = 1000
SURE = 0.97  # a stage whose verdict stands in this share of draws anchors a sweep's interval (its lower end
# needs the lowest stage to hold in more than 95 % of draws)
FAR = 1e9  # a cut-off request's latency: past any bound (as bench/campaign/stage.py counts it)


@dataclass(frozen=True)
class StageSample:
    """One stage's requests as its judgement needs them (one entry per request sent)."""
    rate: float  # offered, requests/s of the modelled GPUs
    judged: np.ndarray  # bool: ok or cut off (not errored)
    within: np.ndarray  # bool: ok and within every bound
    over: np.ndarray  # bool (requests, bounds): judged and past that bound (a cut-off one: past all)
    out_tokens: np.ndarray  # output tokens (0 for a request without an answer)
    output_tps: float  # the stage's measured output tokens/s (modelled GPUs)
    index: np.ndarray | None = None  # each request's place in the prompts of `seed` (shared with other stages)
    seed: int | None = None  # None: the stage's requests are its own


def stage_sample(rate: float, status_ok: np.ndarray, cut_off: np.ndarray, latencies: np.ndarray,
                 bounds: tuple[float | None, ...], out_tokens: np.ndarray, output_tps: float,
                 index: np.ndarray | None = None, seed: int | None = None) -> StageSample:
    """`latencies`: (requests, bounds) as measured (NaN where none), in the order of `bounds` (None: no bound);
    `index` and `seed`: where the stage sent the same prompts as others (common requests), which they are."""
    judged = status_ok | cut_off
    lat = np.where(cut_off[:, None], FAR, np.nan_to_num(latencies, nan=0.0))
    limit = np.array([FAR if b is None else b for b in bounds], dtype=float)
    over = judged[:, None] & (lat > limit)
    within = status_ok & ~over.any(axis=1)
    return StageSample(rate, judged, within, over, np.nan_to_num(out_tokens.astype(float)), output_tps,
                       None if index is None or seed is None else np.asarray(index, dtype=np.int64), seed)


def weights(s: StageSample, rng: np.random.Generator, draws: int, boot_seed: int = 0) -> np.ndarray:
    """(draws, requests): how many times each request is drawn. A stage of its own: multinomial (resampling its n
    requests). Stages that sent the same requests (the same `seed`): Poisson(1) weights per request, drawn from the
    seed and the request's place, so each draw weighs request j alike in every such stage, in every deployment that
    was sent them (a paired bootstrap: what differs between those stages is the rate and the server, not the draw)."""
    n = len(s.judged)
    if s.index is None or s.seed is None:
        picks = rng.integers(0, n, size=(draws, n)) + np.arange(draws)[:, None] * n
        return np.bincount(picks.ravel(), minlength=draws * n).reshape(draws, n).astype(float)
    # row j is request j's weights in every draw: the same rows whatever the stage's count (a prefix of more)
    table = np.random.default_rng([boot_seed, s.seed]).poisson(1.0, size=(int(s.index.max()) + 1, draws))
    return table[s.index].T.astype(float)


@dataclass(frozen=True)
class Draws:
    """A sweep's figures in each bootstrap draw (arrays of DRAWS)."""
    low: np.ndarray  # highest rate within the SLO (0: none held)
    high: np.ndarray  # first rate past it (the low end when none missed: a lower bound)
    goodput: np.ndarray
    output_tps: np.ndarray  # at the highest rate within the SLO (0: none)
    requests: int


def _judge(s: StageSample, percentile: int, errors_ok: float, rng: np.random.Generator, draws: int,
           boot_seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per draw: does the stage hold, its share within the SLO, its output tokens/s."""
    if len(s.judged) == 0:
        return np.zeros(draws, bool), np.zeros(draws), np.zeros(draws)
    w = weights(s, rng, draws, boot_seed)
    total = w.sum(axis=1)
    judged = w @ s.judged
    over = w @ s.over  # (draws, bounds)
    # p-th percentile <= bound  <=>  at most m - ceil(m p) of the m judged requests are past it (quantile_disc)
    allowed = judged - np.ceil(judged * percentile / 100 - 1e-9)
    errored = np.divide(total - judged, total, out=np.ones(draws), where=total > 0)
    holds = (errored <= errors_ok) & (over <= allowed[:, None]).all(axis=1) & (judged > 0)
    share = np.divide(w @ s.within, judged, out=np.zeros(draws), where=judged > 0)
    mean_out = s.out_tokens.mean()
    tps = s.output_tps * np.divide(w @ s.out_tokens, total * mean_out, out=np.zeros(draws), where=total > 0) \
        if mean_out else np.zeros(draws)
    return holds, share, tps


def verdict_share(s: StageSample, percentile: int, errors_ok: float, meets: bool, seed: int = 0,
                  draws: int = DRAWS) -> float:
    """The share of bootstrap draws in which the stage's verdict (meets the SLO or not) is the same as measured."""
    holds = _judge(s, percentile, errors_ok, np.random.default_rng(seed), draws, seed)[0]
    return float(np.mean(holds == meets))


def sweep_draws(stages: list[StageSample], percentile: int, errors_ok: float, seed: int = 0,
                draws: int = DRAWS) -> Draws:
    """The sweep's figures per draw, its stages (any order) resampled as weights() says: alike where they sent the
    same requests, apart otherwise."""
    rng = np.random.default_rng(seed)
    order = sorted(range(len(stages)), key=lambda k: stages[k].rate)
    rates = np.array([stages[k].rate for k in order])
    judged = [_judge(stages[k], percentile, errors_ok, rng, draws, seed) for k in order]
    holds = np.stack([j[0] for j in judged], axis=1)  # (draws, stages), rates ascending
    share = np.stack([j[1] for j in judged], axis=1)
    tps = np.stack([j[2] for j in judged], axis=1)
    missed = ~holds
    first_miss = np.where(missed.any(axis=1), missed.argmax(axis=1), len(rates))  # index of the lowest miss
    below = holds & (np.arange(len(rates))[None, :] < first_miss[:, None])
    has = below.any(axis=1)
    best = np.where(has, len(rates) - 1 - below[:, ::-1].argmax(axis=1), 0)  # highest hold below it
    rows = np.arange(draws)
    low = np.where(has, rates[best], 0.0)
    high = np.where(first_miss < len(rates), rates[np.minimum(first_miss, len(rates) - 1)], low)
    return Draws(low, high, np.where(has, low * share[rows, best], 0.0), np.where(has, tps[rows, best], 0.0),
                 sum(len(s.judged) for s in stages))


def mean_draws(repeats: list[Draws]) -> Draws:
    """The mean over repeats, draw by draw (each repeat resampled on its own)."""
    return Draws(*(np.mean([getattr(d, f) for d in repeats], axis=0) for f in ("low", "high", "goodput",
                                                                                "output_tps")),
                 sum(d.requests for d in repeats))


def method(requests: int) -> str:
    return f"{LEVEL} % bootstrap over {requests:,} requests"


def interval(low_ends: np.ndarray, high_ends: np.ndarray | None = None) -> tuple[float, float]:
    """5th percentile of the low ends, 95th of the high ends (the same draws for both when high_ends is None)."""
    tail = (100 - LEVEL) / 2
    high_ends = low_ends if high_ends is None else high_ends
    return float(np.percentile(low_ends, tail)), float(np.percentile(high_ends, 100 - tail))


def gain(a_low: np.ndarray, a_high: np.ndarray, b_low: np.ndarray, b_high: np.ndarray
         ) -> tuple[float, float] | None:
    """The interval of a / b from two deployments' draws (independent: each drew its own requests); None when the
    baseline held no rate in more than the interval's tail of draws (no upper end)."""
    tail = (100 - LEVEL) / 200
    if np.mean(b_low <= 0) > tail:
        return None
    lows = np.divide(a_low, b_high, out=np.zeros(len(a_low)), where=b_high > 0)
    highs = np.divide(a_high, b_low, out=np.full(len(a_high), math.inf), where=b_low > 0)
    return interval(lows, highs)


def cell_gain(cell: dict, base: dict) -> Interval | None:
    """A campaign cell's gain over its baseline's (the highest rate within the SLO): the ratio of the measured
    figures (with repeats, of their geometric means) and its interval: the bootstrap's when both cells kept their
    draws, the wider of it and the t interval of the log ratio when there are repeats; None when either has no rate
    within the SLO."""
    t = gain_interval(cell.get("repeats_rps") or [cell["measured_rps"]],
                      base.get("repeats_rps") or [base["measured_rps"]])
    if t is None or not cell.get("boot_low") or not base.get("boot_low"):
        return t
    ends = gain(*(np.array(x[k], dtype=float) for x in (cell, base) for k in ("boot_low", "boot_high")))
    how = (f"{LEVEL} % bootstrap over {cell.get('boot_requests', 0):,} and {base.get('boot_requests', 0):,} "
           "requests, the brackets' ends included"
           + (", paired: both were sent the same requests" if cell.get("boot_paired") and base.get("boot_paired")
              else ""))
    if ends is None:
        return Interval(t.value, None, None, t.n, f"{how}: the baseline held no rate in too many draws")
    return wider(t, ends, how)


def wider(t: Interval, ends: tuple[float, float], how: str) -> Interval:
    """The bootstrap's interval `ends` (found `how`) around t's value; with repeats, the wider of it and t's."""
    lo, hi = min(ends[0], t.value), max(ends[1], t.value)
    if t.low is None or t.high is None:
        return Interval(t.value, lo, hi, t.n, how)
    return Interval(t.value, min(lo, t.low), max(hi, t.high), t.n, f"the wider of {t.method} and {how}")
