"""What every page shares: where the DB is, opening it read-only, the empty state, cached reads.

The DB path comes from $CAPBENCH_DB (set by `capbench dashboard --db PATH`), else data/capbench.duckdb. Every read
opens a short read-only connection (bench.store.Store.connect retries while a run's writer holds the file), and
results are cached for a few seconds so a page that reruns on every widget change does not hammer the file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
import streamlit as st

from bench.errors import BadInput
from bench.model import Slo
from bench.store import DEFAULT_DB, Store, StoreBusy, runinfo

TTL_S = 3
TS_HEIGHT = 320  # Streamlit's default "content" height squashes a line chart whose legend is tall


def db_path() -> Path:
    return Path(os.environ.get("CAPBENCH_DB") or DEFAULT_DB)


def launch_templates() -> dict:
    """The launch templates `capbench serve`'s operator named at start (--templates); none without."""
    from bench.campaign import operator_templates

    return operator_templates(os.environ.get("CAPBENCH_TEMPLATES"))


def store() -> Store | None:
    """The store, read-only; None (with a message on the page) when it is missing, empty or busy."""
    path = db_path()
    try:
        s = Store(path, read_only=True)
        if runs().empty:
            raise BadInput(f"no runs yet in {path}")
        return s
    except (BadInput, StoreBusy) as e:
        st.info(f"No measured runs to show: {e}.\n\n"
                "Make some with `make demo` (a load test against the twin, no GPU needed) or "
                "`capbench run --target URL --profile poisson --rate 4 --duration 60`, then reload this page. "
                "The Planner page works without any runs.")
        return None


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _runs(path: str) -> pd.DataFrame:
    return runinfo.list_runs(Store(path, read_only=True))


def runs() -> pd.DataFrame:
    return _runs(str(db_path()))


def read(fn, *args):
    """fn(con, *args) on a short read-only connection, cached for TTL_S seconds."""
    return _read(str(db_path()), fn.__module__, fn.__name__, args)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _read(path: str, module: str, name: str, args: tuple):
    import importlib

    fn = getattr(importlib.import_module(module), name)
    with Store(path, read_only=True).connect() as con:
        return fn(con, *args)


def slo_inputs(key: str) -> Slo:
    c1, c2 = st.columns(2)
    ttft = c1.number_input("SLO: TTFT (s)", min_value=0.01, value=2.0, step=0.1, key=f"{key}_slo_ttft")
    tpot = c2.number_input("SLO: TPOT (ms)", min_value=1.0, value=50.0, step=5.0, key=f"{key}_slo_tpot")
    return Slo(ttft_s=ttft, tpot_s=tpot / 1e3)


def own_slo(runs_df: pd.DataFrame, run_id: str) -> Slo | None:
    """The SLO the run recorded when it ran (runinfo.run_config's "slo"), None when it recorded none."""
    row = runs_df[runs_df.run_id == run_id]
    value = row.iloc[0].get("slo") if not row.empty and "slo" in row else None
    return value if isinstance(value, Slo) else None


def md_text(text: str) -> str:
    """Text for st.subheader/st.caption, which render Markdown: a run label stays a label, never an image that
    makes the viewer's browser fetch a URL, a link, HTML or a Streamlit directive."""
    return re.sub(r"[\\`*_{}\[\]()<>#+!|~:$-]", lambda m: "\\" + m.group(0), text)


def run_label(runs_df: pd.DataFrame, run_id: str) -> str:
    """The run's identity (runinfo.identity) and the end of its id: what every picker shows."""
    row = runs_df[runs_df.run_id == run_id]
    if row.empty:
        return run_id
    return f"{row.iloc[0]['identity']} · {run_id[-6:]}"


def fmt(value, spec: str = ",.1f", unit: str = "") -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "n/a"
    return f"{format(value, spec)}{unit}"


SVG = {"embedOptions": {"renderer": "svg"}}


def chart(where, c, **kwargs) -> None:
    """where.altair_chart(c), drawn as SVG (also past Streamlit's 2,000-point switch to canvas), so the browser test
    can count every chart's data marks; in the chart's own colours, as the reports draw it (Streamlit's theme
    recolours every category with its palette, whose second blue is near-white beside a faint band)."""
    where.altair_chart(c.properties(usermeta=SVG), **{"theme": None, **kwargs})


def drift_table() -> pd.DataFrame | None:
    """The DB's drift runs (for the savings' quality note), None without a DB or drift table."""
    path = db_path()
    if not path.is_file():
        return None
    try:
        return read(runinfo.drift)
    except (BadInput, StoreBusy):
        return None
