"""What the CLI prints: rich tables of capacity, the plan's options, the replay of the published corpus, and the runs
in the store (bench/report/simulated.py: what `capbench simulate` prints)."""

from __future__ import annotations

import math

import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Column, Table

from bench.model import Capacity
from bench.report import screen

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


FIGURES = (("output_tok_s", "out tok/s"), ("ttft_ms", "TTFT ms"), ("tpot_ms", "TPOT ms"))


def _case_config(c) -> str:
    return f"tp{c.tp}" + (f" dp{c.dp}" if c.dp > 1 else "") + (f" ep{c.ep}" if c.ep > 1 else "") + (
        " mtp" if c.mtp else "") + (" fp8kv" if c.kv_dtype.startswith("fp8") else "") + (
        f" {c.weights}" if c.weights != "native" else "")


def _case_load(w) -> str:
    if w is None:
        return ""
    load = (f"c{w.max_concurrency}" if w.max_concurrency else f"{w.request_rate:g}/s"
            if w.request_rate not in (None, math.inf) else f"burst {w.num_prompts}")
    return load + f" {w.dataset} {w.input_len or ''}/{w.output_len or ''}"


def validation_table(replays: list, title: str, excluded: dict[str, str]) -> Table:
    """One row per published case under its source: the case, its deployment and load (and why it is not in the
    goal) below it; each figure published above predicted, and the error."""
    names = [r.case.key.split("/", 1)[-1] for r in replays] + [r.case.key.split("/", 1)[0] for r in replays]
    room = max(map(len, names), default=20)  # the case column: its longest name, never wrapped
    table = screen.table(Column("source / case\n  GPU model config load; note", width=room),
                         *(c for _, head in FIGURES for c in (screen.figure(f"{head}\npublished\npredicted"),
                                                              screen.figure("err"))), title=title)
    source = None
    for r in replays:
        c, p = r.case, r.case.published
        src, case = c.key.split("/", 1) if "/" in c.key else ("", c.key)
        if src != source:
            table.add_row(src, *[""] * 2 * len(FIGURES), style="bold")
            source = src
        note = r.why_not or excluded.get(c.key, "")
        below = f"{c.gpu} {c.model} {_case_config(c)} {_case_load(c.workload)}" + (f"; {note}" if note else "")
        cells = []
        for figure, _ in FIGURES:
            pub = getattr(p, figure) if p else None
            cells += [f"{_fig(pub, '')}\n{_fig(r.predicted.get(figure), '')}", _err(r.errors.get(figure))]
        table.add_row("\n".join([case, *screen.wrapped("  " + below, room)]), *cells)
    return table


def validation_answer(report: dict, cases: int, in_goal: int, disaggregated: int) -> list[str]:
    """`capbench validate`'s first screen: what was replayed, the verdict against the goals, the intervals'
    coverage, the GPU rankings that agree."""
    out = [f"Replayed {cases} published SGLang cases ({in_goal} in the goal)"
           + (f" and {disaggregated} disaggregated (not in the goal)" if disaggregated else "")
           + ": predicted vs published.", report["verdict"]]
    cov = report.get("interval_coverage") or {}
    if cov:
        out.append("80 % intervals, leave one source out: " + ", ".join(
            f"{f} {c['coverage']:.0%} of {c['cases']}" for f, c in cov.items()) + " inside (goal 75-85 %)")
    ranks = report.get("gpu_ranking") or []
    if ranks:
        off = [r["config"] for r in ranks if not r["agrees"]]
        out.append(f"GPU order: {len(ranks) - len(off)} of {len(ranks)} configurations on several GPUs ranked as "
                   "published" + (f"; not: {', '.join(off)}" if off else ""))
    big = [b for b in report.get("bias_by_publisher") or [] if b["cases"] >= 5 and "output_tok_s" in b["ratio"]]
    if len(big) > 1:
        out.append("Out of sample the error follows who measured (predicted / published output tok/s, median): "
                   + ", ".join(f"{b['org']} {b['ratio']['output_tok_s']:.2f}x ({b['cases']} cases)" for b in big)
                   + ". For your own serving stack, fit the model to your runs: capbench calibrate.")
    return out


def error_summary_table(summaries: dict[str, dict], title: str) -> Table:
    """Rows: in-sample / out-of-sample ...; columns per figure: median and worst |error|, cases beyond 1.5x."""
    table = screen.table(screen.prose("", 20), title=title)
    for _, head in FIGURES:
        table.add_column(f"{head}\nmedian", justify="right")
        table.add_column("\nworst", justify="right")
        table.add_column("\n>1.5x", justify="right")
    for label, s in summaries.items():
        row = [label]
        for figure, _ in FIGURES:
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
    """Simulated options: the deployment (GPU, parallelism, experts and KV, ★ the recommended), rate within the SLO,
    per-GPU and per-user speed, latencies, what limits it, cost; cells stacked to fit screen.TABLES columns."""
    p = q.slo.percentile
    table = screen.table(screen.name("deployment"), screen.figure("req/s an\ninstance\n(80 %)"),
                         screen.figure("out tok/s\nper GPU"), screen.figure("tok/s\nper user"),
                         screen.figure(f"TTFT p{p}\nTPOT p{p}\nE2E p{p}"), screen.prose("limited by", 10),
                         screen.figure("$/1M\nout"), screen.figure("instances\nGPUs (80 %)"),
                         screen.figure("$/month\n(up to)"), title=title)
    for o in options:
        pr, iv = o.prediction, o.interval()
        mark = "★ " if o.recommended else ("you: " if o.chosen else "")
        where = f"{mark}{o.config.gpu} {o.config.parallelism()}"
        table.add_row("\n".join([where, *screen.wrapped(o.short_label, max(24, len(where)))]),
                      (f"{pr.rate_rps:,.2f}" + (f"\n({iv['rate_rps'][0]:,.2f}-{iv['rate_rps'][1]:,.2f})" if iv
                                                else "")) if pr else "-",
                      f"{o.output_tps_per_gpu:,.0f}" if o.serves else "-",
                      f"{pr.tps_per_user:,.0f}" if o.serves else "-",
                      "\n".join(_duration(getattr(pr, k) if pr else None) for k in ("ttft_s", "tpot_s", "e2e_s")),
                      (pr.limited_by + ("" if pr.converged else " (not converged)")) if pr else "-",
                      _money(o.usd_per_m_output),
                      f"{o.instances_needed or '-'}\n"
                      + (f"{o.gpus_needed} ({iv['gpus_needed'][0]}-{iv['gpus_needed'][1]})" if iv else "-"),
                      _money(o.monthly_cost, 0) + (f"\n({_money(iv['monthly_cost'][1], 0)})" if iv else ""))
    return table


def rejected_table(options: list) -> Table:
    """Configurations not recommended, grouped by why, with how many and an example."""
    groups: dict[str, list] = {}
    for o in options:
        if o.rejected_because:
            key = o.rejected_because.split(":")[0]
            groups.setdefault(key, []).append(o)
    table = screen.table(screen.prose("why", 24), screen.figure("configurations"), screen.prose("for example"),
                         title="Rejected configurations: why not more capacity or less cost")
    for why, opts in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        table.add_row(why, str(len(opts)), f"{opts[0].label}: {opts[0].rejected_because}")
    return table


def coverage_table(coverage: dict) -> Table:
    """Leave one source out: the share of each figure's left-out cases inside their 80 % interval, per regime."""
    table = screen.table(screen.name("regime"),
                         title="80 % intervals, leave one source out: left-out cases inside (goal 75-85 %)")
    figures = list(coverage)
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
