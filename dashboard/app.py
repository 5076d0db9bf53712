"""capbench dashboard: `capbench dashboard [--db PATH] [--port N]` (or `streamlit run dashboard/app.py`)."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

HERE = Path(__file__).resolve().parent

st.set_page_config(page_title="capbench", layout="wide")
pages = [
    st.Page(HERE / "pages" / "planner.py", title="Planner", default=True),
    st.Page(HERE / "pages" / "runs.py", title="Runs"),
    st.Page(HERE / "pages" / "compare.py", title="Compare"),
    st.Page(HERE / "pages" / "integrity.py", title="Integrity"),
    st.Page(HERE / "pages" / "campaigns.py", title="Campaigns"),
]
st.navigation(pages).run()
