"""Fit the performance model's efficiency factors to measured runs, so the twin, simulate, the planner and the
reports predict what a real deployment does.

Each run is replayed in virtual time through the same scheduler and performance model the twin uses: its
requests arrive when they were due, with the prompt tokens the server counted (less those it served from its
prefix cache) and the output tokens it produced. The replay's TTFT and TPOT medians and p90s and its output
throughput are compared with the measured ones; a coordinate search in log space moves the factors in
FITTED until the mean squared log error stops falling. A run measured against a twin is scaled back by the
twin's time_scale first, so a twin run stands for the GPU deployment it models.

Not replayed: which requests shared a prefix (their cached tokens are taken off the prompt instead, so the
replay's KV use is a little low), and client-side queueing before a request was sent.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from bench import files
from bench.errors import BadInput
from bench.model import Deployment, Efficiency, Request, load_efficiency, parse_spec, simulate
from bench.store import Store

FITTED = ("hbm_eff", "bf16_eff", "kernel_us", "step_overhead_ms")
METRICS = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "output_tps")
BOUNDS = {"hbm_eff": (0.05, 1.0), "bf16_eff": (0.02, 1.0), "kernel_us": (0.1, 100.0),
          "step_overhead_ms": (0.01, 200.0)}
LONGEST_S = 1e5  # a TTFT or TPOT past the longest request timeout an option takes (--timeout) is no measurement


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
    spec = config.get("twin") or fallback
    if not spec:
        raise BadInput("a run that did not target a twin needs --deployment (e.g. twin:glm-4.6@h200x8,kv=fp8_e4m3: "
                       "the model, GPUs and flags the measured server ran with)")
    s = parse_spec(spec)
    return s.deployment(), (s.value("time_scale", float, 1.0) if config.get("twin") else 1.0)


def load_run(store: Store, run_id: str, deployment: str | None = None) -> MeasuredRun:
    run = store.run(run_id)
    config = run["config"] if isinstance(run["config"], dict) else json.loads(run["config"] or "{}")
    dep, scale = _deployment(config, deployment)
    with store.connect() as con:
        rows = con.execute("""
            SELECT coalesce(scheduled_at, sent_at), prompt_tokens, coalesce(cached_tokens, 0), completion_tokens,
                   ttft_s, tpot_s, phase = 'measured' AND status = 'ok'
            FROM requests WHERE run_id = ? AND prompt_tokens IS NOT NULL AND completion_tokens > 0
            ORDER BY 1""", [run_id]).fetchall()
    if not rows:
        raise BadInput(f"run {run_id} has no completed requests to calibrate on")
    mid = sorted(r[0] for r in rows if _usable(r[0]))[len(rows) // 2] if any(_usable(r[0]) for r in rows) else 0
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


def _loss(runs: list[MeasuredRun], eff: Efficiency) -> float:
    total, n = 0.0, 0
    for run in runs:
        pred = predict(run, eff)
        for k in METRICS:
            meas, p = run.measured.get(k), pred.get(k)
            if meas and p and meas > 0 and p > 0 and math.isfinite(meas) and math.isfinite(p):
                total += math.log(p / meas) ** 2
                n += 1
    return total / n if n else math.inf


def fit(runs: list[MeasuredRun], start: Efficiency, progress=lambda: None, rounds: int = 40) -> Efficiency:
    """Coordinate search in log space: try each factor up and down by a step, keep what lowers the loss,
    halve the step when nothing does."""
    best, best_loss, step = start, _loss(runs, start), 0.5
    for _ in range(rounds):
        improved = False
        for name in FITTED:
            lo, hi = BOUNDS[name]
            for factor in (1 + step, 1 / (1 + step)):
                value = min(hi, max(lo, getattr(best, name) * factor))
                cand = replace(best, **{name: value})
                loss = _loss(runs, cand)
                if loss < best_loss - 1e-12:
                    best, best_loss, improved = cand, loss, True
                    break
        progress()
        if not improved:
            step /= 2
            if step < 0.005:
                break
    return best


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
    fitted = fit(runs, start, progress)
    after = errors(runs, fitted)
    write(out, gpu, fitted, run_ids)
    return start, fitted, before, after


def write(path: Path, gpu: str, eff: Efficiency, run_ids: list[str]) -> None:
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
    gpus[gpu] = {name: round(getattr(eff, name), 6) for name in FITTED}
    doc.setdefault("runs", {})[gpu] = run_ids
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")



def print_result(start: Efficiency, fitted: Efficiency, before: dict, after: dict, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    errs = Table(title="prediction error (mean |predicted - measured| / measured over the runs)")
    for col in ("metric", "before", "after"):
        errs.add_column(col, justify="left" if col == "metric" else "right")
    for k in METRICS:
        if k in before:
            errs.add_row(k, f"{before[k]:.1%}", f"{after.get(k, math.nan):.1%}")
    factors = Table(title=f"efficiency factors, written to {out}")
    for col in ("factor", "before", "fitted"):
        factors.add_column(col, justify="left" if col == "factor" else "right")
    for name in FITTED:
        factors.add_row(name, f"{getattr(start, name):.4g}", f"{getattr(fitted, name):.4g}")
    console = Console(width=max(Console().width, 100))
    console.print(errs)
    console.print(factors)
