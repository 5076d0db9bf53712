"""capbench dashboard: `capbench dashboard [--db PATH] [--port N]` (or `streamlit run dashboard/app.py`). The pages live
in views/, not pages/: Streamlit runs a pages/ folder beside the main script as its old multipage app for the first
visit to a page URL, so /campaigns opened first would lose this navigation."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

HERE = Path(__file__).resolve().parent

st.set_page_config(page_title="capbench", layout="wide")
pages = [
    st.Page(HERE / "views" / "planner.py", title="Planner", default=True),
    st.Page(HERE / "views" / "runs.py", title="Runs"),
    st.Page(HERE / "views" / "compare.py", title="Compare"),
    st.Page(HERE / "views" / "integrity.py", title="Integrity"),
    st.Page(HERE / "views" / "quality.py", title="Quality"),
    st.Page(HERE / "views" / "campaigns.py", title="Campaigns"),
]
st.navigation(pages).run()
