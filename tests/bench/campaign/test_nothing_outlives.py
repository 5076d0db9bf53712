"""Nothing outlives its campaign: a server that leaves its launched process group (`setsid -w`) is ended with its
launch; `capbench campaign` SIGKILLed at random moments leaves 0 processes, without a resume (the watchdog);
`--stop-orphans` runs a dead campaign's stop commands; a bad CAPBENCH_STOP_TIMEOUT_S is one line; the queue moves a
FIFO and a link to /dev/zero to rejected/ unread and survives a file taken away; serve's port check ignores
TIME_WAIT."""

import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.campaign import queue
from bench.campaign.queue import pending, port_taken, submit, take_submissions
from bench.store import Store

CAPBENCH = str(Path(sys.executable).parent / "capbench")
FAKE = Path(__file__).with_name("fake_sglang.py")
BASE = """name: t
slo: "ttft=10s,tpot=200ms"
duration: 3
stop_grace: 2
deployments:
  - {name: s, health_timeout: 90, sglang: {model: glm-4.6, tp: 8, template: {start: 'START', stop: 'STOP'}}}
loads:
  - {name: a, workload: chat, profile: poisson, rate: 1}
  - {name: b, workload: chat, profile: poisson, rate: 2}
"""


def _campaign(tmp_path: Path, setsid: bool, stop: str = "true", duration: float = 3) -> tuple[Path, Path]:
    pids = tmp_path / "pids"
    pids.write_text("")
    start = f"{'setsid -w ' if setsid else ''}{sys.executable} {FAKE} --port {{port}} --pids {pids} -- {{command}}"
    f = tmp_path / "c.yaml"
    f.write_text(BASE.replace("START", start).replace("STOP", stop).replace("duration: 3", f"duration: {duration:g}"))
    return f, pids


