"""Colocated vs disaggregated in words and a table (bench/model/pd/versus.py's Versus), for the CLI and the report."""

from __future__ import annotations

from rich.table import Column, Table

from bench.model.pd import launch as disagg_launch
from bench.model.pd import versus as pd_versus
from bench.report import screen


def _money(x: float | None) -> str:
    return "-" if x is None else f"${x:,.0f}"


COLUMNS = ("", "deployment", "instances", "GPUs", "$ / month", "$ / month, interval", "$ / 1M output", "TTFT", "TPOT",
           "decode batch", "figures from")


def _span(iv: dict | None, how: str) -> str:
    if iv is None:
        return "-"
    lo, hi = iv["monthly_cost"]
    return f"${lo:,.0f}-${hi:,.0f} ({how})"


def versus_rows(v: pd_versus.Versus) -> list[dict]:
    """The two answers as rows (the CLI's table and the dashboard's Planner show these)."""
    c, d = v.colocated, v.disaggregated
    none = dict.fromkeys(COLUMNS[2:], "-")
    rows = []
    if c is not None:
        p = c.prediction
        rows.append(dict(zip(COLUMNS, ("colocated", c.label, str(c.instances_needed), str(c.gpus_needed),
                                       _money(c.monthly_cost), _span(c.interval(), "80 %"),
                                       f"${c.usd_per_m_output:,.2f}", f"{p.ttft_s:,.2f} s",
                                       f"{p.tpot_s * 1e3:,.0f} ms", f"{p.batch} per instance",
                                       "simulator (rate.py), validated"), strict=True)))
    else:
        rows.append({"": "colocated", "deployment": "none serves the load", **none})
    if d is not None:
        rows.append(dict(zip(COLUMNS, ("disaggregated", d.shape.label, d.ratio, str(d.gpus_needed),
                                       _money(d.monthly_cost), _span(v.interval, "not calibrated"),
                                       f"${d.usd_per_m_output:,.2f}", f"{d.ttft_s:,.2f} s",
                                       f"{d.tpot_s * 1e3:,.0f} ms", f"{d.batch_per_rank} per rank",
                                       "analytic PD model (disagg.py), little evidence"), strict=True)))
    else:
        rows.append({"": "disaggregated", "deployment": "none serves the load", **none})
    return rows


def versus_table(v: pd_versus.Versus) -> Table:
    """versus_rows turned on their side (a figure a row, the two answers side by side) to fit screen.TABLES."""
    rows = versus_rows(v)
    t = screen.table(screen.name(""), *(screen.prose(r[""], 48) for r in rows),
                     title="Colocated vs prefill/decode disaggregated, cheapest of each for the target load")
    for col in COLUMNS[1:]:
        t.add_row(col, *(r[col] for r in rows))
    return t


def versus_lines(v: pd_versus.Versus) -> list[str]:
    return [*v.why, *interval_lines(v), *v.evidence]


def interval_lines(v: pd_versus.Versus) -> list[str]:
    """The disaggregated answer's bounds in one sentence, then why they are not a calibrated interval."""
    iv = v.interval
    if iv is None:
        return []
    lo, hi = iv["gpus_needed"]
    return [f"Disaggregated, optimistic to pessimistic end: {iv['ratio'][0]} to {iv['ratio'][1]} ({lo}-{hi} GPUs), "
            f"${iv['monthly_cost'][0]:,.0f}-${iv['monthly_cost'][1]:,.0f} a month, "
            f"${iv['usd_per_m_output'][0]:,.2f}-${iv['usd_per_m_output'][1]:,.2f} per 1M output tokens, "
            f"{iv['prefill_rps'][0]:,.2f}-{iv['prefill_rps'][1]:,.2f} req/s per prefill instance, "
            f"{iv['decode_rps'][0]:,.2f}-{iv['decode_rps'][1]:,.2f} per decode instance, TTFT "
            f"{iv['ttft_s'][0]:,.2f}-{iv['ttft_s'][1]:,.2f} s, TPOT {iv['tpot_s'][0] * 1e3:,.0f}-"
            f"{iv['tpot_s'][1] * 1e3:,.0f} ms.", iv["evidence"][0].upper() + iv["evidence"][1:] + "."]


def launch_lines(v: pd_versus.Versus) -> list[str]:
    """The PD answer's launch commands, one per node, then the router."""
    if v.disaggregated is None:
        return []
    out = []
    for launch in disagg_launch.commands(v.disaggregated):
        where = "router" if launch.role == "router" else f"{launch.role} {launch.instance} node {launch.node}"
        out += [f"# {where}", launch.command]
    return out


def validation_table(replays: list) -> Table:
    """The disaggregated cases: each case, its phase and GPUs below it; published figure, predicted, error
    (bench/model/pd/validate.py)."""
    room = max((len(r.case.key) for r in replays), default=20)
    t = screen.table(Column("case\n  phase, GPUs; note", width=room), screen.name("figure"),
                     screen.figure("published"), screen.figure("predicted"), screen.figure("error"),
                     title="Prefill/decode disaggregated, wide-EP published runs: published vs predicted (apart from "
                           "the colocated corpus)")
    for r in replays:
        published = r.case.pd.get("published", {})
        where = f"{r.case.pd.get('phase')} on {r.case.gpus} x {r.case.gpu}"
        if not r.errors:
            below = screen.wrapped(f"  {where}; {r.why_not or ''}", room)
            t.add_row("\n".join([r.case.key, *below]), "-", "-", "-", "-")
            continue
        case = "\n".join([r.case.key, *screen.wrapped(f"  {where}; {len(r.case.uncertain)} uncertain point(s) in "
                                                       "the case", room)])
        for figure, err in r.errors.items():
            t.add_row(case, figure, f"{float(published[figure]):,.0f}", f"{r.predicted[figure]:,.0f}", f"{err:+.0%}")
            case = ""
    return t
