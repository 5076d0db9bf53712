"""`capbench report`: a self-contained capacity report (HTML with inline SVG charts, or Markdown) a manager can act
on: the question, the configurations compared, capacity, predictions and cost, what was measured and how far the
predictions were from it, the recommendation with its savings, and the SGLang launch commands.

With no DB, or no runs in it, it is a planning report from the capacity model and `capbench simulate`'s
scheduler, and says that nothing was measured. The HTML has no script and no external reference: charts are SVG
made offline by vl-convert, styles are inline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bench.errors import BadInput
from bench.model import Option, Plan, Question, capacity, catalog, format_table, make_plan
from bench.model import launch as sglang_cmd
from bench.model.answer import Headline, make_headline
from bench.model.pd import versus as pd_versus
from bench.report import charts, load, plancharts, run_extras, wording
from bench.report.formats_table import formats_section
from bench.report.predicted import STEADY_REQUESTS, measured_vs_predicted
from bench.store import Store, identity, runinfo


@dataclass
class Measured:
    run_id: str
    label: str
    config: dict
    summary: dict
    vs_predicted: dict
    integrity: dict
    short: str = ""  # for chart legends: deployment and load, and the end of the run id


@dataclass
class Report:
    plan: Plan
    db: str | None
    why_unmeasured: str | None  # None when runs were measured
    runs: list[Measured] = field(default_factory=list)
    drift: pd.DataFrame | None = None
    other_gpus: list[Option] = field(default_factory=list)  # the recommended configuration on other GPUs
    load: pd.DataFrame | None = None  # latency against load (load.predicted / load.measured rows)
    formats: list = field(default_factory=list)  # format_table.FormatRow per expert format, on the question's GPU
    generated_at: float = field(default_factory=time.time)
    headline: Headline | None = None  # the answer, as the CLI's first screen and the Planner's top give it
    extras: dict = field(default_factory=dict)  # per-GPU telemetry and repeat groups' intervals (run_extras)

    @property
    def measured(self) -> bool:
        return bool(self.runs)


def select_runs(store: Store, run_ids: list[str] | None, model: str | None, gpu: str | None,
                limit: int = 8) -> pd.DataFrame:
    """The runs a report covers: the ids given (all must exist), else the newest finished runs of the model/GPU."""
    runs = runinfo.list_runs(store)
    if run_ids:
        unknown = [r for r in run_ids if r not in set(runs.run_id)]
        if unknown:
            raise BadInput(f"unknown run id(s): {', '.join(unknown)} (see `capbench runs`)")
        return runs.set_index("run_id").loc[run_ids].reset_index()
    runs = runs[runs.status.isin(["completed", "aborted"])]
    if model:
        runs = runs[runs.model == model]
    if gpu:
        runs = runs[runs.gpu == gpu]
    return runs.head(limit)


def newest_deployment(db: str | Path | None, run_ids: list[str] | None = None) -> dict:
    """model, gpu, tp, kv_dtype, weights of the newest run in the DB (of run_ids, if given) that names them ({}
    when none)."""
    if db is None or not Path(db).is_file():
        return {}
    runs = runinfo.list_runs(Store(db, read_only=True))
    if run_ids:
        runs = runs[runs.run_id.isin(run_ids)]
    runs = runs.dropna(subset=["model", "gpu", "tp"])
    if runs.empty:
        return {}
    row = runs.iloc[0]
    return {k: row[k] for k in ("model", "gpu", "tp", "kv_dtype", "weights") if pd.notna(row[k])}


def build(q: Question, db: str | Path | None = None, run_ids: list[str] | None = None,
          progress=None, other_gpus: bool = True, workers: int = 1) -> Report:
    """progress: called once per simulated configuration and once per run (a rich progress bar's advance).
    other_gpus: also price the recommended configuration on the catalog's other GPUs."""
    slo = q.slo
    measured, why, drift, extras = [], None, None, {}
    if db is None or not Path(db).is_file():
        if run_ids:
            raise BadInput(f"--runs given but there is no results database at {db}")
        why = f"there is no results database at {db}" if db else "no results database was given"
    else:
        store = Store(db, read_only=True)
        runs = select_runs(store, run_ids, None if run_ids else q.model, None if run_ids else q.gpu)
        if runs.empty:
            why = f"{db} holds no finished runs of {q.model} on {q.gpu}"
        with store.connect() as con:
            for _, row in runs.iterrows():
                mvp = measured_vs_predicted(con, row.run_id, slo)
                measured.append(Measured(row.run_id, row.identity, mvp["config"], mvp["summary"], mvp,
                                         runinfo.integrity(con, row.run_id),
                                         f"{_without_model(identity.short(row.to_dict()))} ({row.run_id[-6:]})"))
                if progress:
                    progress()
            drift, extras = runinfo.drift(con), run_extras.tables(con, measured, slo)
        _unique_labels(measured)
    plan = make_plan(q, progress=(lambda *_: progress()) if progress else None, workers=workers, curves=True)
    others = [o for o in gpu_bests(plan) if o is not (plan.recommended or plan.chosen)] if other_gpus else []
    report = Report(plan, str(db) if db else None, why, measured, drift, others, extras=extras)
    report.headline = make_headline(plan, pd_versus.compare(plan))
    report.load = latency_load(report, db)
    report.formats = format_table.rows(q.model, q.gpu, q.tp, q.kv_dtype, q.request_mix(), slo, q.context,
                                       q.price_per_gpu_hour)
    return report


def gpu_bests(plan: Plan) -> list[Option]:
    """Each GPU's cheapest configuration for the target (plan.by_gpu), the recommended one for its own GPU."""
    rec = plan.recommended
    return [rec if rec is not None and o.config.gpu == rec.config.gpu else o for o in plan.by_gpu()]


def latency_load(r: Report, db: str | Path | None) -> pd.DataFrame | None:
    """Predicted latency against load for the recommended configuration, with the measured runs of that
    deployment and workload as points (None when nothing serves the load)."""
    rec, q = r.plan.recommended, r.plan.question
    if rec is None:
        return None
    df = load.predicted(rec.config.deployment(q.model, q.context), q.request_mix(), q.slo, rec.prediction)
    model = catalog.model(q.model)

    def deployed(gpu, tp, kv, weights) -> tuple:
        return gpu, tp, kv, capacity.weight_formats(model, weights or "native")[0]

    same = [m.run_id for m in r.runs if m.config.get("workload") == q.workload and
            deployed(m.config.get("gpu"), m.config.get("tp"), m.config.get("kv_dtype"), m.config.get("weights")) ==
            deployed(rec.config.gpu, rec.tp, rec.kv_dtype, rec.weights)]
    if same and db is not None:
        with Store(db, read_only=True).connect() as con:
            df = pd.concat([df, load.measured(con, same, q.slo)], ignore_index=True)
    return df


def _without_model(short: str) -> str:
    """A run's short identity less its model name (the report's sections are per model): for chart labels."""
    return short.split(", ", 1)[-1]


def _unique_labels(runs: list[Measured]) -> None:
    """Two runs of one identity (same deployment and load, started the same minute) get the end of their id."""
    labels = [m.label for m in runs]
    for m in runs:
        if labels.count(m.label) > 1:
            m.label = f"{m.label} · {m.run_id[-6:]}"


# ---- the figures a manager reads first -----------------------------------------------------------------------------
def compared(plan: Plan) -> tuple[list[Option], list[dict]]:
    """The KV dtype x expert weights variants at the recommended GPU and parallelism, as rows with gains against
    the first (BF16 KV, native weights)."""
    opts = plan.four_way()
    rows = []
    for o in opts:
        row = o.to_row()
        for key in ("kv_pool_tokens", "concurrent_seqs_at_context", "rate_rps", "output_tps"):
            row[f"{key}_gain"] = plan.gain(o, opts[0], key)
        row["config"] = o.short_label + (" (your choice)" if o.chosen else "")
        rows.append(row)
    return opts, rows


def answer_lines(r: Report) -> list[str]:
    plan = r.plan
    rec = plan.recommended
    head = r.headline or make_headline(plan)
    lines = wording.headline_lines(head, width=10**6, launch=False)
    if rec is None:
        return lines
    lines += [wording.quality(r.drift, plan.question.model, what) + "." for what, used in
              (("fp8 KV", rec.kv_dtype != "bf16"), ("int4 experts", "int4" in wording.experts(rec))) if used]
    you = plan.chosen
    if you is not rec and you.serves:
        lines.append(f"Your choice, {wording.choice(you, plan.question.slo.percentile)}.")
    cheaper = [o for o in r.other_gpus if o.monthly_cost is not None and o.monthly_cost < rec.monthly_cost]
    if cheaper:
        o = min(cheaper, key=lambda o: o.monthly_cost)
        lines.append(f"Other GPUs: {o.label} on {o.gpus_needed} GPUs would cost "
                     f"${o.monthly_cost:,.0f} a month at the catalog's ${o.price:.2f}/GPU-hour (see the table below).")
    if r.measured:
        errs = [row["error"] for m in r.runs if m.vs_predicted.get("steady") for row in m.vs_predicted["rows"]
                if row["figure"] == "output tokens/s" and row["error"] is not None]
        worst = (f"; prediction error of output tokens/s up to {max(abs(e) for e in errs):.0%} over the runs of "
                 f"{STEADY_REQUESTS}+ requests" if errs else
                 f"; no run has {STEADY_REQUESTS}+ requests, too few to judge the predictions by")
        twins = sum(1 for m in r.runs if m.config.get("twin"))
        against = (" against capbench's twin (simulated GPUs: this checks the load path and the model's consistency, "
                   "not the hardware)" if twins == len(r.runs) else
                   f" ({twins} against capbench's twin, the rest against real servers)" if twins else
                   " against real servers")
        judged = [row["inside"] for m in r.runs if m.vs_predicted.get("steady") for row in m.vs_predicted["rows"]
                  if row.get("inside") is not None]
        inside = (f" {sum(judged)} of {len(judged)} measured figures lie inside the model's 80 % interval."
                  if judged else "")
        lines.append(f"Measured: {len(r.runs)} run(s) in {r.db}{against}{worst}."
                     + (" Treat the predictions as that uncertain." if errs else "") + inside)
    else:
        lines.append(f"Nothing was measured ({r.why_unmeasured}): every figure here is a prediction from the "
                     "capacity model and capbench simulate. Measure before buying: see 'How to measure'.")
    return lines


# ---- tables ---------------------------------------------------------------------------------------------------------
def _num(v, spec: str = ",.0f", suffix: str = "", none: str = "n/a") -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return none
    return f"{format(v, spec)}{suffix}"


def _gain(v) -> str:
    return "" if v is None or pd.isna(v) else f" ({v:.2f}x)"


def predicted_table(plan: Plan) -> tuple[list[str], list[list[str]]]:
    """The KV dtype x expert weights variants' predicted rate, latency and cost (the report and the Planner)."""
    q, rows = plan.question, compared(plan)[1]
    p = q.slo.percentile
    return (["configuration", "max req/s per instance", "output tokens/s", f"TTFT p{p}", f"TPOT p{p}",
                       "limited by", "$ per 1M output tokens", f"GPUs for {q.target_rate_rps:g} req/s",
                       "monthly cost"],
                      [[x["config"], _rate(x) + ("" if not x["rate_rps"] else _gain(x["rate_rps_gain"])),
                        _num(x["output_tps"]), _num(x["ttft_s"] and x["ttft_s"] * 1e3, ",.0f", " ms"),
                        _num(x["tpot_s"] and x["tpot_s"] * 1e3, ",.1f", " ms"),
                        (x["limited_by"] + " passes its bound" if x["limited_by"] else "does not fit"),
                        wording.money(x["usd_per_m_output"], ",.2f", _none(x)), _num(x["gpus_needed"], none="-"),
                        wording.money(x["monthly_cost"], ",.0f", _none(x))] for x in rows])


def tables(r: Report) -> dict[str, tuple[list[str], list[list[str]]]]:
    plan, q = r.plan, r.plan.question
    four, rows = compared(plan)
    t = {}
    t["configs"] = (["configuration", "expert weights", "KV cache", "weights per GPU", "fits"],
                    [[o.label + (" (your choice)" if o.chosen else ""),
                      wording.experts(o).upper() + (" (converted)" if wording.converted(o) else " (as shipped)"),
                      o.kv_dtype.replace("_e4m3", "").upper(),
                      _num(o.capacity.weight_bytes_per_gpu / 1e9, ",.1f", " GB"), "yes" if o.capacity.fits else "no"]
                     for o in four])
    t["capacity"] = (["configuration", "KV pool tokens", f"sequences at {plan.context:,} tokens",
                      "max running requests", "longest context"],
                     [[x["config"], _num(x["kv_pool_tokens"]) + _gain(x["kv_pool_tokens_gain"]),
                       _num(x["concurrent_seqs_at_context"]) + _gain(x["concurrent_seqs_at_context_gain"]),
                       _num(x["max_running_requests"]), _num(o.capacity.longest_context)]
                      for x, o in zip(rows, four, strict=True)])
    t["predicted"] = predicted_table(plan)
    if r.other_gpus:
        t["gpus"] = (["configuration", "$ per GPU-hour", "fits", "max req/s per instance",
                      f"GPUs for {q.target_rate_rps:g} req/s", "monthly cost", "$ per 1M output tokens"],
                     [[o.label, wording.money(o.price, ",.2f"), "yes" if o.capacity.fits else "no",
                       _rate(o.to_row()), _num(o.gpus_needed, none="-"),
                       wording.money(o.monthly_cost, ",.0f", _none(o.to_row())),
                       wording.money(o.usd_per_m_output, ",.2f", _none(o.to_row()))]
                      for o in [_on_question_gpu(plan), *r.other_gpus]])
    if r.formats:
        t["formats"] = formats_section(r.formats)
    if r.measured:
        t["measured"] = (["run", "requests", "success", "achieved req/s", "output tokens/s",
                          "goodput req/s", "TTFT p50 / p99", "TPOT p50 / p99"],
                         [[m.label, _num(m.summary["measured"]),
                           _num(m.summary["success_rate"] and m.summary["success_rate"] * 100, ".1f", " %"),
                           _num(m.summary["achieved_rate_rps"], ",.2f"), _num(m.summary["output_tps"]),
                           _num(m.summary["goodput_rps"], ",.2f"),
                           f"{_ms(m.summary['ttft_p50'])} / {_ms(m.summary['ttft_p99'])}" + _late(m.summary),
                           f"{_ms(m.summary['tpot_p50'])} / {_ms(m.summary['tpot_p99'])}"] for m in r.runs])
        figures = list(dict.fromkeys(row["figure"] for m in r.runs for row in m.vs_predicted["rows"]))
        t["vs"] = (["run", *(f"{f}: measured / predicted [80 % interval] (error)" for f in figures)],
                   [[m.label, *(_vs_cell(next((x for x in m.vs_predicted["rows"] if x["figure"] == f), None))
                                for f in figures)] for m in r.runs])
        t.update(r.extras)
        checked = [m for m in r.runs if m.integrity["has_data"]]
        if checked:
            t["integrity"] = (["run", "pages checksummed", "pages verified", "mismatches", "checksum time share"],
                              [[m.label, _num(m.integrity["pages_checksummed"]), _num(m.integrity["pages_verified"]),
                                _num(m.integrity["mismatches"]),
                                _num(m.integrity["checksum_share"] and m.integrity["checksum_share"] * 100, ".2f",
                                     " %")] for m in checked])
    return t


def _on_question_gpu(plan: Plan) -> Option:
    return plan.recommended or plan.chosen


def _ms(seconds) -> str:
    return _num(None if seconds is None else seconds * 1e3, ",.0f", " ms")


def _late(s: dict) -> str:
    """Beside TTFT (counted from the due time), where the client fell behind its schedule: its lag's p50."""
    late = (s.get("dispatch_lag_p99") or 0) > 0.010 and s.get("ttft_lag_p50") is not None
    return f" (the client late: p50 {_ms(s['ttft_lag_p50'])})" if late else ""


def _vs_cell(row: dict | None) -> str:
    if row is None:
        return "-"
    err = "" if row["error"] is None else f" ({row['error']:+.0%})"
    band = "" if row.get("low") is None else f" [{_num(row['low'], ',.1f')}-{_num(row['high'], ',.1f')}]"
    return f"{_num(row['measured'], ',.1f')} / {_num(row['predicted'], ',.1f')}{band}{err}"


def _none(row: dict) -> str:
    return "does not fit" if not row["fits"] else "not simulated" if not row["simulated"] else wording.NONE_MEETS


def _rate(row: dict) -> str:
    if not row["fits"]:
        return "does not fit"
    if row["rate_rps"] is None:
        return "not simulated"
    return wording.NONE_MEETS if row["rate_rps"] == 0 else _num(row["rate_rps"], ",.2f", " req/s")


def launch(r: Report) -> tuple[str | None, list[str], list[str]]:
    """(single-node command or None when tp spans nodes, multi-node commands, prerequisites) for the recommended
    (else chosen) option."""
    plan, q = r.plan, r.plan.question
    o = plan.recommended or plan.chosen
    single, multi = o.commands()
    notes = []
    path, where = sglang_cmd.model_path(q.model, o.weights, o.tp)
    if where:
        notes.append(f"{path}: {where}.")
    if o.kv_dtype == "fp8_e4m3":
        notes.append("kv_scales.json: per-layer FP8 KV scales, from a BF16-KV server started with `capbench "
                     "sglang-launch --record-kv-amax amax -- ...` and `capbench calibrate-kv-scales --target URL "
                     "--amax amax --out kv_scales.json`; without them SGLang runs Kimi's and GLM's FP8 KV at scale "
                     "1.0 and values past 448 saturate.")
    notes.append(f"{o.instances_needed or 1} instance(s): run one command per instance (each on its own {o.tp} "
                 "GPUs) and put a load balancer (e.g. sglang_router) in front.")
    return single, multi, notes


def chart_svgs(r: Report) -> dict[str, str]:
    df = pd.DataFrame(compared(r.plan)[1])
    q = r.plan.question
    out = {
        "capacity": charts.to_svg(charts.option_bars(df, "kv_pool_tokens", "KV pool tokens",
                                                     gain_field="kv_pool_tokens_gain")),
        "throughput": charts.to_svg(charts.option_bars(df, "output_tps", "Output tokens/s at the SLO, per instance",
                                                       gain_field="output_tps_gain")),
        "gpus": charts.to_svg(charts.option_bars(df, "gpus_needed", f"GPUs for {q.target_rate_rps:g} req/s")),
        "cost": charts.to_svg(charts.option_bars(df, "monthly_cost", "Monthly cost ($)")),
    }
    rows = pd.DataFrame(r.plan.rows())
    if rows["output_tps_per_gpu"].notna().any():
        out["curves"] = charts.to_svg(plancharts.curves(r.plan.curves()))
        out["pareto_tps"] = charts.to_svg(plancharts.pareto_throughput(rows))
        out["pareto_cost"] = charts.to_svg(plancharts.pareto_cost(rows, q.slo.percentile))
    bests = gpu_bests(r.plan)
    if len(bests) > 1:
        out["gpu_compare"] = charts.to_svg(plancharts.gpu_comparison(pd.DataFrame([o.to_row() for o in bests]),
                                                                     q.target_rate_rps))
    if r.load is not None and not r.load.empty:
        out["load"] = charts.to_svg(plancharts.latency_vs_load(
            r.load, q.slo, f"Latency against load: {r.plan.recommended.label}"))
    if r.measured:
        pct = pd.concat([runinfo.percentile_rows(m.summary).assign(run=m.short) for m in r.runs])
        pct = pct[pct.metric.isin(["TTFT", "TPOT", "E2E"])]
        if not pct.empty:
            out["latency"] = charts.to_svg(charts.latency_percentiles(pct, "Measured latency percentiles (ms)"))
        vs = pd.DataFrame([dict(row, run=m.short) for m in r.runs for row in m.vs_predicted["rows"]])
        if not vs.empty:
            out["vs"] = charts.to_svg(charts.measured_vs_predicted(vs, "Measured vs predicted"))
    return out


# ---- rendering ------------------------------------------------------------------------------------------------------
