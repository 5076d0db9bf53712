"""A disaggregated deployment launched by a campaign (`capbench campaign` subprocesses), with a fake server standing
in for each role behind node templates (tests/bench/campaign/fake_pd.py): the cell completes through the router
with every role started and stopped (router, then decode, then prefill; no process left); a decode server that
dies at start fails the cell within 10 s naming it, one that dies mid-run fails it naming it too; SIGKILL of the
campaign mid-launch then --resume leaves no process behind; a prefill server that says it is a decode server fails
the cell with both identities, a router that routes to other servers than those launched fails it naming both lists.
Each campaign is a subprocess (2-4 s of imports on this machine): 5-15 s a test."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb

from tests.bench.campaign.test_campaign_run import CLI, ROOT, _cells, _dead

FAKE = Path(__file__).with_name("fake_pd.py")


def _campaign(tmp: Path, prefill_node: str = "n1", decode_node: str = "n1", router_node: str = "n1",
              **node_args: str) -> Path:
    """One disaggregated deployment (1 prefill, 1 decode, the router) on fake nodes: n1 a healthy one, and one per
    node_args entry whose fake gets those arguments (`bad="--mode fail"`)."""
    (tmp / "pids").touch()
    nodes = {"n1": "", **node_args}
    lines = "".join(f"        {n}: {{start: '{sys.executable} {FAKE} --pids {tmp / 'pids'} --served {tmp / 'served'} "
                    f"{extra} -- {{command}}'}}\n" for n, extra in nodes.items())
    f = tmp / "c.yaml"
    f.write_text("name: pd\nslo: \"ttft=10s,tpot=200ms\"\nduration: 0.5\nstop_grace: 3\nhealth_timeout: 30\n"
                 "deployments:\n  - name: glm-pd\n    disaggregated:\n      model: glm-4.6\n      kv_dtype: bf16\n"
                 "      nodes:\n" + lines +
                 f"      prefill: {{tp: 8, node: {prefill_node}}}\n      decode: {{tp: 8, node: {decode_node}}}\n"
                 f"      router: {{node: {router_node}}}\n"
                 "loads:\n  - {name: a, workload: chat, profile: poisson, rate: 4}\n")
    return f


def _run(f: Path, db: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, str(f), "--db", str(db), *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def _servers(db: Path) -> list[tuple[str, float | None]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT deployment, stopped_at FROM campaign_servers ORDER BY started_at").fetchall()


def test_a_disaggregated_cell_completes_through_the_router_and_every_role_is_stopped(tmp_path):
    db = tmp_path / "c.duckdb"
    out = _run(_campaign(tmp_path), db)
    assert out.returncode == 0, out.stderr[-3000:]
    assert _cells(db)["glm-pd/a"][0] == "completed"
    served = (tmp_path / "served").read_text().split("\n")
    by_role = {r: sum(1 for s in served if s.startswith(r + " ")) for r in ("router", "prefill", "decode")}
    assert by_role["router"] > 0 and by_role["router"] == by_role["prefill"] == by_role["decode"], by_role
    servers = _servers(db)
    assert [d for d, _ in servers] == ["glm-pd/prefill[0]", "glm-pd/decode[0]", "glm-pd/router"]
    stopped = {d: t for d, t in servers}
    assert None not in stopped.values()
    assert stopped["glm-pd/router"] <= stopped["glm-pd/decode[0]"] <= stopped["glm-pd/prefill[0]"]
    assert len((tmp_path / "pids").read_text().split()) == 3 and _dead(tmp_path / "pids") == []


def test_a_decode_server_that_dies_at_start_fails_the_cell_within_10_s_naming_it(tmp_path):
    f = _campaign(tmp_path, decode_node="bad", bad="--mode fail --delay 1")
    proc = subprocess.Popen([*CLI, str(f), "--db", str(tmp_path / "c.duckdb")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    started = failed = None
    for line in proc.stderr:
        if line.startswith("glm-pd: starting"):
            started = time.monotonic()
        if line.startswith("glm-pd: failed to start"):
            failed = time.monotonic()
            break
    rest = proc.communicate(timeout=60)[1]
    assert started is not None and failed is not None, rest
    assert failed - started < 10, f"noticed after {failed - started:.1f} s"
    assert proc.returncode == 1, rest
    status, error, log = _cells(tmp_path / "c.duckdb")["glm-pd/a"]
    assert status == "failed" and "the decode[0] server exited with code 1" in error, error
    assert "the decode server failed to start" in log
    assert _dead(tmp_path / "pids") == []


def test_sigkill_mid_launch_then_resume_leaves_no_process(tmp_path):
    hold = tmp_path / "hold"
    hold.touch()  # the prefill server does not answer while it exists: the campaign is mid-launch
    f = _campaign(tmp_path, prefill_node="slow", slow=f"--hold {hold}")
    db = tmp_path / "c.duckdb"
    proc = subprocess.Popen([*CLI, str(f), "--db", str(db)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, start_new_session=True)  # kill -9 of the campaign alone
    for line in proc.stderr:
        if line.startswith("glm-pd: starting"):
            break
    deadline = time.monotonic() + 10
    while len((tmp_path / "pids").read_text().split()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    launched = (tmp_path / "pids").read_text().split()
    assert len(launched) == 2
    assert _dead(tmp_path / "pids", wait_s=60) == [], "a role outlived its killed campaign (the watchdog ends both)"
    hold.unlink()
    out = _run(f, db, "--resume")
    assert _dead(tmp_path / "pids") == [], "a role's process outlived its campaign"
    assert all(t is not None for _, t in _servers(db))
    assert out.returncode == 0 and _cells(db)["glm-pd/a"][0] == "completed", out.stderr[-3000:]


def test_a_prefill_server_that_says_it_is_a_decode_server_fails_with_both_identities(tmp_path):
    f = _campaign(tmp_path, prefill_node="liar", liar="--say-mode decode")
    out = _run(f, tmp_path / "c.duckdb")
    assert out.returncode == 1, out.stderr[-3000:]
    status, error, _ = _cells(tmp_path / "c.duckdb")["glm-pd/a"]
    assert status == "failed" and "prefill[0]" in error and "mode differ" in error, error
    assert "expected mode prefill, model zai-org/GLM-4.6, tp 8, kv_dtype bf16" in error
    assert "the server says model zai-org/GLM-4.6, tp 8, kv_dtype bf16, mode decode" in error, error
    assert not (tmp_path / "served").exists()  # nothing was measured against it
    assert _dead(tmp_path / "pids") == []


def test_a_decode_server_that_dies_mid_run_fails_the_cell_naming_it(tmp_path):
    f = _campaign(tmp_path, decode_node="dying", dying="--mode die --die-after 1")  # 1 s after its first request
    f.write_text(f.read_text().replace("rate: 4}", "rate: 4, duration: 4}"))
    out = _run(f, tmp_path / "c.duckdb")
    assert out.returncode == 1, out.stderr[-3000:]
    status, error, log = _cells(tmp_path / "c.duckdb")["glm-pd/a"]
    assert status == "failed" and "went down during glm-pd/a" in error, error
    assert "the decode[0] server's launched process exited with code 3" in error, error
    assert "the server died" in log
    assert _dead(tmp_path / "pids") == []


def test_a_router_that_routes_to_other_servers_than_those_launched_fails_the_cell(tmp_path):
    f = _campaign(tmp_path, router_node="stray", stray="--say-decode http://127.0.0.1:9")
    # how long its list may lag: long enough for the servers to start on a loaded host (2 s was not), short enough
    # that the wait for a list that never matches does not dominate the test
    f.write_text(f.read_text().replace("health_timeout: 30", "health_timeout: 12"))
    out = _run(f, tmp_path / "c.duckdb")
    assert out.returncode == 1, out.stderr[-3000:]
    status, error, _ = _cells(tmp_path / "c.duckdb")["glm-pd/a"]
    assert status == "failed" and "the router at http://127.0.0.1:" in error, error
    assert "routes to prefill http://127.0.0.1:" in error and "decode http://127.0.0.1:9; launched prefill" in error
    assert not (tmp_path / "served").exists() and _dead(tmp_path / "pids") == []
