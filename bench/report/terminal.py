"""What the CLI prints: rich tables of capacity, simulated rates and sweeps, and the runs in the store."""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from bench.model import Capacity, Deployment, Point, Slo, Sweep, Workload, interval
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


def _range(value: str, iv: dict | None, key: str, fmt, sep: str = "\n") -> str:
    """A figure with its 80 % interval in brackets, when it has one (below it in a table's cell)."""
    r = (iv or {}).get(key)
    if r is None or not all(math.isfinite(x) for x in r):
        return value
    return f"{value}{sep}[{fmt(r[0])}-{fmt(r[1])}]"


def points_table(rows: list[tuple[str, Point, dict | None]], slo: Slo, title: str):
    """Each row: its label, the simulated point and its intervals (interval.for_point), shown in brackets."""
    q = slo.percentile
    table = Table(title=title)
    for col in ("rate req/s", "achieved req/s", "output tok/s", "TTFT p50 s", f"TTFT p{q} s", "TPOT p50 ms",
                f"TPOT p{q} ms", "running", "cache hit", "retracted", "$/1M out", "meets SLO"):
        wide = col.startswith(("output", f"TTFT p{q}", f"TPOT p{q}", "$"))  # a figure with its interval
        table.add_column(col, justify="right", overflow="fold", min_width=15 if wide else None)
    for label, p, iv in rows:
        table.add_row(*(Text(c) for c in (label, f"{p.achieved_rps:.2f}",
                      _range(f"{p.output_tok_s:,.0f}", iv, "output_tps", lambda x: f"{x:,.0f}"), _s(p.ttft_p50),
                      _range(_s(getattr(p, f"ttft_p{q}")), iv, "ttft_s", _s), _ms(p.tpot_p50),
                      _range(_ms(getattr(p, f"tpot_p{q}")), iv, "tpot_s", _ms),
                      f"{p.mean_running:.0f}", f"{p.cache_hit_rate:.0%}", str(p.retractions),
                      _range(f"{p.usd_per_million:.2f}", iv, "usd_per_m_output", lambda x: f"{x:.2f}"),
                      "yes" if slo.met(p) else "no")))
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


def _title(dep: Deployment, kv_dtype: str, wl: Workload, what: str) -> str:
    c = capacity_model.capacity(replace(dep, kv_dtype=kv_dtype), with_ratios=False)
    return (f"{dep.model.id} on {dep.tp} x {dep.gpu.id}, {kv_dtype} KV ({c.kv_pool_tokens_total:,} tokens), "
            f"{dep.weights} weights, workload {wl.name}, {what}")


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


def print_sweeps(sweeps: list[Sweep], dep: Deployment, wl: Workload, n: int, min_seconds: float) -> None:
    console = Console(width=max(Console().width, 170))
    ivs = [sweep_intervals(dep, sw) for sw in sweeps]
    for sw, iv in zip(sweeps, ivs, strict=True):
        rows = [("all at once", sw.saturation, iv["saturation"])] + [
            (f"{p.rate:.2f}", p, piv) for p, piv in zip(sw.points, iv["points"], strict=True)]
        what = f"per rate {n}+ requests, {min_seconds:g}+ s of arrivals"
        console.print(points_table(rows, sw.slo, _title(dep, sw.kv_dtype, wl, what)))
    for sw, iv in zip(sweeps, ivs, strict=True):
        console.print(verdict(sw, iv["best"]))
    if len(sweeps) == 2 and all(s.best_rate for s in sweeps):
        bf16, fp8 = sweeps
        console.print(f"FP8 KV vs BF16 KV at the SLO: {fp8.best_rate / bf16.best_rate:.2f}x the request rate, "
                      f"{fp8.best.output_tok_s / bf16.best.output_tok_s:.2f}x the output throughput, "
                      f"{fp8.best.usd_per_million / bf16.best.usd_per_million:.2f}x the cost per token")
    caption = interval_caption([i for iv in ivs for i in (iv["saturation"], iv["best"])])
    if caption:
        console.print(caption, markup=False)


