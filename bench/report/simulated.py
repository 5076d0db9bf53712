"""What `capbench simulate` prints (bench/report/screen.py's pattern): first the answer, the figures at the offered
rate or each KV dtype's highest rate within the SLO; then the tables, the figures a user acts on (output tok/s,
TTFT and TPOT at the SLO's percentile, $ per 1M output tokens, the SLO met) each with its 80 % interval in
brackets under it; `--details` adds the rest per rate (achieved rate, p50s, running, cache hit, retractions), and
last, what the brackets are and the evidence behind them."""

from __future__ import annotations

import math
from dataclasses import replace

from rich.table import Table
from rich.text import Text

from bench.model import Deployment, Point, Slo, Sweep, Workload, interval
from bench.model import capacity as capacity_model
from bench.report import screen

MORE = "each rate's achieved req/s, TTFT and TPOT p50, running requests, cache hit rate, retractions"


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1e3:,.0f}"


def _s(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:,.2f}"


def _range(value: str, iv: dict | None, key: str, fmt, sep: str = "\n") -> str:
    """A figure with its 80 % interval in brackets, when it has one (below it in a table's cell)."""
    r = (iv or {}).get(key)
    if r is None or not all(math.isfinite(x) for x in r):
        return value
    return f"{value}{sep}[{fmt(r[0])}-{fmt(r[1])}]"


def points_table(rows: list[tuple[str, Point, dict | None]], slo: Slo, label: str, title: str | None = None) -> Table:
    """Each row: its label (a rate, or a KV dtype), the simulated point and its intervals (interval.for_point),
    shown in brackets: the figures a user acts on."""
    q = slo.percentile
    table = screen.table(screen.name(label), screen.figure("out tok/s"), screen.figure(f"TTFT p{q} s"),
                         screen.figure(f"TPOT p{q} ms"), screen.figure("$/1M out"), screen.name("meets SLO"),
                         title=title)
    for name, p, iv in rows:
        table.add_row(*(Text(c) for c in (
            name, _range(f"{p.output_tok_s:,.0f}", iv, "output_tps", lambda x: f"{x:,.0f}"),
            _range(_s(getattr(p, f"ttft_p{q}")), iv, "ttft_s", _s),
            _range(_ms(getattr(p, f"tpot_p{q}")), iv, "tpot_s", _ms),
            _range(f"{p.usd_per_million:.2f}", iv, "usd_per_m_output", lambda x: f"{x:.2f}"),
            "yes" if slo.met(p) else "no")))
    return table


def details_table(rows: list[tuple[str, Point]], label: str, title: str | None = None) -> Table:
    """The rest of each point's figures (`--details`)."""
    table = screen.table(screen.name(label), screen.figure("achieved req/s"), screen.figure("TTFT p50 s"),
                         screen.figure("TPOT p50 ms"), screen.figure("running"), screen.figure("cache hit"),
                         screen.figure("retracted"), title=title)
    for name, p in rows:
        table.add_row(name, f"{p.achieved_rps:.2f}", _s(p.ttft_p50), _ms(p.tpot_p50), f"{p.mean_running:.0f}",
                      f"{p.cache_hit_rate:.0%}", str(p.retractions))
    return table


def point_intervals(dep: Deployment, p: Point, percentile: int, at_capacity: bool) -> dict | None:
    return interval.for_point(dep.model.id, dep.gpu.id, dep.weights, p, percentile, at_capacity)


def interval_caption(ivs: list[dict | None]) -> str | None:
    """What the brackets are, from how many published cases, and the evidence's words once each."""
    ivs = [iv for iv in ivs if iv]
    if not ivs:
        return None
    first = ivs[0]
    said = list(dict.fromkeys(iv[k] for iv in ivs for k in ("evidence", "burst_evidence") if iv.get(k)))
    head = (f"[in brackets]: the {first['level']:.0%} interval, from the model's out-of-sample errors on the "
            f"published corpus ({first['cases']} case(s) of {first['regime'].rsplit(', ', 1)[0]}; "
            "bench/model/evidence/interval.py). Output tok/s and $/1M get one only at capacity (all at once, or "
            "the highest rate within the SLO): below it the offered load is served whatever the error.")
    return "\n".join([head, *(f"Evidence: {e}." for e in said)])


def _pool(dep: Deployment, kv_dtype: str) -> int:
    return capacity_model.capacity(replace(dep, kv_dtype=kv_dtype), with_ratios=False).kv_pool_tokens_total


def _about(dep: Deployment, wl: Workload, what: str) -> str:
    return f"{dep.model.id} on {dep.tp} x {dep.gpu.id}, {dep.weights} weights, workload {wl.name}, {what}"


