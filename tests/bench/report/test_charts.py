"""The shared charts show the data: log bins on a log axis, an ITL histogram and CDF from the stored gaps, lines
that break at gaps, one axis per unit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bench.report import charts
from bench.store import Store, queries, runinfo
from tests.rundb import fill


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("charts") / "capbench.duckdb"
    return path, fill(path)


def _data(chart) -> list[dict]:
    spec = chart.to_dict()
    return [row for rows in spec.get("datasets", {}).values() for row in rows]


def test_log_bins_are_equal_on_a_log_axis_and_keep_every_count():
    values = pd.DataFrame({"value_ms": np.geomspace(0.01, 500, 300), "n": np.arange(1, 301)})
    b = charts.log_bins(values, bins=20)
    ratios = b["hi_ms"] / b["lo_ms"]
    assert np.allclose(ratios, ratios.iloc[0])  # every bin spans the same factor: equal width on a log axis
    assert b["n"].sum() == values["n"].sum()
    assert b["lo_ms"].min() > 0  # nothing lands on 0, which a log axis cannot draw
    two = charts.log_bins(pd.concat([values.assign(run="a"), values.assign(run="b", value_ms=values.value_ms * 2)]))
    assert set(two.groupby("run")["share"].sum().round(9)) == {1.0}


def test_itl_histogram_and_cdf_come_from_the_stored_gaps(db):
    path, ids = db
    with Store(path, read_only=True).connect() as con:
        d = runinfo.distribution(con, ids[0], "itl")
        gaps = con.execute("SELECT sum(len(itl_s)) FROM requests WHERE run_id = ? AND phase = 'measured' "
                           "AND status = 'ok'", [ids[0]]).fetchone()[0]
    assert d["n"].sum() == gaps  # every stored gap of the measured, successful requests is in the histogram
    hist = _data(charts.distribution(d, "ITL", "gaps"))
    assert sum(r["n"] for r in hist) == gaps and all(r["lo_ms"] > 0 for r in hist)
    cdf = _data(charts.cdf(d, "ITL CDF"))
    shares = [r["share"] for r in cdf]
    assert shares == sorted(shares) and shares[-1] == pytest.approx(1.0)
    median = next(r["value_ms"] for r in cdf if r["share"] >= 0.5)
    assert median == pytest.approx(40.0, rel=0.1)  # the bf16 run's gaps were written around 40 ms


def test_series_keeps_empty_slots_and_the_line_breaks_there(db):
    path, ids = db
    with Store(path, read_only=True).connect() as con:
        s = queries.series(con, ids[0], 0.25)
    assert np.allclose(np.diff(s["elapsed_s"]), 0.25)  # every slot from the first finish to the last
    empty = s[s["completed"] == 0]
    assert len(empty) > 0 and empty["ttft_p50"].isna().all() and (empty["rps"] == 0).all()
    seg = charts.segments(s, "ttft_p50", step=0.25)
    assert seg["ttft_p50"].notna().all()
    assert seg["segment"].nunique() > 1  # the line is drawn in pieces, never across the empty slots
    # a jump in time between samples is a gap too, as for server samples that stopped for a while
    samples = pd.DataFrame({"elapsed_s": [0, 1, 2, 10, 11], "value": [1.0, 2, 3, 4, 5]})
    assert charts.segments(samples, "value", step=1.0)["segment"].nunique() == 2


def test_twin_runs_are_shown_in_the_modelled_gpus_time(tmp_path):
    store = Store(tmp_path / "t.duckdb")
    run = store.start_run(config={"twin": "twin:glm-4.6@h200x8,kv=fp8_e4m3,time_scale=4",
                                  "profile": {"name": "poisson", "params": {"rate": 8.0}}})
    from bench.store import BatchedWriter

    t0 = store.run(run)["started_at"]
    with BatchedWriter(store, run) as w:
        for i in range(20):
            w.add_request({"request_id": str(i), "phase": "measured", "scheduled_at": t0 + i / 8,
                           "sent_at": t0 + i / 8, "first_token_at": t0 + i / 8 + 0.1,
                           "finished_at": t0 + i / 8 + 1.1, "itl_s": [0.01] * 100, "prompt_tokens": 100,
                           "completion_tokens": 101, "status": "ok"})
    store.finish_run(run)
    with Store(tmp_path / "t.duckdb", read_only=True).connect() as con:
        raw, gpu = queries.summary(con, run), runinfo.summary(con, run)
        itl = runinfo.distribution(con, run, "itl")
    assert gpu["time_scale"] == 4
    assert gpu["ttft_p50"] == pytest.approx(raw["ttft_p50"] * 4)
    assert gpu["achieved_rate_rps"] == pytest.approx(raw["achieved_rate_rps"] / 4)
    assert itl["value_ms"].iloc[0] == pytest.approx(40, rel=0.01)
    row = runinfo.runs_table(store.runs()).iloc[0]
    assert "poisson 2 req/s" in row["identity"] and row["identity"].endswith("twin (modelled)")


def test_latency_against_load_puts_measured_and_predicted_on_one_chart_with_the_slo(db):
    from bench.model import Question, Slo, make_plan
    from bench.report import load, plancharts

    path, ids = db
    slo = Slo(ttft_s=2.0, tpot_s=0.05)
    runs = runinfo.list_runs(Store(path, read_only=True))
    assert load.sweep_runs(runs, ids[0]) == [ids[0]]  # the only run of its deployment (BF16 KV, no checksum)
    with Store(path, read_only=True).connect() as con:
        measured = load.measured(con, [ids[0]], slo)
    assert measured.offered_rps.tolist() == [4.0] and measured.within_slo.tolist() == [True]
    q = Question(model="kimi-k2-thinking", gpu="h200", tp=8, kv_dtype="bf16", workload="chat", search_gpus=("h200",))
    rec = make_plan(q).recommended
    predicted = load.predicted(rec.config.deployment(q.model), q.request_mix(), slo, rec.prediction)
    assert load.highest_within(predicted)["predicted"] == rec.prediction.rate_rps  # the plan's figure is marked
    ttft = predicted.sort_values("offered_rps").tpot_ms.tolist()
    assert ttft[0] < ttft[-1]  # more load, slower tokens
    spec = plancharts.latency_vs_load(pd.concat([measured, predicted]), slo).to_dict()
    rows = next(iter(spec["datasets"].values()))
    assert {r["source"] for r in rows} == {"measured", "predicted"}
    assert {r["slo_ms"] for r in rows if r["metric"].startswith("TPOT")} == {50.0}
    assert sum(r["best"] for r in rows) == 2 * 2 * 2  # measured and predicted, TTFT and TPOT, offered and achieved
