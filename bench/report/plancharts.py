"""Charts of a plan and of load: latency against load with the SLO drawn on it, the Pareto views of `capbench plan`
(output tokens/s per GPU against tokens/s per user; $ per 1M output tokens against latency) and the GPU comparison
at each GPU's best configuration. Each takes a DataFrame (plan.rows(), load.predicted/measured) and returns an
Altair chart, for the Planner, the Compare page and the report alike."""

from __future__ import annotations

import altair as alt
import pandas as pd

from bench.model import Slo

SOURCE = alt.Scale(domain=["measured", "predicted"], range=["#4c78a8", "#f58518"])
VARIANT = alt.Scale(scheme="tableau10")


def latency_vs_load(df: pd.DataFrame, slo: Slo, title: str = "Latency against load") -> alt.Chart:
    """df: load.predicted/measured rows. A 2 x 2 grid: TTFT and TPOT (rows, own axes) against the offered and the
    achieved rate (columns); measured and predicted lines; the SLO a dashed red line; the highest offered rate
    within the SLO of each source ringed."""
    q = slo.percentile
    limits = {"TTFT": None if slo.ttft_s is None else slo.ttft_s * 1e3,
              "TPOT": None if slo.tpot_s is None else slo.tpot_s * 1e3}
    best = {}
    for src, g in df.groupby("source"):
        ok = g[g.within_slo]
        best[src] = ok.offered_rps.max() if len(ok) else None
    rows = []
    for r in df.to_dict("records"):
        for metric, col in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms")):
            if r[col] is None or pd.isna(r[col]):
                continue
            for kind, x in (("offered rate (req/s)", r["offered_rps"]), ("achieved rate (req/s)", r["achieved_rps"])):
                rows.append({"metric": f"{metric} p{q} (ms)", "x_kind": kind, "x": x, "ms": r[col],
                             "source": r["source"], "slo_ms": limits[metric],
                             "best": best.get(r["source"]) == r["offered_rps"], "run": r["run"]})
    long = pd.DataFrame(rows, columns=["metric", "x_kind", "x", "ms", "source", "slo_ms", "best", "run"])
    base = alt.Chart(long)
    lines = base.mark_line(point=alt.OverlayMarkDef(size=40)).encode(
        x=alt.X("x:Q", title=None), y=alt.Y("ms:Q", title=None, scale=alt.Scale(type="log")),
        color=alt.Color("source:N", scale=alt.Scale(domain=[x for x in SOURCE.domain if x in set(df.source)],
                                                    range=[c for x, c in zip(SOURCE.domain, SOURCE.range,
                                                                             strict=True) if x in set(df.source)]),
                        legend=alt.Legend(orient="top", title=None)),
        order="x:Q", detail="source:N",
        tooltip=[alt.Tooltip("source:N", title="measured or predicted"), alt.Tooltip("run:N", title="run"),
                 alt.Tooltip("x_kind:N", title="x axis"), alt.Tooltip("x:Q", format=",.2f", title="rate (req/s)"),
                 alt.Tooltip("metric:N", title="figure"), alt.Tooltip("ms:Q", format=",.1f", title="latency (ms)")])
    rule = base.transform_filter("isValid(datum.slo_ms)").mark_rule(color="#e45756", strokeDash=[6, 3]).encode(
        y="mean(slo_ms):Q")
    ring = base.transform_filter("datum.best").mark_point(size=220, shape="circle", strokeWidth=2.5,
                                                          color="black").encode(x="x:Q", y="ms:Q")
    return alt.layer(lines, rule, ring).properties(width=250, height=170).facet(
        row=alt.Row("metric:N", title=None, sort=[f"TTFT p{q} (ms)", f"TPOT p{q} (ms)"]),
        column=alt.Column("x_kind:N", title=None, sort=["offered rate (req/s)", "achieved rate (req/s)"]),
    ).resolve_scale(y="independent", x="independent").properties(
        title=alt.TitleParams(title, subtitle=["Dashed red: the SLO. Ringed: the highest offered rate within it."]))


def _variant(rows: pd.DataFrame) -> pd.DataFrame:
    rows = rows.copy()
    rows["variant"] = rows["short"]
    rows["marked"] = rows["recommended"].map({True: "recommended", False: "other"})
    return rows


