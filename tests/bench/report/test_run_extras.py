"""The report's per-GPU table (NVML rows and a GPU node's DCGM rows) and a repeat group's 90 % intervals, from a DB
filled through the store's writer (tests/rundb.py plus a repeat group of three runs)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.model import Question
from bench.report import build, render, run_extras
from bench.report.content import Measured
from bench.store import BatchedWriter, Store, repeats
from bench.store.nodes import parse_dcgm
from tests.bench.store.dcgm_exporter import text
from tests.rundb import RUNS, _requests, fill

CONFIG = RUNS[1][1]  # kimi, FP8 KV
TTFTS = (0.20, 0.25, 0.30)  # each repeat's TTFT scale: their p50s differ, the interval must hold them all


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("extras") / "capbench.duckdb"
    fill(path)
    store, rng, ids = Store(path), np.random.default_rng(3), []
    for i, ttft in enumerate(TTFTS):
        run_id = store.start_run(label=f"steady #{i + 1}", target="http://127.0.0.1:30000", profile="poisson",
                                 config={**CONFIG, "repeat_group": "g123", "repeat": i})
        t0 = store.run(run_id)["started_at"]
        with BatchedWriter(store, run_id, flush_interval_s=60) as w:
            _requests(w, rng, t0, CONFIG["rate"], 0.03, ttft)
            for k in range(4):  # a DCGM exporter's scrapes of one node, 2 GPUs
                for row in parse_dcgm(text(k, "gpu-node-9"), "10.0.0.9:9400", t0 + k)[0]:
                    w.add_gpu_sample(row)
        store.finish_run(run_id)
        ids.append(run_id)
    return path, ids


def test_a_repeat_groups_intervals_hold_each_run_and_the_node_gpus_are_listed(db):
    path, ids = db
    with Store(path, read_only=True).connect() as con:
        assert repeats.group_runs(con, "g123") == ids
        ivs = repeats.intervals(con, ids)
        runs = [Measured(r, f"run {r}", {}, {}, {}, {}, f"kimi fp8 ({r[-6:]})") for r in ids]
        t = run_extras.tables(con, runs)
    ttft = ivs["ttft_p50"]
    assert ttft["n"] == 3 and all(ttft["low"] <= v <= ttft["high"] for v in ttft["values"])
    assert len({round(v, 3) for v in ttft["values"]}) == 3  # three different runs, not one counted thrice
    head, rows = t["repeats"]
    assert len(rows) == 1 and rows[0][1] == "3" and "group g123" in rows[0][0]
    cell = rows[0][head.index("TTFT p50: mean +/- 90 % (ms)")]
    assert f"{ttft['mean'] * 1e3:,.0f} +/- {ttft['half'] * 1e3:,.0f}" in cell
    head, rows = t["gpu_nodes"]
    assert {(r[1], r[2]) for r in rows} == {("gpu-node-9", "0"), ("gpu-node-9", "1")} and len(rows) == 6


def test_the_report_shows_both_sections_only_where_they_apply(db):
    path, ids = db
    q = Question(model="kimi-k2-thinking", gpu="h200", tp=8, workload="chat", target_rate_rps=20,
                 search_gpus=("h200",))
    page = render(build(q, path, ids, other_gpus=False), "md")
    assert "## Repeated runs: 90 % intervals" in page and "group g123" in page
    assert "## GPUs during the runs" in page and "gpu-node-9" in page
    single = render(build(q, path, [ids[0]], other_gpus=False), "md")
    assert "## Repeated runs" in single  # one run of a group still shows its group's interval
