"""Campaigns as users run them (`capbench campaign FILE` as a subprocess) against twins, a URL that is down, and a
fake SGLang launcher behind a command template (serves after a delay, fails to start, dies mid-run): every cell
ends completed or failed, every process started is stopped, Ctrl-C aborts cleanly and --resume skips completed
cells."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb

from bench.store import Store, runinfo

ROOT = Path(__file__).resolve().parents[3]
FAKE = Path(__file__).with_name("fake_sglang.py")
CLI = [sys.executable, "-c", "from bench.cli import main; main()", "campaign"]


def _launcher(mode: str, pids: Path, **extra) -> str:
    args = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in extra.items())
    return (f"{{name: {mode}, health_timeout: 60, sglang: {{model: glm-4.6, tp: 8, kv_dtype: bf16, template: "
            f"{{start: '{sys.executable} {FAKE} --port {{port}} --mode {mode} --pids {pids} {args} -- "
            "{command}'}}}")


def _write(tmp_path: Path, deployments: list[str], loads: str) -> Path:
    f = tmp_path / "c.yaml"
    f.write_text("name: t\nslo: \"ttft=10s,tpot=200ms\"\nduration: 1.5\ndeployments:\n"
                 + "".join(f"  - {d}\n" for d in deployments) + "loads:\n" + loads)
    return f


LOADS = ("  - {name: a, workload: chat, profile: poisson, rate: 1}\n"
         "  - {name: b, workload: chat, profile: poisson, rate: 2}\n")


def _cells(db: Path) -> dict[str, tuple[str, str | None, str | None]]:
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT cell, status, error, log FROM campaign_cells").fetchall()
    return {c: (s, e, lg) for c, s, e, lg in rows}


def _dead(pids: Path, wait_s: float = 10.0) -> list[int]:
    """The recorded processes still alive after up to wait_s (a killed process is gone once it is reaped)."""
    deadline = time.time() + wait_s
    while True:
        alive = []
        for pid in (int(x) for x in pids.read_text().split()):
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    alive.append(pid)
            except (FileNotFoundError, ProcessLookupError):
                pass
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.2)


def test_cells_end_completed_or_failed_and_every_server_is_stopped(tmp_path):
    pids = tmp_path / "pids"
    pids.write_text("")
    f = _write(tmp_path, ['{name: twin, twin: "glm-4.6@h200x8,time_scale=10"}', _launcher("ok", pids),
                          _launcher("fail", pids), _launcher("die", pids, die_after=2.5),
                          "{name: down, url: 'http://127.0.0.1:9', health_timeout: 2}"],
               LOADS.replace("rate: 1}", "rate: 1, duration: 2}").replace("rate: 2}", "rate: 2, duration: 2}"))
    db = tmp_path / "c.duckdb"
    report = tmp_path / "campaign.html"
    out = subprocess.run([*CLI, str(f), "--db", str(db), "--report", str(report)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    html = report.read_text()
    assert "twin/a" in html and "fail/a: server log" in html and "CUDA out of memory" in html
    cells = _cells(db)
    assert set(cells) == {f"{d}/{x}" for d in ("twin", "ok", "fail", "die", "down") for x in ("a", "b")}
    assert {c: s for c, (s, _, _) in cells.items() if s == "completed"}.keys() >= {"twin/a", "twin/b", "ok/a", "ok/b"}
    assert all(s in ("completed", "failed") for s, _, _ in cells.values())
    for x in ("a", "b"):
        status, error, log = cells[f"fail/{x}"]
        assert status == "failed" and "exited with code 1" in error and "CUDA out of memory" in log
        assert cells[f"down/{x}"][0] == "failed" and "did not answer within 2 s" in cells[f"down/{x}"][1]
    died = [e for s, e, _ in (cells["die/a"], cells["die/b"]) if s == "failed"]
    assert died and all("down" in e for e in died), cells
    assert "CUDA out of memory" in out.stderr  # the failed launch's last log lines are shown
    assert _dead(pids) == [] and len(pids.read_text().split()) >= 4
    with duckdb.connect(str(db), read_only=True) as con:
        runs = con.execute("SELECT config FROM runs").fetchall()
        status = con.execute("SELECT status FROM campaigns").fetchone()[0]
    configs = [json.loads(c) for (c,) in runs]
    assert len(configs) >= 4 and all(c["campaign"].startswith("c") and "/" in c["cell"] for c in configs)
    assert status == "failed" and out.returncode == 1  # a campaign with a failed cell exits 1
    # a stage's rate is the same in its label (the campaign's, modelled time) and in the run's identity
    table = runinfo.list_runs(Store(db, read_only=True))
    staged = table[table.label.str.contains("rps")]
    assert len(staged) > 0
    for label, ident in zip(staged.label, staged.identity, strict=True):
        assert f" {label.rpartition('@')[2].removesuffix('rps')} req/s" in ident, (label, ident)
    assert "twin/a" in out.stdout and "ok/b" in out.stdout  # the campaign report


def test_ctrl_c_stops_the_servers_and_resume_skips_completed_cells(tmp_path):
    pids = tmp_path / "pids"
    pids.write_text("")
    f = _write(tmp_path, [_launcher("ok", pids), '{name: twin, twin: "glm-4.6@h200x8,time_scale=10"}'], LOADS)
    db = tmp_path / "c.duckdb"
    proc = subprocess.Popen([*CLI, str(f), "--db", str(db)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True, cwd=ROOT)
    seen = []
    deadline = time.time() + 180
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("ok/a: 1 req/s") or time.time() > deadline:
            break
    proc.send_signal(signal.SIGINT)  # while ok/b runs or is about to
    rest = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, "".join(seen) + rest
    assert "Traceback" not in rest and "ok: stopped" in rest
    assert _dead(pids) == []
    cells = _cells(db)
    assert cells["ok/a"][0] == "completed" and "twin/a" not in cells
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT status FROM campaigns").fetchone()[0] == "aborted"
    again = subprocess.run([*CLI, str(f), "--db", str(db), "--resume"], capture_output=True, text=True, timeout=300,
                           cwd=ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 already completed" in again.stderr and "ok/a:" not in again.stderr
    cells = _cells(db)
    assert {c: s for c, (s, _, _) in cells.items()} == {c: "completed" for c in ("ok/a", "ok/b", "twin/a", "twin/b")}
    with duckdb.connect(str(db), read_only=True) as con:
        per_cell = dict(con.execute("SELECT json_extract_string(config, '$.cell'), count(*) FROM runs "
                                    "GROUP BY ALL").fetchall())
        campaigns = con.execute("SELECT count(*), max(status) FROM campaigns").fetchone()
        twin_b = json.loads(con.execute("SELECT result FROM campaign_cells WHERE cell = 'twin/b'").fetchone()[0])
    # ok/a was not run again; ok/b's aborted run is kept; a twin stage that missed while behind was measured twice
    assert per_cell["ok/a"] == 1 and per_cell["twin/b"] == 1 + twin_b["points"][0]["reruns"]
    assert campaigns == (1, "completed") and _dead(pids) == []


def test_a_template_places_the_named_interpreter_and_image(tmp_path):
    """`python:` and `image:` reach the template's {python} and {image}; the checksum deployment needs capbench's
    patches, so the command is `PYTHON -m bench.cli sglang-launch --kv-checksum verify -- ...`."""
    pids, seen = tmp_path / "pids", tmp_path / "seen"
    pids.write_text("")
    dep = (f"{{name: boxed, health_timeout: 60, sglang: {{model: glm-4.6, tp: 8, kv_checksum: verify, "
           f"python: /opt/sglang/bin/python, image: 'lmsysorg/sglang:v0.5.3-cu129', template: {{start: "
           f"'echo {{python}} {{image}} > {seen}; {sys.executable} {FAKE} --port {{port}} --pids {pids} -- "
           "{command}'}}}")
    f = _write(tmp_path, [dep], "  - {name: a, workload: chat, profile: poisson, rate: 1}\n")
    out = subprocess.run([*CLI, str(f), "--db", str(tmp_path / "c.duckdb")], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert seen.read_text().split() == ["/opt/sglang/bin/python", "lmsysorg/sglang:v0.5.3-cu129"]
    log = next((tmp_path / "campaign-logs").rglob("*.log")).read_text()
    assert "launch command: -- /opt/sglang/bin/python -m bench.cli sglang-launch --kv-checksum verify --" in log
    assert _dead(pids) == []

