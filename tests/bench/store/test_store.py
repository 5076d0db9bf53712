"""The results store on real DuckDB files: schema, migrations, writer, queries, parameters, export."""

from __future__ import annotations

import json
import time

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.errors import BadInput
from bench.model import Slo
from bench.store import MIGRATIONS, SCHEMA_VERSION, BatchedWriter, Store, bucket_value, export_run, queries, to_buckets
from bench.store.schema import GPU_SCHEMA, INTEGRITY_SCHEMA, REQUESTS_SCHEMA, RUN_TABLES, SERVER_SCHEMA


def _requests(n: int, t0: float, rng: np.random.Generator, ttft=0.3, tpot=0.02, gaps=10) -> dict:
    due = t0 + np.arange(n) * 0.1
    ttfts = rng.lognormal(np.log(ttft), 0.5, n)
    itl = rng.lognormal(np.log(tpot), 0.3, (n, gaps))
    first = due + 0.001 + ttfts
    return {
        "request_id": [f"r{i}" for i in range(n)], "scheduled_at": due, "sent_at": due + 0.001,
        "first_token_at": first, "finished_at": first + itl.sum(axis=1), "itl_s": [list(r) for r in itl],
        "prompt_tokens": np.full(n, 1000, np.int32), "completion_tokens": np.full(n, gaps + 1, np.int32),
    }


def test_arrow_schemas_match_the_tables(tmp_db):
    Store(tmp_db)
    con = duckdb.connect(str(tmp_db), read_only=True)
    for table, schema in [("requests", REQUESTS_SCHEMA), ("gpu_samples", GPU_SCHEMA),
                          ("server_samples", SERVER_SCHEMA), ("integrity_events", INTEGRITY_SCHEMA)]:
        cols = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
        assert cols == schema.names, table
    assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    con.close()


def test_reopen_does_not_migrate_twice_and_newer_schema_is_refused(tmp_db):
    Store(tmp_db)
    Store(tmp_db)
    con = duckdb.connect(str(tmp_db))
    assert con.execute("SELECT count(*) FROM schema_version").fetchone()[0] == len(
        [m for m in MIGRATIONS])
    con.execute("INSERT INTO schema_version VALUES (?, 0, 'from the future')", [SCHEMA_VERSION + 1])
    con.close()
    with pytest.raises(BadInput, match="newer than this capbench"):
        Store(tmp_db)
    with pytest.raises(BadInput, match="newer than this capbench"):
        Store(tmp_db, read_only=True)


def test_missing_or_foreign_db_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="no results database"):
        Store(tmp_path / "nope.duckdb", read_only=True)
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"this is not a database" * 200)
    with pytest.raises(BadInput, match="cannot open"):
        Store(junk)
    assert junk.read_bytes() == b"this is not a database" * 200  # nothing of the user's is overwritten


def test_outside_text_is_stored_verbatim_through_parameters(tmp_db):
    store = Store(tmp_db)
    evil = "x'); DROP TABLE runs; -- \" ; SELECT 1; '' \\"
    run_id = store.start_run(label=evil, target=evil, profile=evil, config={"note": evil})
    with BatchedWriter(store, run_id) as w:
        w.add_request({"request_id": evil, "status": "error", "error_kind": evil, "error": evil})
        w.add_server_sample({"t": 1.0, "metric": evil, "labels": evil, "value": 1.0})
        w.add_integrity_event({"t": 1.0, "kind": evil, "detail": evil})
    store.finish_run(run_id, status="failed")
    runs = store.runs()
    assert list(runs.label) == [evil] and runs.status[0] == "failed"
    assert json.loads(runs.config[0]) == {"note": evil}
    with store.connect() as con:
        assert con.execute("SELECT request_id, error_kind, error FROM requests").fetchone() == (evil, evil, evil)
        assert con.execute("SELECT metric, labels FROM server_samples").fetchone() == (evil, evil)
        assert con.execute("SELECT kind, detail FROM integrity_events").fetchone() == (evil, evil)
        s = queries.summary(con, run_id)
    assert s["errors_by_kind"] == {evil: 1}
    with pytest.raises(BadInput, match="unknown run id"):
        store.run(evil)