def print_points(points: list[tuple[str, Point]], slo: Slo, dep: Deployment, wl: Workload, n: int) -> None:
    """One table per KV dtype's point at the offered rate, then what the brackets are, once."""
    console = Console(width=max(Console().width, 170))
    ivs = []
    for kv, p in points:
        d = replace(dep, kv_dtype=kv)
        ivs.append(point_intervals(d, p, slo.percentile, math.isinf(p.rate)))
        console.print(points_table([(f"{p.rate:g}", p, ivs[-1])], slo, _title(d, kv, wl, f"{n}+ requests")))
    caption = interval_caption(ivs)
    if caption:
        console.print(caption, markup=False)


def runs_table(runs: pd.DataFrame):
    """`capbench runs` as a rich table, newest first: each run's identity (identity.runs_display: the columns every
    run table shows), its status, duration, request counts, throughput (successful requests/s) and TTFT p99 (a
    twin's in the modelled GPUs' time; a summary-only import's as its tool reported them)."""
    from bench.store import identity

    shown = identity.runs_display(runs)
    left = ["run id", *identity.IDENTITY_COLUMNS, "label", "status"]
    table = Table(*(Column(c, no_wrap=True) for c in left),
                  *(Column(c, justify="right", no_wrap=True) for c in ("duration", "requests", "errors", "req/s",
                                                                       "TTFT p99")),
                  box=box.SIMPLE_HEAD, pad_edge=False)
    if runs.empty:
        table.caption = "no runs yet"
    for r, (_, row) in zip(runs.itertuples(), shown.iterrows(), strict=True):
        duration = "" if pd.isna(r.finished_at) else f"{r.finished_at - r.started_at:,.0f} s"
        k = float(getattr(r, "time_scale", 1) or 1) if bool(getattr(r, "twin", False)) else 1.0
        rps, ttft = getattr(r, "throughput_rps", None), getattr(r, "ttft_p99_s", None)
        table.add_row(r.run_id, *(str(row[c]) for c in identity.IDENTITY_COLUMNS), r.label or "", r.status,
                      duration, f"{int(r.requests):,}", "" if pd.isna(r.errors) else f"{int(r.errors):,}",
                      "" if pd.isna(rps) else f"{rps / k:,.2f}", "" if pd.isna(ttft) else f"{ttft * k * 1000:,.0f} ms")
    return table


def _err(e: float | None) -> str:
    return "" if e is None else f"{e:+.0%}"


def _fig(v: float | None, unit: str) -> str:
    return "-" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:,.1f}") + unit


def validation_table(replays: list, title: str, excluded: dict[str, str]) -> Table:
    """One row per published case: the deployment and load, each figure published vs predicted, and the error."""
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("case", "GPU", "model", "config", "load", "output tok/s pub / pred", "err", "TTFT ms pub / pred",
                "err", "TPOT ms pub / pred", "err", "note"):
        table.add_column(col, justify="left" if col in ("case", "GPU", "model", "config", "load", "note") else "right",
                         overflow="fold")
    for r in replays:
        c, w, p = r.case, r.case.workload, r.case.published
        config = f"tp{c.tp}" + (f" dp{c.dp}" if c.dp > 1 else "") + (f" ep{c.ep}" if c.ep > 1 else "") + (
            " mtp" if c.mtp else "") + (" fp8kv" if c.kv_dtype.startswith("fp8") else "") + (
            f" {c.weights}" if c.weights != "native" else "")
        load = ""
        if w is not None:
            load = (f"c{w.max_concurrency}" if w.max_concurrency else f"{w.request_rate:g}/s"
                    if w.request_rate not in (None, math.inf) else f"burst {w.num_prompts}")
            load += f" {w.dataset} {w.input_len or ''}/{w.output_len or ''}"
        cells = []
        for figure, unit in (("output_tok_s", ""), ("ttft_ms", ""), ("tpot_ms", "")):
            pub = getattr(p, figure) if p else None
            cells += [f"{_fig(pub, unit)} / {_fig(r.predicted.get(figure), unit)}", _err(r.errors.get(figure))]
        note = r.why_not or excluded.get(c.key, "")
        table.add_row(c.key, c.gpu, c.model, config, load, *cells, note[:60])
    return table


