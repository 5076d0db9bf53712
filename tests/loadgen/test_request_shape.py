"""Request shape, the way users run it: extra body parameters, headers from the environment, several targets,
the embeddings endpoint; bad values are one line and exit 2."""

import os
import statistics
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tests.loadgen.conftest import StubServer
from tests.loadgen.test_sessions import server_log

CAPBENCH = str(Path(sys.executable).parent / "capbench")


def _run(tmp_path, *args, env=None):
    return subprocess.run([CAPBENCH, "run", "--db", str(tmp_path / "c.duckdb"), "--no-live", "--duration", "1",
                           "--rate", "20", "--workload", "synthetic", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=180, env={**os.environ, **(env or {})})


def test_extra_body_headers_and_two_targets(tmp_path):
    a, b = StubServer("--log"), StubServer("--log")
    try:
        out = _run(tmp_path, "--target", a.url, "--also-target", b.url, "--extra-body",
                   '{"temperature": 0.3, "reasoning_effort": "low"}', "--header", "X-Team=env:CB_TEAM",
                   env={"CB_TEAM": "team-secret-7"})
        assert out.returncode == 0, out.stderr
        la, lb = server_log(a), server_log(b)
    finally:
        a.kill()
        b.kill()
    assert len(la) + len(lb) == 20 and abs(len(la) - len(lb)) <= 2  # round robin
    for e in la + lb:
        assert e["body"]["temperature"] == 0.3 and e["body"]["reasoning_effort"] == "low"
        assert "x-team: team-secret-7" in [h.lower() for h in e["headers"]]
    with duckdb.connect(str(tmp_path / "c.duckdb"), read_only=True) as con:
        by_target = dict(con.execute("SELECT target, count(*) FROM requests GROUP BY target").fetchall())
        config = con.execute("SELECT config FROM runs").fetchone()[0]
    assert by_target == {a.url: len(la), b.url: len(lb)}
    assert "team-secret-7" not in config and "CB_TEAM" in config  # the header's variable, never its value


def test_the_embeddings_endpoint(tmp_path):
    srv = StubServer("--log")
    try:
        out = _run(tmp_path, "--target", srv.url, "--api", "embeddings")
        assert out.returncode == 0, out.stderr
        log = server_log(srv)
    finally:
        srv.kill()
    assert len(log) == 20 and all(e["path"] == "/v1/embeddings" and "input" in e["body"] for e in log)
    with duckdb.connect(str(tmp_path / "c.duckdb"), read_only=True) as con:
        ok, prompt = con.execute("SELECT count(*) FILTER (WHERE status = 'ok'), min(prompt_tokens) FROM requests"
                                 ).fetchone()
    assert ok == 20 and prompt > 0


@pytest.mark.parametrize("args,message", [
    (["--extra-body", "{nope"], "not JSON"), (["--extra-body", "[1]"], "JSON object"),
    (["--extra-body", '{"model": "x"}'], "may not set model"), (["--header", "X-A=plain"], "NAME=env:VAR"),
    (["--header", "X-A=env:CB_NOT_SET_ANYWHERE"], "is not set"), (["--route", "random"], "round-robin or session"),
    (["--also-target", "localhost:1"], "--target is a URL"),
])
def test_bad_request_shape_is_one_line_and_exit_2(tmp_path, args, message):
    out = _run(tmp_path, "--target", "http://127.0.0.1:9", "--model", "m", *args)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_time_to_the_first_answer_token_after_reasoning(tmp_path):
    srv = StubServer("--reasoning", "3", "--token-delay", "0.05", "--max-tokens", "6")
    try:
        out = _run(tmp_path, "--target", srv.url)
    finally:
        srv.kill()
    assert out.returncode == 0, out.stderr
    assert "time to the first answer token (after reasoning)" in out.stdout
    with duckdb.connect(str(tmp_path / "c.duckdb"), read_only=True) as con:
        gaps = [r[0] for r in con.execute("SELECT ttfc_s - ttft_s FROM requests WHERE status = 'ok'").fetchall()]
    # Three 50 ms gaps separate the first reasoning delta from the first answer delta. A busy client can read the
    # first delta late, which shortens one gap by its lag, so each gap is bounded by two token delays (a clock
    # stopped one token early or at the first delta would give 50 ms or 0) and their median by 90 % of three.
    assert len(gaps) == 20 and min(gaps) >= 2 * 0.05, sorted(gaps)
    assert statistics.median(gaps) >= 3 * 0.05 * 0.9, sorted(gaps)
