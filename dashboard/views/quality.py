"""Quality: `capbench eval` runs and campaign cells' eval stages. B against A on the same problems per model family
and per change (the difference with its 90 % interval and the gate "no drop larger than 2 points"), every run's
pass rates with their intervals, and long generations' agreement by answer position."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from bench.report import quality
from dashboard import common

st.title("Quality")
if common.store() is None:
    st.stop()
ab = common.read(quality.ab_rows)
runs = common.read(quality.runs_table)
if not ab and not runs:
    st.info("No eval run yet. `capbench eval --target URL_A --target URL_B --suite humaneval,bfcl` compares two "
            "servers on the same problems (HumanEval run in a sandbox, BFCL v4 tool calls); a campaign load's "
            "`eval:` key measures quality on each cell's server.")
    st.stop()
st.subheader("B against A, per model family and per change")
if ab:
    common.chart(st, quality.interval_chart(ab))
    shown = ["family", "change", "suite", "problems", "A pass rate", "B pass rate", "B - A [90 %]", "McNemar p",
             "gate", "source"]
    st.dataframe(pd.DataFrame(ab)[shown], hide_index=True, key="quality_ab")
    st.caption("Paired on the problems both endpoints answered (an endpoint's error leaves a problem out, never "
               "counts as the model's failure): Agresti-Min 90 % interval, McNemar's exact p. The gate passes when "
               "the interval excludes a drop larger than 2 points and fails when it holds only such drops.")
else:
    st.caption("No A/B yet: give `capbench eval` two targets, or give a campaign deployment a baseline and its "
               "load an `eval:` key.")
st.subheader("Pass rates per run")
if runs:
    st.dataframe(pd.DataFrame(runs), hide_index=True, key="quality_runs")
if any(r["twin"] for r in runs) or any("twin" in r["source"] for r in ab):
    st.warning(f"Some of these runs were against a twin: {quality.TWIN_NOTE}.")
positions = common.read(quality.positions_table)
if positions:
    st.subheader("Long generations: A against B by answer position")
    st.dataframe(pd.DataFrame(positions), hide_index=True, key="quality_positions")
