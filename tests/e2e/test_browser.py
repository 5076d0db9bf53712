"""A real browser over a real dashboard: Debian's chromium driven by Playwright opens every page of
`capbench dashboard` over a DB the test filled through the store's writer (or $CAPBENCH_E2E_DB, e.g. a demo's, to
look at), waits for the charts, checks that every chart draws data marks and no exception is shown, checks the
Planner's figures against `capbench plan --json` for the same inputs, and keeps a screenshot of each page in
artifacts/screenshots/."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import sync_playwright

from tests.rundb import fill

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# page url path, charts it must show at least, text it must show
PAGES = [
    ("", 9, "Every configuration searched"),
    ("runs", 11, "Over time (one time axis)"),
    ("compare", 4, "Measured vs predicted"),
    ("integrity", 2, "Integrity events"),
]
# Data marks of every chart on the page: Vega draws a mark's items as paths inside g.role-mark (axes, legends and
# titles have role-axis-*, role-legend-*, role-title). A mark counts when it covers some area (a line: some length):
# a chart with no data draws none, and bars of zero width (linear bins from 0 on a log axis) do not count.
MARKS = """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')].map(c => {
    const svg = c.querySelector('svg.marks');
    const title = svg ? [...svg.querySelectorAll('g.role-title text')].map(t => t.textContent).join(' ') : '';
    const marks = svg ? [...svg.querySelectorAll('g.role-mark > path')].filter(p => {
        const b = p.getBBox();
        const line = p.closest('g.mark-line, g.mark-rule');
        return line ? (b.width > 0.5 || b.height > 0.5) : (b.width > 0.5 && b.height > 0.5);
    }).length : -1;
    return {title, marks};
})"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dashboard_url(tmp_path_factory):
    db = os.environ.get("CAPBENCH_E2E_DB")
    if not db:
        db = tmp_path_factory.mktemp("e2e") / "capbench.duckdb"
        fill(db)
    port = _free_port()
    log = open(tmp_path_factory.getbasetemp() / "streamlit.log", "w")
    capbench = str(Path(sys.executable).parent / "capbench")
    proc = subprocess.Popen([capbench, "dashboard", "--db", str(db), "--port", str(port)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/_stcore/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, "the dashboard process exited"
        time.sleep(0.3)
    else:
        proc.terminate()
        pytest.fail("the dashboard did not answer on /_stcore/health within 60 s")
    yield url
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


def _metrics(page) -> dict[str, str]:
    return {m.locator('[data-testid="stMetricLabel"]').inner_text().strip():
            m.locator('[data-testid="stMetricValue"]').inner_text().strip()
            for m in page.locator('[data-testid="stMetric"]').all()}


def test_every_page_draws_data_in_every_chart_and_the_planner_matches_the_cli(dashboard_url):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        for path, min_charts, text in PAGES:
            page.goto(f"{dashboard_url}/{path}", timeout=60_000)
            page.wait_for_selector('[data-testid="stVegaLiteChart"]', timeout=120_000)
            page.get_by_text(text).first.wait_for(timeout=120_000)
            # Streamlit scrolls inside its main section, not the document: grow the viewport to show it all, so
            # every lazily drawn chart and table is in view
            height = page.evaluate("Math.max(...[...document.querySelectorAll('[data-testid=\"stMain\"], "
                                   "[data-testid=\"stMainBlockContainer\"]')].map(e => e.scrollHeight))")
            page.set_viewport_size({"width": 1400, "height": min(int(height) + 80, 16000)})
            page.wait_for_function(
                "document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] svg.marks').length >= "
                f"{min_charts}", timeout=120_000)
            page.wait_for_timeout(2000)  # tables, code blocks and the last charts draw once they are in view
            charts = page.evaluate(MARKS)
            assert len(charts) >= min_charts, f"/{path}: {len(charts)} charts, expected at least {min_charts}"
            empty = [c["title"] or f"chart {i + 1}" for i, c in enumerate(charts) if c["marks"] <= 0]
            assert not empty, f"/{path}: charts without data marks: {empty}"
            assert page.locator('[data-testid="stException"]').count() == 0, f"/{path} shows an exception"
            page.screenshot(path=str(SHOTS / f"{path or 'planner'}.png"), full_page=True)
            if path == "":
                _planner_matches_the_cli(_metrics(page), page.locator('[data-testid="stAlert"]').all_inner_texts())
                _planner_compares_gpus(page)
            page.set_viewport_size({"width": 1400, "height": 1000})
        browser.close()


def _planner_compares_gpus(page) -> None:
    """Search a second GPU: the Planner draws each GPU at its cheapest configuration, with data."""
    box = page.locator('[data-testid="stMultiSelect"]').filter(has_text="h200").first
    box.locator("input").fill("b200")
    page.keyboard.press("Enter")
    page.get_by_text("Each GPU at its cheapest configuration").first.wait_for(timeout=300_000)
    page.wait_for_timeout(2000)
    charts = page.evaluate(MARKS)
    gpu = [c for c in charts if c["title"].startswith("Each GPU at its cheapest")]
    assert gpu and gpu[0]["marks"] >= 2, gpu  # a bar per GPU searched
    assert all(c["marks"] > 0 for c in charts), [c["title"] for c in charts if c["marks"] <= 0]
    page.screenshot(path=str(SHOTS / "planner-gpus.png"), full_page=True)


def _planner_matches_the_cli(metrics: dict[str, str], alerts: list[str]) -> None:
    """The Planner's defaults (Kimi K2 Thinking, 8 x H200, FP8 KV, native weights, chat, p90 TTFT 2 s / TPOT 50 ms,
    10 req/s, H200 searched) asked of `capbench plan --json`: the same figures on the page."""
    capbench = str(Path(sys.executable).parent / "capbench")
    done = subprocess.run([capbench, "plan", "--model", "kimi-k2-thinking", "--gpus", "h200", "--gpu", "h200",
                           "--tp", "8", "--kv-dtype", "fp8_e4m3", "--weights", "native", "--workload", "chat",
                           "--slo", "ttft=2s,tpot=50ms,p=90", "--rate", "10", "--json"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    chosen = next(r for r in out["configurations"] if r["chosen"])
    rec = out["recommended"]
    assert metrics["KV pool tokens"] == f"{chosen['kv_pool_tokens']:,}"
    assert metrics["Max rate within SLO (req/s)"] == f"{chosen['rate_rps']:,.2f}"
    assert metrics["$ per 1M output tokens"] == f"${chosen['usd_per_m_output']:,.2f}"
    assert metrics["GPUs needed for 10 req/s"] == f"{chosen['gpus_needed']:,}"
    assert metrics["Monthly cost for 10 req/s"] == f"${chosen['monthly_cost']:,.0f}"
    assert metrics["TPOT p90 at that rate (ms)"] == f"{chosen['tpot_s'] * 1e3:,.1f}"
    head = out["headline"]  # the answer block: the CLI's first screen, colocated or disaggregated
    assert rec is not None and any(head["summary"] in a and f"${head['monthly_cost']:,.0f} a month" in a
                                   for a in alerts)


def test_the_marks_check_fails_an_empty_chart_and_zero_width_bars():
    """The same check over charts drawn by Vega: one with data passes; one with no rows, and the old ITL histogram
    (linear bins from 0 on a log axis: every bar 0 px wide), count no marks."""
    import altair as alt
    import pandas as pd
    import vl_convert as vlc

    values = pd.DataFrame({"value_ms": [0.01, 0.02, 3.0, 14.0, 15.0, 40.0], "n": [50, 40, 3, 200, 180, 5]})
    good = alt.Chart(values).mark_rect().encode(x=alt.X("value_ms:Q", scale=alt.Scale(type="log")),
                                                x2=alt.datum(50.0), y="n:Q", y2=alt.datum(0))
    empty = alt.Chart(values.iloc[:0]).mark_line().encode(x="value_ms:Q", y="n:Q")
    linear_bins_on_log = alt.Chart(values).mark_bar().encode(
        x=alt.X("value_ms:Q", scale=alt.Scale(type="log"), bin=alt.Bin(maxbins=60)), y="sum(n):Q")
    html = "".join(f'<div data-testid="stVegaLiteChart">{vlc.vegalite_to_svg(c.to_dict())}</div>'
                   for c in (good, empty, linear_bins_on_log))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        page.set_content(f"<html><body>{html}</body></html>")
        marks = [c["marks"] for c in page.evaluate(MARKS)]
        browser.close()
    assert marks[0] > 0 and marks[1] == 0 and marks[2] == 0
