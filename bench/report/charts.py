"""Altair charts shared by the dashboard and the report: each function takes a DataFrame and returns a chart.

The report renders them to inline SVG (`to_svg`, vl-convert: no network, no scripts); the dashboard hands them to
st.altair_chart. Time-series charts take an x domain so several of them share one time axis.
"""

from __future__ import annotations

import sys

import altair as alt
import numpy as np
import pandas as pd

from bench.report import static_charts

WIDTH = 560
CONFIG_COLORS = alt.Scale(scheme="tableau10")


def _base(df: pd.DataFrame) -> alt.Chart:
    return alt.Chart(df)


def option_bars(df: pd.DataFrame, field: str, title: str, fmt: str = ",.0f", gain_field: str | None = None,
                highlight: str = "chosen") -> alt.Chart:
    """One bar per configuration (row `config`), labelled with its value and, if given, its gain."""
    df = df.copy()
    df["label"] = df[field].map(lambda v: "n/a" if pd.isna(v) else format(v, fmt))
    if gain_field and gain_field in df:
        df["label"] = df["label"] + df[gain_field].map(lambda g: "" if pd.isna(g) else f"  ({g:.2f}x)")
    df[field] = df[field].fillna(0)
    top = float(df[field].max()) or 1.0
    bars = _base(df).mark_bar().encode(
        y=alt.Y("config:N", title=None, sort=None, axis=alt.Axis(labelLimit=260)),
        x=alt.X(f"{field}:Q", title=title, scale=alt.Scale(domain=[0, top * 1.5], nice=False),
                axis=alt.Axis(format=",.0f" if top >= 1e3 else ",.4~g", tickCount=6, labelOverlap=True)),
        color=alt.condition(f"datum.{highlight}", alt.value("#e45756"), alt.value("#4c78a8"))
        if highlight in df else alt.value("#4c78a8"),
        tooltip=["config", alt.Tooltip(f"{field}:Q", format=fmt)],
    )
    text = bars.mark_text(align="left", dx=4, color="black").encode(text="label:N", color=alt.value("black"))
    return (bars + text).properties(title=title, width=WIDTH - 200, height=alt.Step(28))


def latency_percentiles(df: pd.DataFrame, title: str = "Latency percentiles (ms)") -> alt.Chart:
    """df: metric, percentile, ms (and run, for several runs)."""
    runs = list(dict.fromkeys(df["run"])) if "run" in df else None
    color = alt.Color("run:N", scale=CONFIG_COLORS, sort=runs, legend=alt.Legend(
        orient="bottom", title=None, columns=1, labelLimit=700)) if runs else alt.Color("percentile:N",
                                                                                        scale=CONFIG_COLORS)
    return _base(df).mark_bar().encode(
        x=alt.X("percentile:N", title=None, sort=["p50", "p90", "p95", "p99"]),
        xOffset=alt.XOffset("run:N", sort=runs) if runs else alt.value(0),
        y=alt.Y("ms:Q", title="ms"),
        color=color,
        column=alt.Column("metric:N", title=None, sort=["TTFT", "TPOT", "ITL", "E2E"]),
        tooltip=[*(["run"] if "run" in df else []), "metric", "percentile", alt.Tooltip("ms:Q", format=",.1f")],
    ).resolve_scale(y="independent").properties(title=title, width=110, height=180)


def log_bins(df: pd.DataFrame, bins: int = 40) -> pd.DataFrame:
    """The store's fine log buckets (value_ms, n, optional run) regrouped into `bins` bins of equal width on a log
    axis, the same edges for every run: lo_ms, hi_ms, n, share (of the run's values), run."""
    df = df[df["n"] > 0]
    if df.empty:
        return pd.DataFrame(columns=["lo_ms", "hi_ms", "n", "share", "run"])
    lo, hi = float(df["value_ms"].min()), float(df["value_ms"].max())
    edges = np.geomspace(lo / 1.01, hi * 1.01, bins + 1)
    parts = []
    for run, g in (df.groupby("run", sort=False) if "run" in df else [(None, df)]):
        n, _ = np.histogram(g["value_ms"], bins=edges, weights=g["n"])
        parts.append(pd.DataFrame({"lo_ms": edges[:-1], "hi_ms": edges[1:], "n": n, "share": n / n.sum(),
                                   "run": run}))
    out = pd.concat(parts, ignore_index=True)
    return out[out["n"] > 0]


