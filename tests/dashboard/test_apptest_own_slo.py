"""A campaign's runs are judged by the SLO they ran under on every page that shows them, not by the page's 2 s /
50 ms: a twin stage whose TTFT (in the modelled GPUs' time) is past 2 s but within its campaign's 30 s is "within the
SLO" with its attainment near 100 %, never 0 %. Compare opens on two deployments, not two repeats of one stage."""

from __future__ import annotations

import numpy as np
import pytest

from bench.campaign import parse_campaign, record
from bench.model import Slo
from bench.report import load
from bench.store import BatchedWriter, Store, runinfo
from tests.dashboard.apptest import metric, no_exception, page, table_with
from tests.rundb import _requests

SCALE = 10  # the twin ran 10x faster than the GPUs it models
SLO = Slo(ttft_s=30.0, tpot_s=0.3, percentile=50)  # the campaign's, in the modelled GPUs' time
SPEC = ("name: own\nslo: \"ttft=30s,tpot=300ms,p=50\"\nduration: 2\ndeployments:\n"
        f"  - {{name: bf16, twin: 'glm-4.6@h200x8,kv=bf16,time_scale={SCALE}'}}\n"
        f"  - {{name: fp8, twin: 'glm-4.6@h200x8,kv=fp8_e4m3,time_scale={SCALE}'}}\n"
        "loads:\n  - {name: chat, workload: chat, sweep: {start: 0.4}}\n")


@pytest.fixture
def campaign_runs(tmp_path, monkeypatch):
    """Two cells of one campaign (BF16 KV, FP8 KV), two repeats each of one 0.4 req/s stage, written as the campaign
    writes them: the SLO handed to the twin in its own time (10x tighter), TTFTs of ~0.3 s twin time (~3 s modelled:
    past the page's 2 s, within the campaign's 30 s)."""
    db = tmp_path / "own.duckdb"
    store = Store(db)
    cid = record.new_campaign(store, parse_campaign(SPEC), "test", status="running")
    rng = np.random.default_rng(3)
    ids: dict[str, list[str]] = {}
    for dep, kv in (("bf16", "bf16"), ("fp8", "fp8_e4m3")):
        cell = f"{dep}/chat"
        record.start_cell(store, cid, cell, dep, "chat")
        points = []
        for repeat in range(2):
            twin = f"glm-4.6@h200x8,kv={kv},time_scale={SCALE}"
            config = {"model": "glm-4.6", "campaign": cid, "cell": cell, "time_scale": SCALE, "repeat": repeat,
                      "offered_rps": 0.4 * SCALE, "twin": twin, "workload": {"name": "chat"},
                      "slo": {k: v for k, v in vars(SLO.scaled(SCALE)).items() if v is not None}}
            run_id = store.start_run(label=f"campaign {cell} @0.4rps #{repeat + 1}", target=f"twin:{twin}",
                                     profile="poisson", config=config)
            with BatchedWriter(store, run_id, flush_interval_s=60) as w:
                _requests(w, rng, store.run(run_id)["started_at"], 4.0, 0.004, 0.3)
            store.finish_run(run_id)
            ids.setdefault(dep, []).append(run_id)
            points.append({"repeat": repeat, "rate": 0.4, "meets": True, "why": "", "sent": 120, "completed": 120,
                           "missed": 0, "cut_off": 0, "errored": 0, "run_id": run_id})
        record.finish_cell(store, cid, cell, "completed", {"cell": cell, "points": points, "slo": SLO.text()})
    record.set_status(store, cid, "completed")
    monkeypatch.setenv("CAPBENCH_DB", str(db))
    return db, ids


def test_a_campaign_run_is_judged_by_its_own_slo(campaign_runs):
    db, ids = campaign_runs
    run_id = ids["fp8"][1]
    with Store(db, read_only=True).connect() as con:
        own = runinfo.summary(con, run_id, Slo(ttft_s=2.0, tpot_s=0.05))
        assert own["slo_own"] and own["slo"] == SLO  # the twin's 10x tighter SLO, back in the modelled time
        assert own["ttft_p50"] > 2.0 and own["slo_attainment"] > 0.9
        curve = load.measured(con, ids["fp8"], Slo(ttft_s=2.0, tpot_s=0.05))
        assert curve.within_slo.all()

    at = page("runs")
    at.selectbox(key="run").set_value(run_id).run()
    no_exception(at)
    assert "runs_slo_ttft" not in [n.key for n in at.number_input]  # nothing to set: the run's own SLO judges it
    assert any("Judged by the SLO this run ran under: TTFT p50 <= 30 s, TPOT p50 <= 300 ms" in c.value.replace("\\", "")
               for c in at.caption)
    assert metric(at, "SLO attainment (its own SLO)") > 90
    assert any("within the SLO" in m.value for m in at.markdown)


def test_compare_opens_on_two_deployments_each_judged_by_its_own_slo(campaign_runs):
    _, ids = campaign_runs
    at = page("compare")
    no_exception(at)
    # the newest run (FP8 KV, repeat 2) against the newest of the other deployment, not FP8's repeat 1
    assert at.multiselect(key="compare_runs").value == [ids["bf16"][1], ids["fp8"][1]]
    side = table_with(at, "SLO judged by")
    assert side["SLO judged by"].tolist() == ["TTFT p50 <= 30 s, TPOT p50 <= 300 ms (the run's own)"] * 2
    assert (side["SLO attainment %"] > 90).all()
    assert "compare_slo_ttft" not in [n.key for n in at.number_input]
