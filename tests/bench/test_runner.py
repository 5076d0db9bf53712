"""`capbench run` end to end against the stub SSE server (its own process): the store gets every request, Locust
and DuckDB agree, failures are accounted for, Ctrl-C/SIGTERM aborts cleanly. Twin checks: test_runner_twin.py."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import psutil
import pytest

from bench import local_workers, runner
from bench.errors import BadInput
from bench.model import parse_slo
from bench.runner import RunOptions, run
from tests.loadgen.conftest import ROOT, StubServer

CAPBENCH = str(Path(sys.executable).parent / "capbench")


@pytest.fixture
def stub_server():
    servers = []
    yield lambda *args: servers.append(StubServer(*args)) or servers[-1]
    for s in servers:
        s.kill()


def rows(db, run_id: str, where: str = "true") -> list[dict]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        cur = con.execute(f"SELECT * FROM requests WHERE run_id = ? AND {where}", [run_id])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    finally:
        con.close()


def run_row(db, run_id: str) -> dict:
    con = duckdb.connect(str(db), read_only=True)
    try:
        cur = con.execute("SELECT * FROM runs WHERE run_id = ?", [run_id])
        return dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))
    finally:
        con.close()


def opts(url: str, db, **kw) -> RunOptions:
    base = {"target": url, "profile": "poisson", "overrides": {"rate": 30, "duration": 2}, "workload": "synthetic",
            "db": db, "live": False, "timeout_s": 5.0, "drain_s": 5.0}
    base.update(kw)
    return RunOptions(**base)


@pytest.mark.timing  # its send rate to 25 % over 2 s: beside the other tests a stall made it 40 req/s, not 30 (CI)
def test_open_loop_run_fills_the_store_and_matches_locust(stub_server, tmp_db, monkeypatch):
    srv = stub_server("--token-delay", "0.002")
    monkeypatch.setenv("STUB_KEY", "never-stored-key")
    [res] = run(opts(srv.url, tmp_db, warmup_s=0.5, slo=parse_slo("ttft=1s,tpot=50ms"), label="t",
                     api_key_env="STUB_KEY"))
    assert res.status == "completed"
    stored = rows(tmp_db, res.run_id)
    assert len(stored) == res.locust_requests == res.records == res.rows_written == 30 * 2 + 15
    assert res.locust_failures == 0, {r["error"] for r in stored}
    assert sum(r["phase"] == "warmup" for r in stored) == 15
    assert len({r["request_id"] for r in stored}) == len(stored)
    assert all(r["tokens_from"] == "usage" and r["completion_tokens"] >= 1 for r in stored)
    s = res.summary
    # two seconds only, on a shared machine: the strict rate check is the minute-long twin test
    assert s["measured"] == 60 and s["achieved_rate_rps"] == pytest.approx(30, rel=0.25)
    assert s["slo_ttft_s"] == 1.0 and s["slo_tpot_s"] == 0.05 and s["goodput_rps"] > 0
    stored_run = run_row(tmp_db, res.run_id)
    assert stored_run["status"] == "completed" and stored_run["target"] == srv.url
    config = json.loads(stored_run["config"])
    assert config["model"] == "stub-model"  # from /v1/models
    assert config["api_key_env"] == "STUB_KEY"
    assert "never-stored-key" not in json.dumps(config) and "never-stored-key" not in json.dumps(stored, default=str)


def test_closed_loop_drains_instead_of_killing(stub_server, tmp_db):
    srv = stub_server("--token-delay", "0.01", "--max-tokens", "8")  # about 90 ms a request
    [res] = run(opts(srv.url, tmp_db, profile="users", overrides={"users": 3, "duration": 1.5}))
    stored = rows(tmp_db, res.run_id)
    assert res.status == "completed" and len(stored) == res.locust_requests == res.rows_written
    assert len(stored) >= 15 and all(r["status"] == "ok" for r in stored)  # no request cut off at the end
    assert all(r["dispatch_lag_s"] == 0 for r in stored)


def test_failures_are_all_accounted_for(stub_server, tmp_db):
    srv = stub_server("--faults", "http_500=0.2,malformed=0.1,reset=0.1,close=0.1,stall=0.1",
                      "--token-delay", "0.005", "--max-tokens", "8", "--seed", "3")
    [res] = run(opts(srv.url, tmp_db, overrides={"rate": 40, "duration": 2}, timeout_s=0.8))
    stored = rows(tmp_db, res.run_id)
    assert res.status == "completed"
    assert len(stored) == 80 == res.locust_requests == res.rows_written
    kinds = {r["error_kind"] for r in stored if r["status"] == "error"}
    assert kinds == {"http_500", "malformed_stream", "early_close", "timeout"}
    assert res.locust_failures == sum(r["status"] == "error" for r in stored)
    assert 0.3 < res.summary["errors"] / 80 < 0.8


def test_server_killed_mid_run(stub_server, tmp_db, monkeypatch):
    srv = stub_server("--token-delay", "0.01", "--max-tokens", "10")
    add = runner.Collector.add

    def add_then_kill(self, recs):  # the server dies once ten answers are in
        add(self, recs)
        if self.records >= 10:
            srv.kill()

    monkeypatch.setattr(runner.Collector, "add", add_then_kill)
    [res] = run(opts(srv.url, tmp_db, overrides={"rate": 20, "duration": 2}))
    stored = rows(tmp_db, res.run_id)
    assert res.status == "completed" and len(stored) == 40 == res.locust_requests
    errors = [r for r in stored if r["status"] == "error"]
    assert errors and {r["error_kind"] for r in errors} <= {"connect", "early_close"}
    assert any(r["status"] == "ok" for r in stored)


def test_local_workers_share_the_schedule(stub_server, tmp_db):
    srv = stub_server()
    [res] = run(opts(srv.url, tmp_db, overrides={"rate": 20, "duration": 2}, workers=2))
    stored = rows(tmp_db, res.run_id)
    assert res.status == "completed" and len(stored) == 40 == res.records
    assert sorted(int(r["request_id"]) for r in stored) == list(range(40))
    assert all(r["status"] == "ok" for r in stored)


def test_sweep_runs_one_stage_per_rate_until_saturated(stub_server, tmp_db, tmp_path):
    srv = stub_server("--token-delay", "0.05", "--max-tokens", "4")  # one user: about 4 req/s
    prof = tmp_path / "sweep.yaml"
    prof.write_text("type: sweep\nstage_duration: 1.5\nfactors: [400]\n")
    results = run(opts(srv.url, tmp_db, profile=str(prof), overrides={}, workload="synthetic", max_inflight=64))
    names = [r.summary["profile"] for r in results]
    assert names[0] == "sweep-1user" and all(n.startswith("sweep-") and n.endswith("rps") for n in names[1:])
    assert len(results) == 2  # one user, then 400x, where 64 users cannot keep up: saturated, the sweep stops
    configs = [json.loads(run_row(tmp_db, r.run_id)["config"]) for r in results]
    assert len({c["sweep_id"] for c in configs}) == 1 and [c["stage"] for c in configs] == [0, 1]
    assert results[1].summary["throughput_rps"] < 0.9 * configs[1]["offered_rps"]


def test_sigterm_marks_the_run_aborted_and_keeps_what_was_measured(stub_server, tmp_db):
    srv = stub_server("--token-delay", "0.5", "--max-tokens", "20")  # every request still runs at the signal
    proc = subprocess.Popen([CAPBENCH, "run", "--target", srv.url, "--rate", "10",
                             "--duration", "30", "--db", str(tmp_db), "--no-live", "--workload", "synthetic"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "capbench run" in proc.stderr.readline()  # the run has started: requests go out 0.5 s later
    time.sleep(3.0)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    con = duckdb.connect(str(tmp_db), read_only=True)
    status, n, aborted = con.execute(
        "SELECT r.status, count(q.run_id), count(*) FILTER (WHERE q.error_kind = 'cancelled') "
        "FROM runs r LEFT JOIN requests q USING (run_id) GROUP BY r.status").fetchone()
    con.close()
    assert status == "aborted" and n >= 15 and aborted >= 15  # ~3 s at 10 req/s, all cut off mid-answer


@pytest.mark.parametrize("kw,message", [
    ({"profile": "nope"}, "unknown profile"),
    ({"workload": "nope"}, "unknown workload"),
    ({"api_key_env": "CAPBENCH_NO_SUCH_VAR"}, "is not set"),
    ({"target": "localhost:1"}, "--target is a URL"),
    ({"target": "twin:no-such-model@h200x8"}, "no-such-model"),
])
def test_bad_input_raises_bad_input_before_anything_is_stored(stub_server, tmp_db, kw, message):
    srv = stub_server()
    with pytest.raises(BadInput, match=message):
        run(opts(srv.url, tmp_db, **kw))
    assert not tmp_db.exists()


def test_bad_input_on_the_command_line_is_one_line_and_exit_2(tmp_db):
    for args, message in ((["--profile", "nope"], "unknown profile"), (["--slo", "ttft=fast"], "not a duration")):
        proc = subprocess.run([CAPBENCH, "run", "--target", "http://127.0.0.1:9", "--db", str(tmp_db), "--no-live",
                               "--model", "m", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_remote_worker_serves_successive_runs(stub_server, tmp_db):
    """`capbench worker` from another machine: it joins a run, leaves at its end, and joins the next one."""
    srv = stub_server()
    port = local_workers.free_port()
    worker = subprocess.Popen([sys.executable, "-m", "loadgen.worker", "--master-host", "127.0.0.1", "--master-port",
                               str(port), "--keep"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(2):
            [res] = run(opts(srv.url, tmp_db, overrides={"rate": 10, "duration": 1}, expect_workers=1,
                             master_port=port))
            assert res.status == "completed" and res.rows_written == res.records == 10
    finally:
        worker.terminate()
        worker.wait(timeout=10)


def test_sigkill_leaves_a_cancelled_row_for_every_request_in_flight(stub_server, tmp_db):
    """SIGKILL gives the run no chance to clean up; its recorder process does: the requests in flight at the
    kill (listed with every frame it got) become `cancelled` rows, and the run is marked aborted."""
    srv = stub_server("--token-delay", "0.5", "--max-tokens", "20")  # every request still runs at the kill
    proc = subprocess.Popen([CAPBENCH, "run", "--target", srv.url, "--rate", "10", "--duration", "30", "--db",
                             str(tmp_db), "--no-live", "--workload", "synthetic"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert "capbench run" in proc.stderr.readline()
    srv.wait_for(15)  # none answered before 10 s: all of them in flight
    proc.kill()
    proc.wait(timeout=10)
    deadline, status = time.time() + 60, "running"
    while status == "running" and time.time() < deadline:  # the recorder writes, then marks the run
        time.sleep(0.5)
        try:
            with duckdb.connect(str(tmp_db), read_only=True) as con:
                status = con.execute("SELECT status FROM runs").fetchone()[0]
                n, cancelled = con.execute("SELECT count(*), count(*) FILTER (WHERE error_kind = 'cancelled' AND "
                                           "note LIKE 'recorded by the recorder%') FROM requests").fetchone()
        except duckdb.IOException:  # the recorder holds the file this moment
            continue
    assert status == "aborted" and n >= 15 and cancelled == n


def test_a_recorder_that_dies_fails_the_run_with_the_rows_it_lost(stub_server, tmp_db, monkeypatch):
    from bench.cli.runs import exit_status

    srv = stub_server()
    add = runner.Collector.add

    def add_then_kill_recorder(self, recs):
        add(self, recs)
        if self.records >= 10 and self.recorder.proc.poll() is None:
            self.recorder.proc.kill()
            self.recorder.proc.wait()

    monkeypatch.setattr(runner.Collector, "add", add_then_kill_recorder)
    [res] = run(opts(srv.url, tmp_db, overrides={"rate": 20, "duration": 2}))
    # the run stops sending once its rows can no longer be stored (within a frame: half a second, more when the
    # machine is loaded), not at the end of its schedule
    assert res.status == "failed" and 10 <= res.sent < 40 and "recorder" in res.error
    assert res.rows_written == len(rows(tmp_db, res.run_id)) < res.sent and res.lost == res.sent - res.rows_written
    assert run_row(tmp_db, res.run_id)["status"] == "failed"
    assert exit_status([res]) == 1


def test_sigkill_with_a_local_worker_still_leaves_its_requests_in_flight_a_row(stub_server, tmp_db):
    srv = stub_server("--token-delay", "0.5", "--max-tokens", "20")
    proc = subprocess.Popen([CAPBENCH, "run", "--target", srv.url, "--rate", "10", "--duration", "30", "--db",
                             str(tmp_db), "--no-live", "--workload", "synthetic", "--workers", "1"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert "capbench run" in proc.stderr.readline()
    srv.wait_for(15)  # the worker joins (a process start, then a 2 s lead), then 1.5 s of requests
    workers = [c for c in psutil.Process(proc.pid).children() if "loadgen.worker" in " ".join(c.cmdline())]
    proc.kill()
    proc.wait(timeout=10)
    deadline, status, n, cancelled = time.time() + 60, "running", 0, 0
    try:
        while status == "running" and time.time() < deadline:
            time.sleep(0.5)
            try:  # the recorder holds the file while it writes the in-flight rows: try again
                con = duckdb.connect(str(tmp_db), read_only=True)
            except duckdb.IOException:
                continue
            try:
                status = con.execute("SELECT status FROM runs").fetchone()[0]
                n, cancelled = con.execute("SELECT count(*), count(*) FILTER (WHERE error_kind = 'cancelled') "
                                           "FROM requests").fetchone()
            except duckdb.IOException:
                continue
            finally:
                con.close()
    finally:
        for w in workers:  # orphaned by the kill: it leaves when it sees its master gone, or is killed now
            try:
                w.kill()
            except psutil.NoSuchProcess:
                pass
    # requests that finished before the kill may have reached the store; every other one is a cancelled row
    with duckdb.connect(str(tmp_db), read_only=True) as con:
        ok = con.execute("SELECT count(*) FROM requests WHERE status = 'ok'").fetchone()[0]
    assert len(workers) == 1 and status == "aborted" and n >= 5 and cancelled >= 1 and ok + cancelled == n