def distribution(df: pd.DataFrame, title: str, unit: str = "requests") -> alt.Chart:
    """A latency histogram on a log x axis with bins of equal width on it (log_bins of the store's buckets): df
    value_ms, n (and run: several runs overlaid, y as each run's share)."""
    runs = "run" in df and df["run"].nunique() > 1
    binned = log_bins(df)
    y = alt.Y("share:Q", title=f"share of {unit}", axis=alt.Axis(format="%"), scale=alt.Scale(zero=True)) if runs \
        else alt.Y("n:Q", title=unit, scale=alt.Scale(zero=True))
    color = alt.Color("run:N", scale=CONFIG_COLORS, legend=alt.Legend(orient="bottom", title=None, labelLimit=400)) \
        if runs else alt.value("#4c78a8")
    return _base(binned).mark_rect(opacity=0.6 if runs else 0.9).encode(
        x=alt.X("lo_ms:Q", title="ms (log scale)", scale=alt.Scale(type="log")), x2="hi_ms:Q", y=y, y2=alt.datum(0),
        color=color,
        tooltip=[alt.Tooltip("lo_ms:Q", format=",.1f", title="from ms"),
                 alt.Tooltip("hi_ms:Q", format=",.1f", title="to ms"), alt.Tooltip("n:Q", format=",.0f", title=unit)],
    ).properties(title=title, width=WIDTH / 2 - 30, height=180)


def cdf(df: pd.DataFrame, title: str) -> alt.Chart:
    """The share of values at or below x (log axis), from the store's buckets: df value_ms, n (and run)."""
    parts = []
    for run, g in (df.groupby("run", sort=False) if "run" in df else [("", df)]):
        g = g[g["n"] > 0].sort_values("value_ms")
        parts.append(pd.DataFrame({"value_ms": g["value_ms"], "share": g["n"].cumsum() / g["n"].sum(), "run": run}))
    data = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["value_ms", "share", "run"])
    enc = {"x": alt.X("value_ms:Q", title="ms (log scale)", scale=alt.Scale(type="log")),
           "y": alt.Y("share:Q", title="share at or below", axis=alt.Axis(format="%"), scale=alt.Scale(domain=[0, 1])),
           "tooltip": [alt.Tooltip("value_ms:Q", format=",.1f", title="ms"),
                       alt.Tooltip("share:Q", format=".1%", title="at or below")]}
    if "run" in df and df["run"].nunique() > 1:
        enc["color"] = alt.Color("run:N", scale=CONFIG_COLORS, legend=alt.Legend(orient="bottom", title=None,
                                                                                   labelLimit=400))
    return _base(data).mark_line(interpolate="step-after").encode(**enc).properties(
        title=title, width=WIDTH / 2 - 30, height=180)


def segments(df: pd.DataFrame, y: str, group: str | None = None, step: float | None = None) -> pd.DataFrame:
    """Rows with a value, each tagged with the unbroken stretch it belongs to (`segment`): a stretch ends at a row
    without a value or where the time step jumps past 1.5 x `step`, so a line is never drawn across missing data."""
    df = df.sort_values([*([group] if group else []), "elapsed_s"]).copy()
    keys = df[group] if group else pd.Series(0, index=df.index)
    missing = df[y].isna()
    jump = df.groupby(keys)["elapsed_s"].diff() > 1.5 * step if step else pd.Series(False, index=df.index)
    df["segment"] = (missing | jump).groupby(keys).cumsum().astype(str) + "/" + keys.astype(str)
    return df[~missing]


def timeseries(df: pd.DataFrame, y: str, title: str, domain: tuple[float, float] | None = None,
               color: str | None = None, y_title: str | None = None, step: float | None = None) -> alt.Chart:
    """A line over elapsed_s that breaks where there is no data (segments); `domain` fixes the x axis so stacked
    charts share one time axis; `step` is the slot width (a longer jump between rows is a gap)."""
    data = segments(df, y, color, step)
    x = alt.X("elapsed_s:Q", title="seconds since the run started",
              scale=alt.Scale(domain=list(domain)) if domain else alt.Undefined)
    enc = {"x": x, "y": alt.Y(f"{y}:Q", title=y_title or y, axis=alt.Axis(format=",.4~g")), "detail": "segment:N",
           "tooltip": [alt.Tooltip("elapsed_s:Q", format=",.1f", title="s"),
                       alt.Tooltip(f"{y}:Q", format=",.2f", title=y_title or y)]}
    if color:
        enc["color"] = alt.Color(f"{color}:N", scale=CONFIG_COLORS, legend=alt.Legend(orient="top", title=None))
        enc["tooltip"] = [f"{color}:N", *enc["tooltip"]]
    return _base(data).mark_line(point=len(data) < 40 or alt.OverlayMarkDef(size=12)).encode(**enc).properties(
        title=title, width=WIDTH, height=160)


