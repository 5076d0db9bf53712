"""Prompt JSONL workloads, as a user runs them (the installed `capbench run` from a tmp folder) against a server that
logs every request: the example of docs/load-tests.md replays at its timestamps, its sessions' turns wait for the
previous answer and carry it; a bad line is one line and exit 2 before anything is sent."""

import json
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from loadgen import prompt_file, workloads
from loadgen.workloads import WorkloadError
from tests.loadgen.conftest import StubServer
from tests.loadgen.test_sessions import server_log

ROOT = Path(__file__).resolve().parents[2]
CAPBENCH = str(Path(sys.executable).parent / "capbench")


def docs_example() -> str:
    """The prompt file of docs/load-tests.md (its one ```jsonl block), as a reader would copy it."""
    blocks = re.findall(r"^```jsonl\n(.*?)^```", (ROOT / "docs" / "load-tests.md").read_text(), re.M | re.S)
    assert len(blocks) == 1
    return blocks[0]


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CAPBENCH, "run", *args, "--db", str(tmp_path / "c.duckdb"), "--no-live"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)


def test_the_docs_example_replays_at_its_timestamps_and_its_turns_wait_for_the_answers(tmp_path):
    (tmp_path / "prompts.jsonl").write_text(docs_example())
    rows = [json.loads(line) for line in docs_example().splitlines()]
    srv = StubServer("--log", "--token-delay", "0.03")
    try:
        out = run(tmp_path, "--target", srv.url, "--profile", "trace", "--workload", "prompts.jsonl")
        assert out.returncode == 0, out.stderr
        log = server_log(srv)
    finally:
        srv.kill()
    with duckdb.connect(str(tmp_path / "c.duckdb"), read_only=True) as con:
        db = con.execute("SELECT session_id, turn, scheduled_at, sent_at, status, completion_tokens FROM requests "
                         "ORDER BY scheduled_at, turn").fetchall()
    assert len(db) == len(rows) == len(log) and all(r[4] == "ok" and r[5] == 6 for r in db)
    # the schedule: each session's first turn (and the row without a session) at its timestamp from the first
    firsts = [r for r in db if r[1] == 0]
    assert [round(r[2] - firsts[0][2], 6) for r in firsts] == [0.0, 0.15, 0.4]
    assert all(r[3] >= r[2] for r in db)  # none sent before it was due
    starts = sorted(e["arrived"] for e in log if not any(m["role"] == "assistant" for m in e["body"]["messages"]))
    assert all(a >= r[2] for a, r in zip(starts, firsts, strict=True))  # the server got each after it was due
    # sessions: every later turn after the previous answer's last token, carrying it, then its own row's text
    by_answer = {e["answer"]: e for e in log}
    later = [e for e in log if any(m["role"] == "assistant" for m in e["body"]["messages"])]
    assert len(later) == 3  # chat-1's second turn, chat-2's second and third
    for e in later:
        msgs = e["body"]["messages"]
        prev = by_answer[msgs[-2]["content"]]  # the previous turn's real answer, word for word
        assert msgs[-2]["role"] == "assistant" and e["arrived"] >= prev["last_token"]
        assert msgs[:-2] == prev["body"]["messages"] and e["body"]["max_tokens"] == 6
    assert sorted(e["body"]["messages"][-1]["content"] for e in later) == \
        sorted(r["text"] for r in rows if r.get("session_id") and "text" in r)  # each later turn's own row
    assert sorted(len(e["body"]["messages"]) for e in later) == [3, 4, 5]  # chat-2: 1+2, 1+2+2; chat-1: 2+2