def error_summary_table(summaries: dict[str, dict], title: str) -> Table:
    """Rows: in-sample / out-of-sample ...; columns per figure: median and worst |error|, cases beyond 1.5x."""
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("")
    for figure in ("output tokens/s", "TTFT", "TPOT"):
        table.add_column(f"{figure}: median |err|", justify="right")
        table.add_column("worst", justify="right")
        table.add_column("> 1.5x", justify="right")
    for label, s in summaries.items():
        row = [label]
        for figure in ("output_tok_s", "ttft_ms", "tpot_ms"):
            f = s.get(figure)
            row += (["-"] * 3 if not f else
                    [f"{f['median_abs_error']:.0%} ({f['cases']})", f"{f['worst_abs_error']:.0%}",
                     str(f["beyond_1_5x"])])
        table.add_row(*row)
    return table


def _money(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"${v:,.{digits}f}"


def _duration(v: float | None) -> str:
    return "-" if v is None else (f"{v * 1e3:,.0f} ms" if v < 1 else f"{v:,.1f} s")


def plan_table(options: list, title: str, q) -> Table:
    """Simulated options: parallelism, KV and weights, rate within the SLO, per-GPU and per-user speed, cost."""
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    p = q.slo.percentile
    for col in ("", "GPU", "tp/dp/ep", "experts, KV", "req/s per instance (80 %)", "out tok/s per GPU",
                "tok/s per user", f"TTFT p{p}", f"TPOT p{p}", f"E2E p{p}", "limited by", "$ / 1M out", "instances",
                "GPUs (80 %)", "$ / month"):
        table.add_column(col, justify="left" if col in ("", "GPU", "tp/dp/ep", "experts, KV", "limited by")
                         else "right", overflow="fold")
    for o in options:
        pr, iv = o.prediction, o.interval()
        mark = "★" if o.recommended else ("you" if o.chosen else "")
        table.add_row(mark, o.config.gpu, o.config.parallelism(), o.short_label,
                      (f"{pr.rate_rps:,.2f}" + (f" ({iv['rate_rps'][0]:,.2f}-{iv['rate_rps'][1]:,.2f})" if iv else ""))
                      if pr else "-", f"{o.output_tps_per_gpu:,.0f}" if o.serves else "-",
                      f"{pr.tps_per_user:,.0f}" if o.serves else "-", _duration(pr.ttft_s if pr else None),
                      _duration(pr.tpot_s if pr else None), _duration(pr.e2e_s if pr else None),
                      (pr.limited_by + ("" if pr.converged else " (not converged)")) if pr else "-",
                      _money(o.usd_per_m_output), str(o.instances_needed or "-"),
                      f"{o.gpus_needed} ({iv['gpus_needed'][0]}-{iv['gpus_needed'][1]})" if iv else "-",
                      _money(o.monthly_cost, 0) + (f" (up to {_money(iv['monthly_cost'][1], 0)})" if iv else ""))
    return table


def rejected_table(options: list) -> Table:
    """Configurations not recommended, grouped by why, with how many and an example."""
    groups: dict[str, list] = {}
    for o in options:
        if o.rejected_because:
            key = o.rejected_because.split(":")[0]
            groups.setdefault(key, []).append(o)
    table = Table(title="Rejected configurations: why not more capacity or less cost", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    table.add_column("why")
    table.add_column("configurations", justify="right")
    table.add_column("for example", overflow="fold")
    for why, opts in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        table.add_row(why, str(len(opts)), f"{opts[0].label}: {opts[0].rejected_because}")
    return table


def coverage_table(coverage: dict) -> Table:
    """Leave one source out: the share of each figure's left-out cases inside their 80 % interval, per regime."""
    table = Table(title="80 % intervals, leave one source out: left-out cases inside (goal 75-85 %)",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    figures = list(coverage)
    table.add_column("regime")
    for f in figures:
        table.add_column(f, justify="right")
    table.add_row("all", *(f"{coverage[f]['coverage']:.0%} ({coverage[f]['cases']})" for f in figures))
    regimes = sorted({r for f in figures for r in coverage[f]["by_regime"]})
    for reg in regimes:
        cells = []
        for f in figures:
            hit, n = coverage[f]["by_regime"].get(reg, (0, 0))
            cells.append(f"{hit / n:.0%} ({hit}/{n})" if n else "-")
        table.add_row(reg, *cells)
    return table
