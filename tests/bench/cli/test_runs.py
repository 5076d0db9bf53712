"""`capbench runs` and `capbench export` as a user runs them, on a DB a test made through the store."""

import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq

from bench.store import BatchedWriter, Store


def capbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})


def _db(path):
    store = Store(path)
    run_id = store.start_run(label="kimi fp8-kv", target="http://127.0.0.1:30000", profile="poisson-4")
    with BatchedWriter(store, run_id) as w:
        w.add_requests({"request_id": [f"r{i}" for i in range(12)], "sent_at": np.arange(12.0),
                        "first_token_at": np.arange(12.0) + 0.2, "finished_at": np.arange(12.0) + 1.0,
                        "itl_s": [[0.01, 0.02]] * 12, "status": ["ok"] * 11 + ["error"]})
        w.add_gpu_sample({"t": 1.0, "gpu": 0, "name": "NVIDIA H200", "power_w": 650.0})
    store.finish_run(run_id)
    return run_id


def test_runs_on_an_empty_db_says_so(tmp_db):
    Store(tmp_db)
    out = capbench("runs", "--db", str(tmp_db))
    assert out.returncode == 0 and "no runs yet" in out.stdout


def test_runs_lists_the_run(tmp_db):
    run_id = _db(tmp_db)
    out = capbench("runs", "--db", str(tmp_db))
    assert out.returncode == 0, out.stderr
    assert run_id in out.stdout and "kimi fp8-kv" in out.stdout and "completed" in out.stdout
    assert "12" in out.stdout


def test_export_parquet_and_csv(tmp_db, tmp_path):
    run_id = _db(tmp_db)
    out = capbench("export", "--run", run_id, "--format", "parquet", "--out", str(tmp_path / "pq"), "--db", str(tmp_db))
    assert out.returncode == 0, out.stderr
    assert pq.read_table(tmp_path / "pq" / "requests.parquet").num_rows == 12
    assert pq.read_table(tmp_path / "pq" / "gpu_samples.parquet")["power_w"].to_pylist() == [650.0]
    out = capbench("export", "--run", run_id, "--format", "csv", "--out", str(tmp_path / "csv"), "--db", str(tmp_db))
    assert out.returncode == 0, out.stderr
    assert len((tmp_path / "csv" / "requests.csv").read_text().splitlines()) == 13


def test_bad_input_is_one_line_and_exit_2(tmp_db, tmp_path):
    _db(tmp_db)
    for args, words in [
        (("runs", "--db", str(tmp_path / "missing.duckdb")), "no results database"),
        (("export", "--run", "nope", "--out", str(tmp_path / "x"), "--db", str(tmp_db)), "unknown run id"),
        (("export", "--run", "nope", "--format", "xlsx", "--out", str(tmp_path / "x"), "--db", str(tmp_db)),
         "format"),
    ]:
        out = capbench(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert words in out.stderr and "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "missing.duckdb").exists()