def _marked(db: Path) -> list[int]:
    """Live processes carrying the campaign mark of this DB (what a campaign started here)."""
    want = f"CAPBENCH_LAUNCHED_BY={db.resolve()}|".encode()
    out = []
    for e in Path("/proc").iterdir():
        try:
            if e.name.isdigit() and any(x.startswith(want) for x in (e / "environ").read_bytes().split(b"\0")) \
                    and (e / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(int(e.name))
        except OSError:
            continue
    return out


def _alive(pids: Path) -> list[int]:
    out = []
    for pid in (int(x) for x in pids.read_text().split()):
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(pid)
        except OSError:
            pass
    return out


def _wait_gone(db: Path, pids: Path, within: float) -> list[int]:
    deadline = time.monotonic() + within
    while (left := sorted(set(_marked(db)) | set(_alive(pids)))) and time.monotonic() < deadline:
        time.sleep(0.3)
    return left


def test_a_server_that_left_its_group_is_ended_with_its_launch(tmp_path):
    f, pids = _campaign(tmp_path, setsid=True, duration=1)  # run to its end: the stages' length says nothing here
    db = tmp_path / "c.duckdb"
    out = subprocess.run([CAPBENCH, "campaign", str(f), "--db", str(db)], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert len(pids.read_text().split()) == 2  # the fake server and its twin both ran
    assert _alive(pids) == [] and _marked(db) == []  # at the campaign's exit, not later


@pytest.mark.parametrize("trial", range(4))
def test_sigkill_at_a_random_moment_leaves_nothing_without_a_resume(tmp_path, trial):
    rng = random.Random(trial)
    f, pids = _campaign(tmp_path, setsid=trial % 2 == 0)
    db = tmp_path / "c.duckdb"
    runner = subprocess.Popen([CAPBENCH, "campaign", str(f), "--db", str(db)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, cwd=tmp_path)
    when = rng.uniform(2.0, 14.0)
    time.sleep(when)
    runner.kill()
    runner.wait()
    left = _wait_gone(db, pids, within=30)
    assert left == [], f"killed at {when:.1f} s: {left} still running"


def test_stop_orphans_runs_a_dead_campaigns_stop_commands(tmp_path):
    stopped = tmp_path / "stopped"
    f, pids = _campaign(tmp_path, setsid=False, stop=f"touch {stopped}")
    db = tmp_path / "c.duckdb"
    runner = subprocess.Popen([CAPBENCH, "campaign", str(f), "--db", str(db)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, cwd=tmp_path)
    deadline = time.monotonic() + 120
    while len(pids.read_text().split()) < 2:  # the server is up and recorded
        assert time.monotonic() < deadline and runner.poll() is None
        time.sleep(0.2)
    time.sleep(1)
    runner.kill()
    runner.wait()
    out = subprocess.run([CAPBENCH, "campaign", "--stop-orphans", "--db", str(db)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert stopped.exists()  # the template's stop command ran (a remote server's only way down)
    assert _wait_gone(db, pids, within=30) == []
    again = subprocess.run([CAPBENCH, "campaign", "--stop-orphans", "--db", str(db)], capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
    assert again.returncode == 0 and "nothing a campaign left is running" in again.stdout


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "abc", "1e9"])
def test_a_bad_stop_timeout_is_one_line(tmp_path, value):
    f, _ = _campaign(tmp_path, setsid=False)
    for args in (["campaign", str(f), "--db", str(tmp_path / "c.duckdb")],
                 ["campaign", "--stop-orphans", "--db", str(Store(tmp_path / "o.duckdb").path)]):
        out = subprocess.run([CAPBENCH, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                             env={**os.environ, "CAPBENCH_STOP_TIMEOUT_S": value})
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.strip().count("\n") == 0 and "CAPBENCH_STOP_TIMEOUT_S" in out.stderr
    assert not (tmp_path / "campaign-logs").exists()


GOOD = 'name: q\nslo: "ttft=10s,tpot=200ms"\nduration: 2\ndeployments:\n  - {name: tw, twin: "glm-4.6@h200x8"}\n' \
       "loads:\n  - {name: a, workload: chat, profile: poisson, rate: 1}\n"


def test_the_queue_rejects_a_fifo_and_a_link_unread(tmp_path):
    db = tmp_path / "c.duckdb"
    store = Store(db)
    submit(db, "good.yaml", GOOD)
    folder = pending(db)[0].parent
    os.mkfifo(folder / "1-fifo.yaml")
    (folder / "2-zero.yaml").symlink_to("/dev/zero")
    ids = take_submissions(store, db)
    assert len(ids) == 1
    for name in ("1-fifo.yaml", "2-zero.yaml"):
        reason = (folder / "rejected" / f"{name}.reason.txt").read_text()
        assert "not a regular file" in reason and "Traceback" not in reason, reason
    assert take_submissions(store, db) == [] and not pending(db)


def test_a_queued_file_taken_away_does_not_stop_the_runner(tmp_path, monkeypatch):
    db = tmp_path / "c.duckdb"
    store = Store(db)
    gone = queue.queue_dir(db) / "0-gone.yaml"
    submit(db, "good.yaml", GOOD)
    real = queue.check_campaign

    def parse_then_remove(data, name, templates=None):  # the operator clears the folder meanwhile
        campaign = real(data, name, templates)
        for p in pending(db):
            p.unlink()
        return campaign

    monkeypatch.setattr(queue, "pending", lambda _db: [gone, *sorted(queue.queue_dir(db).glob("*.yaml"))])
    monkeypatch.setattr(queue, "check_campaign", parse_then_remove)
    assert len(take_submissions(store, db)) == 1


def test_serve_port_check_ignores_time_wait():
    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", 0))
        port = srv.getsockname()[1]
        srv.listen()
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = srv.accept()
        assert port_taken("127.0.0.1", port)  # a server listens
        conn.close()  # the server side closes first: its end waits in TIME_WAIT
        time.sleep(0.2)
        client.close()
    assert not port_taken("127.0.0.1", port)  # a restart right after is not refused
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
        again.listen()
        assert port_taken("127.0.0.1", port)
