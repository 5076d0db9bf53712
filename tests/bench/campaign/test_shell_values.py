"""Values are data, never shell. The operator's `ssh gpu1 {command}` and `bash -c '{command}'` templates, with a
stand-in ssh that does what OpenSSH does (joins its arguments with spaces and runs them through `sh -c`), and every
field a visitor of `capbench serve` (or a campaign file on the command line) controls, carrying `$(...)`,
backticks, `;`, `&&`, a newline or quotes around `touch MARKER`: refused in one line per field, exit 2, and no
marker file, ever: through `capbench campaign --check`, a real `capbench campaign` run, the serve queue, and
launch.spawn itself (a command word with shell characters is never filled into a template)."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.campaign import operator_templates, parse_campaign
from bench.campaign.launch import LaunchFailed, spawn
from bench.errors import BadInput

CAPBENCH = str(Path(sys.executable).parent / "capbench")
FAKE = Path(__file__).with_name("fake_sglang.py")
PAYLOADS = {"subst": "x$(touch {m})", "backticks": "x`touch {m}`", "semicolon": "x;touch {m}",
            "and": "x&&touch {m}", "newline": "x\ntouch {m}", "single-quote": "x';touch {m};'",
            "double-quote": 'x";touch {m};"', "spaced": "x $(touch {m})"}


def _q(s: str) -> str:
    """A YAML double-quoted scalar holding s exactly."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _campaign(p: str, template: str = "ssh") -> str:
    """A campaign with the payload in every field a visitor controls that can reach a launch."""
    q = _q(p)
    return f"""name: {q}
slo: "ttft=10s,tpot=200ms"
duration: 2
deployments:
  - name: {q}
    sglang: {{model: glm-4.6, tp: 8, template: {template}, model_path: {q}, kv_scales: {q},
              flags: [--served-model-name, {q}, {_q('--chat-template=' + p)}]}}
  - name: pd
    disaggregated:
      model: glm-4.6
      model_path: {q}
      kv_scales: {q}
      nodes: {{gpu1: {template}, {q}: {template}}}
      prefill: {{count: 1, tp: 8, node: gpu1, flags: [--served-model-name, {q}]}}
      decode: {{count: 1, tp: 8, node: gpu1, flags: [{_q('--served-model-name=' + p)}]}}
      router: {{node: gpu1, flags: [--policy, {q}]}}
loads:
  - {{name: {q}, workload: chat, profile: poisson, rate: 1}}
"""


