"""Fit the performance model's efficiency factors to measured runs, so the twin, simulate, the planner and the
reports predict what a real deployment does.

Each run is replayed in virtual time through the same scheduler and performance model the twin uses: its
requests arrive when they were due, with the prompt tokens the server counted (less those it served from its
prefix cache) and the output tokens it produced. The replay's TTFT and TPOT medians and p90s and its output
throughput are compared with the measured ones; scipy's bounded robust least squares (soft-L1 loss on
log(predicted / measured), from several starts) fits the factors that GPU's model rests on: on a GPU with kernel
tables the scale of the measured kernel latencies, the per-kernel cost of the kernels no table times and the step
overhead; on another GPU the roofline's bandwidth and compute efficiencies with the same two fixed costs. Each
fitted factor's uncertainty (one standard error, from the Jacobian at the optimum) is reported beside it. A run
measured against a twin is scaled back by the twin's time_scale first, so a twin run stands for the GPU deployment
it models.

Not replayed: which requests shared a prefix (their cached tokens are taken off the prompt instead, so the
replay's KV use is a little low), and client-side queueing before a request was sent.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from bench import files
from bench.errors import BadInput
from bench.model import Deployment, Efficiency, Request, kernels, load_efficiency, parse_spec, simulate
from bench.store import Store

ROOFLINE = ("hbm_eff", "bf16_eff", "kernel_us", "step_overhead_ms")
KERNEL = ("kernel_scale", "kernel_us", "step_overhead_ms")
FITTED = ROOFLINE  # kept for callers that list the roofline's factors
METRICS = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "output_tps")
BOUNDS = {"hbm_eff": (0.05, 1.0), "bf16_eff": (0.02, 1.0), "kernel_us": (0.1, 100.0),
          "step_overhead_ms": (0.01, 200.0), "kernel_scale": (0.2, 5.0)}
LONGEST_S = 1e5  # a TTFT or TPOT past the longest request timeout an option takes (--timeout) is no measurement
STARTS = (1.0, 0.5, 2.0)  # every factor times this, clipped to its bounds: the starts of the fit
LONGEST_S = 1e5  # a TTFT or TPOT past the longest request timeout an option takes (--timeout) is no measurement


def fitted_factors(gpu: str) -> tuple[str, ...]:
    """What a GPU's model rests on: the kernel tables' scale where they cover it, else the roofline's efficiencies."""
    return KERNEL if kernels.versions(gpu, "moe") else ROOFLINE


@dataclass
class MeasuredRun:
    run_id: str
    dep: Deployment
    time_scale: float
    arrivals: list[float]  # seconds from the first due time, in the modelled deployment's time
    prompt: list[int]  # uncached prompt tokens
    output: list[int]
    measured_idx: list[int]  # which of them count (measured phase, ok)
    measured: dict[str, float]


def _deployment(config: dict, fallback: str | None) -> tuple[Deployment, float]:
    spec = config.get("twin") or fallback or config.get("deployment")  # deployment: an imported run's
    if not spec:
        raise BadInput("a run that did not target a twin needs --deployment (e.g. twin:glm-4.6@h200x8,kv=fp8_e4m3: "
                       "the model, GPUs and flags the measured server ran with)")
    s = parse_spec(spec)
    return s.deployment(), (s.value("time_scale", float, 1.0) if config.get("twin") else 1.0)