def verdict(sw: Sweep, iv: dict | None = None) -> str:
    """The sweep's answer; iv: the intervals of its best point (interval.for_point at capacity)."""
    slo, q = sw.slo, sw.slo.percentile
    head = f"{sw.kv_dtype} KV: highest rate meeting {slo.describe()}"
    if sw.best is None:
        return f"{head}: none (the lowest rate tried, {sw.points[0].rate:.3f} req/s, misses it)"
    b = sw.best
    rate = _range(f"{sw.best_rate:.2f}", iv, "rate_rps", lambda x: f"{x:.2f}", " ")
    usd = _range(f"${b.usd_per_million:.2f}", iv, "usd_per_m_output", lambda x: f"${x:.2f}", " ")
    tps = _range(f"{b.output_tok_s:,.0f}", iv, "output_tps", lambda x: f"{x:,.0f}", " ")
    ttft = _range(f"{getattr(b, f'ttft_p{q}'):.2f}", iv, "ttft_s", lambda x: f"{x:.2f}", " ")
    tpot = _range(f"{getattr(b, f'tpot_p{q}') * 1e3:.0f}", iv, "tpot_s", lambda x: f"{x * 1e3:.0f}", " ")
    return (f"{head}: {rate} req/s ({tps} output tok/s, TTFT p{q} {ttft} s, TPOT p{q} {tpot} ms, "
            f"{usd} per 1M output tokens)")


def sweep_intervals(dep: Deployment, sw: Sweep) -> dict:
    """Each point's intervals (the all-at-once and the best point at capacity) and the best point's: the one
    source of the brackets in the tables, the verdict and --json."""
    q = sw.slo.percentile
    d = replace(dep, kv_dtype=sw.kv_dtype)
    return {"saturation": point_intervals(d, sw.saturation, q, True),
            "points": [point_intervals(d, p, q, p is sw.best) for p in sw.points],
            "best": point_intervals(d, sw.best, q, True) if sw.best is not None else None}


def print_sweeps(sweeps: list[Sweep], dep: Deployment, wl: Workload, n: int, min_seconds: float,
                 details: bool = False) -> None:
    """The verdicts (and FP8 against BF16) as the first screen, then each KV dtype's rates."""
    ivs = [sweep_intervals(dep, sw) for sw in sweeps]
    answer = [_about(dep, wl, f"per rate {n}+ requests, {min_seconds:g}+ s of arrivals:")]
    answer += [verdict(sw, iv["best"]) for sw, iv in zip(sweeps, ivs, strict=True)]
    if len(sweeps) == 2 and all(s.best_rate for s in sweeps):
        bf16, fp8 = sweeps
        answer.append(f"FP8 KV vs BF16 KV at the SLO: {fp8.best_rate / bf16.best_rate:.2f}x the request rate, "
                      f"{fp8.best.output_tok_s / bf16.best.output_tok_s:.2f}x the output throughput, "
                      f"{fp8.best.usd_per_million / bf16.best.usd_per_million:.2f}x the cost per token")
    screen.show(answer + ([] if details else [screen.more(MORE)]))
    console = screen.tables_console()
    for sw, iv in zip(sweeps, ivs, strict=True):
        rows = [("all at once", sw.saturation, iv["saturation"])] + [
            (f"{p.rate:.2f}", p, piv) for p, piv in zip(sw.points, iv["points"], strict=True)]
        title = f"{sw.kv_dtype} KV ({_pool(dep, sw.kv_dtype):,} pool tokens), each rate:"
        console.print(points_table(rows, sw.slo, "req/s", title))
        if details:
            console.print(details_table([(r, p) for r, p, _ in rows], "req/s", f"{sw.kv_dtype} KV, the rest:"))
    _caption([i for iv in ivs for i in (iv["saturation"], iv["best"])])


def print_points(points: list[tuple[str, Point]], slo: Slo, dep: Deployment, wl: Workload, n: int,
                 details: bool = False) -> None:
    """One table, a row per KV dtype's point at the offered rate, then what the brackets are, once."""
    ivs = [point_intervals(replace(dep, kv_dtype=kv), p, slo.percentile, math.isinf(p.rate)) for kv, p in points]
    rate = points[0][1].rate
    offered = "all requests at once" if math.isinf(rate) else f"{rate:g} req/s offered"
    screen.show([_about(dep, wl, f"{offered}, {n}+ requests:")])
    rows = [(f"{kv} ({_pool(dep, kv):,})", p, iv) for (kv, p), iv in zip(points, ivs, strict=True)]
    console = screen.tables_console()
    console.print(points_table(rows, slo, "KV (pool tokens)"))
    if details:
        console.print(details_table([(r, p) for r, p, _ in rows], "KV (pool tokens)"))
    else:
        screen.show([screen.more(MORE.replace("each rate's ", ""))])
    _caption(ivs)


def _caption(ivs: list[dict | None]) -> None:
    caption = interval_caption(ivs)
    if caption:
        screen.show([caption])