def _points(rows: pd.DataFrame, x: str, y: str, x_title: str, y_title: str, front: str, title: str,
            x_log: bool = False, y_fmt: str = ",.0f") -> alt.Chart:
    d = _variant(rows[rows[x].notna() & rows[y].notna()])
    base = alt.Chart(d)
    enc = {"x": alt.X(f"{x}:Q", title=x_title, scale=alt.Scale(type="log" if x_log else "linear", zero=False)),
           "y": alt.Y(f"{y}:Q", title=y_title, scale=alt.Scale(zero=False))}
    dots = base.mark_point(filled=True, size=70, opacity=0.85).encode(
        **enc, color=alt.Color("variant:N", scale=VARIANT, legend=alt.Legend(orient="bottom", title=None,
                                                                             columns=1, labelLimit=400)),
        shape=alt.Shape("gpu:N", legend=alt.Legend(orient="bottom", title="GPU")),
        tooltip=[alt.Tooltip("config:N", title="configuration"), alt.Tooltip(f"{x}:Q", format=",.2f", title=x_title),
                 alt.Tooltip(f"{y}:Q", format=y_fmt, title=y_title),
                 alt.Tooltip("gpus_needed:Q", format=",.0f", title="GPUs for the target load"),
                 alt.Tooltip("limited_by:N", title="limited by")])
    edge = base.transform_filter(f"datum.{front}").mark_line(color="#888", strokeDash=[4, 3]).encode(
        **enc, order=f"{x}:Q")
    rec = base.transform_filter("datum.recommended").mark_point(size=400, color="#e45756", strokeWidth=3).encode(
        **enc)
    label = base.transform_filter("datum.recommended").mark_text(dy=-18, color="#e45756", fontWeight="bold").encode(
        **enc, text=alt.value("recommended"))
    return alt.layer(edge, dots, rec, label).properties(title=alt.TitleParams(
        title, subtitle=["Each point a configuration that meets the SLO; dashed grey: the Pareto front."]),
        width=380, height=260)


def pareto_throughput(rows: pd.DataFrame) -> alt.Chart:
    """plan.rows(): output tokens/s per GPU against tokens/s per user, at each configuration's highest rate within
    the SLO."""
    return _points(rows, "tps_per_user", "output_tps_per_gpu", "tokens/s per user (1 / TPOT)",
                   "output tokens/s per GPU", "pareto", "Throughput per GPU against speed per user")


def pareto_cost(rows: pd.DataFrame, percentile: int) -> alt.Chart:
    """plan.rows(): $ per 1M output tokens against end-to-end latency at the SLO's percentile."""
    d = rows.assign(e2e_ms=rows["e2e_s"] * 1e3)
    return _points(d, "e2e_ms", "usd_per_m_output", f"E2E latency p{percentile} (ms)", "$ per 1M output tokens",
                   "pareto_cost", "Cost against latency", y_fmt="$,.2f")


def gpu_comparison(rows: pd.DataFrame, target_rps: float) -> alt.Chart:
    """One bar per GPU at its cheapest configuration serving the target: monthly cost, labelled with the GPUs
    needed, the configuration and $ per 1M output tokens; the recommended one red."""
    d = rows.copy()
    d["label"] = d.apply(lambda r: f"${r.monthly_cost:,.0f}/month: {r.gpus_needed:.0f} GPUs, {r.short}, "
                         f"${r.usd_per_m_output:,.2f} per 1M tokens", axis=1)
    bars = alt.Chart(d).mark_bar().encode(
        y=alt.Y("gpu:N", title=None, sort=alt.EncodingSortField("monthly_cost")),
        x=alt.X("monthly_cost:Q", title=f"monthly cost for {target_rps:g} req/s ($)",
                scale=alt.Scale(domain=[0, float(d.monthly_cost.max()) * 2.2]), axis=alt.Axis(format="$,.0f")),
        color=alt.condition("datum.recommended", alt.value("#e45756"), alt.value("#4c78a8")),
        tooltip=[alt.Tooltip("config:N", title="configuration"),
                 alt.Tooltip("monthly_cost:Q", format="$,.0f", title="$ a month"),
                 alt.Tooltip("gpus_needed:Q", format=",.0f", title="GPUs"),
                 alt.Tooltip("usd_per_m_output:Q", format="$,.2f", title="$ per 1M output tokens")])
    text = bars.mark_text(align="left", dx=4, color="black").encode(text="label:N", color=alt.value("black"))
    return (bars + text).properties(title="Each GPU at its cheapest configuration for the target load", width=380,
                                    height=alt.Step(30))


