"""What the dashboard and report read about a run: its deployment from what `capbench run` stores, and the
simulator-comparable throughput window."""

from __future__ import annotations

import pytest

from bench.store import BatchedWriter, Store, runinfo


def test_run_config_from_a_twin_run_and_a_served_model_name():
    twin = {"model": "moonshotai/Kimi-K2-Thinking", "twin": "twin:glm-4.6@h100-sxmx16,kv=fp8_e4m3,scale=4",
            "profile": {"name": "poisson", "params": {"rate": 3.0}}, "workload": {"name": "chat"}}
    c = runinfo.run_config(twin)
    assert (c["model"], c["gpu"], c["tp"], c["kv_dtype"], c["weights"], c["rate"], c["time_scale"], c["workload"]) \
        == ("glm-4.6", "h100-sxm", 16, "fp8_e4m3", "native", 3.0, 4.0, "chat")
    assert c["twin"] is True
    real = runinfo.run_config('{"model": "MOONSHOTAI/Kimi-K2-Thinking", "target": "http://10.0.0.1:30000"}')
    assert (real["model"], real["gpu"], real["tp"], real["twin"]) == ("kimi-k2-thinking", None, None, False)
    assert runinfo.run_config("not json")["model"] is None


def test_run_deployment_fills_tp_and_gpu_from_samples(tmp_db):
    store = Store(tmp_db)
    run = store.start_run(config={"model": "zai-org/GLM-4.6", "target": "http://127.0.0.1:30000"})
    t0 = store.run(run)["started_at"]
    with BatchedWriter(store, run) as w:
        w.add_server_sample({"t": t0, "metric": "server_info:tp_size", "labels": "", "value": 8.0})
        w.add_gpu_sample({"t": t0, "gpu": 0, "name": "NVIDIA H100 80GB HBM3"})
    store.finish_run(run)
    with Store(tmp_db, read_only=True).connect() as con:
        d = runinfo.run_deployment(con, run)
    assert (d["model"], d["gpu"], d["tp"], d["kv_dtype"]) == ("glm-4.6", "h100-sxm", 8, "bf16")


def test_window_output_tps_counts_tokens_inside_the_arrival_window(tmp_db):
    store = Store(tmp_db)
    run = store.start_run()
    t0 = store.run(run)["started_at"]
    # arrivals at t0 .. t0+10: the window is [t0+2, t0+10] (the first 20 % warms up)
    rows = [(0.0, 1.0, 3.0, 100), (5.0, 6.0, 7.0, 50), (10.0, 11.0, 15.0, 40)]
    with BatchedWriter(store, run) as w:
        for i, (due, first, done, toks) in enumerate(rows):
            w.add_request({"request_id": str(i), "scheduled_at": t0 + due, "sent_at": t0 + due,
                           "first_token_at": t0 + first, "finished_at": t0 + done, "completion_tokens": toks,
                           "status": "ok"})
    store.finish_run(run)
    with Store(tmp_db, read_only=True).connect() as con:
        tps = runinfo.window_output_tps(con, run)
    # 100 tokens over [1, 3]: half inside [2, 10]; 50 over [6, 7]: all; 40 over [11, 15]: none
    assert tps == pytest.approx((50 + 50) / 8)


def test_capbench_runs_shows_each_runs_identity(tmp_path):
    """`capbench runs` names what each run measured (model, GPUs, parallelism, KV, experts, checksum, load,
    workload, twin or host), from the one identity every page and report shows."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    from bench.store import identity
    from tests.rundb import fill

    db = tmp_path / "capbench.duckdb"
    ids = fill(db)
    store = Store(db)
    twin = store.start_run(label="demo chat", config={
        "twin": "twin:glm-4.6@h200x8,kv=fp8_e4m3,weights=int4-g32,time_scale=4",
        "profile": {"name": "poisson", "params": {"rate": 8.0}}, "workload": {"name": "chat"}})
    store.finish_run(twin)
    out = subprocess.run([str(Path(sys.executable).parent / "capbench"), "runs", "--db", str(db)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = {r: next(line for line in out.stdout.splitlines() if r in line) for r in [*ids, twin]}
    assert all(c in out.stdout for c in identity.IDENTITY_COLUMNS)
    for word in ("GLM-4.6", "8x H200", "tp8", "FP8", "INT4-G32 (converted)", "poisson 2 req/s", "chat",
                 "twin (modelled)"):
        assert word in lines[twin], word
    bf16 = lines[ids[0]]  # tests/rundb.py's first run: Kimi K2 Thinking, BF16 KV, no checksum, 4 req/s
    for word in ("Kimi K2 Thinking", "BF16", "INT4-G32 (as shipped)", "off", "poisson 4 req/s",
                 f"measured on {socket.gethostname()}"):
        assert word in bf16, word
