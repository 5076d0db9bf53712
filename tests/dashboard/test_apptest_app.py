"""The app itself: navigation over the four pages, the Planner first."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from tests.dashboard.apptest import ROOT, no_exception


def test_app_opens_on_the_planner_and_switches_pages(db):
    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120).run()
    no_exception(at)
    assert at.title[0].value == "Planner"
    at.switch_page(str(ROOT / "dashboard" / "views" / "integrity.py")).run()
    no_exception(at)
    assert at.title[0].value == "Integrity"
