"""Twin runs beside modelled figures: the Runs page shows a campaign stage's counts (sent / completed / missed /
cut off / errored) and a twin's server-metric rates in the modelled GPUs' time, labelled; Compare says whose time
each run's figures are in and computes a twin's KV pool (a model figure, labelled so) at the twin's own memory
fraction."""

import shutil

import numpy as np
import pytest

from bench.campaign import parse_campaign, record
from bench.model import capacity, catalog
from bench.store import BatchedWriter, Store, runinfo
from tests.bench.report.test_campaign_curves import SPEC, _cell
from tests.dashboard.apptest import metric, no_exception, page, table_with
from tests.rundb import _requests, _samples

TWIN = "twin:kimi-k2-thinking@h200x8,kv=fp8_e4m3,time_scale=10,mem_fraction=0.62"


@pytest.fixture
def twin_db(filled_db, tmp_path, monkeypatch):
    """The four GPU runs, and a twin run that was a campaign stage of cell bf16/lc."""
    path, ids = filled_db
    db = tmp_path / "twin.duckdb"
    shutil.copy(path, db)
    store = Store(db)
    cid = record.new_campaign(store, parse_campaign(SPEC), "test", status="running")
    run_id = store.start_run(label="campaign bf16/lc @0.4rps", target=TWIN, profile="poisson",
                             config={"twin": TWIN, "campaign": cid, "cell": "bf16/lc", "time_scale": 10,
                                     "rate": 4.0, "model": "kimi-k2-thinking"})
    t0 = store.run(run_id)["started_at"]
    with BatchedWriter(store, run_id, flush_interval_s=60) as w:
        _requests(w, np.random.default_rng(3), t0, 4.0, 0.003, 0.03)
        _samples(w, np.random.default_rng(3), t0, False)
    store.finish_run(run_id)
    cell = _cell("bf16", 1.0)
    cell["points"][1].update(run_id=run_id, sent=116, completed=110, missed=9, cut_off=4, errored=2)
    record.start_cell(store, cid, "bf16/lc", "bf16", "lc")
    record.finish_cell(store, cid, "bf16/lc", "completed", cell)
    record.set_status(store, cid, "completed")
    monkeypatch.setenv("CAPBENCH_DB", str(db))
    return db, ids, run_id, cid


def test_twin_rates_from_the_server_are_in_the_modelled_time(twin_db):
    db, ids, twin, _ = twin_db
    with Store(db, read_only=True).connect() as con:
        gpu = runinfo.server_series(con, ids[1], "sglang:gen_throughput", 5.0)
        own = runinfo.server_series(con, twin, "sglang:gen_throughput", 5.0)
        usage = runinfo.server_series(con, twin, "sglang:token_usage", 5.0)
    assert gpu.value.max() == pytest.approx(1200)  # as the server said
    assert own.value.max() == pytest.approx(120)  # the twin said 1200 tok/s on its clock, 10x the GPUs'
    assert usage.value.max() == pytest.approx(0.3)  # a share: as reported


def test_the_runs_page_shows_a_campaign_stage_and_labels_the_twin(twin_db):
    _, _, twin, cid = twin_db
    at = page("runs")
    at.selectbox(key="run").set_value(twin).run()
    no_exception(at)
    assert metric(at, "Stage: sent") == 116 and metric(at, "Stage: cut off") == 4 and metric(at, "Stage: errored") == 2
    text = " ".join(m.value for m in at.markdown)
    assert "Campaign stage" in text and "116 sent, 110 completed, 9 missed the SLO \\(4 cut off\\), 2 errored" in text
    captions = " ".join(c.value for c in at.caption)
    assert "twin x10, figures in the time of the modelled GPUs" in captions and "divided by 10" in captions


def test_compare_says_whose_time_and_models_the_twins_own_pool(twin_db):
    _, ids, twin, _ = twin_db
    at = page("compare")
    at.multiselect(key="compare_runs").set_value([ids[1], twin]).run()
    no_exception(at)
    side = table_with(at, "figures from")
    assert side["figures from"].tolist() == ["8x H200 (measured)", "twin x10, figures in the time of 8x H200"]
    kimi, h200 = catalog.model("kimi-k2-thinking"), catalog.gpu("h200")
    pools = [capacity.capacity(capacity.Deployment(kimi, h200, 8, kv_dtype="fp8_e4m3", mem_fraction=f)).kv_pool_tokens
             for f in (None, 0.62)]
    assert side["KV pool tokens (model)"].tolist() == pools and pools[1] < pools[0]
    assert any("not a measurement" in c.value for c in at.caption)


def test_the_running_cell_of_a_twin_is_in_the_modelled_time(twin_db):
    db, _, twin, cid = twin_db
    from bench.report import live_cell

    store = Store(db)
    record.start_cell(store, cid, "bf16/lc", "bf16", "lc")  # running again: its newest run is the twin's
    with store.connect() as con:
        cell = live_cell(con, cid, window_s=1e6)
        raw = con.execute("SELECT quantile_cont(ttft_s, 0.5), count(*) / 1e6 FROM requests WHERE run_id = ?",
                          [twin]).fetchone()
    assert cell["run_id"] == twin and cell["time_scale"] == 10
    assert cell["ttft_p50"] == pytest.approx(raw[0] * 10) and cell["rate_rps"] == pytest.approx(raw[1] / 10)