def test_seconds_timestamps_from_a_workload_yaml_and_speedup(tmp_path):
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"text": f"q{k}", "output_len": 2, "timestamp": t}) + "\n"
                                              for k, t in enumerate([3.0, 3.5, 4.5, 4.6])))
    (tmp_path / "w.yaml").write_text("type: prompts\npath: p.jsonl\ntimestamp_unit: s\n")
    srv = StubServer("--log")
    try:
        out = run(tmp_path, "--target", srv.url, "--profile", "trace", "--workload", "w.yaml",
                  "--param", "speedup=2")
        assert out.returncode == 0, out.stderr
        log = server_log(srv)
    finally:
        srv.kill()
    with duckdb.connect(str(tmp_path / "c.duckdb"), read_only=True) as con:
        due = [r[0] for r in con.execute("SELECT scheduled_at FROM requests ORDER BY scheduled_at").fetchall()]
    assert [round(d - due[0], 6) for d in due] == [0.0, 0.25, 0.75, 0.8]
    # each row not sent before its own timestamp (arrival order is not asserted: on a loaded host the first request's
    # connection can take longer than the 0.25 s to the second's)
    arrived = {e["body"]["messages"][0]["content"]: e["arrived"] for e in log}
    assert sorted(arrived) == ["q0", "q1", "q2", "q3"]
    assert all(arrived[f"q{k}"] >= d for k, d in enumerate(due)), (arrived, due)


BAD = [
    ('{"text": "fine"}\n{"text": "x", "output_len": 0}\n',
     "p.jsonl:2: output_len: Input should be greater than or equal to 1, got 0"),
    ('{"text": "a"}\n\n{"messages": [{"role": "robot", "content": "x"}]}\n', "p.jsonl:3: messages.0.role: "),
    ('{"text": "a", "messages": [{"role": "user", "content": "b"}]}\n', "p.jsonl:1: (top): a row has either"),
    ('{"text": "a"}\n{"text": "b"\n', "p.jsonl:2: not a prompt JSON"),
    ('{"text": "a", "timestamp": 5}\n{"text": "b"}\n', "p.jsonl:2: no timestamp, where earlier rows"),
    ('{"text": "a", "colour": 1}\n', "p.jsonl:1: colour: unknown key"),
    ('\n\n', "p.jsonl: no prompt rows"),
]


@pytest.mark.parametrize(("text", "line"), BAD)
def test_a_bad_line_is_one_line_naming_it_and_exit_2(tmp_path, text, line):
    (tmp_path / "p.jsonl").write_text(text)
    out = run(tmp_path, "--target", "http://127.0.0.1:9", "--model", "m", "--workload", "p.jsonl")
    assert out.returncode == 2, out.stderr
    # the CLI passes the path on resolved: the line names the file as given, from its folder
    assert out.stderr.startswith(f"error: {tmp_path / line}") and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "c.duckdb").exists()


def test_trace_profile_needs_timestamps_and_sessions_are_read_in_file_order(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "s1 t0", "session_id": 1}\n{"text": "alone"}\n{"text": "s2 t0", "session_id": "b"}\n'
                    '{"text": "s1 t1", "session_id": 1}\n')
    out = run(tmp_path, "--target", "http://127.0.0.1:9", "--model", "m", "--workload", "p.jsonl", "--profile",
              "trace")
    assert out.returncode == 2 and "prompt file whose rows have timestamps" in out.stderr, out.stderr
    wl = workloads.load(str(path))
    assert wl.type == "prompts" and wl.closed_loop and wl.session_turns == 1  # 4 rows, 3 sessions
    s = wl.session(0)
    assert s.request().body["messages"] == [{"role": "user", "content": "s1 t0"}]
    assert s.answered("answer one", 2)
    assert [m["content"] for m in s.request().body["messages"]] == ["s1 t0", "answer one", "s1 t1"]
    assert not s.answered("answer two", 2)
    assert [wl.session(k).request().body["messages"][0]["content"] for k in (1, 2, 3)] == ["alone", "s2 t0", "s1 t0"]
    plain = tmp_path / "q.jsonl"
    plain.write_text('{"text": "a", "max_tokens": 3}\n{"text": "b"}\n')
    wl = workloads.load(str(plain))
    assert not wl.closed_loop and wl.request(0).body["max_tokens"] == 3 and wl.request(3).body["messages"][0][
        "content"] == "b"
    with pytest.raises(WorkloadError, match="needs path"):
        workloads.from_dict({"type": "prompts"}).check()
    assert prompt_file.read(str(plain)).timed is False
