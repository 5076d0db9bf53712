"""Charts a person can read, in a real browser (Debian's chromium via Playwright) over `capbench dashboard`: the
Campaigns page draws each latency-against-load chart at its own height (not squashed to a strip), and the Planner's
throughput-per-GPU against tokens/s-per-user chart shows its 80 % bands, legend swatches at full strength, and a
caption that says whether published points are drawn. Screenshots go to artifacts/screenshots/."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import sync_playwright

from bench.campaign import parse_campaign, record
from bench.store import Store
from tests.bench.report.test_campaign_curves import SPEC, _cell
from tests.e2e.test_browser import ARGS, CHROMIUM, ROOT, SHOTS, _free_port

# every chart on the page: its title, the height Vega drew it at, and for area marks their painted bands
CHARTS = """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')].map(c => {
    const svg = c.querySelector('svg.marks');
    if (!svg) return {title: '', height: 0, bands: 0, swatches: []};
    const title = [...svg.querySelectorAll('g.role-title text')].map(t => t.textContent).join(' ');
    const bands = [...svg.querySelectorAll('g.mark-area path')].filter(p => {
        const b = p.getBBox(); return b.width > 2 && b.height > 2 && +(p.getAttribute('fill-opacity') ?? 1) > 0.05;
    }).length;
    const swatches = [...svg.querySelectorAll('g.role-legend-symbol path')].map(p => ({
        stroke: p.getAttribute('stroke'), opacity: +(p.getAttribute('opacity') ?? 1),
        strokeOpacity: +(p.getAttribute('stroke-opacity') ?? 1)}));
    return {title, height: svg.getBoundingClientRect().height, bands, swatches};
})"""


@pytest.fixture(scope="module")
def campaign_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("camp") / "c.duckdb"
    store = Store(db)
    cid = record.new_campaign(store, parse_campaign(SPEC), "test", status="running")
    for dep, scale in (("bf16", 1.0), ("fp8", 0.6)):
        cell = _cell(dep, scale)
        record.start_cell(store, cid, cell["cell"], dep, "lc")
        record.finish_cell(store, cid, cell["cell"], "completed", cell)
    record.set_status(store, cid, "completed")
    return db


@contextlib.contextmanager
def _dashboard(db: Path, log: Path):
    """`capbench dashboard --db DB` on a free port, as a user starts it; its URL once it answers."""
    port = _free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "capbench"), "dashboard", "--db", str(db), "--port",
                                 str(port)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/_stcore/health", timeout=1).status_code == 200:
                        break
                assert proc.poll() is None, "the dashboard process exited"
                time.sleep(0.3)
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def _grow(page) -> None:
    height = page.evaluate("Math.max(...[...document.querySelectorAll('[data-testid=\"stMain\"], "
                           "[data-testid=\"stMainBlockContainer\"]')].map(e => e.scrollHeight))")
    page.set_viewport_size({"width": 1400, "height": min(int(height) + 80, 16000)})
    page.wait_for_timeout(2000)


def test_the_campaign_curves_are_drawn_tall_enough_to_read(campaign_db, tmp_path):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with _dashboard(campaign_db, tmp_path / "streamlit.log") as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/campaigns", timeout=60_000)
        page.get_by_text("against offered rate").first.wait_for(timeout=120_000)
        _grow(page)
        # the matrix refreshes every few seconds: wait until both curves stand drawn, not mid-redraw
        page.wait_for_function(f"({CHARTS})().filter(c => c.title.includes('against offered rate') && "
                               "c.height >= 250).length >= 2", timeout=60_000)
        charts = [c for c in page.evaluate(CHARTS) if "against offered rate" in c["title"]]
        page.screenshot(path=str(SHOTS / "campaigns-curves.png"), full_page=True)
        page.locator('[data-testid="stVegaLiteChart"]').filter(has_text="TTFT p50 (s) against").first.screenshot(
            path=str(SHOTS / "campaigns-curve-chart.png"))
        browser.close()
    assert len(charts) == 2, charts  # TTFT and TPOT of the one load
    for c in charts:
        assert c["height"] >= 250, c  # the plot is 260 px tall, not a ~30 px strip
        assert c["bands"] >= 2, c  # the model's 80 % band, one per deployment


def test_the_planners_curves_show_bands_legend_and_what_is_published(tmp_path):
    from tests.rundb import fill

    fill(tmp_path / "capbench.duckdb")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with _dashboard(tmp_path / "capbench.duckdb", tmp_path / "streamlit.log") as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url, timeout=60_000)
        page.get_by_text("Throughput per GPU against speed per user, over concurrency").first.wait_for(
            timeout=600_000)
        _grow(page)
        charts = [c for c in page.evaluate(CHARTS) if c["title"].startswith("Throughput per GPU against speed per "
                                                                            "user, over concurrency")]
        page.screenshot(path=str(SHOTS / "planner-curves.png"), full_page=True)
        page.locator('[data-testid="stVegaLiteChart"]').filter(has_text="over concurrency").first.screenshot(
            path=str(SHOTS / "planner-curves-chart.png"))
        browser.close()
    assert len(charts) == 1, charts
    c = charts[0]
    assert c["bands"] >= 2, c  # the 80 % bands are painted
    assert "published" in c["title"]  # crosses drawn, or the caption says the corpus has none
    assert c["swatches"] and all(s["opacity"] >= 0.9 and s["strokeOpacity"] >= 0.9 for s in c["swatches"]), c
    assert all(s["stroke"] and s["stroke"].lower() not in ("#fff", "#ffffff", "white") for s in c["swatches"]), c