FIELDS = ("name", "deployments[0].name", "deployments[0].sglang.model_path", "deployments[0].sglang.kv_scales",
          "deployments[0].sglang.flags", "deployments[1].disaggregated.model_path",
          "deployments[1].disaggregated.kv_scales", "deployments[1].disaggregated.nodes",
          "deployments[1].disaggregated.prefill.flags", "deployments[1].disaggregated.decode.flags",
          "deployments[1].disaggregated.router.flags", "loads[0].name")


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A stand-in `ssh` first on PATH (OpenSSH's behaviour: the words after the host joined by spaces, run by the
    remote shell), and the operator's templates through it and through `bash -c '...'`."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "ssh").write_text('#!/bin/sh\nshift\nexec sh -c "$*"\n')
    (bin_ / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    ops = tmp_path / "templates.yaml"
    ops.write_text("ssh: {start: 'ssh gpu1 {command}', stop: 'ssh gpu1 true', host: 127.0.0.1}\n"
                   "bashc: {start: \"bash -c '{command}'\", host: 127.0.0.1}\n")
    return ops


def _markers(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.rglob("PWNED*"))


@pytest.mark.parametrize("template", ["ssh", "bashc"])
@pytest.mark.parametrize("kind", sorted(PAYLOADS))
def test_every_visitor_field_is_refused_in_one_line_each(tmp_path, node, kind, template):
    text = _campaign(PAYLOADS[kind].format(m=tmp_path / f"PWNED-{kind}"), template)
    with pytest.raises(BadInput) as e:
        parse_campaign(text, "queued.yaml", operator_templates(node))  # what the page and the queue call
    lines = str(e.value).splitlines()[1:]
    for field in FIELDS:
        assert any(x.startswith(field) for x in lines), (field, lines)
    assert _markers(tmp_path) == []


def test_the_cli_check_and_the_run_refuse_and_run_nothing(tmp_path, node):
    for kind in ("subst", "newline", "single-quote"):
        f = tmp_path / f"{kind}.yaml"
        f.write_text(_campaign(PAYLOADS[kind].format(m=tmp_path / f"PWNED-{kind}")))
        for extra in (["--check"], []):
            out = subprocess.run([CAPBENCH, "campaign", str(f), "--templates", str(node), "--db",
                                  str(tmp_path / "c.duckdb"), *extra], capture_output=True, text=True, timeout=120,
                                 cwd=tmp_path, env=os.environ)
            assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
            assert "deployments[0].sglang.model_path:" in out.stderr and "a shell would read" in out.stderr
    assert _markers(tmp_path) == [] and not (tmp_path / "campaign-logs").exists()


def test_spawn_never_fills_a_shell_word_into_a_template(tmp_path, node):
    templates = operator_templates(node)
    for name, t in templates.items():
        marker = tmp_path / f"PWNED-spawn-{name}"
        with pytest.raises(LaunchFailed, match="refused to launch"):
            spawn("d", ["capbench", "sglang-launch", "--", "--model-path", f"x$(touch {marker})"], t, 30000,
                  "127.0.0.1", tmp_path / "logs", None, "")
    assert _markers(tmp_path) == []


def test_a_plain_launch_through_the_stand_in_ssh_keeps_every_word(tmp_path, node):
    """The same template with good values launches, and the server sees exactly the words the campaign gave."""
    pids = tmp_path / "pids"
    pids.write_text("")
    ops = tmp_path / "ops.yaml"
    ops.write_text(f"ssh: {{start: 'ssh gpu1 {sys.executable} {FAKE} --port {{port}} --pids {pids} -- {{command}}', "
                   "host: 127.0.0.1}\n")
    f = tmp_path / "c.yaml"
    f.write_text("name: ok\nslo: \"ttft=10s,tpot=200ms\"\nduration: 2\ndeployments:\n"
                 "  - {name: s, health_timeout: 90, sglang: {model: glm-4.6, tp: 8, template: ssh, "
                 "model_path: '/srv/a+b@c,d=e:f%g/GLM-4.6', "
                 "flags: [--mem-fraction-static, '0.8', --served-model-name=a:b@c]}}\n"
                 "loads:\n  - {name: a, workload: chat, profile: poisson, rate: 1}\n")
    out = subprocess.run([CAPBENCH, "campaign", str(f), "--templates", str(ops), "--db", str(tmp_path / "c.duckdb")],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=os.environ)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    log = next((tmp_path / "campaign-logs").rglob("s-*.log")).read_text()
    said = next(x for x in log.splitlines() if x.startswith("launch command:")).split()[2:]
    assert said[said.index("--model-path") + 1] == "/srv/a+b@c,d=e:f%g/GLM-4.6"
    assert "--served-model-name=a:b@c" in said and said[said.index("--mem-fraction-static") + 1] == "0.8"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_serve_queue_refuses_them_and_runs_nothing(tmp_path, node):
    """`capbench serve --templates`: files the page would queue (its queue folder), each moved to rejected/ with
    every field named; no marker, and the service stays up."""
    db = tmp_path / "c.duckdb"
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([CAPBENCH, "serve", "--db", str(db), "--port", str(_free_port()), "--templates",
                                 str(node)], stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, env=os.environ)
    try:
        queue = tmp_path / "campaign-queue"
        deadline = time.monotonic() + 90
        while "queue folder" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.3)
        for kind, p in PAYLOADS.items():
            (queue / f"{kind}.part").write_text(_campaign(p.format(m=tmp_path / f"PWNED-{kind}")))
            (queue / f"{kind}.part").replace(queue / f"{kind}.yaml")
        while len(list((queue / "rejected").glob("*.reason.txt"))) < len(PAYLOADS):
            assert proc.poll() is None and time.monotonic() < deadline + 60, log.read_text()[-2000:]
            time.sleep(0.3)
        for reason in (queue / "rejected").glob("*.reason.txt"):
            text = reason.read_text()
            assert all(field in text for field in FIELDS), text
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
    assert _markers(tmp_path) == []
