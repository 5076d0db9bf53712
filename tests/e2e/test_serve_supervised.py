"""`capbench serve` as one supervised unit, driven as an operator runs it: a port already taken is an error before
anything starts; files dropped in the queue that are not campaigns (binary, a shell template) go to rejected/ with
their reason and the service runs on; `serve` killed outright (SIGKILL) takes its dashboard with it and leaves the
running campaign to be resumed by the next `serve`, which completes it; a dashboard that dies stops the runner and
`serve` says why (exit 1)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import httpx

CAPBENCH = str(Path(sys.executable).parent / "capbench")
CAMPAIGN = ('name: ok\nslo: "ttft=10s,tpot=200ms"\nduration: 1.5\ndeployments:\n'
            '  - {name: glm, twin: "glm-4.6@h200x8,time_scale=10"}\nloads:\n'
            + "".join(f"  - {{name: l{i}, workload: chat, profile: poisson, rate: 0.5}}\n" for i in range(3)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tmp_path: Path, port: int) -> subprocess.Popen:
    log = (tmp_path / "serve.log").open("a")
    return subprocess.Popen([CAPBENCH, "serve", "--db", str(tmp_path / "c.duckdb"), "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)


def _up(proc: subprocess.Popen, port: int, tmp_path: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
        time.sleep(0.5)


def _query(db: Path, sql: str, timeout_s: float = 30) -> list:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with duckdb.connect(str(db), read_only=True) as con:
                return con.execute(sql).fetchall()
        except duckdb.Error:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _wait(db: Path, sql: str, ok, timeout_s: float) -> list:
    deadline = time.monotonic() + timeout_s
    while True:
        rows = _query(db, sql) if db.exists() else []
        if ok(rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.25)


def test_a_taken_port_is_an_error_before_anything_starts(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = subprocess.run([CAPBENCH, "serve", "--db", str(tmp_path / "c.duckdb"), "--port", str(port)],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "already in use" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "c.duckdb").exists()  # nothing started, nothing written


def test_serve_killed_outright_resumes_its_campaign_on_restart(tmp_path):
    db, port = tmp_path / "c.duckdb", _free_port()
    proc = _serve(tmp_path, port)
    try:
        _up(proc, port, tmp_path)
        queue = tmp_path / "campaign-queue"
        queue.mkdir(exist_ok=True)
        (queue / "1-binary.yaml").write_bytes(b"\xff\xfe\x00 not text")
        (queue / "2-shell.yaml").write_text(CAMPAIGN.replace(
            'twin: "glm-4.6@h200x8,time_scale=10"}',
            f"sglang: {{model: glm-4.6, template: {{start: 'touch {tmp_path}/pwned; : {{command}}'}}}}}}"))
        (queue / "3-ok.yaml").write_text(CAMPAIGN)
        done = _wait(db, "SELECT count(*) FROM campaign_cells WHERE status = 'completed'", lambda r: r and r[0][0],
                     180)
        assert done[0][0] >= 1, (tmp_path / "serve.log").read_text()[-3000:]
        rejected = sorted(p.name for p in (queue / "rejected").iterdir())
        assert rejected == ["1-binary.yaml", "1-binary.yaml.reason.txt", "2-shell.yaml", "2-shell.yaml.reason.txt"]
        assert "carries its own shell command" in (queue / "rejected" / "2-shell.yaml.reason.txt").read_text()
        assert not (tmp_path / "pwned").exists()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        gone_by = time.monotonic() + 5
        while True:  # the dashboard goes with its serve: within 5 s it no longer answers
            try:
                httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
            except httpx.HTTPError:
                break
            assert time.monotonic() < gone_by, "the dashboard outlived its serve"
            time.sleep(0.2)
        proc = _serve(tmp_path, port)  # the port is free again: the dashboard went with its serve
        _up(proc, port, tmp_path)
        final = _wait(db, "SELECT status FROM campaigns", lambda r: r == [("completed",)], 240)
        assert final == [("completed",)], (tmp_path / "serve.log").read_text()[-3000:]
        cells = _query(db, "SELECT cell, status FROM campaign_cells ORDER BY cell")
        assert cells == [(f"glm/l{i}", "completed") for i in range(3)]
        log = (tmp_path / "serve.log").read_text()
        assert "already completed" in log  # the second serve resumed, skipping what was done
        # the dashboard dies: the runner is stopped and serve says why
        dash = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "streamlit"],
                                               capture_output=True, text=True).stdout.split()]
        assert len(dash) == 1
        os.kill(dash[0], signal.SIGKILL)
        assert proc.wait(timeout=90) == 1
        assert "the dashboard exited" in (tmp_path / "serve.log").read_text()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert "Traceback" not in (tmp_path / "serve.log").read_text()
