"""`capbench import`: each tool's export, built here from its documented schema with known TTFTs, imported by the
installed capbench from a tmp folder; counts and p50/p90 TTFT and TPOT read back through capbench's own summary
equal numpy's on the file; `capbench runs` shows the provenance; bad files are one line and exit 2; a second
import does nothing; an imported run goes through `capbench calibrate` and the report's summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.store import Store, queries, runinfo, write_imported_runs

CAPBENCH = str(Path(sys.executable).parent / "capbench")
DEPLOYMENT = "glm-4.6@h200x8,kv=fp8_e4m3"
T0 = 1_765_000_000.0  # a wall-clock start, epoch seconds
N = 50


def capbench(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return subprocess.run([CAPBENCH, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def _requests(seed: int, n: int = N) -> list[dict]:
    """n requests: send times 0.1 s apart, TTFT 50-400 ms, 20-200 output tokens, gaps ~20 ms per token."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        n_out = int(rng.integers(20, 200))
        gaps = rng.uniform(0.012, 0.03, n_out - 1)
        out.append({"i": i, "start": T0 + 0.1 * i, "ttft": float(rng.uniform(0.05, 0.4)), "gaps": gaps.tolist(),
                    "n_in": int(rng.integers(100, 3000)), "n_out": n_out})
    return out


