"""The Runs page: the list filters, the chosen run's figures are its own, the SLO moves goodput, and the page
keeps working while another process writes a run into the same file."""

from __future__ import annotations

import subprocess
import sys
import time

import streamlit as st

from bench.model import Slo
from bench.store import Store, queries
from tests.dashboard.apptest import metric, no_exception, page
from tests.rundb import RUNS


def test_runs_list_filters_and_run_figures(db):
    path, ids = db
    at = page("runs")
    no_exception(at)
    assert len(at.dataframe[0].value) == len(RUNS)
    assert len(at.get("vega_lite_chart")) >= 8  # percentiles, 2 distributions, throughput, latency, GPU, server

    store = Store(path, read_only=True)
    by_label = {RUNS[i][0]: r for i, r in enumerate(ids)}
    for label in ("kimi fp8-kv", "kimi bf16-kv"):
        at.selectbox(key="run").set_value(by_label[label]).run()
        no_exception(at)
        with store.connect() as con:
            s = queries.summary(con, by_label[label])
        assert metric(at, "Measured requests") == s["measured"]
        assert metric(at, "TPOT p50 (ms)") == round(s["tpot_p50"] * 1e3, 1)
    assert metric(at, "TPOT p50 (ms)") > 35  # the bf16 run was written with 40 ms TPOT, the fp8 ones with 30 ms

    # a TPOT bound under most of this run's requests: attainment and goodput drop
    before = metric(at, "SLO attainment")
    at.number_input(key="runs_slo_tpot").set_value(40.0).run()
    after = metric(at, "SLO attainment")
    assert after < before - 20
    with store.connect() as con:
        s = queries.summary(con, by_label["kimi bf16-kv"], Slo(ttft_s=2.0, tpot_s=0.040))
    assert after == round(s["slo_attainment"] * 100, 1)

    at.multiselect(key="f_model").set_value(["glm-4.6"]).run()
    assert list(at.dataframe[0].value.model) == ["GLM-4.6"]
    at.multiselect(key="f_model").set_value([])
    at.text_input(key="f_label").set_value("bf16").run()
    assert list(at.dataframe[0].value.label) == ["kimi bf16-kv"]


WRITER = """
import sys, time
from bench.store import BatchedWriter, Store
store = Store(sys.argv[1])
run = store.start_run(label="live", config={"model": "glm-4.6", "gpu": "h200", "tp": 8, "kv_dtype": "bf16"})
print(run, flush=True)
with BatchedWriter(store, run, flush_interval_s=0.1) as w:
    t0 = time.time()
    for i in range(80):
        t = time.time()
        w.add_request({"request_id": str(i), "scheduled_at": t - 1, "sent_at": t - 1, "first_token_at": t - 0.8,
                       "finished_at": t, "prompt_tokens": 100, "completion_tokens": 50, "status": "ok"})
        w.add_gpu_sample({"t": t, "gpu": 0, "gpu_util_pct": 50.0})
        time.sleep(0.05)
store.finish_run(run)
"""


def test_runs_page_reads_while_another_process_writes(db_copy):
    path, _ = db_copy
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        live = writer.stdout.readline().strip()
        seen = []
        for _ in range(2):
            at = page("runs")
            no_exception(at)
            runs = at.dataframe[0].value
            seen.append(runs[runs["run id"] == live].status.tolist())
            time.sleep(0.5)
        assert ["running"] in seen  # the run in progress is listed while its writer flushes every 0.1 s
        assert writer.wait(timeout=60) == 0
    finally:
        writer.kill()
    st.cache_data.clear()  # the page caches reads for a few seconds
    runs = page("runs").dataframe[0].value
    assert runs[runs["run id"] == live][["status", "requests"]].values.tolist() == [["completed", 80]]


def test_missing_db_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPBENCH_DB", str(tmp_path / "none.duckdb"))
    for name in ("runs", "compare", "integrity"):
        at = page(name)
        no_exception(at)
        assert any("make demo" in i.value for i in at.info), name
        assert not at.get("vega_lite_chart")


def test_a_sweeps_runs_make_a_latency_against_load_curve(tmp_path, monkeypatch):
    """Three stages of one sweep (as `capbench run --profile sweep` stores them): the Runs page draws their TTFT and
    TPOT against the offered and achieved rate, with the SLO, one point per stage."""
    import numpy as np

    from bench.store import BatchedWriter

    path = tmp_path / "sweep.duckdb"
    store = Store(path)
    for k, (rate, tpot) in enumerate(((1.0, 0.02), (2.0, 0.03), (4.0, 0.06)), 1):
        run = store.start_run(label="sweep", profile=f"sweep-{rate:g}rps", config={
            "model": "glm-4.6", "gpu": "h200", "tp": 8, "kv_dtype": "fp8_e4m3", "sweep_id": "sweep-1", "stage": k,
            "offered_rps": rate, "profile": {"name": f"sweep-{rate:g}rps", "params": {"rate": rate}}})
        t0 = store.run(run)["started_at"]
        n = int(rate * 20)
        due = t0 + np.arange(n) / rate
        with BatchedWriter(store, run) as w:
            w.add_requests({"request_id": [f"r{i}" for i in range(n)], "phase": ["measured"] * n,
                            "scheduled_at": due, "sent_at": due, "first_token_at": due + 0.2,
                            "finished_at": due + 0.2 + tpot * 99, "itl_s": [[tpot] * 99] * n,
                            "completion_tokens": np.full(n, 100, np.int32), "status": ["ok"] * n})
        store.finish_run(run)
    monkeypatch.setenv("CAPBENCH_DB", str(path))
    st.cache_data.clear()
    at = page("runs")
    no_exception(at)
    assert any("Latency against load: the 3 runs" in c.proto.spec for c in at.get("vega_lite_chart"))
    from bench.model import Slo
    from bench.report import load
    from bench.store import runinfo

    runs = runinfo.list_runs(Store(path, read_only=True))
    stages = load.sweep_runs(runs, runs.run_id.iloc[0])
    assert len(stages) == 3  # the chart's runs: the sweep's stages, oldest first
    slo = Slo(ttft_s=2.0, tpot_s=0.05)  # the page's default SLO
    with Store(path, read_only=True).connect() as con:
        points = load.measured(con, stages, slo)
    assert points.offered_rps.tolist() == [1.0, 2.0, 4.0]
    assert [round(x) for x in points.tpot_ms] == [20, 30, 60]
    assert load.highest_within(points) == {"measured": 2.0}  # the ringed point: 4 req/s misses the 50 ms TPOT