def curves(c: dict) -> alt.Chart:
    """plan.curves(): each configuration's output tokens/s per GPU against tokens/s per user over concurrency, with
    its 80 % band (throughput), the SLO's tokens/s per user as a dashed red line, the corpus's published points of
    the same configurations as black crosses (the subtitle says when the corpus has none), and the Pareto front
    over all curves' points in grey. The legend shows each configuration's line at full strength, not its faint
    band; the axes span the points, not a log scale's rounded decades."""
    pts = pd.DataFrame(c["points"], columns=["config", "concurrency", "tps_per_gpu", "tps_per_user", "tps_per_gpu_low",
                                             "tps_per_gpu_high", "tps_per_user_low", "tps_per_user_high", "ttft_s",
                                             "pareto"])
    published = pd.DataFrame(c.get("published") or [], columns=["config", "case", "concurrency", "sglang_version",
                                                                 "tps_per_gpu", "tps_per_user"])
    xs = pd.concat([pts.tps_per_user, published.tps_per_user, pd.Series([c.get("slo_tps_per_user")])]).dropna()
    xs = xs[xs > 0]
    domain = [float(xs.min()) / 1.25, float(xs.max()) * 1.25] if len(xs) else None
    enc = {"x": alt.X("tps_per_user:Q", title="tokens/s per user (1 / median TPOT)",
                      scale=alt.Scale(type="log", domain=domain, nice=False) if domain else alt.Scale(type="log")),
           "y": alt.Y("tps_per_gpu:Q", title="output tokens/s per GPU", scale=alt.Scale(zero=True))}
    legend = alt.Legend(orient="bottom", title=None, columns=1, labelLimit=400, symbolType="stroke",
                        symbolStrokeWidth=4, symbolOpacity=1, symbolSize=300)
    color = alt.Color("config:N", scale=VARIANT, legend=legend)
    base = alt.Chart(pts)
    # no order channel on the band: with one, Vega-Lite draws no area at all (the band is sorted by x)
    # its own channel (fill, no legend): a band sharing the lines' colour legend turned its swatches near-white
    band = base.mark_area(opacity=0.18).encode(x=enc["x"], y="tps_per_gpu_low:Q", y2="tps_per_gpu_high:Q",
                                               fill=alt.Fill("config:N", scale=VARIANT, legend=None))
    lines = base.mark_line(point=alt.OverlayMarkDef(size=40)).encode(
        **enc, color=color, order="concurrency:Q",
        tooltip=[alt.Tooltip("config:N", title="configuration"),
                 alt.Tooltip("concurrency:Q", format=",d", title="requests in flight"),
                 alt.Tooltip("tps_per_gpu:Q", format=",.0f", title="output tokens/s per GPU"),
                 alt.Tooltip("tps_per_gpu_low:Q", format=",.0f", title="80 % interval: low"),
                 alt.Tooltip("tps_per_gpu_high:Q", format=",.0f", title="80 % interval: high"),
                 alt.Tooltip("tps_per_user:Q", format=",.1f", title="tokens/s per user"),
                 alt.Tooltip("ttft_s:Q", format=",.2f", title="median TTFT (s)")])
    edge = base.transform_filter("datum.pareto").mark_line(color="#888", strokeDash=[4, 3]).encode(
        **enc, order="tps_per_user:Q")
    layers = [band, lines, edge]
    if c.get("slo_tps_per_user"):
        layers.append(alt.Chart(pd.DataFrame({"x": [c["slo_tps_per_user"]]})).mark_rule(
            color="#e45756", strokeDash=[6, 3]).encode(x="x:Q"))
    if len(published):
        layers.append(alt.Chart(published).mark_point(shape="cross", size=120, color="black", filled=True).encode(
            **enc, tooltip=[alt.Tooltip("config:N", title="configuration"),
                            alt.Tooltip("case:N", title="published case"),
                            alt.Tooltip("concurrency:Q", format=",d", title="requests in flight"),
                            alt.Tooltip("sglang_version:N", title="SGLang version"),
                            alt.Tooltip("tps_per_gpu:Q", format=",.0f", title="output tokens/s per GPU"),
                            alt.Tooltip("tps_per_user:Q", format=",.1f", title="tokens/s per user")]))
    crosses = ("Black crosses: published runs of the same configuration." if len(published) else
               "The corpus has no published run of these configurations to draw beside them.")
    return alt.layer(*layers).resolve_scale(fill="independent").properties(title=alt.TitleParams(
        "Throughput per GPU against speed per user, over concurrency", subtitle=[
            "Shaded: 80 % interval. Dashed red: the SLO's tokens/s per user. Dashed grey: the Pareto front over "
            "every curve.", crosses]), width=520, height=320)
