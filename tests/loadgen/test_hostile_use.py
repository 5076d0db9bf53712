"""`capbench run` under hostile use, driven as a user runs it (subprocesses) against tests/loadgen/hostile_server.py,
which counts the requests it received (the truth for "sent"): the key a server echoes in any form never lands,
credentials in a URL are refused before anything is stored, a workload file that cannot be read sends nothing, a
run killed outright keeps every request it sent as a row, and a disk that fills (a tmpfs) stops the run with one
line and the count."""

import base64
import json
import os
import random
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import duckdb
import httpx
import pytest

from tests.loadgen.conftest import ROOT

CAPBENCH = str(Path(sys.executable).parent / "capbench")
KEY = "sk-live-Zq81/hostile+KEY-Xw9QpLm7RtVb"


class Server:
    def __init__(self, *faults: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.loadgen.hostile_server", "--faults",
                                      ",".join(faults)], stdout=subprocess.PIPE, cwd=ROOT, text=True)
        self.url = f"http://127.0.0.1:{json.loads(self.proc.stdout.readline())['port']}"

    def count(self) -> int:
        return httpx.get(f"{self.url}/capbench-count", timeout=5).json()["requests"]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def server():
    made = []
    yield lambda *faults: made.append(Server(*faults)) or made[-1]
    for s in made:
        s.kill()


