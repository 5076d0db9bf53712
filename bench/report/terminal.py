"""What the CLI prints: rich tables of capacity, simulated rates and sweeps, and the runs in the store."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime

import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Column, Table

from bench.model import Capacity, Deployment, Point, Slo, Sweep, Workload
from bench.model import capacity as capacity_model

GB = 1e9


def _tokens(n: int) -> str:
    return f"{n:,}"


def _ratio(cap: Capacity, key: str) -> str:
    r = cap.ratios.get(key)
    return "" if r is None or abs(r - 1) < 1e-9 else f" ({r:.2f}x)"


def _gain(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "-"


def capacity_table(cap: Capacity) -> Table:
    gpus = f"{cap.tp} x {cap.gpu}" + (f" on {cap.nodes} nodes" if cap.nodes > 1 else "")
    table = Table(title=f"{cap.model} on {gpus}, tp {cap.tp}, dp-attention {cap.dp}", show_header=False)
    table.add_column("figure", style="bold")
    table.add_column("value", justify="right")
    rows = [
        ("KV dtype / weights", f"{cap.kv_dtype} / {cap.weights}"),
        ("mem_fraction_static", f"{cap.mem_fraction_static:.3f}"),
        ("weights per GPU", f"{cap.weight_bytes_per_gpu / GB:.1f} GB" + _ratio(cap, "weight_bytes_per_gpu")),
        ("KV bytes per token per GPU", f"{cap.kv_bytes_per_token_per_gpu:,}"),
        ("KV budget per GPU", f"{cap.kv_budget_bytes_per_gpu / GB:.1f} GB"),
        ("KV pool tokens (max_total_num_tokens)", _tokens(cap.kv_pool_tokens) + _ratio(cap, "kv_pool_tokens")),
        ("max_running_requests", _tokens(cap.max_running_requests)),
        (f"concurrent sequences at {cap.context:,} tokens",
         _tokens(cap.max_concurrent_sequences_at_context) + _ratio(cap, "max_concurrent_sequences_at_context")),
        ("longest single context", _tokens(cap.longest_context)),
        ("fits", "yes" if cap.fits else f"NO: short by {cap.short_by_bytes_per_gpu / GB:.1f} GB per GPU"),
    ]
    if cap.dp > 1:
        rows.insert(6, ("KV pool tokens, all dp ranks", _tokens(cap.kv_pool_tokens_total)))
    for name, value in rows:
        table.add_row(name, value)
    return table


def compare_table(caps: list[Capacity]) -> Table:
    first = caps[0]
    table = Table(title=f"{first.model} on {first.tp} x {first.gpu}: KV dtype x expert weights "
                        f"(gains against {first.kv_dtype} KV with {first.weights} weights)")
    for col in ("weights", "KV", "weights/GPU GB", "KV pool tokens", "gain",
                f"seqs at {first.context:,}", "gain", "fits"):
        table.add_column(col, justify="right" if col not in ("weights", "KV") else "left")
    base = caps[0]
    for cap in caps:
        table.add_row(cap.weights, cap.kv_dtype, f"{cap.weight_bytes_per_gpu / GB:.1f}",
                      _tokens(cap.kv_pool_tokens), _gain(cap.kv_pool_tokens, base.kv_pool_tokens),
                      _tokens(cap.max_concurrent_sequences_at_context),
                      _gain(cap.max_concurrent_sequences_at_context, base.max_concurrent_sequences_at_context),
                      "yes" if cap.fits else "no")
    return table


def print_tables(*tables: Table) -> None:
    console = Console(width=max(Console().width, 120))
    for t in tables:
        console.print(t)


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1e3:,.0f}"


def _s(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:,.2f}"


def points_table(rows: list[tuple[str, Point]], slo: Slo, title: str):
    q = slo.percentile
    table = Table(title=title)
    for col in ("rate req/s", "achieved req/s", "output tok/s", "TTFT p50 s", f"TTFT p{q} s", "TPOT p50 ms",
                f"TPOT p{q} ms", "running", "cache hit", "retracted", "$/1M out", "meets SLO"):
        table.add_column(col, justify="right")
    for label, p in rows:
        table.add_row(label, f"{p.achieved_rps:.2f}", f"{p.output_tok_s:,.0f}", _s(p.ttft_p50),
                      _s(getattr(p, f"ttft_p{q}")), _ms(p.tpot_p50), _ms(getattr(p, f"tpot_p{q}")),
                      f"{p.mean_running:.0f}", f"{p.cache_hit_rate:.0%}", str(p.retractions),
                      f"{p.usd_per_million:.2f}", "yes" if slo.met(p) else "no")
    return table


def _title(dep: Deployment, kv_dtype: str, wl: Workload, what: str) -> str:
    c = capacity_model.capacity(replace(dep, kv_dtype=kv_dtype), with_ratios=False)
    return (f"{dep.model.id} on {dep.tp} x {dep.gpu.id}, {kv_dtype} KV ({c.kv_pool_tokens_total:,} tokens), "
            f"{dep.weights} weights, workload {wl.name}, {what}")


def verdict(sw: Sweep) -> str:
    slo, q = sw.slo, sw.slo.percentile
    head = f"{sw.kv_dtype} KV: highest rate meeting {slo.describe()}"
    if sw.best is None:
        return f"{head}: none (the lowest rate tried, {sw.points[0].rate:.3f} req/s, misses it)"
    b = sw.best
    return (f"{head}: {sw.best_rate:.2f} req/s ({b.output_tok_s:,.0f} output tok/s, TTFT p{q} "
            f"{getattr(b, f'ttft_p{q}'):.2f} s, TPOT p{q} {getattr(b, f'tpot_p{q}') * 1e3:.0f} ms, "
            f"${b.usd_per_million:.2f} per 1M output tokens)")


def print_sweeps(sweeps: list[Sweep], dep: Deployment, wl: Workload, n: int, min_seconds: float) -> None:
    console = Console(width=max(Console().width, 150))
    for sw in sweeps:
        rows = [("all at once", sw.saturation)] + [(f"{p.rate:.2f}", p) for p in sw.points]
        what = f"per rate {n}+ requests, {min_seconds:g}+ s of arrivals"
        console.print(points_table(rows, sw.slo, _title(dep, sw.kv_dtype, wl, what)))
    for sw in sweeps:
        console.print(verdict(sw))
    if len(sweeps) == 2 and all(s.best_rate for s in sweeps):
        bf16, fp8 = sweeps
        console.print(f"FP8 KV vs BF16 KV at the SLO: {fp8.best_rate / bf16.best_rate:.2f}x the request rate, "
                      f"{fp8.best.output_tok_s / bf16.best.output_tok_s:.2f}x the output throughput, "
                      f"{fp8.best.usd_per_million / bf16.best.usd_per_million:.2f}x the cost per token")


def print_point(p: Point, slo: Slo, dep: Deployment, wl: Workload, n: int) -> None:
    console = Console(width=max(Console().width, 150))
    console.print(points_table([(f"{p.rate:g}", p)], slo, _title(dep, dep.kv_dtype, wl, f"{n}+ requests")))


def runs_table(runs: pd.DataFrame):
    """`capbench runs` as a rich table: newest first, times in UTC."""
    def when(t: float | None) -> str:
        return "" if t is None or pd.isna(t) else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")

    table = Table(Column("run id", no_wrap=True, min_width=22), Column("label", ratio=1),
                  Column("status", no_wrap=True),
                  Column("started (UTC)", no_wrap=True), Column("duration", justify="right", no_wrap=True),
                  Column("requests", justify="right", no_wrap=True), Column("errors", justify="right", no_wrap=True),
                  box=box.SIMPLE_HEAD, pad_edge=False)
    if runs.empty:
        table.caption = "no runs yet"
    for r in runs.itertuples():
        duration = "" if pd.isna(r.finished_at) else f"{r.finished_at - r.started_at:,.0f} s"
        table.add_row(r.run_id, r.label or "", r.status, when(r.started_at), duration, f"{r.requests:,}",
                      f"{r.errors:,}")
    return table
