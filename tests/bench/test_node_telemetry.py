"""`capbench run --gpu-metrics URL` (the installed command, from a tmp folder) against the stub SSE server, with a
fake DCGM exporter of 2 GPUs whose values change each scrape, and a garbage endpoint beside it: every request is
stored, the GPU rows land per node and GPU with the values served, the summary shows them; credentials refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb

from bench.benchmarks import sse_server  # noqa: F401  (the stub is started as `python -m` of it)
from tests.bench.store.dcgm_exporter import TOTAL_MIB, FakeDcgm

CAPBENCH = str(Path(sys.executable).parent / "capbench")
ROOT = Path(__file__).resolve().parents[2]


def _stub():
    import json

    proc = subprocess.Popen([sys.executable, "-m", "bench.benchmarks.sse_server"], stdout=subprocess.PIPE, cwd=ROOT,
                            text=True)
    return proc, f"http://127.0.0.1:{json.loads(proc.stdout.readline())['port']}"


def test_dcgm_rows_land_per_gpu_and_a_garbage_endpoint_does_not_break_the_run(tmp_path):
    exporter, garbage = FakeDcgm(), FakeDcgm("garbage")
    proc, url = _stub()
    db = tmp_path / "r.duckdb"
    try:
        out = subprocess.run([CAPBENCH, "run", "--target", url, "--profile", "constant", "--rate", "20", "--duration",
                              "4", "--input-len", "32", "--output-len", "8", "--db", str(db), "--no-live",
                              "--gpu-metrics", exporter.url, "--gpu-metrics", garbage.url,
                              "--gpu-metrics-interval", "0.5"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300, env={**os.environ, "COLUMNS": "200", "CAPBENCH_GPU_TELEMETRY": "off"})
    finally:
        exporter.close()
        garbage.close()
        proc.kill()
        proc.wait()
    assert out.returncode == 0, out.stderr[-3000:]
    con = duckdb.connect(str(db), read_only=True)
    run_id, n = con.execute("SELECT r.run_id, (SELECT count(*) FROM requests q WHERE q.run_id = r.run_id) "
                            "FROM runs r").fetchone()
    assert n == 80  # every request stored: the garbage endpoint took nothing from the load test
    rows = con.execute("SELECT node, gpu, name, gpu_util_pct, mem_used_mib, mem_total_mib, power_w, sm_clock_mhz "
                       "FROM gpu_samples WHERE run_id = ?", [run_id]).fetchall()
    times = [t for (t,) in con.execute("SELECT t FROM gpu_samples WHERE run_id = ? AND gpu = 0 ORDER BY t",
                                       [run_id]).fetchall()]
    first_send = con.execute("SELECT min(sent_at) FROM requests WHERE run_id = ?", [run_id]).fetchone()[0]
    prof = con.execute("SELECT count(*) FROM server_samples WHERE run_id = ? AND metric LIKE 'DCGM_FI_PROF_%'",
                       [run_id]).fetchone()[0]
    config = con.execute("SELECT config->>'$.gpu_metrics' FROM runs").fetchone()[0]
    con.close()
    assert {(r[0], r[1], r[2]) for r in rows} == {("gpu-node-1", 0, "NVIDIA H200"), ("gpu-node-1", 1, "NVIDIA H200")}
    # the runner waits for the recorder's samplers: the scrapes cover the load from its first request (on a loaded
    # host the recorder's start took seconds, and a 4 s run once had 3 scrapes, all in its last second)
    assert times[0] <= first_send, (times[0], first_send)
    # a 4 s run scraped every 0.5 s; the gaps stay near the interval asked for (a scrape takes its own time, a
    # loaded host adds some)
    assert len(times) >= 6 and len(rows) == 2 * len(times), (len(rows), len(times))
    assert (times[-1] - times[0]) / (len(times) - 1) < 1.5, times
    for node, gpu, _, util, used, total, power, sm in rows:
        assert any(util == s[gpu]["DCGM_FI_DEV_GPU_UTIL"] and used == s[gpu]["DCGM_FI_DEV_FB_USED"]
                   and power == s[gpu]["DCGM_FI_DEV_POWER_USAGE"] and sm == s[gpu]["DCGM_FI_DEV_SM_CLOCK"]
                   for s in exporter.served), (node, gpu, util, used)
        assert abs(total - TOTAL_MIB) < 1e-6
    assert len({r[3] for r in rows if r[1] == 0}) >= 3  # the values moved, scrape by scrape
    assert prof >= 2 * 3 * len(times)
    assert exporter.url in config and garbage.url in config
    assert "GPUs during the run" in out.stdout and "gpu-node-1" in out.stdout
    assert out.stderr.count("GPU node telemetry") == 1, out.stderr  # the garbage one, said once


def test_credentials_in_a_gpu_metrics_url_are_refused_before_anything_is_stored(tmp_path):
    out = subprocess.run([CAPBENCH, "run", "--target", "http://127.0.0.1:9", "--model", "m", "--db",
                          str(tmp_path / "r.duckdb"), "--no-live", "--gpu-metrics",
                          "http://admin:s3cret-pass@node1:9400/metrics"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "--gpu-metrics" in out.stderr and "s3cret" not in out.stderr + out.stdout
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "r.duckdb").exists()