def _run(*args: str, cwd: Path, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([CAPBENCH, "run", "--no-live", "--model", "m", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def _run_id(db: Path) -> str:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT run_id FROM runs").fetchone()[0]


def _count(db: Path, where: str = "TRUE") -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(f"SELECT count(*) FROM requests WHERE {where}").fetchone()[0]


def test_a_key_echoed_in_any_form_is_never_stored_logged_or_exported(server, tmp_path):
    echoes = ("echo_key_json", "echo_key_upper", "echo_key_prefix", "echo_key_urlencoded", "echo_key_usage",
              "echo_key", "echo_key_stream", "echo_key_unicode", "echo_key_base64", "echo_key_hex",
              "echo_key_reversed", "echo_key_spaced", "echo_key_html", "echo_key_percent", "echo_key_pieces")
    srv = server(*echoes)
    db = tmp_path / "k.duckdb"
    n = 2 * len(echoes)
    out = _run("--target", srv.url, "--profile", "constant", "--rate", str(n), "--duration", "1", "--db", str(db),
               "--api-key-env", "HOSTILE_KEY", "--workload", "synthetic", cwd=tmp_path, env={"HOSTILE_KEY": KEY})
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert _count(db) == srv.count() == n
    assert _count(db, "error LIKE '%***%' OR note LIKE '%***%'") == n  # every echo was there, and redacted
    for fmt in ("csv", "parquet"):
        exp = subprocess.run([CAPBENCH, "export", "--db", str(db), "--run", _run_id(db), "--format", fmt, "--out",
                              str(tmp_path / fmt)],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert exp.returncode == 0, exp.stderr
    forms = {KEY, KEY.upper(), KEY.lower(), KEY[:12], KEY[:8], KEY.replace("/", "\\/"),
             urllib.parse.quote(KEY, safe=""), KEY[-10:]}
    blobs = [db.read_bytes(), out.stdout.encode(), out.stderr.encode()]
    blobs += [p.read_bytes() for p in (tmp_path / "csv").iterdir()] + [p.read_bytes() for p in
                                                                      (tmp_path / "parquet").iterdir()]
    forms |= {"".join(f"\\u{ord(c):04x}" for c in KEY), base64.b64encode(KEY.encode()).decode()[:12],
              KEY.encode().hex()[:12], KEY[::-1][:8], " ".join(KEY)[:12], f"&#{ord(KEY[0])};&#{ord(KEY[1])};",
              "".join(f"%{b:02X}" for b in KEY.encode())[:12], KEY[7:14], KEY[14:21]}
    for form in forms:
        assert not any(form.encode() in b for b in blobs), form
    report = subprocess.run([CAPBENCH, "report", "--db", str(db), "--runs", _run_id(db), "--out",
                             str(tmp_path / "r.html")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    assert not any(form in (tmp_path / "r.html").read_text() for form in forms)


@pytest.mark.parametrize("url", ["{}/v1?api_key=" + KEY, "{}/v1#" + KEY, "{}/" + KEY + "/v1", "{}/token/abc/v1"])
def test_a_key_in_the_target_urls_query_or_path_is_refused(server, tmp_path, url):
    srv = server("ok")
    out = _run("--target", url.format(srv.url), "--rate", "5", "--duration", "1", "--db", str(tmp_path / "c.duckdb"),
               cwd=tmp_path)
    assert out.returncode == 2 and "like credentials" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert KEY[:8] not in out.stderr + out.stdout
    assert not (tmp_path / "c.duckdb").exists() and srv.count() == 0


def test_credentials_in_the_target_url_are_refused_before_anything_is_stored(server, tmp_path):
    srv = server("ok")
    url = srv.url.replace("http://", f"http://user:{KEY}@")
    out = _run("--target", url, "--rate", "5", "--duration", "1", "--db", str(tmp_path / "c.duckdb"), cwd=tmp_path)
    assert out.returncode == 2 and "credentials in the URL" in out.stderr and "Traceback" not in out.stderr
    assert KEY[:8] not in out.stderr + out.stdout
    assert not (tmp_path / "c.duckdb").exists() and srv.count() == 0


@pytest.mark.parametrize("content", [b"this is not JSON", os.urandom(3000), b'{"not": "a list"}'])
def test_a_workload_file_that_cannot_be_read_exits_2_before_sending(server, tmp_path, content):
    srv = server("ok")
    (tmp_path / "convs.json").write_bytes(content)
    t = time.monotonic()
    out = _run("--target", srv.url, "--rate", "5", "--duration", "1", "--db", str(tmp_path / "c.duckdb"),
               "--workload", "convs.json", cwd=tmp_path)
    assert out.returncode == 2 and "sharegpt workload" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert srv.count() == 0 and time.monotonic() - t < 30


def _kill_at_random(srv: Server, tmp_path: Path, k: int, extra: list[str], window: tuple[float, float]) -> dict:
    db = tmp_path / f"kill{k}.duckdb"
    before = srv.count()
    proc = subprocess.Popen([CAPBENCH, "run", "--target", srv.url, "--rate", "20", "--duration", "30", "--db",
                             str(db), "--no-live", "--model", "m", "--workload", "synthetic", *extra], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert "capbench run" in proc.stderr.readline()
    deadline = time.monotonic() + 60
    while srv.count() == before:  # the random moment is counted from the first request (a worker takes seconds)
        assert time.monotonic() < deadline and proc.poll() is None, "the run sent nothing"
        time.sleep(0.1)
    time.sleep(random.uniform(*window))
    proc.kill()
    proc.wait()
    sent_at_kill = srv.count() - before
    deadline = time.monotonic() + 60
    while True:  # the recorder writes the in-flight rows and marks the run aborted
        time.sleep(0.2)
        try:
            with duckdb.connect(str(db), read_only=True) as con:
                status = con.execute("SELECT status FROM runs").fetchone()[0]
            if status == "aborted":
                break
        except duckdb.Error:
            pass
        assert time.monotonic() < deadline, "the run was never marked aborted"
    time.sleep(2)  # a worker still sending would show now: 40 requests at 20 req/s, against a bound of 5
    with duckdb.connect(str(db), read_only=True) as con:
        unique = con.execute("SELECT count(DISTINCT request_id) FROM requests").fetchone()[0]
    return {"sent": srv.count() - before, "sent_at_kill": sent_at_kill, "stored": _count(db), "unique": unique,
            "cancelled": _count(db, "error_kind = 'cancelled'")}


def test_sigkill_at_random_moments_loses_no_request_sent(server, tmp_path):
    srv = server("slow", "ok")  # half the requests take a second: always some in flight
    counts = [_kill_at_random(srv, tmp_path, k, [], (1.0, 6.0)) for k in range(3)]
    print("single process, SIGKILL:", counts)
    for c in counts:
        assert c["sent"] == c["sent_at_kill"] > 0  # nothing goes out after the kill
        # every request the server received has its row; the rows beyond are requests the client had begun
        # (announced to the recorder before writing them) that had not reached the server: cancelled ones
        assert c["sent"] <= c["stored"] <= c["sent"] + c["cancelled"], counts
        assert c["stored"] - c["cancelled"] <= c["sent"] and c["cancelled"] >= 1
        assert c["unique"] == c["stored"]


def test_sigkill_of_a_master_stops_its_worker(server, tmp_path):
    srv = server("slow", "ok")
    c = _kill_at_random(srv, tmp_path, 0, ["--workers", "1"], (1.0, 4.0))
    print("master with one local worker, SIGKILL:", c)
    # the worker left with its master: it checks every 0.2 s, so at most the requests due in that 0.2 s at 20 req/s
    # (and one racing the count read just after the kill) reach the server afterwards, never the rest of the schedule
    assert c["sent"] - c["sent_at_kill"] <= 20 * 0.2 + 1
    assert c["sent"] > 0 and c["stored"] <= c["sent"]


def _unshare_tmpfs() -> list[str] | None:
    """A private mount namespace for a tmpfs (root, or an unprivileged user namespace); None if neither works."""
    for prefix in (["unshare", "-m"], ["unshare", "-Urm"]):
        if shutil.which("unshare") and subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs -o size=1m tmpfs "
                                                       "/mnt"], capture_output=True).returncode == 0:
            return prefix
    return None


def _on_full_disk(tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    """`script` in a shell whose $M is a 24 MB tmpfs holding a fresh results DB and a file that leaves ~600 kB free;
    without mount rights, a 24 MB file size limit (RLIMIT_FSIZE) is the full disk instead."""
    m = tmp_path / "full"
    m.mkdir()
    prep = (f"M={m}; {sys.executable} -c 'from bench.store import Store; Store(\"'$M'/c.duckdb\")'; "
            "avail=$(df -k --output=avail $M | tail -1); head -c $(( (avail - 600) * 1024 )) /dev/zero > $M/filler; ")
    prefix = _unshare_tmpfs()
    if prefix is not None:
        cmd = [*prefix, "sh", "-c", f"mount -t tmpfs -o size=24m tmpfs {m} && {prep}{script}"]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    import resource
    import signal

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1_200_000, 1_200_000))

    return subprocess.run(["sh", "-c", f"M={m}; {sys.executable} -c 'from bench.store import Store; "
                           f"Store(\"'$M'/c.duckdb\")'; {script}"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, preexec_fn=limit)


def test_a_full_disk_stops_the_run_with_one_line_and_the_count(server, tmp_path):
    srv = server("ok")
    out = _on_full_disk(tmp_path, f"{CAPBENCH} run --target {srv.url} --rate 50 --duration 30 --db $M/c.duckdb "
                                  "--no-live --model m --input-len 2000 --output-len 5; echo rc=$?")
    assert "rc=1" in out.stdout, out.stdout[-2000:] + out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the run stopped sending" in errors[0] and "Traceback" not in out.stderr, out.stderr
    sent = srv.count()
    assert f"of {sent} requests sent have no stored row" in errors[0]  # the count is the server's count
    assert sent < 50 * 30 * 0.8  # it stopped: far fewer than the 1500 the schedule holds


def test_an_export_onto_a_full_disk_leaves_no_partial_file(server, tmp_path):
    srv = server("ok")
    db = tmp_path / "e.duckdb"
    run = _run("--target", srv.url, "--rate", "50", "--duration", "2", "--db", str(db), "--input-len", "3000",
               "--output-len", "5", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    out = _on_full_disk(tmp_path, f"head -c $(( $(df -k --output=avail $M | tail -1) * 1024 - 4096 )) /dev/zero "
                                  f"> $M/more; {CAPBENCH} export --db {db} --run {_run_id(db)} --format csv "
                                  "--out $M/out; echo rc=$?; "
                                  "ls -a $M/out")
    assert "rc=2" in out.stdout and "cannot write" in out.stderr and "Traceback" not in out.stderr, \
        out.stdout + out.stderr[-3000:]
    assert ".part" not in out.stdout and "requests.csv" not in out.stdout  # no partial file left behind


def test_a_db_file_truncated_mid_run_stops_it_with_one_line(server, tmp_path):
    srv = server("ok")
    db = tmp_path / "t.duckdb"
    proc = subprocess.Popen([CAPBENCH, "run", "--target", srv.url, "--rate", "20", "--duration", "30", "--db",
                             str(db), "--no-live", "--model", "m", "--input-len", "20", "--output-len", "5"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while srv.count() < 20:  # a second of requests went out (and some rows were written)
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    time.sleep(1.5)
    os.truncate(db, 0)
    Path(f"{db}.wal").unlink(missing_ok=True)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the run stopped sending" in errors[0], err
    assert srv.count() < 20 * 30 * 0.8
