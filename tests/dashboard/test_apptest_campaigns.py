"""The Campaigns page of `capbench serve` offers a finished campaign's HTML report for download: the page that
`capbench report --campaign ID` writes, standing alone (conditions, stage counts, latency against load with the
model's curve and the SLO, gains with their intervals), and draws the same latency-against-load charts."""

import subprocess
import sys

import pytest
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

from bench.campaign import parse_campaign, record
from bench.store import Store
from tests.bench.report.test_campaign_curves import SPEC, _cell
from tests.dashboard.apptest import no_exception, page

CLI = [sys.executable, "-c", "from bench.cli import main; main()"]


@pytest.fixture
def campaign_db(tmp_path, monkeypatch):
    db = tmp_path / "c.duckdb"
    store = Store(db)
    cid = record.new_campaign(store, parse_campaign(SPEC), "test", status="running")
    for dep, scale in (("bf16", 1.0), ("fp8", 0.6)):
        cell = _cell(dep, scale)
        record.start_cell(store, cid, cell["cell"], dep, "lc")
        record.finish_cell(store, cid, cell["cell"], "completed", cell)
    record.set_status(store, cid, "completed")
    monkeypatch.setenv("CAPBENCH_DB", str(db))
    return db, cid


def test_a_finished_campaign_offers_its_report_for_download(campaign_db, monkeypatch, tmp_path):
    served = []
    load = MemoryMediaFileStorage.load_and_get_id

    def keep(self, path_or_data, mimetype, kind, filename=None):  # noqa: ANN001, ANN202
        served.append((path_or_data, mimetype, filename))
        return load(self, path_or_data, mimetype, kind, filename)

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", keep)
    at = page("campaigns")
    no_exception(at)
    buttons = at.get("download_button")
    assert [b.label for b in buttons] == ["Download the campaign report (HTML, stands alone)"]
    db, cid = campaign_db
    html = next(data for data, mime, name in served if mime == "text/html" and name == f"p-{cid}.html")
    html = html.decode() if isinstance(html, bytes) else html
    assert html.count("<svg") == 2 and "<script" not in html
    for words in ("Conditions of each cell", "memory fraction", "Every stage", "against offered rate", "SLO 30"):
        assert words in html, words
    charts = at.get("vega_lite_chart")
    assert len(charts) >= 3  # the measured-vs-predicted bars and one chart per (load, figure)
    # the CLI writes the same page from the same function
    out = tmp_path / "r.html"
    done = subprocess.run([*CLI, "report", "--campaign", cid, "--db", str(db), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == html


def test_report_of_an_unknown_campaign_is_one_line(campaign_db, tmp_path):
    db, _ = campaign_db
    done = subprocess.run([*CLI, "report", "--campaign", "nope", "--db", str(db), "--out", str(tmp_path / "r.html")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == f"error: no campaign nope in {db}"