def aiperf_export(folder: Path, failed: int = 3, warmup: int = 2) -> tuple[Path, list[dict]]:
    """profile_export.jsonl (AIPerf's per-request records, times in ms) and profile_export_aiperf.json beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    reqs = _requests(1)
    lines = []
    for r in reqs:
        start_ns = int(r["start"] * 1e9)
        latency = r["ttft"] + sum(r["gaps"])
        md = {"session_num": r["i"], "x_request_id": f"req-{r['i']}", "x_correlation_id": f"sess-{r['i']}",
              "conversation_id": f"conv-{r['i']}", "turn_index": 0, "request_start_ns": start_ns,
              "request_ack_ns": start_ns + 1_000_000, "request_end_ns": start_ns + int(latency * 1e9),
              "worker_id": "worker_1", "record_processor_id": "rp_1",
              "benchmark_phase": "warmup" if r["i"] < warmup else "profiling", "was_cancelled": False,
              "cancellation_time_ns": None}
        if warmup <= r["i"] < warmup + failed:
            r["failed"] = True
            lines.append({"metadata": md, "metrics": {"error_isl": {"value": r["n_in"], "unit": "tokens"}},
                          "error": {"code": 500, "type": "ServerError", "message": "internal error"}})
            continue
        ms = 1000.0
        metrics = {"input_sequence_length": {"value": r["n_in"], "unit": "tokens"},
                   "time_to_first_token": {"value": r["ttft"] * ms, "unit": "ms"},
                   "request_latency": {"value": latency * ms, "unit": "ms"},
                   "output_token_count": {"value": r["n_out"], "unit": "tokens"},
                   "output_sequence_length": {"value": r["n_out"], "unit": "tokens"},
                   "inter_chunk_latency": {"value": [g * ms for g in r["gaps"]], "unit": "ms"},
                   "inter_token_latency": {"value": sum(r["gaps"]) / (r["n_out"] - 1) * ms, "unit": "ms"},
                   "output_token_throughput_per_user": {"value": 50.0, "unit": "tokens/sec/user"}}
        lines.append({"metadata": md, "metrics": metrics, "error": None})
    path = folder / "profile_export.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    (folder / "profile_export_aiperf.json").write_text(json.dumps({
        "schema_version": "1.0", "aiperf_version": "0.13.0",
        "input_config": {"endpoint": {"model_names": ["zai-org/GLM-4.6"], "url": "http://gpu-node:30000",
                                      "streaming": True}, "loadgen": {"concurrency": 8}},
        "time_to_first_token": {"unit": "ms", "avg": 200.0, "p50": 190.0}}))
    return path, reqs


def bench_serving_export(folder: Path) -> tuple[Path, list[list[dict]]]:
    """Two runs appended to one --output-file with --output-details: request_rate 4.0, then the default inf."""
    folder.mkdir(parents=True, exist_ok=True)
    runs, text = [], ""
    for k, rate in enumerate(("4.0", "Infinity")):
        reqs = _requests(10 + k)
        reqs[5]["failed"] = True
        ok = [r for r in reqs if not r.get("failed")]
        lists = {"input_lens": [r["n_in"] for r in reqs],
                 "output_lens": [0 if r.get("failed") else r["n_out"] for r in reqs],
                 "ttfts": [0.0 if r.get("failed") else r["ttft"] for r in reqs],
                 "itls": [[] if r.get("failed") else r["gaps"] for r in reqs],
                 "generated_texts": ["" if r.get("failed") else "text" for r in reqs],
                 "errors": ["Traceback: connection reset" if r.get("failed") else "" for r in reqs]}
        head = {"tag": None, "backend": "sglang-oai", "dataset_name": "random", "max_concurrency": 16,
                "server_info": {"version": "0.5.6"}, "duration": 12.5, "completed": len(ok),
                "total_input_tokens": sum(r["n_in"] for r in ok), "request_throughput": len(ok) / 12.5,
                "median_ttft_ms": float(np.median([r["ttft"] for r in ok]) * 1000)}
        line = json.dumps(head | lists)[:-1] + f', "request_rate": {rate}}}'
        text += line + "\n"
        runs.append(reqs)
    path = folder / "sglang_results.jsonl"
    path.write_text(text)
    return path, runs


def guidellm_export(folder: Path) -> tuple[Path, list[dict]]:
    """benchmarks.json with one constant-rate benchmark: 45 successful, 3 errored, 2 incomplete requests."""
    folder.mkdir(parents=True, exist_ok=True)
    reqs = _requests(20)
    groups = {"successful": [], "errored": [], "incomplete": []}
    for r in reqs:
        status = "errored" if r["i"] in (3, 9, 27) else "incomplete" if r["i"] >= N - 2 else "successful"
        r["failed"] = status != "successful"
        first = r["start"] + r["ttft"]
        last = first + sum(r["gaps"])
        timings = {"targeted_start": r["start"] - 0.001, "request_start": r["start"],
                   "first_token_iteration": None if r["failed"] else first,
                   "last_token_iteration": None if r["failed"] else last,
                   "request_end": last + 0.001, "resolve_end": last + 0.002, "token_iterations": r["n_out"]}
        groups[status].append({
            "type_": "generative_request_stats", "request_id": f"g-{r['i']}", "request_args": None,
            "output": "text", "info": {"request_id": f"g-{r['i']}", "status": "completed", "timings": timings,
                                       "error": "HTTP 503" if status == "errored" else None},
            "input_metrics": {"text_tokens": r["n_in"], "total_tokens": r["n_in"]},
            "output_metrics": {"text_tokens": r["n_out"], "total_tokens": None if r["failed"] else r["n_out"]},
            "prompt_tokens": r["n_in"], "output_tokens": None if r["failed"] else r["n_out"],
            "time_to_first_token_ms": None if r["failed"] else r["ttft"] * 1000})
    report = {"metadata": {"version": 1, "guidellm_version": "0.4.0", "python_version": "3.12"},
              "args": {"target": "http://gpu-node:8000", "profile": "constant"},
              "benchmarks": [{"type_": "generative_benchmark", "config": {"strategy": {"type_": "constant",
                                                                                       "rate": 5.0}},
                              "start_time": T0, "end_time": T0 + 12.0, "duration": 12.0, "metrics": {},
                              "requests": groups}]}
    path = folder / "benchmarks.json"
    path.write_text(json.dumps(report))
    return path, reqs


def nearest_rank(values: list[float], q: int) -> float:
    return float(np.percentile(values, q, method="inverted_cdf"))


def read_summary(db: Path, run_id: str) -> dict:
    store = Store(db, read_only=True)
    with store.connect() as con:
        return runinfo.summary(con, run_id)


def imported(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stderr
    return [line.split()[0] for line in result.stdout.splitlines() if "imported from" in line]


def check_figures(s: dict, ok: list[dict], failed: int, warmup: int = 0) -> None:
    assert (s["measured"], s["ok"], s["errors"], s["warmup"]) == (len(ok) + failed, len(ok), failed, warmup)
    ttft = [r["ttft"] for r in ok]
    tpot = [sum(r["gaps"]) / (r["n_out"] - 1) for r in ok]
    for q in (50, 90):
        assert s[f"ttft_p{q}"] == pytest.approx(nearest_rank(ttft, q), rel=0.005)
        assert s[f"tpot_p{q}"] == pytest.approx(nearest_rank(tpot, q), rel=0.005)


def test_aiperf_export_imports_with_its_counts_percentiles_and_provenance(tmp_path):
    path, reqs = aiperf_export(tmp_path / "artifacts" / "run1")
    [run_id] = imported(capbench(tmp_path, "import", "aiperf", str(path), "--deployment", DEPLOYMENT,
                                 "--label", "from-aiperf"))
    db = tmp_path / "data" / "capbench.duckdb"
    ok = [r for r in reqs if r["i"] >= 2 and not r.get("failed")]
    s = read_summary(db, run_id)
    check_figures(s, ok, failed=3, warmup=2)
    assert s["duration_s"] == pytest.approx(max(r["start"] + r["ttft"] + sum(r["gaps"]) for r in reqs[2:])
                                            - reqs[2]["start"], rel=1e-6)
    cfg = json.loads(Store(db, read_only=True).run(run_id)["config"])
    prov = cfg["import"]
    assert (prov["tool"], prov["tool_version"], prov["file"], cfg["deployment"]) == (
        "aiperf", "0.13.0", "profile_export.jsonl", DEPLOYMENT)
    assert len(prov["sha256"]) == 64 and prov["requests"] == N
    listing = capbench(tmp_path, "runs")
    assert listing.returncode == 0, listing.stderr
    row = next(line for line in listing.stdout.splitlines() if run_id in line)
    assert "imported (aiperf)" in row and "8 users" in row and "H200" in row and "from-aiperf" in row

    again = capbench(tmp_path, "import", "aiperf", str(path), "--deployment", DEPLOYMENT)
    assert again.returncode == 0 and "already imported" in again.stdout and run_id in again.stdout
    assert len(Store(db, read_only=True).runs()) == 1


def test_bench_serving_runs_import_one_per_line_with_derived_e2e(tmp_path):
    path, runs = bench_serving_export(tmp_path / "out")
    ids = imported(capbench(tmp_path, "import", "bench-serving", str(path), "--deployment", DEPLOYMENT))
    assert len(ids) == 2
    db = tmp_path / "data" / "capbench.duckdb"
    for run_id, reqs in zip(ids, runs, strict=True):
        ok = [r for r in reqs if not r.get("failed")]
        s = read_summary(db, run_id)
        check_figures(s, ok, failed=1)
        assert s["e2e_p50"] == pytest.approx(nearest_rank([r["ttft"] + sum(r["gaps"]) for r in ok], 50), rel=0.005)
        prov = json.loads(Store(db, read_only=True).run(run_id)["config"])["import"]
        assert "sent_at" in prov["null"] and any(d.startswith("e2e_s") for d in prov["derived"])
    cal = capbench(tmp_path, "calibrate", "--runs", ids[0], "--out", str(tmp_path / "fitted.json"))
    assert cal.returncode == 2 and "has no send times" in cal.stderr and len(cal.stderr.splitlines()) == 1
    with Store(db, read_only=True).connect() as con:  # the Compare page's table
        table = queries.compare(con, ids)
    assert table.loc["ttft_p50", ids[0]] == pytest.approx(read_summary(db, ids[0])["ttft_p50"])
    configs = [runinfo.run_config(Store(db, read_only=True).run(i)["config"]) for i in ids]
    assert [c["rate"] for c in configs] == [4.0, None] and configs[1]["users"] == 16
    # a line appended later imports alone; the two before are already there
    with path.open("a") as f:
        f.write(path.read_text().splitlines()[0].replace('"duration": 12.5', '"duration": 13.5') + "\n")
    out = capbench(tmp_path, "import", "bench-serving", str(path), "--deployment", DEPLOYMENT)
    assert out.returncode == 0 and out.stdout.count("already imported") == 2 and len(imported(out)) == 1


def test_guidellm_report_imports_and_calibrates(tmp_path):
    path, reqs = guidellm_export(tmp_path / "g")
    [run_id] = imported(capbench(tmp_path, "import", "guidellm", str(path), "--deployment", DEPLOYMENT))
    db = tmp_path / "data" / "capbench.duckdb"
    ok = [r for r in reqs if not r.get("failed")]
    s = read_summary(db, run_id)
    check_figures(s, ok, failed=5)
    assert s["errors_by_kind"] == {"error": 3, "cancelled": 2}
    assert runinfo.run_config(Store(db, read_only=True).run(run_id)["config"])["profile"] == "guidellm constant"
    cal = capbench(tmp_path, "calibrate", "--runs", run_id, "--out", str(tmp_path / "fitted.json"), timeout=600)
    assert cal.returncode == 0, cal.stderr
    fitted = json.loads((tmp_path / "fitted.json").read_text())
    assert run_id in json.dumps(fitted)


@pytest.mark.slow  # the report plans the whole question (about a minute on 2 busy cores)
def test_an_imported_run_goes_through_the_report(tmp_path):
    path, runs = bench_serving_export(tmp_path / "out")
    ids = imported(capbench(tmp_path, "import", "bench-serving", str(path), "--deployment", DEPLOYMENT))
    out = tmp_path / "report.md"
    rep = capbench(tmp_path, "report", "--out", str(out), "--format", "md", "--runs", ",".join(ids), timeout=600)
    assert rep.returncode == 0, rep.stderr
    measured = out.read_text().split("## Measured results")[1].split("\n## ")[0]
    rows = [line for line in measured.splitlines() if "imported (bench-serving)" in line]
    assert len(rows) == 2 and all("GLM-4.6, 8x H200 tp8, FP8 KV" in row for row in rows)
    ttft_p50_ms = nearest_rank([r["ttft"] for r in runs[0] if not r.get("failed")], 50) * 1000
    assert f"{ttft_p50_ms:.0f} ms /" in rows[0]


def _bad_files(tmp: Path) -> dict[str, tuple[str, Path]]:
    good, _ = aiperf_export(tmp / "good")
    lines = good.read_text().splitlines()
    cases = {}

    def write(name: str, text: str) -> Path:
        p = tmp / name
        p.write_text(text)
        return p

    cases["not json"] = ("aiperf", write("notjson.jsonl", "this is not json\nnor this\n"))
    g, _ = guidellm_export(tmp / "g")
    cases["wrong tool"] = ("aiperf", g)
    rec = json.loads(lines[5])
    del rec["metadata"]["request_start_ns"]
    cases["missing field"] = ("aiperf", write("missing.jsonl", "\n".join([lines[0], json.dumps(rec)]) + "\n"))
    cases["NaN"] = ("aiperf", write("nan.jsonl", lines[0] + "\n" + lines[6].replace(
        '"time_to_first_token": {"value": ', '"time_to_first_token": {"value": NaN, "x": ') + "\n"))
    rec = json.loads(lines[7])
    rec["metrics"]["time_to_first_token"]["value"] = -12.0
    cases["negative time"] = ("aiperf", write("neg.jsonl", json.dumps(rec) + "\n"))
    big = tmp / "big.jsonl"
    with big.open("wb") as f:
        f.truncate(2 << 30)  # 2 GiB, sparse
    cases["2 GB file"] = ("aiperf", big)
    summary_only = json.loads(bench_serving_export(tmp / "bs")[0].read_text().splitlines()[0].replace(
        "Infinity", "1.0"))
    for key in ("ttfts", "itls"):  # some per-request lists, not all (a summary alone imports: test_import_summaries)
        summary_only.pop(key)
    cases["lists missing"] = ("bench-serving", write("summary.jsonl", json.dumps(summary_only) + "\n"))
    report = json.loads(g.read_text())
    report["benchmarks"][0]["requests"]["successful"][4]["info"]["timings"]["request_end"] = T0 - 60
    cases["guidellm end before start"] = ("guidellm", write("g.json", json.dumps(report)))
    return cases


def test_bad_files_are_one_line_exit_2_and_leave_the_store_as_it_was(tmp_path):
    path, _ = guidellm_export(tmp_path / "first")
    assert imported(capbench(tmp_path, "import", "guidellm", str(path), "--deployment", DEPLOYMENT))
    db = tmp_path / "data" / "capbench.duckdb"
    before = Store(db, read_only=True).runs()[["run_id", "requests"]]
    cases = _bad_files(tmp_path / "bad")
    cases["unknown model"] = ("guidellm", path)
    for name, (tool, file) in cases.items():
        dep = "no-such-model@h200x8" if name == "unknown model" else DEPLOYMENT
        r = capbench(tmp_path, "import", tool, str(file), "--deployment", dep)
        assert r.returncode == 2, (name, r.stdout, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: "), (name, r.stderr)
        assert "Traceback" not in r.stderr
    assert "capbench import guidellm" in capbench(tmp_path, "import", "aiperf", str(cases["wrong tool"][1]),
                                                  "--deployment", DEPLOYMENT).stderr
    assert Store(db, read_only=True).runs()[["run_id", "requests"]].equals(before)


def test_a_write_that_fails_midway_stores_none_of_the_file(tmp_path):
    """Two runs in one call; the second's rows do not fit the requests table: the first is not stored either."""
    db = tmp_path / "c.duckdb"
    store = Store(db)

    def run(digest: str, prompt: list) -> dict:
        return {"label": "", "target": "", "profile": "p", "started_at": T0, "finished_at": T0 + 1,
                "config": {"import": {"record_sha256": digest}},
                "requests": {"request_id": ["a", "b"], "sent_at": [T0, T0 + 0.5], "ttft_s": [0.1, 0.2],
                             "prompt_tokens": prompt}}

    with pytest.raises(Exception):  # noqa: B017 (DuckDB's or Arrow's conversion error, whichever comes first)
        write_imported_runs(store, [run("a" * 64, [10, 20]), run("b" * 64, ["ten", "twenty"])])
    assert store.runs().empty
    [(run_id, stored)] = write_imported_runs(store, [run("a" * 64, [10, 20])])
    assert stored and Store(db).runs()["requests"].tolist() == [2]