def load_run(store: Store, run_id: str, deployment: str | None = None) -> MeasuredRun:
    run = store.run(run_id)
    config = run["config"] if isinstance(run["config"], dict) else json.loads(run["config"] or "{}")
    if (config.get("import") or {}).get("summary_only"):
        raise BadInput(f"run {run_id}: summary-only import: no per-request times (calibration replays each "
                       "request's arrival; import the tool's per-request file instead)")
    dep, scale = _deployment(config, deployment)
    with store.connect() as con:
        rows = con.execute("""
            SELECT coalesce(scheduled_at, sent_at), prompt_tokens, coalesce(cached_tokens, 0), completion_tokens,
                   ttft_s, tpot_s, phase = 'measured' AND status = 'ok'
            FROM requests WHERE run_id = ? AND prompt_tokens IS NOT NULL AND completion_tokens > 0
            ORDER BY 1""", [run_id]).fetchall()
    if not rows:
        raise BadInput(f"run {run_id} has no completed requests to calibrate on")
    if not any(_usable(r[0]) for r in rows):
        raise BadInput(f"run {run_id} has no send times (bench_serving records none: an import of its file keeps "
                       "latencies only); calibration replays the arrivals")
    mid = sorted(r[0] for r in rows if _usable(r[0]))[len(rows) // 2]
    rows = [r for r in rows if _usable(r[0]) and abs(r[0] - mid) < 100 * LONGEST_S]  # not 1e308
    measured = [r for r in rows if r[6]]
    m = [r for r in measured if _time(r[4]) and (r[5] is None or _time(r[5]))]
    if len(m) < 5:
        bad = len(measured) - len(m)
        raise BadInput(f"run {run_id}: nothing to fit: {len(m)} measured requests with usable times, calibration "
                       f"needs at least 5" + (f" ({bad} have a TTFT or TPOT that is zero, negative, not a number or "
                                              f"above {LONGEST_S:g} s)" if bad else ""))
    kept = {id(r) for r in m}
    rows = [r for r in rows if not r[6] or id(r) in kept]
    t0 = rows[0][0]
    ttft = [r[4] * scale for r in m if r[4] is not None]
    tpot = [r[5] * scale for r in m if r[5] is not None]
    span = (max(r[0] + (r[4] or 0) for r in m) - min(r[0] for r in m)) * scale
    measured = {"ttft_p50": simulate.percentile(ttft, 50), "ttft_p90": simulate.percentile(ttft, 90),
                "tpot_p50": simulate.percentile(tpot, 50), "tpot_p90": simulate.percentile(tpot, 90)}
    measured["output_tps"] = _throughput([(r[0] - t0) * scale for r in m], [r[4] * scale for r in m],
                                         [r[3] for r in m], [r[5] * scale if r[5] else 0.0 for r in m]) if span else 0
    if not (math.isfinite(measured["ttft_p50"]) and measured["ttft_p50"] > 0):
        raise BadInput(f"run {run_id}: nothing to fit: its measured TTFT median is {measured['ttft_p50']:g} s")
    return MeasuredRun(run_id, dep, scale, [(r[0] - t0) * scale for r in rows],
                       [max(1, r[1] - r[2]) for r in rows], [r[3] for r in rows],
                       [i for i, r in enumerate(rows) if r[6]], measured)


def _usable(t: float | None) -> bool:
    return t is not None and math.isfinite(t)


def _time(t: float | None) -> bool:
    """A latency a run could have measured: finite, above 0, below LONGEST_S."""
    return _usable(t) and 0 < t < LONGEST_S


def _throughput(arrivals: list[float], ttft: list[float], out: list[int], tpot: list[float]) -> float:
    """Output tokens per second from the first arrival to the last finish of the counted requests."""
    finish = [a + f + (n - 1) * p for a, f, n, p in zip(arrivals, ttft, out, tpot, strict=True)]
    span = max(finish) - min(arrivals)
    return sum(out) / span if span > 0 else 0.0


def predict(run: MeasuredRun, eff: Efficiency) -> dict[str, float]:
    sched = simulate.make_scheduler(run.dep, eff)
    reqs = [Request(f"r{i}", p, o, a) for i, (a, p, o) in enumerate(zip(run.arrivals, run.prompt, run.output,
                                                                         strict=True))]
    simulate.play(sched, reqs)
    m = [reqs[i] for i in run.measured_idx if reqs[i].state == "done"]
    ttft = [r.first_token - r.arrival for r in m]
    tpot = [(r.finish - r.first_token) / (r.max_new - 1) for r in m if r.max_new > 1]
    pred = {"ttft_p50": simulate.percentile(ttft, 50), "ttft_p90": simulate.percentile(ttft, 90),
            "tpot_p50": simulate.percentile(tpot, 50), "tpot_p90": simulate.percentile(tpot, 90)}
    pred["output_tps"] = _throughput([r.arrival for r in m], ttft, [r.max_new for r in m],
                                     [(r.finish - r.first_token) / max(r.max_new - 1, 1) for r in m])
    return pred


def errors(runs: list[MeasuredRun], eff: Efficiency) -> dict[str, float]:
    """Mean absolute relative error per metric over the runs (metrics a run did not measure are left out)."""
    per: dict[str, list[float]] = {k: [] for k in METRICS}
    for run in runs:
        pred = predict(run, eff)
        for k in METRICS:
            meas, p = run.measured.get(k), pred.get(k)
            if meas and p and meas > 0 and math.isfinite(meas) and math.isfinite(p):
                per[k].append(abs(p - meas) / meas)
    return {k: sum(v) / len(v) for k, v in per.items() if v}


def residuals(runs: list[MeasuredRun], eff: Efficiency) -> np.ndarray:
    """log(predicted / measured) per run and metric (0 where a run did not measure it or the replay has none)."""
    out = []
    for run in runs:
        pred = predict(run, eff)
        for k in METRICS:
            meas, p = run.measured.get(k), pred.get(k)
            ok = meas and p and meas > 0 and p > 0 and math.isfinite(meas) and math.isfinite(p)
            out.append(math.log(p / meas) if ok else 0.0)
    return np.array(out)


def _loss(runs: list[MeasuredRun], eff: Efficiency) -> float:
    """Mean squared log error over the metrics that can be compared (inf when none can)."""
    r = residuals(runs, eff)
    compared = np.count_nonzero(r)
    return float(np.sum(r ** 2) / compared) if compared else math.inf


@dataclass
class Fit:
    eff: Efficiency
    factors: tuple[str, ...]
    uncertainty: dict[str, float]  # one standard error of each factor, relative (0.1 = +-10 %); nan: not pinned
    loss: float
    starts: int


def fit(runs: list[MeasuredRun], start: Efficiency, progress=lambda: None, factors: tuple[str, ...] | None = None
        ) -> Efficiency:
    """The factors that fit the runs best (see fit_with_uncertainty)."""
    return fit_with_uncertainty(runs, start, progress, factors).eff


def fit_with_uncertainty(runs: list[MeasuredRun], start: Efficiency, progress=lambda: None,
                         factors: tuple[str, ...] | None = None) -> Fit:
    """The runs' factors: least_squares_fit on their residuals."""
    names = factors or fitted_factors(runs[0].dep.gpu.id)

    def fun(eff: Efficiency) -> np.ndarray:
        progress()
        return residuals(runs, eff)

    return least_squares_fit(fun, start, names)


def least_squares_fit(fun, start: Efficiency, names: tuple[str, ...], starts: tuple[float, ...] = STARTS,
                      max_nfev: int = 60) -> Fit:
    """Bounded robust least squares in log space over the factors `names` of `start`, minimising fun(eff) (log
    errors), from several starts; the best fit, with each factor's standard error from the Jacobian
    (sigma^2 (J^T J)^-1, sigma^2 from the residuals). `capbench calibrate` and the corpus check use it."""
    lo = np.log([BOUNDS[n][0] for n in names])
    hi = np.log([BOUNDS[n][1] for n in names])

    def eff_of(x: np.ndarray) -> Efficiency:
        return replace(start, **{n: float(math.exp(v)) for n, v in zip(names, x, strict=True)})

    best = None
    for f in starts:
        x0 = np.clip(np.log([getattr(start, n) * f for n in names]), lo + 1e-9, hi - 1e-9)
        r = least_squares(lambda x: fun(eff_of(x)), x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1,
                          diff_step=0.05, max_nfev=max_nfev)
        if best is None or r.cost < best.cost:
            best = r
    m, n = best.fun.size, len(names)
    uncertainty = dict.fromkeys(names, math.nan)
    jtj = best.jac.T @ best.jac
    if m > n and np.linalg.matrix_rank(jtj) == n:
        cov = np.linalg.inv(jtj) * float(best.fun @ best.fun) / (m - n)
        sd = np.sqrt(np.clip(np.diag(cov), 0.0, None))
        uncertainty = {nm: float(math.expm1(v)) if v < 5 else math.nan for nm, v in zip(names, sd, strict=True)}
    return Fit(eff_of(best.x), names, uncertainty, float(np.mean(best.fun ** 2)), len(starts))


def calibrate(store: Store, run_ids: list[str], deployment: str | None, out: Path, progress=lambda: None
              ) -> tuple[Efficiency, Efficiency, dict, dict]:
    runs = [load_run(store, rid, deployment) for rid in run_ids]
    gpus = {r.dep.gpu.id for r in runs}
    if len(gpus) > 1:
        raise BadInput(f"calibrate runs of one GPU kind at a time; these ran on {', '.join(sorted(gpus))}")
    gpu = gpus.pop()
    start = load_efficiency(gpu)
    if not math.isfinite(_loss(runs, start)):
        raise BadInput(f"nothing to fit: no metric of run(s) {', '.join(run_ids)} can be compared with the model's "
                       "prediction (each measured and predicted value must be finite and above 0)")
    before = errors(runs, start)
    result = fit_with_uncertainty(runs, start, progress)
    after = errors(runs, result.eff)
    write(out, gpu, result.eff, run_ids, result)
    return start, result, before, after


def write(path: Path, gpu: str, eff: Efficiency, run_ids: list[str], result: Fit | None = None) -> None:
    """Merge the fitted factors for `gpu` into a calibration file (other GPUs' entries are kept)."""
    doc = {}
    if path.exists():
        try:
            doc = files.read(path, "calibration", "json")
        except BadInput as e:
            raise BadInput(f"{e}; pass another --out") from None
        if not isinstance(doc, dict):
            raise BadInput(f"{path} exists and is not a calibration JSON file; pass another --out")
    gpus = doc.setdefault("gpus", {})
    names = result.factors if result else fitted_factors(gpu)
    gpus[gpu] = {name: round(getattr(eff, name), 6) for name in names}
    doc.setdefault("runs", {})[gpu] = run_ids
    if result:
        doc.setdefault("uncertainty", {})[gpu] = {k: (None if math.isnan(v) else round(v, 4))
                                                  for k, v in result.uncertainty.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")



def print_result(start: Efficiency, result: Fit, before: dict, after: dict, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    errs = Table(title="prediction error (mean |predicted - measured| / measured over the runs)")
    for col in ("metric", "before", "after"):
        errs.add_column(col, justify="left" if col == "metric" else "right")
    for k in METRICS:
        if k in before:
            errs.add_row(k, f"{before[k]:.1%}", f"{after.get(k, math.nan):.1%}")
    factors = Table(title=f"factors (bounded robust least squares, {result.starts} starts), written to {out}")
    for col in ("factor", "before", "fitted", "standard error"):
        factors.add_column(col, justify="left" if col == "factor" else "right")
    for name in result.factors:
        u = result.uncertainty.get(name, math.nan)
        factors.add_row(name, f"{getattr(start, name):.4g}", f"{getattr(result.eff, name):.4g}",
                        "not pinned by these runs" if math.isnan(u) else f"+-{u:.0%}")
    console = Console(width=max(Console().width, 100))
    console.print(errs)
    console.print(factors)
