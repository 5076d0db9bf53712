"""The Compare page: the runs chosen are the runs shown, with their gains against the first, measured beside
predicted, and a quality-drift section only when the DB has a drift table."""

from __future__ import annotations

import duckdb
import streamlit as st

from bench.model import Slo
from bench.report import measured_vs_predicted
from bench.store import Store, queries
from tests.dashboard.apptest import has_table_with, no_exception, page, table_with
from tests.rundb import RUNS


def test_compare_shows_the_chosen_runs_and_their_gains(db):
    path, ids = db
    by_label = {RUNS[i][0]: r for i, r in enumerate(ids)}
    at = page("compare")
    no_exception(at)
    # default: the newest two runs of one deployment, older first (kimi fp8-kv, then the checksum one)
    assert at.multiselect(key="compare_runs").value == [by_label["kimi fp8-kv"], by_label["kimi fp8-kv checksum"]]
    chosen = [by_label["kimi bf16-kv"], by_label["kimi fp8-kv"]]
    at.multiselect(key="compare_runs").set_value(chosen).run()
    no_exception(at)
    assert len(at.get("vega_lite_chart")) >= 3
    side = table_with(at, "identity")
    assert [i.endswith(f"'{lbl}'") for i, lbl in zip(side.identity, ("kimi bf16-kv", "kimi fp8-kv"), strict=True)] \
        == [True] * 2
    assert side.run.tolist() == [f"Kimi K2 Thinking, 8x H200 tp8, {kv} KV, INT4-G32 experts (as shipped) · poisson 4 "
                                 f"req/s ({r[-6:]})" for kv, r in zip(("BF16", "FP8"), chosen, strict=True)]
    with Store(path, read_only=True).connect() as con:
        s = [queries.summary(con, r, Slo(ttft_s=2.0, tpot_s=0.05)) for r in chosen]
    assert side["output tokens/s"].tolist() == [x["output_tps"] for x in s]
    gains = table_with(at, "output tokens/s vs first")
    assert abs(gains["output tokens/s vs first"].iloc[1] - s[1]["output_tps"] / s[0]["output_tps"]) < 1e-9
    # FP8 KV doubles Kimi's KV pool
    assert abs(gains["KV pool tokens (model) vs first"].iloc[1] - 2.0) < 0.01
    assert side["figures from"].tolist() == ["8x H200 (measured)"] * 2
    # $/1M tokens follows the price input
    cost = side["$ per 1M output tokens"].iloc[0]
    at.number_input(key="compare_price").set_value(3.79 * 2).run()
    assert abs(table_with(at, "identity")["$ per 1M output tokens"].iloc[0] - 2 * cost) < 1e-6

    pred = table_with(at, "predicted")
    assert set(pred.figure) == {"output tokens/s", "TPOT p50 (ms)", "TTFT p50 (ms)"}
    with Store(path, read_only=True).connect() as con:
        mvp = measured_vs_predicted(con, chosen[0], Slo(ttft_s=2.0, tpot_s=0.05))
    row = next(r for r in mvp["rows"] if r["figure"] == "output tokens/s")
    shown = pred[(pred.figure == "output tokens/s") & pred.run.str.endswith(f"({chosen[0][-6:]})")].iloc[0]
    assert shown.predicted == row["predicted"] and shown.error == f"{row['error']:+.1%}"
    # the prediction's 80 % interval: TTFT and TPOT always; output tokens/s only where the replay runs at capacity
    # (below it the offered 4 req/s is served whatever the error)
    tpot = next(r for r in mvp["rows"] if r["figure"] == "TPOT p50 (ms)")
    assert tpot["low"] < tpot["predicted"] < tpot["high"]
    assert tpot["inside"] == (tpot["low"] <= tpot["measured"] <= tpot["high"])
    shown = pred[(pred.figure == "TPOT p50 (ms)") & pred.run.str.endswith(f"({chosen[0][-6:]})")].iloc[0]
    assert shown["80 % interval"] == f"{tpot['low']:,.1f}-{tpot['high']:,.1f}"
    assert shown["inside"] == ("yes" if tpot["inside"] else "no")
    offered = mvp["config"]["rate"] / mvp["summary"]["time_scale"]  # in the modelled GPUs' time, as the replay
    if mvp["predicted"].achieved_rps >= 0.95 * offered:
        assert row["low"] is None and row["inside"] is None and shown_tps_interval(pred, chosen[0]) == "-"
    else:
        assert row["low"] < row["predicted"] < row["high"] and shown_tps_interval(pred, chosen[0]) != "-"


def shown_tps_interval(pred, run_id: str) -> str:
    return pred[(pred.figure == "output tokens/s") & pred.run.str.endswith(f"({run_id[-6:]})")].iloc[0][
        "80 % interval"]


def test_drift_section_only_when_the_table_exists(db_copy):
    path, ids = db_copy
    con = duckdb.connect(str(path))
    con.execute("DROP TABLE IF EXISTS drift")
    con.close()
    at = page("compare")
    no_exception(at)
    assert not any("Quality drift" in h.value for h in at.subheader)
    assert not has_table_with(at, "token_agreement")

    con = duckdb.connect(str(path))
    con.execute("""CREATE TABLE drift (run_id VARCHAR NOT NULL, target_a VARCHAR, target_b VARCHAR,
        prompt_id VARCHAR, kind VARCHAR, tokens_a INTEGER, tokens_b INTEGER, token_agreement DOUBLE,
        first_divergence INTEGER, mean_kl DOUBLE, exact_match BOOLEAN, tool_calls_match BOOLEAN, error VARCHAR)""")
    con.executemany("INSERT INTO drift (run_id, target_a, target_b, prompt_id, token_agreement, first_divergence, "
                    "mean_kl, exact_match) VALUES (?, 'bf16', 'fp8', ?, ?, ?, 0.01, ?)",
                    [[ids[0], "p1", 1.0, None, True], [ids[0], "p2", 0.5, 7, False]])
    con.close()
    st.cache_data.clear()  # the page caches reads for a few seconds
    at = page("compare")
    no_exception(at)
    assert any("Quality drift" in h.value for h in at.subheader)
    drift = table_with(at, "token_agreement")
    assert drift.token_agreement.tolist() == [0.75] and drift.exact_match_rate.tolist() == [0.5]