def test_secrets_in_config_are_not_stored(tmp_db):
    store = Store(tmp_db)
    run_id = store.start_run(config={"api_key": "sk-live-123", "headers": {"Authorization": "Bearer x"}, "tp": 8})
    config = json.loads(store.run(run_id)["config"])
    assert config == {"api_key": "***", "headers": {"Authorization": "***"}, "tp": 8}
    assert "sk-live-123" not in tmp_db.read_bytes().decode("latin-1")


def test_writer_flushes_within_a_second_while_the_run_goes_on(tmp_db):
    store = Store(tmp_db)
    run_id = store.start_run(label="live")
    w = BatchedWriter(store, run_id, flush_interval_s=0.2)
    w.add_request({"request_id": "a", "scheduled_at": time.time()})
    w.add_gpu_sample({"t": time.time(), "gpu": 0, "power_w": 500.0})
    deadline = time.monotonic() + 5
    while store.runs().requests[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert store.runs().requests[0] == 1
    assert w.flushes >= 1 and w.rows_written["gpu_samples"] == 1
    w.add_request({"request_id": "b"})
    w.close()
    assert store.runs().requests[0] == 2
    with pytest.raises(RuntimeError, match="closed"):
        w.add_request({"request_id": "c"})


def test_writer_rejects_unknown_columns_and_keeps_misfit_rows_with_a_note(tmp_db, caplog):
    store = Store(tmp_db)
    run_id = store.start_run()
    with BatchedWriter(store, run_id) as w:
        with pytest.raises(ValueError, match="unknown requests column"):
            w.add_request({"request_idd": "x"})
        with pytest.raises(ValueError, match="unknown request column"):
            w.add_requests({"nope": [1]})
        w.add_request({"request_id": "good", "prompt_tokens": 5})
        w.add_request({"request_id": "bad", "prompt_tokens": "many", "e2e_s": 1.5})
        w.add_request({"request_id": "huge", "prompt_tokens": 2**31, "completion_tokens": 7, "note": "n0"})
    with store.connect() as con:
        got = con.execute("SELECT request_id, prompt_tokens, completion_tokens, e2e_s, note FROM requests "
                          "ORDER BY request_id").fetchall()
        stats = con.execute("SELECT sum(n) FROM request_stats").fetchone()[0]
    assert [g[:4] for g in got] == [("bad", None, None, 1.5), ("good", 5, None, None), ("huge", None, 7, None)]
    assert got[0][4] == "prompt_tokens 'many' does not fit int32: stored as NULL" and got[1][4] is None
    assert got[2][4].startswith("n0; prompt_tokens '2147483648' does not fit int32")
    assert stats == 3  # the summary counts them too
    assert "does not fit its column" in caplog.text


def test_derived_columns_count_from_the_due_time(tmp_db):
    store = Store(tmp_db)
    run_id = store.start_run()
    with BatchedWriter(store, run_id) as w:
        w.add_request({"request_id": "1", "scheduled_at": 100.0, "sent_at": 100.5, "first_token_at": 101.0,
                       "finished_at": 103.0, "completion_tokens": 5})
        w.add_request({"request_id": "2", "sent_at": 200.0, "first_token_at": 200.25, "finished_at": 201.0,
                       "completion_tokens": 1, "error": "boom"})
        w.add_request({"request_id": "3", "ttft_s": 9.0, "scheduled_at": 100.0, "first_token_at": 101.0})
    with store.connect() as con:
        rows = con.execute("SELECT request_id, dispatch_lag_s, ttft_s, e2e_s, tpot_s, phase, status FROM requests "
                           "ORDER BY request_id").fetchall()
    assert rows[0] == ("1", 0.5, 1.0, 3.0, 0.5, "measured", "ok")
    assert rows[1] == ("2", None, 0.25, 1.0, None, "measured", "error")
    assert rows[2][2] == 9.0  # a value the client measured is kept


def test_histogram_percentiles_are_within_half_a_percent_of_exact():
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.lognormal(-3, 1.5, 50_000), [0.0, 1e-9, 5e3]])
    buckets, counts = to_buckets(values)
    cum = np.cumsum(counts)
    for q in (50, 90, 95, 99, 99.9):
        exact = np.percentile(values, q, method="inverted_cdf")
        got = bucket_value(buckets[np.searchsorted(cum, q / 100 * cum[-1])])
        assert got == pytest.approx(exact, rel=0.004)
    assert counts.sum() == values.size


