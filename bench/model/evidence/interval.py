"""How far to trust a predicted figure: an 80 % interval from the model's out-of-sample errors on the published
corpus, per regime, and the words to say when no published case resembles the deployment.

The evidence is validation.json's leave-one-source-out rows (each case predicted by factors fitted without its
organisation's cases). A residual is log(published / predicted). The interval of a prediction P is
P * exp(m + w * (q10 - m)) .. P * exp(m + w * (q90 - m)), with m, q10, q90 the median and the 10th and 90th
percentiles of all rows' residuals of that figure, and w = WIDEN[figure] * sqrt(1 + 2 / (n + 1)), n the rows of
the deployment's regime. So a regime with many published cases gets the corpus's spread, one with few a wider
one, one with none about 1.4x wider and a sentence saying so.

A regime is the GPU family, the attention kind (MLA, GQA), the routed experts' format (FP8, BF16, INT4) and the
load (latency-bound: at most LATENCY_BOUND requests running; a burst: more, all sent at once with no cap;
batch-bound: the rest). The load only labels coverage and adds words for bursts: width depends on the first
three. Why not each regime's own residuals: they cluster by source more than by regime
(on the corpus of 2026-12-01 a regime's own rows, leave one source out, covered 11-61 % of the left-out cases; the
pooled ones with a width for evidence, 75-85 %), so a regime's rows set how wide, all rows set the shape.

WIDEN is calibrated (calibrate()) so that, leaving each organisation out in turn and building intervals from the
others' rows only, 75-85 % of the left-out cases fall inside: coverage() measures that, `capbench validate` prints
it per figure and regime, and tests/bench/model/test_interval.py holds it in range.

Derived figures: the rate within the SLO and the output tok/s scale with the throughput residual; $ per 1M output
tokens with its inverse; instances and GPUs for a target load and $ a month follow from the rate's bounds.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from bench.model.fits import catalog
from bench.model.fits.capacity import weight_formats

if TYPE_CHECKING:
    from bench.model.evidence.corpus import Case
    from bench.model.serving.simulate import Point

LEVEL = 0.8
FIGURES = ("output_tok_s", "ttft_ms", "tpot_ms")
WIDEN = {"output_tok_s": 0.88, "ttft_ms": 0.89, "tpot_ms": 0.81}  # calibrate() on validation.json of the refit
LATENCY_BOUND = 4
THIN = 5  # fewer out-of-sample cases in a regime than this: said in words
HOURS_PER_MONTH = 730
FAMILY = {"a100-80gb": "Ampere", "h100-sxm": "Hopper", "h200": "Hopper", "b200": "Blackwell", "mi300x": "MI300X"}
# where the measurement a thin interval asks for comes from: a campaign file made for the plan's own question
# (bench/model/advice/campaign_file.py), never a fixed example of another model and GPU
MEASURE = ("measure before buying: `capbench plan ... --campaign FILE` writes a campaign file for this model, GPU, "
           "formats and load (the Planner and the report offer it as a download)")


@dataclass(frozen=True)
class Regime:
    family: str  # GPU family
    attention: str  # mla | gqa
    experts: str  # fp8 | bf16 | int4
    load: str = "batch"  # latency | batch | burst

    @property
    def kind(self) -> tuple[str, str, str]:
        """What sets the width (the load only labels coverage)."""
        return self.family, self.attention, self.experts

    def describe(self) -> str:
        return f"{self.experts.upper()} experts, {self.attention.upper()} on {self.family}"

    def label(self) -> str:
        return f"{self.describe()}, {'all at once' if self.load == 'burst' else self.load + '-bound'}"


def regime(model_id: str, gpu: str, weights: str, running: float | None = None, burst: bool = False) -> Regime:
    """burst: every request sent at once with no cap on those in flight."""
    m = catalog.model(model_id)
    experts = weight_formats(m, weights)[0].split("-")[0]
    load = "latency" if running is not None and running <= LATENCY_BOUND else "burst" if burst else "batch"
    return Regime(FAMILY.get(gpu, gpu), m.attention, experts, load)


def case_regime(c: Case) -> Regime:
    """A published case's regime, its load read from how its benchmark sent the requests."""
    w = c.workload
    running = (w.max_concurrency or w.num_prompts) if w else None
    burst = bool(w and w.max_concurrency is None and w.request_rate is not None and math.isinf(w.request_rate))
    return regime(c.model, c.gpu, c.weights, running, burst)


@dataclass(frozen=True)
class Row:
    """One out-of-sample case: its organisation, regime and residual per figure."""

    case: str
    org: str
    regime: Regime
    residual: dict