def compare_bars(df: pd.DataFrame, title: str) -> alt.Chart:
    """Runs side by side: df figure, run, value. One panel per figure (own scale), a row per run, every run named
    on the left (labels are run identities: long, so never on a slanted x axis)."""
    order = list(dict.fromkeys(df["run"]))
    return _base(df).mark_bar().encode(
        y=alt.Y("run:N", title=None, sort=order, axis=alt.Axis(labelLimit=460)),
        x=alt.X("value:Q", title=None, axis=alt.Axis(format=",.4~g")),
        color=alt.Color("run:N", scale=CONFIG_COLORS, sort=order, legend=None),
        row=alt.Row("figure:N", title=None, sort=list(dict.fromkeys(df["figure"])),
                    header=alt.Header(labelAngle=0, labelAlign="left", labelFontWeight="bold")),
        tooltip=["run", "figure", alt.Tooltip("value:Q", format=",.2f")],
    ).resolve_scale(x="independent").properties(title=title, width=360, height=alt.Step(20))


def measured_vs_predicted(df: pd.DataFrame, title: str = "") -> alt.Chart:
    """df: run, figure, measured, predicted, error -> paired bars (measured blue, predicted orange) per run, a row
    per run named on the left, one panel per figure."""
    long = df.melt(id_vars=["run", "figure", "error"], value_vars=["measured", "predicted"], var_name="source",
                   value_name="value")
    order = list(dict.fromkeys(df["run"]))
    return _base(long).mark_bar().encode(
        y=alt.Y("run:N", title=None, sort=order, axis=alt.Axis(labelLimit=460)),
        yOffset="source:N",
        x=alt.X("value:Q", title=None, axis=alt.Axis(format=",.4~g")),
        color=alt.Color("source:N", scale=alt.Scale(domain=["measured", "predicted"], range=["#4c78a8", "#f58518"]),
                        legend=alt.Legend(orient="top", title=None)),
        row=alt.Row("figure:N", title=None, sort=list(dict.fromkeys(df["figure"])),
                    header=alt.Header(labelAngle=0, labelAlign="left", labelFontWeight="bold")),
        tooltip=["run", "figure", "source", alt.Tooltip("value:Q", format=",.1f"),
                 alt.Tooltip("error:Q", format="+.1%", title="prediction error")],
    ).resolve_scale(x="independent").properties(title=title, width=360, height=alt.Step(12))


def integrity_bars(df: pd.DataFrame, title: str = "KV pages checksummed, verified and mismatched") -> alt.Chart:
    """df: run, counter, value."""
    return _base(df).mark_bar().encode(
        x=alt.X("value:Q", title="pages", scale=alt.Scale(type="symlog")),
        y=alt.Y("run:N", title=None, axis=alt.Axis(labelLimit=460)),
        yOffset="counter:N",
        color=alt.Color("counter:N", scale=alt.Scale(domain=["pages_checksummed", "pages_verified", "mismatches"],
                                                     range=["#4c78a8", "#54a24b", "#e45756"])),
        tooltip=["run", "counter", alt.Tooltip("value:Q", format=",.0f")],
    ).properties(title=title, width=WIDTH - 160, height=alt.Step(14))


_said_static: list[bool] = []


def to_svg(chart: alt.TopLevelMixin) -> str:
    """Static SVG of a chart, made offline by vl-convert (no scripts, no CDN); under an address-space limit that
    vl-convert's V8 cannot start in, drawn by matplotlib instead, captioned so (bench/report/static_charts.py)."""
    spec = chart.to_dict()
    if not static_charts.v8_usable():
        if not _said_static:
            _said_static.append(True)
            print(f"capbench: report charts {static_charts.NOTE}; drawn by matplotlib instead", file=sys.stderr,
                  flush=True)
        return static_charts.to_svg(spec)
    import vl_convert as vlc

    # text is measured with vl-convert's fonts but drawn with the reader's: leave room for wider ones
    spec["padding"] = {"left": 40, "right": 60, "top": 5, "bottom": 5}
    return vlc.vegalite_to_svg(spec)