def test_summary_matches_numpy_on_the_raw_rows(tmp_db):
    store = Store(tmp_db)
    rng = np.random.default_rng(5)
    run_id = store.start_run(label="a")
    t0 = store.run(run_id)["started_at"]
    batch = _requests(2000, t0, rng)
    batch["phase"] = ["warmup"] * 100 + ["measured"] * 1900
    batch["status"] = ["ok"] * 1950 + ["error"] * 50
    batch["error_kind"] = [None] * 1950 + ["timeout"] * 50
    with BatchedWriter(store, run_id, flush_interval_s=3600) as w:
        for i in range(0, 2000, 250):
            w.add_requests({k: v[i:i + 250] for k, v in batch.items()})
            w.flush()  # eight flushes, so eight histogram and stats slices for finish_run to fold
    assert w.flushes == 8
    store.finish_run(run_id)
    with store.connect() as con:
        raw = con.execute("SELECT * FROM requests WHERE phase = 'measured'").df()
        s = queries.summary(con, run_id, Slo(ttft_s=0.4, tpot_s=0.025))
        hist_rows = con.execute("SELECT count(*), count(DISTINCT (metric, bucket)) FROM latency_hist").fetchone()
    assert hist_rows[0] == hist_rows[1]  # finish_run folded the slices
    ok = raw[raw.status == "ok"]
    assert (s["requests"], s["warmup"], s["measured"], s["ok"], s["errors"]) == (2000, 100, 1900, 1850, 50)
    assert s["success_rate"] == pytest.approx(1850 / 1900)
    assert s["errors_by_kind"] == {"timeout": 50}
    duration = raw.finished_at.max() - raw.scheduled_at.min()
    assert s["duration_s"] == pytest.approx(duration)
    assert s["achieved_rate_rps"] == pytest.approx(1900 / (raw.sent_at.max() - raw.sent_at.min()))
    assert s["output_tps"] == pytest.approx(ok.completion_tokens.sum() / duration)
    for metric, col in (("ttft", ok.ttft_s), ("e2e", ok.e2e_s), ("tpot", ok.tpot_s),
                        ("itl", np.concatenate(ok.itl_s.to_list()))):
        for q in queries.QUANTILES:
            exact = np.percentile(np.asarray(col, dtype=np.float64), q, method="inverted_cdf")
            assert s[f"{metric}_p{q}"] == pytest.approx(exact, rel=0.004), (metric, q)
    good = ((ok.ttft_s <= 0.4) & (ok.tpot_s <= 0.025)).sum()
    assert 0 < good < len(ok)
    assert s["slo_attainment"] == pytest.approx(good / 1900)
    assert s["goodput_rps"] == pytest.approx(good / duration)


