"""Closed-loop sessions against a fake server that logs every request: turn N+1 goes out only after turn N's last
token (plus the think time) and carries turn N's real answer; TTFT and prefix-cache hits are reported by turn."""

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import duckdb
import pytest

from loadgen import workloads
from loadgen.sessions import Session
from loadgen.workloads import WorkloadError
from tests.loadgen.conftest import StubServer

CAPBENCH = str(Path(sys.executable).parent / "capbench")


def server_log(srv: StubServer) -> list[dict]:
    with urllib.request.urlopen(f"{srv.url}/log", timeout=10) as r:
        return json.loads(r.read())


def _check_sessions(log: list[dict], turns: int, think_s: float) -> int:
    """Every session's turns in order: each sent after the previous answer's last token plus the think time,
    carrying that answer as its last assistant message. Returns the number of complete sessions."""
    by_answer = {e["answer"]: e for e in log}
    complete = 0
    for e in log:
        assistants = [m for m in e["body"]["messages"] if m["role"] == "assistant"]
        if not assistants:
            continue
        prev = by_answer[assistants[-1]["content"]]  # the real answer of an earlier request, word for word
        assert e["arrived"] >= prev["last_token"] + think_s * 0.99, (e["id"], prev["id"])
        assert e["body"]["messages"][: len(prev["body"]["messages"])] == prev["body"]["messages"]
        assert all(a["content"] in by_answer for a in assistants)
        complete += len(assistants) == turns - 1
    return complete


@pytest.mark.parametrize("workers", [0, 1])
def test_turn_n_plus_1_waits_for_turn_ns_answer_and_carries_it(tmp_path, workers):
    srv = StubServer("--log", "--token-delay", "0.02", "--max-tokens", "6")
    wl = tmp_path / "mt.yaml"
    wl.write_text(json.dumps({"name": "mt", "type": "multi_turn", "turns": 3, "think_s": 0.2,
                              "system_tokens": 50, "input": 20, "output": 6}))
    try:
        out = subprocess.run([CAPBENCH, "run", "--target", srv.url, "--rate", "12", "--duration", "2", "--workload",
                              str(wl), "--db", str(tmp_path / "c.duckdb"), "--no-live", "--workers", str(workers)],
                             cwd=tmp_path, capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr
        log = server_log(srv)
    finally:
        srv.kill()
    with duckdb.connect(str(tmp_path / "c.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT session_id, turn, status FROM requests ORDER BY session_id, turn").fetchall()
    sessions = {s for s, _, _ in rows}
    assert len(log) == len(rows) == 3 * len(sessions) and all(st == "ok" for *_, st in rows)
    assert _check_sessions(log, 3, 0.2) == len(sessions)
    assert "by turn (closed-loop sessions)" in out.stdout


def test_a_session_builds_on_the_real_answers():
    wl = workloads.from_dict({"name": "ac", "type": "agentic_coding", "turns": 3, "system_tokens": 40,
                              "input": 10, "output": 5, "tool_output": 7, "think_s": {"dist": "uniform", "min": 1,
                                                                                       "max": 2}})
    s = Session(wl, 0)
    first = s.request().body["messages"]
    assert [m["role"] for m in first] == ["system", "user"] and s.request().body["tools"]
    assert s.answered("the real answer", 3)
    msgs = s.request().body["messages"]
    assert msgs[:2] == first and msgs[2]["content"] == "the real answer" and msgs[2]["tool_calls"]
    assert msgs[3]["role"] == "tool" and msgs[3]["tool_call_id"] == msgs[2]["tool_calls"][0]["id"]
    assert 1 <= s.think_s() <= 2
    assert s.answered("second", 1) and s.turn == 2  # the third turn, the last
    assert s.answered("third", 1) is False
    assert wl.closed_loop and not workloads.from_dict({"name": "o", "type": "multi_turn", "loop": "open"}).closed_loop


@pytest.mark.parametrize("spec", [{"type": "chat", "loop": "closed"}, {"type": "multi_turn", "loop": "sometimes"},
                                  {"type": "multi_turn", "think_s": -1}, {"type": "multi_turn", "think_s": "nan"},
                                  {"type": "agentic_coding", "think_s": {"dist": "lognormal", "median": 1}}])
def test_bad_session_options_are_workload_errors(spec):
    with pytest.raises(WorkloadError):
        workloads.from_dict({"name": "x", **spec})
