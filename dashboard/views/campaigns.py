"""Campaigns: queue a campaign file (uploaded, pasted or built in), the queue, the cell running now (refreshed every
few seconds) and each campaign's matrix. The page never writes the DB: a queued file goes to the queue folder, and
`capbench serve`'s runner, the one writer, takes it from there."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from bench.campaign import check_campaign, pending, submit
from bench.errors import BadInput
from bench.report import (
    campaign_curves,
    campaign_html,
    campaign_list,
    campaign_matrix,
    campaign_sections,
    charts,
    live_cell,
)
from bench.store import Store, StoreBusy, runinfo
from dashboard import common
from dashboard.common import fmt

BUILT_IN = Path(__file__).resolve().parents[2] / "data" / "campaigns"
REFRESH_S = 3
CURVE_HEIGHT = 420  # a latency-against-load chart with its legends above and below the plot

st.title("Campaigns")
db = common.db_path()

with st.expander("Queue a campaign", expanded=False):
    built_in = sorted(p.stem for p in BUILT_IN.glob("*.yaml"))
    choice = st.selectbox("Built-in campaign", ["(paste or upload below)", *built_in])
    upload = st.file_uploader("Campaign file (YAML)", type=["yaml", "yml"])
    pasted = st.text_area("or paste it here", height=160)
    if st.button("Queue it"):
        if upload is not None:
            name, text = upload.name[:200], upload.getvalue()
        elif pasted.strip():
            name, text = "pasted.yaml", pasted
        elif choice in built_in:
            name, text = f"{choice}.yaml", (BUILT_IN / f"{choice}.yaml").read_text()
        else:
            name, text = "", ""
        try:
            if not text:
                raise BadInput("choose a built-in campaign, upload a file or paste one")
            # `capbench campaign --check`'s whole check, as `capbench serve`'s runner will run it: no shell command of
            # the campaign's own, only the operator's launch templates by name (bench/campaign/templates.py)
            spec = check_campaign(text, Path(name).name or "campaign", common.launch_templates())
            submit(db, name, text.decode() if isinstance(text, bytes) else text)
            st.success(f"queued {spec.name}: {len(spec.cells())} cells; `capbench serve`'s runner takes it next")
        except BadInput as e:
            st.error(str(e))


@st.cache_data(max_entries=8, show_spinner="drawing the report")
def _report_html(path: str, cid: str, stamp: tuple) -> str:
    """A finished campaign's HTML report (the same function as `capbench report --campaign`), drawn once per
    `stamp` (its status and its cells' last finish: a resumed campaign draws again)."""
    return campaign_html(campaign_matrix(path, cid))


def _stamp(matrix) -> tuple:  # noqa: ANN001
    return matrix.status, max((c.get("finished_at") or 0 for c in matrix.cells), default=0)


def _campaigns() -> list[dict]:
    try:
        Store(db, read_only=True)
        return common.read(campaign_list)
    except (BadInput, StoreBusy):
        return []


@st.fragment(run_every=REFRESH_S)
def queue_and_live() -> None:
    waiting = pending(db)
    camps = _campaigns()
    st.subheader("Queue")
    rows = [{"campaign": p.name, "status": "submitted (not yet taken by the runner)"} for p in waiting]
    rows += [{"campaign": f"{c['name']} ({c['campaign_id']})", "status": c["status"],
              "cells completed": c["completed"], "cells failed": c["failed"], "by": c["submitted_by"]}
             for c in camps if c["status"] in ("queued", "running")]
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    else:
        st.caption("Nothing queued. Queue a campaign above, or run `capbench campaign FILE`.")
    running = [c for c in camps if c["status"] == "running"]
    st.subheader("Running now")
    cell = common.read(live_cell, running[0]["campaign_id"]) if running else None
    if cell is None:
        st.caption("No cell is running.")
        return
    st.markdown(f"**{cell['cell']}** of {running[0]['name']}: {cell['label'] or 'starting the deployment'}")
    if cell.get("time_scale", 1) != 1:
        st.caption(f"A {runinfo.clock(cell['time_scale'], True)}: rates / {cell['time_scale']:g}, latencies x "
                   f"{cell['time_scale']:g}; the last 10 s are of the wall clock.")
    cols = st.columns(5)
    cols[0].metric("requests", f"{cell['requests']:,}")
    cols[1].metric("finished / s (last 10 s)", fmt(cell["rate_rps"], ".2f"))
    cols[2].metric("offered (modelled req/s)", fmt(cell["offered_rps"], ".3g"))
    cols[3].metric("TTFT p50 / p90", f"{fmt(cell['ttft_p50'], '.2f')} / {fmt(cell['ttft_p90'], '.2f')} s")
    cols[4].metric("TPOT p50 / p90", f"{fmt(cell['tpot_p50'] and cell['tpot_p50'] * 1e3, '.1f')} / "
                   f"{fmt(cell['tpot_p90'] and cell['tpot_p90'] * 1e3, '.1f')} ms")


queue_and_live()

@st.fragment(run_every=2 * REFRESH_S)
def matrix_section() -> None:
    """Each campaign's matrix, refreshed too: a finished cell appears without a reload."""
    st.subheader("Matrix")
    camps = _campaigns()
    if not camps:
        st.info(f"No campaigns in {db} yet: `make demo` runs the built-in one, `capbench serve` runs queued ones.")
        return
    # no status here: the picker keeps an option's label from its first drawing (a finished campaign read "running");
    # the matrix's own titles below say its status
    labels = {c["campaign_id"]: f"{c['name']} ({c['campaign_id']})" for c in camps}
    cid = st.selectbox("Campaign", list(labels), format_func=labels.get, key="campaign")
    matrix = campaign_matrix(db, cid)
    if matrix.status not in ("queued", "running"):
        st.download_button("Download the campaign report (HTML, stands alone)",
                           _report_html(str(db), cid, _stamp(matrix)),
                           file_name=f"{matrix.name}-{cid}.html", mime="text/html", on_click="ignore",
                           help="The page `capbench report --campaign ID` writes: conditions, stage counts, "
                                "latency against load with the model's curve, gains with their intervals.")
    for title, head, rows in campaign_sections(matrix, detail=True):
        st.markdown(f"**{title}**")
        st.dataframe(pd.DataFrame(rows, columns=head), hide_index=True, width="stretch")
    done = [c for c in matrix.cells if c["status"] == "completed"]
    if done:
        df = pd.DataFrame([{"run": c["cell"], "figure": f"{what} req/s", "value": value}
                           for what in ("measured", "predicted") for c in done
                           if (value := c.get(f"{what}_rps")) is not None])
        st.altair_chart(charts.compare_bars(df, "Highest rate within the SLO (req/s of the modelled GPUs)"),
                        width="stretch")
    for title, chart in campaign_curves(matrix.cells):  # a set height: "content" squashed them to a ~30 px strip
        common.chart(st, chart, width="stretch", height=CURVE_HEIGHT, key=f"curve-{cid}-{title}")
    for c in matrix.cells:
        if c["status"] == "failed":
            with st.expander(f"{c['cell']}: failed"):
                st.code((c.get("error") or "") + "\n\n" + (c.get("log") or ""), language="text")


matrix_section()
