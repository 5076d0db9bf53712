"""`capbench run` against a hostile server (tests/loadgen/hostile_server.py, its own process): whatever the server
sends, every request sent has exactly one stored row, with its error class, and the API key never lands."""

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import duckdb
import pytest

from bench.errors import BadInput
from bench.runner import RunOptions, run
from bench.store import Store, export_run
from tests.loadgen.conftest import ROOT

CAPBENCH = str(Path(sys.executable).parent / "capbench")
SHAPE_FAULTS = ["delta_string", "usage_string", "choices_dict", "choice_string", "json_list"]
MISFIT_FAULTS = ["details_string", "int32_overflow", "huge_int", "negative_tokens"]


class Hostile:
    def __init__(self, *faults: str, models: str | None = None):
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.loadgen.hostile_server", "--faults",
                                      ",".join(faults), *(["--models", models] if models else [])],
                                     stdout=subprocess.PIPE, cwd=ROOT, text=True)
        self.url = f"http://127.0.0.1:{json.loads(self.proc.stdout.readline())['port']}"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def hostile():
    servers = []
    yield lambda *faults, **kw: servers.append(Hostile(*faults, **kw)) or servers[-1]
    for s in servers:
        s.kill()


def _rows(db, run_id: str) -> list[dict]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        cur = con.execute("SELECT * FROM requests WHERE run_id = ? ORDER BY request_id", [run_id])
        return [dict(zip([d[0] for d in cur.description], r, strict=True)) for r in cur.fetchall()]
    finally:
        con.close()


def _opts(url: str, db, **kw) -> RunOptions:
    base = {"target": url, "profile": "constant", "overrides": {"rate": 20, "duration": 1}, "workload": "synthetic",
            "db": db, "live": False, "timeout_s": 5.0, "drain_s": 5.0, "quiet": True}
    return RunOptions(**{**base, **kw})


@pytest.mark.parametrize("stream", [True, False])
def test_wrong_shapes_and_misfit_counts_each_get_their_one_row(hostile, tmp_db, stream):
    faults = SHAPE_FAULTS + MISFIT_FAULTS + ["ok"]  # served in turn: 20 requests, each fault twice (ok: twice)
    srv = hostile(*faults)
    [res] = run(_opts(srv.url, tmp_db, stream=stream, overrides={"rate": 20, "duration": 1}))
    stored = _rows(tmp_db, res.run_id)
    assert res.status == "completed"
    assert res.sent == res.rows_written == len(stored) == res.locust_requests == 20
    kinds = Counter(r["error_kind"] for r in stored)
    assert kinds["malformed_response"] == 2 * len(SHAPE_FAULTS), kinds
    assert "client_error" not in kinds and "malformed_stream" not in kinds
    ok = [r for r in stored if r["status"] == "ok"]
    notes = [r for r in ok if r["note"]]
    # the counts that fit no column: the request is kept, the count is NULL and the row says why
    assert len(notes) == 2 * 3  # int32_overflow, huge_int, negative_tokens (details_string only loses details)
    assert all(r["prompt_tokens"] is None and "stored as NULL" in r["note"] for r in notes)
    assert any("does not fit int32" in r["note"] for r in notes)  # 2**31 + 5: caught by the store
    assert any("is not a token count" in r["note"] for r in notes)  # 1e30, -4: caught by the client
    assert all(r["e2e_s"] is not None for r in stored)  # the timings stay with every row
    assert res.summary["sent"] == res.summary["stored"] == 20


def test_the_key_an_error_echoes_is_never_stored_or_exported(hostile, tmp_db, tmp_path, monkeypatch):
    key = "sk-live-Zq81hostileKEY"
    monkeypatch.setenv("HOSTILE_KEY", key)
    srv = hostile("echo_key", "echo_key_stream")
    [res] = run(_opts(srv.url, tmp_db, api_key_env="HOSTILE_KEY", overrides={"rate": 10, "duration": 1}))
    stored = _rows(tmp_db, res.run_id)
    assert res.sent == len(stored) == 10
    assert Counter(r["error_kind"] for r in stored) == {"http_401": 5, "stream_error": 5}
    assert all("***" in r["error"] for r in stored), {r["error"] for r in stored}
    assert key not in json.dumps(stored, default=str)
    for path in export_run(Store(tmp_db, read_only=True), res.run_id, "csv", tmp_path / "out"):
        assert key not in Path(path).read_text()


def test_an_oversized_event_fails_its_request_fast(hostile, tmp_db):
    srv = hostile("big_event", "ok")
    t = time.monotonic()
    [res] = run(_opts(srv.url, tmp_db, overrides={"rate": 4, "duration": 1}))
    stored = _rows(tmp_db, res.run_id)
    # the server holds the rest of the oversized event's stream 0.5 s: the request ends at the limit, not at its
    # 5 s timeout (the run's whole length bounds a slow machine's start, not the claim)
    assert res.sent == len(stored) == 4 and time.monotonic() - t < 60
    big = [r for r in stored if r["error_kind"] == "event_too_large"]
    assert len(big) == 2 and all(r["e2e_s"] < 2.0 for r in big)
    assert sum(r["status"] == "ok" for r in stored) == 2


