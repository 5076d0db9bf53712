"""The Integrity page: checksum totals per run from the capbench_kv_* counters, the mismatch events of the run
chosen, and the overhead against the same deployment without checksums."""

from __future__ import annotations

from bench.store import Store, queries
from tests.dashboard.apptest import has_table_with, metric, no_exception, page, table_with
from tests.rundb import RUNS


def test_integrity_totals_events_and_overhead(db):
    path, ids = db
    by_label = {RUNS[i][0]: r for i, r in enumerate(ids)}
    at = page("integrity")
    no_exception(at)
    table = table_with(at, "pages verified")
    assert sorted(table["checksum mode"]) == ["verify", "verify"]
    with Store(path, read_only=True).connect() as con:
        verified = con.execute("SELECT max(value) - arg_min(value, t) FROM server_samples WHERE run_id = ? AND "
                               "metric = 'capbench_kv_pages_verified_total'", [by_label["kimi fp8-kv checksum"]]
                               ).fetchone()[0]
        on = queries.summary(con, by_label["kimi fp8-kv checksum"])["output_tps"]
        off = queries.summary(con, by_label["kimi fp8-kv"])["output_tps"]
    kimi = table[table["run id"] == by_label["kimi fp8-kv checksum"]].iloc[0]
    assert kimi["pages verified"] == verified and kimi.mismatches == 1
    assert kimi["throughput overhead %"] == round((1 - on / off) * 100, 3)
    glm = table[table["run id"] == by_label["glm fp8-kv checksum"]].iloc[0]
    assert glm.mismatches == 0 and glm["throughput overhead %"] != glm["throughput overhead %"]  # NaN: no baseline
    assert metric(at, "Mismatches") == 1

    at.selectbox(key="integrity_run").set_value(by_label["kimi fp8-kv checksum"]).run()
    no_exception(at)
    events = table_with(at, "page")
    assert sorted(events.kind) == ["kv_checksum_action", "kv_checksum_mismatch"]
    assert events[events.kind == "kv_checksum_mismatch"].page.tolist() == [4242]
    at.selectbox(key="integrity_run").set_value(by_label["glm fp8-kv checksum"]).run()
    assert not has_table_with(at, "page")
    assert any("No mismatches logged" in c.value for c in at.caption)
    assert len(at.get("vega_lite_chart")) == 3
