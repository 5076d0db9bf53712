"""A real browser over a real dashboard: Debian's chromium driven by Playwright opens every page of
`capbench dashboard` over a DB the test filled through the store's writer, waits for the charts, checks that no
exception is shown, and keeps a screenshot of each page in artifacts/screenshots/."""

from __future__ import annotations

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
    ("", 6, "What FP8 KV and INT4 experts buy"),
    ("runs", 8, "Over time (one time axis)"),
    ("compare", 3, "Measured vs predicted"),
    ("integrity", 2, "Integrity events"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dashboard_url(tmp_path_factory):
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


def test_every_page_renders_charts_without_exceptions(dashboard_url):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        for path, min_charts, text in PAGES:
            page.goto(f"{dashboard_url}/{path}", timeout=60_000)
            page.wait_for_selector('[data-testid="stVegaLiteChart"]', timeout=60_000)
            page.get_by_text(text).first.wait_for(timeout=60_000)
            page.wait_for_function(
                f"document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] canvas, "
                f"[data-testid=\"stVegaLiteChart\"] svg.marks').length >= {min_charts}", timeout=60_000)
            page.wait_for_timeout(300)
            charts = page.locator('[data-testid="stVegaLiteChart"]').count()
            assert charts >= min_charts, f"/{path}: {charts} charts, expected at least {min_charts}"
            assert page.locator('[data-testid="stException"]').count() == 0, f"/{path} shows an exception"
            # Streamlit scrolls inside its main section, not the document: grow the viewport to show it all
            height = page.evaluate("Math.max(...[...document.querySelectorAll('[data-testid=\"stMain\"], "
                                   "[data-testid=\"stMainBlockContainer\"]')].map(e => e.scrollHeight))")
            page.set_viewport_size({"width": 1400, "height": min(int(height) + 80, 9000)})
            page.wait_for_timeout(1500)  # tables and code blocks draw once they are in view
            page.screenshot(path=str(SHOTS / f"{path or 'planner'}.png"))
            page.set_viewport_size({"width": 1400, "height": 1000})
        browser.close()