def test_series_and_compare(tmp_db):
    store = Store(tmp_db)
    rng = np.random.default_rng(9)
    ids = []
    for tpot in (0.04, 0.02):
        run_id = store.start_run(label=f"tpot {tpot}")
        t0 = store.run(run_id)["started_at"]
        with BatchedWriter(store, run_id) as w:
            w.add_requests(_requests(300, t0, rng, tpot=tpot))
            for k in range(30):
                w.add_gpu_sample({"t": t0 + k, "gpu": 0, "power_w": 100.0 + k})
                w.add_server_sample({"t": t0 + k, "metric": "sglang:num_running_reqs", "labels": "{}", "value": k})
        store.finish_run(run_id)
        ids.append(run_id)
    with store.connect() as con:
        ser = queries.series(con, ids[0], resolution_s=5)
        gpu = queries.gpu_series(con, ids[0], resolution_s=10)
        srv = queries.server_series(con, ids[0], "sglang:num_running_reqs", resolution_s=10)
        cmp = queries.compare(con, ids)
        with pytest.raises(BadInput, match="resolution"):
            queries.series(con, ids[0], resolution_s=0)
        with pytest.raises(BadInput, match="two different run ids"):
            queries.compare(con, [ids[0], ids[0]])
        with pytest.raises(BadInput, match="unknown run id"):
            queries.compare(con, [ids[0], "nope"])
    assert ser.completed.sum() == 300 and (ser.elapsed_s.diff().dropna() % 5 == 0).all()
    assert list(gpu.power_w) == [104.5, 114.5, 124.5]
    assert list(srv.value) == [4.5, 14.5, 24.5]
    ratio = cmp.loc["tpot_p50", f"{ids[1]} / {ids[0]}"]
    assert ratio == pytest.approx(0.5, rel=0.1)
    assert cmp.loc["measured", ids[0]] == 300


def test_integrity_log_import(tmp_db, tmp_path):
    store = Store(tmp_db)
    run_id = store.start_run()
    log = tmp_path / "kv.jsonl"
    log.write_text("\n".join([
        json.dumps({"t": 1.5, "kind": "kv_checksum_mismatch", "layer": 3, "page": 77, "detail": {"node": 1}}),
        "not json",
        json.dumps({"kind": "no time"}),
        json.dumps({"t": 2.0, "kind": "kv_checksum_action", "layer": None, "page": None, "detail": "evicted"}),
        "",
    ]))
    assert store.import_integrity_log(run_id, log) == 2
    with store.connect() as con:
        rows = con.execute("SELECT t, kind, layer, page, detail FROM integrity_events ORDER BY t").fetchall()
    assert rows == [(1.5, "kv_checksum_mismatch", 3, 77, '{"node": 1}'), (2.0, "kv_checksum_action", None, None,
                                                                              "evicted")]
    with pytest.raises(BadInput, match="no integrity log"):
        store.import_integrity_log(run_id, tmp_path / "missing.jsonl")


def test_export_writes_every_table_of_one_run(tmp_db, tmp_path):
    store = Store(tmp_db)
    rng = np.random.default_rng(1)
    ids = []
    for n in (5, 7):
        run_id = store.start_run(label=f"n={n}")
        with BatchedWriter(store, run_id) as w:
            w.add_requests(_requests(n, 0.0, rng))
            w.add_gpu_sample({"t": 1.0, "gpu": 0})
        ids.append(run_id)
    files = export_run(store, ids[1], "parquet", tmp_path / "pq")
    assert sorted(p.name for p in files) == sorted(f"{t}.parquet" for t in RUN_TABLES)
    assert {"runs", "requests", "gpu_samples", "server_samples", "integrity_events"} <= set(RUN_TABLES)
    req = pq.read_table(tmp_path / "pq" / "requests.parquet")
    assert req.num_rows == 7 and set(req["run_id"].to_pylist()) == {ids[1]}
    assert len(req["itl_s"][0].as_py()) == 10
    export_run(store, ids[1], "csv", tmp_path / "csv")
    lines = (tmp_path / "csv" / "requests.csv").read_text().splitlines()
    assert len(lines) == 8 and "[" in lines[1]
    with pytest.raises(BadInput, match="format"):
        export_run(store, ids[1], "xlsx", tmp_path / "x")
    with pytest.raises(BadInput, match="unknown run id"):
        export_run(store, "nope", "csv", tmp_path / "x")