def _cli(*args: str, cwd: Path, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([CAPBENCH, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_relative_paths_from_another_directory_reach_recorder_and_workers(hostile, tmp_path):
    """Run from a directory that is not the checkout: the default-style relative --db and a relative ShareGPT
    --workload are the files in that directory, for the recorder and for a local worker process."""
    srv = hostile("ok")
    (tmp_path / "convs.json").write_text(json.dumps(
        [{"conversations": [{"from": "human", "value": f"question {i} " * 20},
                            {"from": "gpt", "value": "answer " * 30}]} for i in range(5)]))
    proc = _cli("run", "--target", srv.url, "--profile", "constant", "--rate", "10", "--duration", "1", "--db",
                "data/capbench.duckdb", "--workload", "convs.json", "--workers", "1", "--no-live", "--model", "m",
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "10 sent, 10 stored" in proc.stdout
    db = tmp_path / "data" / "capbench.duckdb"
    con = duckdb.connect(str(db), read_only=True)
    n, ok = con.execute("SELECT count(*), count(*) FILTER (WHERE status = 'ok') FROM requests").fetchone()
    con.close()
    assert n == ok == 10
    assert not (ROOT / "convs.json").exists()


def test_exit_status_says_when_nothing_succeeded(hostile, tmp_path):
    srv = hostile("delta_string")
    proc = _cli("run", "--target", srv.url, "--profile", "constant", "--rate", "5", "--duration", "1",
                "--db", "x.duckdb", "--no-live", "--model", "m", cwd=tmp_path)
    assert proc.returncode == 1 and "none of the 5 requests sent succeeded" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "5 sent, 5 stored" in proc.stdout


def test_a_reader_holding_the_db_delays_the_run_but_does_not_fail_it(hostile, tmp_path):
    """Another process holds the file read-only from the run's start for 30 s (past the store's 10 s lock
    timeout): the writer says it waits, every row lands, the run is completed."""
    srv = hostile("ok")
    db = tmp_path / "held.duckdb"
    Store(db)  # the file exists for the reader
    # the holder starts first (its imports take seconds on a loaded machine) and takes the file when told
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time\nsys.stdin.readline()\n"
                               "while True:\n  try:\n"  # the recorder may be writing this moment: try again
                               f"    con = duckdb.connect({str(db)!r}, read_only=True)\n    break\n"
                               "  except duckdb.IOException:\n    time.sleep(0.05)\n"
                               "print('held', flush=True)\ntime.sleep(30)"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    run_proc = subprocess.Popen([CAPBENCH, "run", "--target", srv.url, "--profile", "constant", "--rate", "10",
                                 "--duration", "2", "--db", str(db), "--no-live", "--model", "m"], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the run's row is in; the holder takes the file for 30 s, longer than a slow machine takes to send the run
    # and write its rows, so the writer meets the lock whenever it comes
    assert "capbench run" in run_proc.stderr.readline()
    holder.stdin.write("go\n")
    holder.stdin.flush()
    assert holder.stdout.readline().strip() == "held"
    out, err = run_proc.communicate(timeout=120)
    holder.wait(timeout=30)
    assert run_proc.returncode == 0, err[-3000:]
    assert "waiting for another process to release" in err and "Traceback" not in err
    con = duckdb.connect(str(db), read_only=True)
    status, n = con.execute("SELECT r.status, count(q.run_id) FROM runs r LEFT JOIN requests q USING (run_id) "
                            "GROUP BY r.status").fetchone()
    con.close()
    assert status == "completed" and n == 20


def test_the_drain_limit_is_enforced_and_what_it_cuts_off_is_cancelled(tmp_db):
    from tests.loadgen.conftest import StubServer

    srv = StubServer("--faults", "stall=1.0")  # headers and one token, then silence
    try:
        t = time.monotonic()
        [res] = run(_opts(srv.url, tmp_db, timeout_s=600.0, drain_s=1.0, overrides={"rate": 5, "duration": 1}))
        took = time.monotonic() - t
    finally:
        srv.kill()
    stored = _rows(tmp_db, res.run_id)
    assert took < 60 and res.sent == len(stored) == 5  # the requests' timeout is 600 s; the run's start is seconds
    assert all(r["error_kind"] == "cancelled" for r in stored)


@pytest.mark.parametrize("models", ['{"data": "abc"}', '{"data": [{"id": 5}]}', '[]', "not json", '{"data": []}'])
def test_a_models_list_of_the_wrong_shape_is_bad_input_before_the_run(hostile, tmp_db, models):
    srv = hostile("ok", models=models)
    with pytest.raises(BadInput, match="cannot read the model name"):
        run(_opts(srv.url, tmp_db))
    assert not tmp_db.exists()
