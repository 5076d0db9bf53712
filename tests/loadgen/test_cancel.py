"""--cancel SHARE[:after=SECONDS] as a user runs it (the installed `capbench run` from a tmp folder) against a server
that logs every request and when a client left before the answer's end: the seeded requests, and only they, are
cancelled (a share within a binomial bound of the one asked), the server sees each disconnect, and the summary
counts them apart from errors and latencies."""

import math
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from bench.store import Store, queries
from loadgen import cancel
from tests.loadgen.conftest import StubServer
from tests.loadgen.test_sessions import server_log

CAPBENCH = str(Path(sys.executable).parent / "capbench")


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CAPBENCH, "run", *args, "--db", str(tmp_path / "c.duckdb"), "--no-live"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize(("spec", "workers"), [("0.3:after=0.05", 0), ("0.5", 1)])
def test_the_seeded_share_is_cancelled_and_the_server_sees_it_go(tmp_path, spec, workers):
    srv = StubServer("--log", "--token-delay", "0.04")  # 10 tokens: an answer takes 0.4 s, longer than 0.05 s
    try:
        out = run(tmp_path, "--target", srv.url, "--rate", "20", "--duration", "3", "--input-len", "8",
                  "--output-len", "10", "--seed", "3", "--cancel", spec, "--workers", str(workers))
        assert out.returncode == 0, out.stderr
        log = server_log(srv)
    finally:
        srv.kill()
    with duckdb.connect(str(tmp_path / "c.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT request_id, status, error_kind, note, sent_at, first_token_at, finished_at, "
                           "completion_tokens FROM requests").fetchall()
        run_id = con.execute("SELECT run_id FROM runs").fetchone()[0]
    parsed = cancel.parse(spec)
    cut = {r[0] for r in rows if r[1] == "cancelled"}
    n, p, k = len(rows), parsed["share"], len(cut)
    assert n == 60 and {r[1] for r in rows} <= {"ok", "cancelled"}
    assert cut == {r[0] for r in rows if cancel.picked(parsed, 3, r[0])}  # exactly the seeded ones
    assert abs(k - n * p) <= 4 * math.sqrt(n * p * (1 - p))  # 4 sigma: never a flake, a wrong share fails
    for rid, _, kind, note, sent, first, finished, _tokens in (r for r in rows if r[1] == "cancelled"):
        assert kind is None and "--cancel" in note
        if parsed["after_s"] is not None:
            assert 0.05 <= finished - sent < 0.4, rid  # at its delay, before the answer would have ended
        else:
            assert first is not None and finished - first < 0.3, rid  # at the first token, not the last
    assert all(r[7] == 10 for r in rows if r[1] == "ok")
    assert sum(1 for e in log if e.get("disconnected")) == k  # each cancel is a connection the server saw close
    assert all(not e.get("done") for e in log if e.get("disconnected"))
    with Store(tmp_path / "c.duckdb", read_only=True).connect() as con:
        s = queries.summary(con, run_id)
        in_hist = con.execute("SELECT sum(n) FROM latency_hist WHERE run_id = ? AND metric = 'ttft'",
                              [run_id]).fetchone()[0]
    assert (s["cancelled"], s["errors"], s["ok"], s["success_rate"]) == (k, 0, n - k, 1.0)
    assert in_hist == n - k and s["errors_by_kind"] == {}  # not in the percentiles, not an error
    assert "cancelled by the client" in out.stdout and f"{k} (--cancel" in out.stdout


@pytest.mark.parametrize("text", ["0", "1.5", "x", "0.2:after=-1", "0.2:before=3", "0.2:after=1e9"])
def test_a_bad_cancel_is_one_line_and_exit_2(tmp_path, text):
    out = run(tmp_path, "--target", "http://127.0.0.1:9", "--model", "m", "--cancel", text)
    assert out.returncode == 2 and out.stderr.startswith("error: --cancel takes SHARE"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_cancel_at_the_first_token_needs_a_stream(tmp_path):
    out = run(tmp_path, "--target", "http://127.0.0.1:9", "--model", "m", "--cancel", "0.2", "--no-stream")
    assert out.returncode == 2 and "needs streaming" in out.stderr, out.stderr