def test_a_version_1_file_is_migrated_with_its_request_stats_backfilled(tmp_db):
    from bench.store import MIGRATIONS

    con = duckdb.connect(str(tmp_db))  # a file as the first release of the store left it
    con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL, applied_at DOUBLE NOT NULL, note VARCHAR)")
    for sql in MIGRATIONS[0][2]:
        con.execute(sql)
    con.execute("INSERT INTO schema_version VALUES (1, 0, 'initial schema')")
    con.execute("INSERT INTO runs (run_id, started_at, status) VALUES ('old', 0, 'completed')")
    con.execute("INSERT INTO requests (run_id, request_id, phase, sent_at, finished_at, prompt_tokens, status) "
                "SELECT 'old', i::VARCHAR, 'measured', i, i + 1, 10, CASE WHEN i < 8 THEN 'ok' ELSE 'error' END "
                "FROM range(10) t(i)")
    con.close()
    with pytest.raises(BadInput, match="open it read-write once"):
        Store(tmp_db, read_only=True)
    store = Store(tmp_db)
    with store.connect() as con:
        assert con.execute("SELECT max(version) FROM schema_version").fetchall()[0][0] == SCHEMA_VERSION
        s = queries.summary(con, "old")
    assert (s["measured"], s["ok"], s["errors"], s["input_tokens"]) == (10, 8, 2, 80)
    assert s["duration_s"] == 10.0


def test_a_failing_migration_leaves_the_file_as_it_was(tmp_db, monkeypatch):
    import bench.store.db as store_module

    Store(tmp_db)
    broken = (SCHEMA_VERSION + 1, "broken", ["CREATE TABLE half_done (a INTEGER)", "SELECT * FROM no_such_table"])
    monkeypatch.setattr(store_module, "MIGRATIONS", [*store_module.MIGRATIONS, broken])
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with pytest.raises(duckdb.CatalogException):
        Store(tmp_db)
    monkeypatch.undo()
    con = duckdb.connect(str(tmp_db), read_only=True)
    assert con.execute("SELECT max(version) FROM schema_version").fetchall()[0][0] == SCHEMA_VERSION
    assert con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'half_done'"
                       ).fetchall()[0][0] == 0
    con.close()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=1e-6, max_value=1e4, allow_nan=False), min_size=1, max_size=300),
       st.sampled_from([50, 90, 95, 99]), st.booleans())
def test_any_percentile_from_the_buckets_is_within_0_4_percent(values, q, as_float32):
    v = np.array(values, dtype=np.float32 if as_float32 else np.float64)
    buckets, counts = to_buckets(v)
    cum = np.cumsum(counts)
    got = bucket_value(buckets[np.searchsorted(cum, q / 100 * cum[-1])])
    exact = float(np.percentile(v.astype(np.float64), q, method="inverted_cdf"))
    assert abs(got - exact) <= 0.0040 * exact


def test_many_threads_adding_while_the_writer_flushes_lose_nothing(tmp_db):
    import threading

    store = Store(tmp_db)
    run_id = store.start_run()
    w = BatchedWriter(store, run_id, flush_interval_s=0.02)

    def add(k: int) -> None:
        for i in range(500):
            w.add_request({"request_id": f"{k}-{i}", "itl_s": [0.01, 0.02]})
            w.add_server_sample({"t": float(i), "metric": "m", "labels": str(k), "value": 1.0})
            if i % 25 == 0:
                time.sleep(0.002)

    threads = [threading.Thread(target=add, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        w.flush()  # a fifth thread flushing too, besides the writer's own
    for t in threads:
        t.join()
    w.close()
    with store.connect() as con:
        assert con.execute("SELECT count(DISTINCT request_id) FROM requests").fetchall()[0][0] == 2000
        assert con.execute("SELECT count(*) FROM server_samples").fetchall()[0][0] == 2000
        assert con.execute("SELECT sum(n) FROM latency_hist WHERE metric = 'itl'").fetchall()[0][0] == 4000
