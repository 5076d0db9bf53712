"""`capbench serve` in a real browser: a pasted campaign carrying its own shell command is refused on the page; a
campaign pasted on the Campaigns page is queued (the page writes only the queue folder), the runner process takes
it, the page shows the running cell live (its requests rising between refreshes), then the finished matrix with its
chart; Ctrl-C stops the service."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import httpx
from playwright.sync_api import sync_playwright

from tests.e2e.test_browser import ARGS, CHROMIUM, SHOTS, _free_port

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGN = """name: browser
slo: "ttft=10s,tpot=200ms"
deployments:
  - {name: glm, twin: "glm-4.6@h200x8,time_scale=5"}
loads:
  - {name: chat, workload: chat, profile: poisson, rate: 0.5, duration: 15}
  - {name: again, workload: chat, profile: poisson, rate: 0.75, duration: 5}
"""


SHELL = """name: pwn
deployments:
  - {{name: s, sglang: {{model: glm-4.6, template: {{start: "touch {marker}; : {{command}}"}}}}}}
loads:
  - {{name: a, workload: chat, profile: poisson, rate: 1}}
"""


def _live(page) -> tuple[str, int]:
    """The running cell's line (which cell, which stage) and its request count, as the page shows them now."""
    line, metric = page.evaluate("""() => [
        [...document.querySelectorAll('[data-testid="stMarkdown"]')].map(e => e.innerText)
            .find(t => t.includes(' of browser: ')) || '',
        (document.querySelector('[data-testid="stMetric"]') || {innerText: ''}).innerText]""")
    return line, int(re.sub(r"[^0-9]", "", metric.split("\n")[-1]) or 0)


def _rising(page, timeout_s: float) -> list[tuple[str, int]]:
    """Readings of the live cell, taken as the page refreshes itself (no reload), until one stage's request count
    rises between two of them: on a slow machine a refresh may come late in a stage, or after it."""
    seen: list[tuple[str, int]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line, n = _live(page)
        if not seen or seen[-1] != (line, n):
            seen.append((line, n))
        if len(seen) >= 2 and line and seen[-2][0] == line and n > seen[-2][1] > 0:
            break
        page.wait_for_timeout(500)
    return seen


def test_a_queued_campaign_runs_live_in_the_browser(tmp_path):
    db = tmp_path / "capbench.duckdb"
    port = _free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "capbench"), "serve", "--db", str(db), "--port",
                             str(port)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/_stcore/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.3)
        SHOTS.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            page.goto(f"{url}/campaigns", timeout=60_000)
            links = page.get_by_test_id("stSidebarNavLink")  # the app's navigation, also on a page's own URL
            links.filter(has_text="Planner").wait_for(timeout=60_000)
            assert [t.strip() for t in links.all_inner_texts()] == ["Planner", "Runs", "Compare", "Integrity",
                                                                    "Quality", "Campaigns"]
            page.get_by_test_id("stExpander").get_by_text("Queue a campaign").click(timeout=120_000)
            box = page.get_by_label("or paste it here")
            box.fill(SHELL.format(marker=tmp_path / "pwned"))  # a visitor's shell command: refused on the page
            box.press("Control+Enter")
            page.get_by_role("button", name="Queue it").click()
            page.get_by_text("carries its own shell command").wait_for(timeout=30_000)
            assert not list((tmp_path / "campaign-queue").glob("*.yaml"))  # nothing reached the queue
            box.fill(CAMPAIGN)
            box.press("Control+Enter")
            page.get_by_role("button", name="Queue it").click()
            page.get_by_text("queued browser: 2 cells").wait_for(timeout=30_000)
            page.get_by_text("of browser: campaign glm/").first.wait_for(timeout=90_000)  # a run of a cell is live
            seen = _rising(page, 180.0)  # the fragment refreshes every 3 s; the first stage is 15 s, after a warm-up
            (line, first), (_, later) = seen[-2:]
            assert seen[-2][0] == line and later > first > 0, seen
            page.screenshot(path=str(SHOTS / "campaigns-live.png"))
            assert page.locator('[data-testid="stException"]').count() == 0  # the matrix of a running campaign
            # the matrix refreshes itself too: its title says when the campaign has ended ("No cell is running" also
            # shows between two runs, while the queue's table, hidden text on a canvas, still lists the campaign)
            page.get_by_text(re.compile(r"browser \(c[0-9a-f-]+, completed\): highest rate within the SLO per cell")
                             ).wait_for(timeout=240_000)
            page.get_by_text("No cell is running.").wait_for(timeout=30_000)
            assert page.get_by_text(re.compile(r", running\)")).count() == 0  # nothing on the page says it still runs
            page.wait_for_function("document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] canvas, "
                                   "[data-testid=\"stVegaLiteChart\"] svg.marks').length >= 1", timeout=60_000)
            assert page.locator('[data-testid="stException"]').count() == 0
            page.screenshot(path=str(SHOTS / "campaigns-matrix.png"))
            browser.close()
        assert not (tmp_path / "pwned").exists()
        deadline = time.time() + 60
        while True:  # the page says no cell runs before the runner has written the campaign's end and let go
            try:
                with duckdb.connect(str(db), read_only=True) as con:
                    status = con.execute("SELECT status FROM campaigns").fetchall()
                    cells = con.execute("SELECT cell, status FROM campaign_cells ORDER BY cell").fetchall()
                if status == [("completed",)] or time.time() > deadline:
                    break
            except duckdb.IOException:
                if time.time() > deadline:
                    raise
            time.sleep(0.5)
        assert status == [("completed",)]
        assert cells == [("glm/again", "completed"), ("glm/chat", "completed")]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        log.close()
    assert proc.returncode in (0, 130, -signal.SIGINT)
