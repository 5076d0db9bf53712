"""Launched servers are owned, and a campaign has one runner, as users meet it (`capbench campaign` subprocesses
against a fake SGLang launcher behind a template): SIGKILL of the campaign at random moments, then --resume, leaves
no process behind, records no cell from a server other than its own, keeps completed cells; a launcher that OOMs at
start with a stop template fails its cell within 10 s; a second runner is refused (a --resume beside the live
campaign, two --resumes after a kill); a server that is not the one launched fails its cell with both identities."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb

from tests.bench.campaign.test_campaign_run import CLI, FAKE, ROOT, _cells, _dead

KILLS = 5
PROGRESS_LINES = 15  # a fresh 4-cell campaign prints about 14: starting, stage results, stopped, ...


def _launcher(name: str, kv: str, tmp: Path, mode: str = "ok", stop: bool = True, extra: str = "") -> str:
    stop_cmd = ", stop: 'true'" if stop else ""
    return (f"{{name: {name}, health_timeout: 90, sglang: {{model: glm-4.6, tp: 8, kv_dtype: {kv}, template: "
            f"{{start: '{sys.executable} {FAKE} --port {{port}} --mode {mode} --pids {tmp / 'pids'} "
            f"--ports {tmp / 'ports'} --tag {name} {extra} -- {{command}}'{stop_cmd}}}}}}}")


def _campaign(tmp: Path, deployments: list[str], loads: str | None = None) -> Path:
    (tmp / "pids").touch()
    f = tmp / "c.yaml"
    f.write_text("name: own\nslo: \"ttft=10s,tpot=200ms\"\nduration: 1.5\nstop_grace: 5\ndeployments:\n"
                 + "".join(f"  - {d}\n" for d in deployments) + "loads:\n"
                 + (loads or "  - {name: a, workload: chat, profile: poisson, rate: 2}\n"
                              "  - {name: b, workload: chat, profile: poisson, rate: 3}\n"))
    return f


def _start(f: Path, db: Path, *args: str) -> subprocess.Popen:
    # its own session: a SIGKILL of the campaign alone, as `kill -9 PID` does, leaves its servers running
    return subprocess.Popen([*CLI, str(f), "--db", str(db), *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)


def _runs(db: Path) -> list[tuple[str, str, float, float]]:
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT config, started_at, finished_at FROM runs").fetchall()
    return [(json.loads(c)["cell"], json.loads(c)["target"], s, e) for c, s, e in rows]


def _completed(db: Path) -> set[tuple[str, str]]:
    if not db.exists():
        return set()
    with duckdb.connect(str(db), read_only=True) as con:
        return set(con.execute("SELECT campaign_id, cell FROM campaign_cells WHERE status = 'completed'").fetchall())


def _unfinished(db: Path) -> bool:
    if not db.exists():
        return False
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT count(*) FROM campaigns WHERE status <> 'completed'").fetchone()[0] > 0


def _kill_after(proc: subprocess.Popen, lines: int, delay_s: float) -> str:
    """SIGKILL the campaign delay_s after its `lines`-th progress line (a moment in any phase: starting, serving a
    stage, stopping a server), or sooner if it ends by itself; its stderr."""
    seen = []
    while len(seen) < lines:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
    try:
        proc.wait(timeout=delay_s)
    except subprocess.TimeoutExpired:
        pass
    proc.send_signal(signal.SIGKILL)
    return "".join(seen) + proc.communicate(timeout=30)[1]


def test_sigkill_at_random_moments_then_resume(tmp_path):
    """Each trial: --resume the unfinished campaign (or, once one completed, start a new one on the same DB), SIGKILL
    it at a random moment (a random progress line, then up to 4 s: no trial waits past the campaign's end); then
    resume to the end."""
    f = _campaign(tmp_path, [_launcher("bf16", "bf16", tmp_path), _launcher("fp8", "fp8_e4m3", tmp_path)])
    db = tmp_path / "c.duckdb"
    rng = random.Random(int(os.environ.get("CAPBENCH_KILL_SEED", "23")))
    kept: set[tuple[str, str]] = set()
    for k in range(KILLS):
        proc = _start(f, db, *(["--resume"] if _unfinished(db) else []))
        err = _kill_after(proc, rng.randrange(PROGRESS_LINES), rng.uniform(0.0, 4.0))
        assert "Traceback" not in err, err[-3000:]
        now = _completed(db)
        assert kept <= now, f"kill {k}: completed cells lost: {kept - now}"
        kept = now
    if _unfinished(db):
        done = subprocess.run([*CLI, str(f), "--db", str(db), "--resume"], capture_output=True, text=True,
                              timeout=400, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-3000:]
    assert _dead(tmp_path / "pids") == [], "a launched process outlived its campaign"
    assert kept <= _completed(db) and not _unfinished(db)
    with duckdb.connect(str(db), read_only=True) as con:
        last = con.execute("SELECT campaign_id FROM campaigns ORDER BY submitted_at DESC LIMIT 1").fetchone()[0]
        assert con.execute("SELECT count(*) FROM campaign_servers WHERE stopped_at IS NULL").fetchone()[0] == 0
        n_campaigns = con.execute("SELECT count(*) FROM campaigns").fetchone()[0]
    assert {c for cid, c in _completed(db) if cid == last} == {f"{d}/{x}" for d in ("bf16", "fp8") for x in ("a", "b")}
    # every run was against a server its own deployment launched (the ports each launch served on)
    ports: dict[str, set[str]] = {}
    for line in (tmp_path / "ports").read_text().split("\n"):
        if line:
            tag, port = line.split()
            ports.setdefault(tag, set()).add(port)
    for cell, target, _, _ in _runs(db):
        assert target.rsplit(":", 1)[1] in ports[cell.split("/")[0]], (cell, target, ports)
    print(f"\n{KILLS} SIGKILLs then --resume: {n_campaigns} campaign(s), {len(kept)} completed cells kept across "
          f"kills, {len((tmp_path / 'pids').read_text().split())} processes launched, 0 left behind")


def test_a_launcher_that_ooms_at_start_with_a_stop_template_fails_within_10_s(tmp_path):
    f = _campaign(tmp_path, [_launcher("oom", "bf16", tmp_path, mode="fail", extra="--delay 1")],
                  "  - {name: a, workload: chat, profile: poisson, rate: 2}\n")
    proc = _start(f, tmp_path / "c.duckdb")
    started = failed = None
    for line in proc.stderr:
        if line.startswith("oom: starting"):
            started = time.monotonic()
        if line.startswith("oom: failed to start"):
            failed = time.monotonic()
            break
    rest = proc.communicate(timeout=60)[1]
    assert started is not None and failed is not None, rest
    assert failed - started < 10, f"noticed after {failed - started:.1f} s"
    assert proc.returncode == 1, rest  # a campaign with a failed cell exits 1
    status, error, log = _cells(tmp_path / "c.duckdb")["oom/a"]
    assert status == "failed" and "exited with code 1" in error and "CUDA out of memory" in log
    assert _dead(tmp_path / "pids") == []


def _wait_for(proc: subprocess.Popen, text: str, timeout_s: float = 120) -> list[str]:
    seen, deadline = [], time.time() + timeout_s
    for line in proc.stderr:
        seen.append(line)
        if text in line or time.time() > deadline:
            break
    return seen


def test_a_resume_beside_the_live_campaign_is_refused(tmp_path):
    # the launched server serves only once the gate file exists, so the live campaign is still running when the
    # resume starts, however slow the machine
    gate = tmp_path / "gate"
    f = _campaign(tmp_path, [_launcher("bf16", "bf16", tmp_path, extra=f"--wait-for {gate}")],
                  "  - {name: a, workload: chat, profile: poisson, rate: 2}\n")
    db = tmp_path / "c.duckdb"
    live = _start(f, db)
    seen = _wait_for(live, "bf16: starting")
    assert any("bf16: starting" in s for s in seen), seen
    second = subprocess.run([*CLI, str(f), "--db", str(db), "--resume"], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    gate.touch()
    assert second.returncode == 2 and "a second runner is refused" in second.stderr, second.stderr[-2000:]
    assert f"pid {live.pid}" in second.stderr and "Traceback" not in second.stderr
    rest = live.communicate(timeout=300)[1]
    assert live.returncode == 0, rest[-3000:]
    per_cell = [c for c, *_ in _runs(db)]
    assert per_cell == ["bf16/a"]  # measured once, by the live runner alone
    assert _dead(tmp_path / "pids") == []


def test_two_resumes_after_a_kill_one_runs_the_other_is_refused(tmp_path):
    f = _campaign(tmp_path, [_launcher("bf16", "bf16", tmp_path)])
    db = tmp_path / "c.duckdb"
    first = _start(f, db)
    _wait_for(first, "bf16: starting")
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    a, b = _start(f, db, "--resume"), _start(f, db, "--resume")
    out_a, out_b = a.communicate(timeout=300)[1], b.communicate(timeout=300)[1]
    codes = sorted([a.returncode, b.returncode])
    assert codes == [0, 2], (out_a[-2000:], out_b[-2000:])
    refused = out_a if a.returncode == 2 else out_b
    assert "a second runner is refused" in refused and "Traceback" not in refused
    runs = sorted(_runs(db), key=lambda r: r[2])
    assert sorted(c for c, *_ in runs) == ["bf16/a", "bf16/b"]  # no cell measured twice, none concurrently
    assert all(x[3] <= y[2] for x, y in zip(runs, runs[1:], strict=False))
    assert _dead(tmp_path / "pids") == []


def test_a_server_that_is_not_the_one_launched_fails_its_cells_with_both_identities(tmp_path):
    f = _campaign(tmp_path, [_launcher("fp8", "fp8_e4m3", tmp_path, extra="--serve-kv bf16")],
                  "  - {name: a, workload: chat, profile: poisson, rate: 2}\n")
    out = subprocess.run([*CLI, str(f), "--db", str(tmp_path / "c.duckdb")], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 1, out.stderr[-3000:]
    status, error, _ = _cells(tmp_path / "c.duckdb")["fp8/a"]
    assert status == "failed" and "kv_dtype differ" in error
    assert "expected model zai-org/GLM-4.6, tp 8, kv_dtype fp8_e4m3" in error and "kv_dtype bf16" in error, error
    assert _runs(tmp_path / "c.duckdb") == [] and _dead(tmp_path / "pids") == []
