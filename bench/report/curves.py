"""A campaign's latency against load: per load (workload) and figure (TTFT, TPOT at the SLO's percentile), every
deployment's measured stages against their offered rate, the model's curve for the same deployment on the same
axes with its 80 % interval as a band, and the SLO's bound as a line. The campaign's HTML report draws them as
static SVG (no script, no network); the dashboard's Campaigns page draws the same charts.

The measured points are the sweep's stages (result["points"]; a stage whose requests were cut off past every bound
is drawn at the top, as a triangle); the predicted curve is the model's own sweep for the cell (result
["predicted_curve"], bench/campaign/predict.py). Rates and latencies are in the modelled GPUs' time (a twin's
divided by its time scale), like every other figure of the campaign report.
"""

from __future__ import annotations

import html

import altair as alt
import pandas as pd

from bench.model import parse_slo
from bench.report.charts import to_svg

FIGURES = (("TTFT", "ttft", "s", 1.0), ("TPOT", "tpot", "ms", 1e3))  # name, result key, unit, from seconds
VERDICTS = ("stage within the SLO", "stage missed the SLO", "cut off (past every bound)")
COLUMNS = ["load", "figure", "deployment", "source", "rate", "value", "low", "high", "verdict", "detail"]


def curve_rows(cells: list[dict]) -> pd.DataFrame:
    """Long rows of every cell's measured stages and predicted curve, in the chart's units (COLUMNS)."""
    rows = []
    for c in cells:
        q = c.get("percentile") or 90
        for name, key, unit, k in FIGURES:
            base = {"load": c.get("load"), "figure": f"{name} p{q} ({unit})", "deployment": c.get("deployment")}
            for p in c.get("points") or []:
                value = p.get(key) if key in p else p.get(f"{key}_p90")
                if value is None and not p.get("sent"):
                    continue
                verdict = VERDICTS[2] if value is None else VERDICTS[0] if p.get("meets") else VERDICTS[1]
                rows.append({**base, "source": "measured", "rate": p.get("rate"),
                             "value": None if value is None else value * k, "low": None, "high": None,
                             "verdict": verdict, "detail": f"repeat {p.get('repeat', 0) + 1}: {p.get('why') or ''}"})
            for p in c.get("predicted_curve") or []:
                if not p.get(key):
                    continue
                rows.append({**base, "source": "predicted", "rate": p["rate"], "value": p[key] * k,
                             "low": _times(p.get(f"{key}_low"), k), "high": _times(p.get(f"{key}_high"), k),
                             "verdict": "", "detail": "the model's sweep"})
    return pd.DataFrame(rows, columns=COLUMNS)


def _times(v: float | None, k: float) -> float | None:
    return None if v is None else v * k


def slo_bounds(cells: list[dict]) -> dict[tuple[str, str], float]:
    """(load, figure column) -> the SLO's bound in the chart's unit, from each cell's SLO."""
    out = {}
    for c in cells:
        if not c.get("slo"):
            continue
        slo = parse_slo(c["slo"])
        for name, key, unit, k in FIGURES:
            bound = getattr(slo, f"{key}_s")
            if bound is not None:
                out[(c.get("load"), f"{name} p{slo.percentile} ({unit})")] = bound * k
    return out


def latency_chart(df: pd.DataFrame, figure: str, bound: float | None, title: str) -> alt.Chart:
    """One load's one figure: measured points (shape: the stage's verdict), the predicted curve dashed with its band,
    colour per deployment, the SLO a red rule; log latency axis (past saturation the model's latency climbs fast)."""
    shown = df[df.value.notna()]
    top = max([float(shown.value.max()) if len(shown) else 1.0, float(df.high.max()) if df.high.notna().any() else 0,
               bound or 0]) * 1.5
    df = df.assign(value=df.value.fillna(top))  # a cut-off stage: at the top
    color = alt.Color("deployment:N", legend=alt.Legend(orient="top", title=None, symbolOpacity=1))
    x = alt.X("rate:Q", title="offered rate (req/s of the modelled GPUs)")
    y = alt.Y("value:Q", title=figure, scale=alt.Scale(type="log"))
    tip = [alt.Tooltip("deployment:N", title="deployment"), alt.Tooltip("source:N", title="measured or predicted"),
           alt.Tooltip("rate:Q", format=",.3g", title="offered rate (req/s)"),
           alt.Tooltip("value:Q", format=",.3g", title=figure), alt.Tooltip("verdict:N", title="stage"),
           alt.Tooltip("detail:N", title="detail")]
    pred = df[df.source == "predicted"]
    layers = [
        # the band on its own channel without a legend: sharing the colour legend washed its swatches out
        alt.Chart(pred).mark_area(opacity=0.18).encode(
            x=x, y=alt.Y("low:Q", title=figure, scale=alt.Scale(type="log")), y2="high:Q",
            fill=alt.Fill("deployment:N", legend=None)),
        alt.Chart(pred).mark_line(strokeDash=[6, 3]).encode(x=x, y=y, color=color, tooltip=tip),
        alt.Chart(df[df.source == "measured"]).mark_point(size=70, filled=True).encode(
            x=x, y=y, color=color, tooltip=tip,
            shape=alt.Shape("verdict:N", scale=alt.Scale(domain=list(VERDICTS), range=["circle", "cross",
                                                                                         "triangle-up"]),
                            legend=alt.Legend(orient="bottom", title=None))),
    ]
    if bound is not None:
        slo = pd.DataFrame([{"value": bound, "label": f"SLO {bound:g}"}])
        layers += [alt.Chart(slo).mark_rule(color="#d62728", strokeDash=[4, 4]).encode(y="value:Q"),
                   alt.Chart(slo).mark_text(align="left", dx=4, dy=-6, color="#d62728").encode(
                       y="value:Q", x=alt.value(0), text="label:N")]
    sub = "points: measured stages; dashed: predicted, band: its 80 % interval; red: the SLO"
    return alt.layer(*layers).resolve_scale(fill="independent").properties(title=alt.Title(title, subtitle=sub),
                                                                          width=520, height=260)


def campaign_curves(cells: list[dict]) -> list[tuple[str, alt.Chart]]:
    """(title, chart) per (load, figure) that has any point: the report's and the Campaigns page's charts."""
    df, bounds = curve_rows(cells), slo_bounds(cells)
    out = []
    for (load, figure), g in df.groupby(["load", "figure"], sort=False):
        if g.value.notna().any():
            title = f"{load}: {figure} against offered rate"
            out.append((title, latency_chart(g, figure, bounds.get((load, figure)), title)))
    return out


def curves_html(cells: list[dict]) -> str:
    """The charts as inline SVG with a heading, or a line saying why there are none."""
    charts = campaign_curves(cells)
    if not charts:
        return "<h2>Latency against load</h2><p>No stage measured yet.</p>"
    parts = ["<h2>Latency against load, per load: measured stages and the model's curve (modelled GPUs' time)</h2>"]
    if not any(c.get("predicted_curve") for c in cells):
        parts.append("<p>No predicted curve recorded for these cells (not predicted, or run before capbench "
                     "recorded it).</p>")
    for title, chart in charts:
        parts.append(f"<figure aria-label='{html.escape(title)}'>{to_svg(chart)}</figure>")
    return "".join(parts)
