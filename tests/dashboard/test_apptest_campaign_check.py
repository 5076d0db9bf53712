"""The Campaigns page runs `capbench campaign --check`'s whole check before it queues a file: a campaign the file
check passes but a launch would not (a PD twin whose prefill cannot hold the weights) is refused on the page with
the lines `--check` prints, and nothing reaches the queue folder; a good one is queued."""

import subprocess
import sys
from pathlib import Path

import pytest

from bench.store import Store
from tests.dashboard.apptest import no_exception, page

CAPBENCH = str(Path(sys.executable).parent / "capbench")
CAMPAIGN = """name: pd
slo: "ttft=4s,tpot=100ms"
deployments:
  - {{name: pd, twin: "kimi-k2-thinking@h200x8,dp=8,kv=fp8_e4m3,prefill_tp={prefill}"}}
loads:
  - {{name: x, workload: campaign-prefill-heavy, sweep: {{start: 0.5}}}}
"""


def _queue(at, text: str):
    at.text_area[0].input(text)
    next(b for b in at.button if b.label == "Queue it").click()
    return at.run()


@pytest.fixture
def empty_db(tmp_path, monkeypatch):
    db = tmp_path / "c.duckdb"
    Store(db)
    monkeypatch.setenv("CAPBENCH_DB", str(db))
    return db


@pytest.mark.parametrize("prefill", ["3", "0"])
def test_the_page_refuses_what_check_refuses_with_the_same_lines(empty_db, tmp_path, prefill):
    text = CAMPAIGN.format(prefill=prefill)
    (tmp_path / "pasted.yaml").write_text(text)
    cli = subprocess.run([CAPBENCH, "campaign", "pasted.yaml", "--check"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert cli.returncode == 2 and "Traceback" not in cli.stderr, cli.stderr
    at = _queue(page("campaigns"), text)
    no_exception(at)
    shown = "\n".join(e.value for e in at.error)
    said = cli.stderr.removeprefix("error: ").strip().splitlines()
    assert said[1:] and all(line in shown for line in said[1:]), (said, shown)  # every problem line, the same
    assert not list((tmp_path / "campaign-queue").glob("*.yaml"))


def test_a_campaign_that_passes_check_is_queued(empty_db, tmp_path):
    at = _queue(page("campaigns"), CAMPAIGN.format(prefill="8"))
    no_exception(at)
    assert not at.error, [e.value for e in at.error]
    assert [s.value for s in at.success][0].startswith("queued pd")
    assert len(list((tmp_path / "campaign-queue").glob("*.yaml"))) == 1