@dataclass(frozen=True)
class Band:
    """Multipliers on a prediction that bound its 80 % interval, and the evidence behind them."""

    figure: str
    low: float
    high: float
    cases: int  # out-of-sample rows of the regime
    regime: Regime

    def of(self, value: float) -> tuple[float, float]:
        return value * self.low, value * self.high


def rows_of(validation: dict | None, cases: dict) -> list[Row]:
    """validation.json's out-of-sample rows with their regimes (cases: corpus cases by key)."""
    out = []
    for r in (validation or {}).get("out_of_sample", {}).get("cases", []):
        c = cases.get(r["case"])
        if c is None or not r["errors"]:
            continue
        out.append(Row(r["case"], r["org"], case_regime(c), {f: -math.log1p(e) for f, e in r["errors"].items()}))
    return out


@cache
def shipped_rows() -> tuple[Row, ...]:
    from bench.model.evidence import corpus, fit

    return tuple(rows_of(fit.stored_validation(), {c.key: c for c in corpus.load()}))


@cache
def left_out() -> tuple[Regime, ...]:
    """The regime of each published case left out as anomalous (data/calibration/outliers.yaml)."""
    from bench.model.evidence import corpus, fit

    cases = {c.key: c for c in corpus.load()}
    out = []
    for key in fit.outliers():
        c = cases.get(key)
        if c is not None:
            out.append(case_regime(c))
    return tuple(out)


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    f = math.floor(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def band(figure: str, reg: Regime, rows: tuple[Row, ...] | list[Row] | None = None,
         widen: dict | None = None) -> Band | None:
    """The 80 % band of a figure in a regime; None when there is no out-of-sample row at all."""
    rows = shipped_rows() if rows is None else rows
    res = [r.residual[figure] for r in rows if figure in r.residual]
    if len(res) < 3:
        return None
    n = sum(1 for r in rows if r.regime.kind == reg.kind and figure in r.residual)
    m = statistics.median(res)
    w = (widen or WIDEN)[figure] * math.sqrt(1 + 2 / (n + 1))
    tail = (1 - LEVEL) / 2
    return Band(figure, math.exp(m + w * (_quantile(res, tail) - m)), math.exp(m + w * (_quantile(res, 1 - tail) - m)),
                n, reg)


def evidence(reg: Regime, rows: tuple[Row, ...] | None = None) -> str | None:
    """A sentence when the regime has no or few published cases, or when most of its own cases fall outside the
    band on one side (the pooled shape does not fit it), and for a burst what the published bursts' first tokens
    did; None otherwise."""
    rows = shipped_rows() if rows is None else rows
    said = [s for s in (_evidence(reg, rows), burst_evidence(reg, rows) if reg.load == "burst" else None) if s]
    return "; ".join(said) or None


def _evidence(reg: Regime, rows: tuple[Row, ...]) -> str | None:
    own = [r.residual["output_tok_s"] for r in rows if r.regime.kind == reg.kind and "output_tok_s" in r.residual]
    n = sum(1 for r in rows if r.regime.kind == reg.kind)
    k = sum(1 for x in left_out() if x.kind == reg.kind)
    also = (f"; {k} more published run{'s' if k > 1 else ''} of it {'are' if k > 1 else 'is'} left out of the "
            "evidence (data/calibration/outliers.yaml says why)") if k else ""
    if n < THIN:
        what = "no published evidence" if n == 0 else f"only {n} published case{'s' if n > 1 else ''}"
        return (f"{what} for {reg.describe()}{_delivered(own)}{also}: the interval is the corpus's spread widened; "
                f"{MEASURE}")
    b = band("output_tok_s", reg, rows)
    slower = [x for x in own if b and x < math.log(b.low)]
    faster = [x for x in own if b and x > math.log(b.high)]
    for side, word, worst, reach in ((slower, "slower", min, "down"), (faster, "faster", max, "up")):
        if len(side) * 2 >= len(own):
            return (f"{len(side)} of the {len(own)} published cases of {reg.describe()} delivered throughput "
                    f"{word} than even this interval allows ({reach} to {math.exp(worst(side)):.2f}x the prediction): "
                    f"the interval is the corpus's, not this regime's; {MEASURE}")
    return None


def burst_evidence(reg: Regime, rows: tuple[Row, ...] | None = None) -> str | None:
    """What the published all-at-once bursts' time to first token did against the model, whose burst waits only
    in the scheduler's queue after a fixed per-request overhead (docs/planning.md says what was checked)."""
    rows = shipped_rows() if rows is None else rows
    bursts = [r for r in rows if r.regime.load == "burst" and "ttft_ms" in r.residual]
    own = [r for r in bursts if r.regime.kind == reg.kind]
    pick, where = (own, reg.describe()) if len(own) >= THIN else (bursts, "any regime")
    b = band("ttft_ms", reg, rows)
    if not pick or b is None:
        return "no published all-at-once burst to check this burst's time to first token against"
    ratios = [math.exp(r.residual["ttft_ms"]) for r in pick]
    above = sum(1 for x in ratios if x > b.high)
    return (f"in the {len(pick)} published all-at-once bursts of {where} the time to first token was "
            f"{min(ratios):.2f}-{max(ratios):.2f}x the model's ({above} beyond this interval's upper end): what "
            "delays a burst's first tokens beyond the scheduler's queue is not modelled (docs/planning.md)")


def for_point(model_id: str, gpu: str, weights: str, point: Point, percentile: int,
              at_capacity: bool) -> dict | None:
    """80 % intervals on one simulated point (capbench simulate): TTFT and TPOT at the percentile and, where the
    point is at the deployment's capacity (all at once, or a sweep's highest rate within the SLO), its output tok/s,
    request rate and $ per 1M output tokens, which scale with the throughput error. Below capacity the offered
    load is served whatever the error, so those get none. None when the corpus gives no interval."""
    burst = math.isinf(point.rate)
    reg = regime(model_id, gpu, weights, point.mean_running, burst)
    tps, ttft, tpot = (band(f, reg) for f in FIGURES)
    if tps is None:
        return None
    out = {"level": LEVEL, "regime": reg.label(), "cases": tps.cases, "evidence": _evidence(reg, shipped_rows()),
           "burst_evidence": burst_evidence(reg) if burst else None, "percentile": percentile}
    if ttft:
        out["ttft_s"] = ttft.of(getattr(point, f"ttft_p{percentile}"))
    if tpot:
        out["tpot_s"] = tpot.of(getattr(point, f"tpot_p{percentile}"))
    if at_capacity:
        out["output_tps"] = tps.of(point.output_tok_s)
        out["rate_rps"] = tps.of(point.achieved_rps if burst else point.rate)
        out["usd_per_m_output"] = (point.usd_per_million / tps.high, point.usd_per_million / tps.low)
    return out


def _delivered(residuals: list[float]) -> str:
    """What a thin regime's own cases delivered against their predictions (a planner reads two cases that both
    came in at 0.6x differently from two on either side of 1x)."""
    if not residuals:
        return ""
    lo, hi = math.exp(min(residuals)), math.exp(max(residuals))
    said = f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"
    return f" ({'it' if len(residuals) == 1 else 'they'} delivered {said} the predicted throughput)"


def predicted_range(model_id: str, gpu: str, weights: str, figure: str, value: float,
                    running: float | None = None) -> tuple[float, float] | None:
    """The 80 % interval of one predicted figure (output_tok_s, or a rate that scales with it; ttft_ms; tpot_ms):
    the one function the plan, the Planner, the report and the campaign's predicted column call."""
    b = band(figure, regime(model_id, gpu, weights, running))
    return None if b is None else b.of(value)




def coverage(rows: list[Row] | tuple[Row, ...] | None = None, widen: dict | None = None) -> dict:
    """Leave one source out: each organisation's rows against bands built from the others' rows only. Per figure
    the share inside, and per regime label (hits, cases)."""
    rows = list(shipped_rows() if rows is None else rows)
    out: dict = {}
    for figure in FIGURES:
        hit = total = 0
        by: dict[str, list[int]] = {}
        for org in sorted({r.org for r in rows}):
            others = [r for r in rows if r.org != org]
            for r in rows:
                if r.org != org or figure not in r.residual:
                    continue
                b = band(figure, r.regime, others, widen)
                inside = b is not None and math.log(b.low) <= r.residual[figure] <= math.log(b.high)
                hit, total = hit + inside, total + 1
                cell = by.setdefault(r.regime.label(), [0, 0])
                cell[0], cell[1] = cell[0] + inside, cell[1] + 1
        if total:
            out[figure] = {"coverage": hit / total, "cases": total, "by_regime": by}
    return out


def calibrate(rows: list[Row] | tuple[Row, ...] | None = None, target: float = LEVEL) -> dict[str, float]:
    """Per figure the smallest WIDEN whose leave-one-source-out coverage reaches the target (a scan in 0.01 steps:
    coverage moves in jumps of one case)."""
    out = {}
    for figure in FIGURES:
        w = 0.5
        while w < 3 and coverage(rows, {**WIDEN, figure: w})[figure]["coverage"] < target:
            w += 0.01
        out[figure] = round(w, 2)
    return out
