"""`capbench import` of a file that holds only a tool's summary: SGLang's and vLLM's bench_serving result lines
saved without per-request lists, AIPerf's profile_export_aiperf.json alone, a guidellm benchmark that kept no
requests. Each file is built here from the tool's documented fields, imported by the installed capbench from a tmp
folder; `capbench runs`, the Compare query, the Runs page and the report show the tool's own figures; calibrate
refuses in one line; a second import does nothing; a bad summary is one line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.store import Store, queries

CAPBENCH = str(Path(sys.executable).parent / "capbench")
DEPLOYMENT = "glm-4.6@h200x8,kv=fp8_e4m3"

# SGLang bench_serving's result line without --output-details (python/sglang/bench_serving.py, benchmark())
SGLANG = {"tag": None, "backend": "sglang-oai", "dataset_name": "random", "request_rate": 8.0, "max_concurrency": None,
          "random_input_len": 1024, "random_output_len": 256, "server_info": {"version": "0.5.6"},
          "duration": 60.52, "completed": 480, "total_input_tokens": 491_520, "total_output_tokens": 122_880,
          "request_throughput": 7.931, "input_throughput": 8121.6, "output_throughput": 2030.4,
          "total_throughput": 10152.0, "mean_e2e_latency_ms": 1901.2, "median_e2e_latency_ms": 1850.4,
          "std_e2e_latency_ms": 300.2, "p99_e2e_latency_ms": 2911.8, "mean_ttft_ms": 121.5, "median_ttft_ms": 110.25,
          "std_ttft_ms": 40.1, "p99_ttft_ms": 310.7, "mean_tpot_ms": 7.1, "median_tpot_ms": 6.95, "std_tpot_ms": 0.5,
          "p99_tpot_ms": 9.25, "mean_itl_ms": 7.0, "median_itl_ms": 6.8, "std_itl_ms": 1.1, "p95_itl_ms": 8.5,
          "p99_itl_ms": 12.0, "concurrency": 15.1, "accept_length": None}
# vLLM's benchmark_serving --save-result without --save-detailed, --metric-percentiles 50,90,99: e2el, p<N>_, failed
VLLM = {"backend": "vllm", "dataset_name": "sharegpt", "request_rate": "inf", "max_concurrency": 32,
        "duration": 40.0, "completed": 390, "failed": 10, "total_input_tokens": 200_000, "total_output_tokens": 80_000,
        "request_throughput": 9.75, "output_throughput": 2000.0, "total_token_throughput": 7000.0,
        "mean_ttft_ms": 250.0, "median_ttft_ms": 230.0, "std_ttft_ms": 80.0, "p50_ttft_ms": 230.0, "p90_ttft_ms": 380.0,
        "p99_ttft_ms": 620.25, "mean_tpot_ms": 15.0, "median_tpot_ms": 14.5, "p50_tpot_ms": 14.5, "p90_tpot_ms": 19.0,
        "p99_tpot_ms": 25.0, "mean_itl_ms": 14.0, "median_itl_ms": 13.0, "p99_itl_ms": 40.0, "mean_e2el_ms": 4000.0,
        "median_e2el_ms": 3900.0, "p50_e2el_ms": 3900.0, "p90_e2el_ms": 5200.0, "p99_e2el_ms": 6500.0}


def aiperf_summary(folder: Path, nested: bool = False) -> Path:
    """profile_export_aiperf.json (JsonExportData: each metric a JsonMetricResult {unit, avg, p50, ..., p99}),
    at the top level (AIPerf >= 0.3) or under `records` (earlier)."""
    folder.mkdir(parents=True, exist_ok=True)

    def dist(unit: str, avg: float, p50: float, p90: float, p99: float) -> dict:
        return {"unit": unit, "avg": avg, "p50": p50, "p90": p90, "p99": p99, "min": p50 / 2, "max": p99 * 1.2,
                "std": avg / 5}

    metrics = {"time_to_first_token": dist("ms", 180.0, 170.0, 260.0, 401.75),
               "inter_token_latency": dist("ms", 11.0, 10.5, 13.0, 16.25),
               "inter_chunk_latency": dist("ms", 11.5, 10.0, 14.0, 30.0),
               "request_latency": dist("ms", 2600.0, 2500.0, 3300.0, 4100.0),
               "request_throughput": {"unit": "requests/sec", "avg": 12.125},
               "output_token_throughput": {"unit": "tokens/sec", "avg": 2950.5},
               "request_count": {"unit": "requests", "avg": 728},
               "error_request_count": {"unit": "requests", "avg": 3},
               "benchmark_duration": {"unit": "sec", "avg": 60.04},
               "total_isl": {"unit": "tokens", "avg": 745_472}, "total_osl": {"unit": "tokens", "avg": 177_143}}
    head = {"schema_version": "1.0", "aiperf_version": "0.3.0",
            "input_config": {"endpoint": {"model_names": ["zai-org/GLM-4.6"], "urls": ["http://gpu-node:30000"]},
                             "loadgen": {"concurrency": 32}},
            "was_cancelled": False, "start_time": "2026-12-01T10:00:00.000000",
            "end_time": "2026-12-01T10:01:00.040000"}
    path = folder / "profile_export_aiperf.json"
    path.write_text(json.dumps(head | ({"records": metrics} if nested else metrics), indent=2))
    return path


def guidellm_summary(folder: Path) -> Path:
    """benchmarks.json whose benchmark kept no requests: metrics as StatusDistributionSummary (successful: mean,
    median, std_dev, percentiles)."""
    folder.mkdir(parents=True, exist_ok=True)

    def dist(mean: float, median: float, p90: float, p99: float, total: float | None = None) -> dict:
        return {"successful": {"mean": mean, "median": median, "std_dev": mean / 4, "min": median / 2,
                               "max": p99 * 1.1, "count": 300, "total_sum": total,
                               "percentiles": {"p50": median, "p90": p90, "p95": (p90 + p99) / 2, "p99": p99}}}

    metrics = {"request_totals": {"successful": 300, "errored": 4, "incomplete": 1, "total": 305},
               "requests_per_second": dist(5.0, 5.0, 5.5, 6.0), "output_tokens_per_second": dist(1100.0, 1000.0,
                                                                                                   1500.0, 1900.0),
               "time_to_first_token_ms": dist(95.0, 90.0, 140.0, 210.0),
               "inter_token_latency_ms": dist(9.0, 8.75, 11.0, 14.0), "request_latency": dist(2.1, 2.0, 2.6, 3.2),
               "prompt_token_count": dist(512, 512, 512, 512, 153_600),
               "output_token_count": dist(220, 220, 240, 256, 66_000)}
    report = {"metadata": {"guidellm_version": "0.4.0"}, "args": {"target": "http://gpu-node:8000"},
              "benchmarks": [{"type_": "generative_benchmark",
                              "config": {"strategy": {"type_": "constant", "rate": 5.0}},
                              "start_time": 1_765_000_000.0, "end_time": 1_765_000_060.0, "metrics": metrics,
                              "requests": {"successful": [], "errored": [], "incomplete": []}}]}
    path = folder / "benchmarks.json"
    path.write_text(json.dumps(report))
    return path


def capbench(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return subprocess.run([CAPBENCH, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def imported(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stderr
    return [line.split()[0] for line in result.stdout.splitlines() if "imported from" in line]


def summaries(db: Path, ids: list[str]) -> list[dict]:
    with Store(db, read_only=True).connect() as con:
        return [queries.summary(con, i) for i in ids]


def listed(cwd: Path, run_id: str) -> str:
    out = capbench(cwd, "runs")
    assert out.returncode == 0, out.stderr
    return next(line for line in out.stdout.splitlines() if run_id in line)


def test_bench_serving_summaries_import_as_runs_with_the_tools_figures(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(SGLANG) + "\n" + json.dumps(VLLM) + "\n")
    ids = imported(capbench(tmp_path, "import", "bench-serving", str(path), "--deployment", DEPLOYMENT))
    assert len(ids) == 2
    db = tmp_path / "data" / "capbench.duckdb"
    sglang, vllm = summaries(db, ids)
    for s, line in ((sglang, SGLANG), (vllm, VLLM)):
        assert s["summary_only"] == f"summary only: {s['measured']:,} requests, percentiles from the tool"
        assert s["ok"] == line["completed"] and s["throughput_rps"] == line["request_throughput"]
        assert s["output_tps"] == line["output_throughput"] and s["duration_s"] == line["duration"]
        assert s["ttft_p50"] == pytest.approx(line["median_ttft_ms"] / 1e3)
        assert s["ttft_p99"] == pytest.approx(line["p99_ttft_ms"] / 1e3)
        assert s["tpot_p99"] == pytest.approx(line["p99_tpot_ms"] / 1e3)
        assert s["itl_p99"] == pytest.approx(line["p99_itl_ms"] / 1e3)
        assert s["goodput_rps"] is None and s["achieved_rate_rps"] is None  # they need each request
    assert sglang["e2e_p99"] == pytest.approx(SGLANG["p99_e2e_latency_ms"] / 1e3)
    assert sglang["errors"] is None and sglang["measured"] == 480  # SGLang's summary counts successes only
    assert sglang["input_tps"] == SGLANG["input_throughput"] and sglang["ttft_p90"] is None
    assert (vllm["errors"], vllm["measured"]) == (10, 400) and vllm["success_rate"] == pytest.approx(390 / 400)
    assert vllm["ttft_p90"] == pytest.approx(0.38) and vllm["e2e_p99"] == pytest.approx(6.5)

    store = Store(db, read_only=True)
    prov = json.loads(store.run(ids[0])["config"])["import"]
    assert prov["summary_only"] and prov["tool"] == "bench-serving" and len(prov["sha256"]) == 64
    assert prov["requests"] == 480 and any("every request" in x for x in prov["null"])
    row = listed(tmp_path, ids[0])
    assert "imported (bench-serving)" in row and "7.93" in row and "311 ms" in row and " 480 " in row
    assert "9.75" in listed(tmp_path, ids[1]) and "620 ms" in listed(tmp_path, ids[1])
    runs = store.runs().set_index("run_id")
    assert runs.loc[ids[0], "throughput_rps"] == SGLANG["request_throughput"]
    assert runs.loc[ids[0], "ttft_p99_s"] == pytest.approx(SGLANG["p99_ttft_ms"] / 1e3)
    assert (runs.loc[ids[1], "requests"], runs.loc[ids[1], "errors"]) == (400, 10)
    assert pd.isna(runs.loc[ids[0], "errors"])  # SGLang's summary does not count failures: unknown, not 0
    with store.connect() as con:  # the Compare page's table
        table = queries.compare(con, ids)
    assert table.loc["ttft_p99", ids[0]] == pytest.approx(0.3107)
    assert table.loc["throughput_rps", f"{ids[1]} / {ids[0]}"] == pytest.approx(9.75 / 7.931)

    cal = capbench(tmp_path, "calibrate", "--runs", ids[0], "--out", str(tmp_path / "fitted.json"))
    assert cal.returncode == 2 and len(cal.stderr.strip().splitlines()) == 1
    assert "summary-only import: no per-request times" in cal.stderr and not (tmp_path / "fitted.json").exists()

    again = capbench(tmp_path, "import", "bench-serving", str(path), "--deployment", DEPLOYMENT)
    assert again.returncode == 0 and again.stdout.count("already imported") == 2 and not imported(again)
    assert len(Store(db, read_only=True).runs()) == 2


def test_aiperf_summary_alone_imports_as_a_run(tmp_path):
    path = aiperf_summary(tmp_path / "artifacts" / "run1")
    [run_id] = imported(capbench(tmp_path, "import", "aiperf", str(path), "--deployment", DEPLOYMENT))
    db = tmp_path / "data" / "capbench.duckdb"
    [s] = summaries(db, [run_id])
    assert (s["ok"], s["errors"], s["measured"]) == (728, 3, 731)
    assert s["throughput_rps"] == 12.125 and s["output_tps"] == 2950.5 and s["duration_s"] == 60.04
    assert (s["ttft_p50"], s["ttft_p90"], s["ttft_p99"]) == pytest.approx((0.17, 0.26, 0.40175))
    assert s["tpot_p99"] == pytest.approx(0.01625) and s["itl_p99"] == pytest.approx(0.03)
    assert s["e2e_p50"] == pytest.approx(2.5) and s["input_tokens"] == 745_472
    cfg = json.loads(Store(db, read_only=True).run(run_id)["config"])
    assert cfg["import"]["tool_version"] == "0.3.0" and cfg["target"] == "http://gpu-node:30000"
    row = listed(tmp_path, run_id)
    assert "imported (aiperf)" in row and "32 users" in row and "12.12" in row and "402 ms" in row
    cal = capbench(tmp_path, "calibrate", "--runs", run_id, "--out", str(tmp_path / "fitted.json"))
    assert cal.returncode == 2 and "summary-only import" in cal.stderr and len(cal.stderr.strip().splitlines()) == 1
    again = capbench(tmp_path, "import", "aiperf", str(path), "--deployment", DEPLOYMENT)
    assert "already imported" in again.stdout and run_id in again.stdout

    # AIPerf before 0.3 kept the metrics under `records`: the same figures
    old = aiperf_summary(tmp_path / "artifacts" / "old", nested=True)
    [old_id] = imported(capbench(tmp_path, "import", "aiperf", str(old), "--deployment", DEPLOYMENT))
    [o] = summaries(db, [old_id])
    assert (o["ttft_p99"], o["ok"]) == (s["ttft_p99"], 728)


def test_guidellm_benchmark_without_requests_imports_its_metrics(tmp_path):
    path = guidellm_summary(tmp_path / "g")
    [run_id] = imported(capbench(tmp_path, "import", "guidellm", str(path), "--deployment", DEPLOYMENT))
    [s] = summaries(tmp_path / "data" / "capbench.duckdb", [run_id])
    assert (s["ok"], s["errors"]) == (300, 5) and s["throughput_rps"] == 5.0 and s["duration_s"] == 60.0
    assert (s["ttft_p50"], s["ttft_p99"], s["tpot_p90"], s["e2e_p99"]) == pytest.approx((0.09, 0.21, 0.011, 3.2))
    assert s["output_tokens"] == 66_000
    assert "5.00" in listed(tmp_path, run_id) and "210 ms" in listed(tmp_path, run_id)


def test_bad_summaries_are_one_line_exit_2_and_store_nothing(tmp_path):
    first = tmp_path / "ok.jsonl"
    first.write_text(json.dumps(SGLANG) + "\n")
    imported(capbench(tmp_path, "import", "bench-serving", str(first), "--deployment", DEPLOYMENT))
    db = tmp_path / "data" / "capbench.duckdb"
    before = Store(db, read_only=True).runs()[["run_id", "requests"]]

    def write(name: str, doc: dict) -> Path:
        p = tmp_path / "bad" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(doc) + "\n")
        return p

    no_figures = {k: v for k, v in SGLANG.items() if not k.endswith("_ms")}
    aiperf = json.loads(aiperf_summary(tmp_path / "a").read_text())
    cases = {"negative p99": ("bench-serving", write("neg.jsonl", SGLANG | {"p99_ttft_ms": -3.0})),
             "no figures": ("bench-serving", write("none.jsonl", no_figures)),
             "text for a number": ("bench-serving", write("text.jsonl", SGLANG | {"output_throughput": "fast"})),
             "aiperf unit": ("aiperf", write("profile_export_aiperf.json", aiperf | {
                 "time_to_first_token": {"unit": "fortnights", "p99": 1.0}})),
             "aiperf without counts": ("aiperf", write("x/profile_export_aiperf.json", {
                 k: v for k, v in aiperf.items() if k != "request_count"}))}
    beside = aiperf_summary(tmp_path / "both")
    (beside.parent / "profile_export.jsonl").write_text("")
    cases["aiperf with its records beside"] = ("aiperf", beside)
    for name, (tool, file) in cases.items():
        r = capbench(tmp_path, "import", tool, str(file), "--deployment", DEPLOYMENT)
        assert r.returncode == 2, (name, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: "), (name, r.stderr)
    assert "profile_export.jsonl beside it" in capbench(tmp_path, "import", "aiperf", str(beside), "--deployment",
                                                        DEPLOYMENT).stderr
    assert Store(db, read_only=True).runs()[["run_id", "requests"]].equals(before)


def test_the_runs_page_says_summary_only_instead_of_empty_charts(tmp_path, monkeypatch):
    from tests.dashboard.apptest import metric, no_exception, page

    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(SGLANG) + "\n" + json.dumps(VLLM) + "\n")
    sglang, _ = imported(capbench(tmp_path, "import", "bench-serving", str(path), "--deployment", DEPLOYMENT))
    monkeypatch.setenv("CAPBENCH_DB", str(tmp_path / "data" / "capbench.duckdb"))
    at = page("runs")
    at.selectbox(key="run").set_value(sglang).run()
    no_exception(at)
    assert any(i.value.startswith("Summary only: 480 requests, percentiles from the tool") for i in at.info)
    assert metric(at, "TTFT p99 (ms)") == pytest.approx(310.7)
    assert metric(at, "Output tokens/s") == pytest.approx(2030)
    assert not at.get("vega_lite_chart")[1:]  # the percentiles chart only: no empty distribution or time series
    at = page("compare")
    no_exception(at)
    said = [c.value for c in at.caption if "summary only" in c.value]
    assert len(said) == 2 and any("480 requests" in c for c in said) and any("400 requests" in c for c in said)


@pytest.mark.slow  # the report plans the whole question (about a minute on 2 busy cores)
def test_a_summary_only_run_goes_through_the_report(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(SGLANG) + "\n")
    [run_id] = imported(capbench(tmp_path, "import", "bench-serving", str(path), "--deployment", DEPLOYMENT))
    out = tmp_path / "report.md"
    rep = capbench(tmp_path, "report", "--out", str(out), "--format", "md", "--runs", run_id, timeout=600)
    assert rep.returncode == 0, rep.stderr
    measured = out.read_text().split("## Measured results")[1].split("\n## ")[0]
    [row] = [line for line in measured.splitlines() if "imported (bench-serving)" in line]
    assert "| 480 |" in row and "| 2,030 |" in row and "110 ms / 311 ms" in row and "7 ms / 9 ms" in row
    versus = out.read_text().split("## Predicted vs measured")[1].split("\n## ")[0]
    # the tool's output tokens/s and TTFT p50 beside the model's replay at the rate it served
    assert "| 2,030.4 / " in versus and "| 110.2 / " in versus


def test_runs_lists_a_measured_runs_throughput_and_ttft_p99_as_its_summary(tmp_path):
    """The same two columns for runs with their requests: the summary's figures (histogram p99, ok per second)."""
    from tests.rundb import fill

    db = tmp_path / "c.duckdb"
    ids = fill(db)
    out = capbench(tmp_path, "runs", "--db", str(db))
    assert out.returncode == 0, out.stderr
    runs = Store(db, read_only=True).runs().set_index("run_id")
    for run_id, s in zip(ids, summaries(db, ids), strict=True):
        assert runs.loc[run_id, "throughput_rps"] == pytest.approx(s["throughput_rps"])
        assert runs.loc[run_id, "ttft_p99_s"] == pytest.approx(s["ttft_p99"])
        row = next(line for line in out.stdout.splitlines() if run_id in line)
        assert f"{s['throughput_rps']:,.2f}" in row and f"{s['ttft_p99'] * 1000:,.0f} ms" in row
