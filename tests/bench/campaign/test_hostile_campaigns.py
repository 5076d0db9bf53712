"""Campaign files under hostile use, as a user (or a visitor of `capbench serve`) gives them: `capbench campaign
FILE --check` answers every broken file with one line per problem and exit 2, quickly, never a traceback; the
queue moves what it refuses to rejected/ with the reason; a campaign queued on the service may carry no shell
command; SGLang's secret flags never reach a file, a log or a `ps` line."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.campaign import operator_templates, parse_campaign, pending, submit
from bench.campaign.queue import take_submissions
from bench.errors import BadInput
from bench.store import Store

ROOT = Path(__file__).resolve().parents[3]
CAPBENCH = str(Path(sys.executable).parent / "capbench")
BASE = """name: t
slo: "ttft=10s,tpot=200ms"
duration: 2
deployments:
  - {name: tw, twin: "glm-4.6@h200x8,time_scale=50"}
loads:
  - {name: a, workload: chat, profile: poisson, rate: 1}
"""
TWIN = 'twin: "glm-4.6@h200x8,time_scale=50"}'
LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
SECRET = "sk-live-Campaign/Key+0123456789"

BROKEN = {  # name -> (file text, what the one line says)
    "billion-laughs": (LAUGHS, "aliases (*name) are not accepted"),
    "deep-nesting": ("[" * 5000 + "]" * 5000, "nested deeper than"),
    "tp-abc": (BASE.replace(TWIN, "sglang: {model: glm-4.6, tp: abc}}"), "tp: expected a number, got 'abc'"),
    "port-99999": (BASE.replace(TWIN, "sglang: {model: glm-4.6, port: 99999}}"), "port: 99999 is out of range"),
    "duration-inf": (BASE.replace("duration: 2", "duration: .inf"), "duration: inf is out of range"),
    "time-scale-nan": (BASE.replace("time_scale=50", "time_scale=nan"), "time_scale=nan is out of range"),
    "rate-1e9": (BASE.replace("rate: 1}", "rate: 1e9}"), "rate: '1e9' is out of range"),
    "sweep-start-inf": (BASE.replace("profile: poisson, rate: 1", "sweep: {start: .inf}"), "start: inf is out"),
    "health-timeout-inf": (BASE.replace("duration: 2", "duration: 2\nhealth_timeout: .inf"),
                           "health_timeout: inf is out of range"),
    "workload-etc-passwd": (BASE.replace("workload: chat", "workload: /etc/passwd"), "loads[0].workload:"),
    "url-unclosed-ipv6": (BASE.replace(TWIN, 'url: "http://[::1"}'), "not a URL"),
    "url-credentials": (BASE.replace(TWIN, f'url: "http://user:{SECRET}@127.0.0.1:9"}}'), "credentials in the URL"),
    "url-key-in-query": (BASE.replace(TWIN, f'url: "http://127.0.0.1:9/v1?key={SECRET}"}}'), "like credentials"),
    "url-key-in-path": (BASE.replace(TWIN, f'url: "http://127.0.0.1:9/{SECRET}/v1"}}'), "like credentials"),
    "template-unknown-placeholder": (BASE.replace(TWIN, "sglang: {model: glm-4.6, template: {start: 'x {nope} "
                                                        "{command}'}}}"), "unknown placeholder(s) nope"),
    "template-positional": (BASE.replace(TWIN, "sglang: {model: glm-4.6, template: {start: 'x {0} {command}'}}}"),
                            "unknown placeholder(s) 0"),
    "template-lone-brace": (BASE.replace(TWIN, "sglang: {model: glm-4.6, template: {start: 'x { {command}'}}}"),
                            "literal brace"),
    "api-key-literal": (BASE.replace(TWIN, f"sglang: {{model: glm-4.6, flags: [--api-key, '{SECRET}']}}}}"),
                        "--api-key takes env:NAME"),
}


def _check(path: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([CAPBENCH, "campaign", str(path), "--check", "--db", str(cwd / "x.duckdb"), *extra],
                          capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_check_refuses_each_broken_file_in_one_line(tmp_path, case):
    text, says = BROKEN[case]
    f = tmp_path / f"{case}.yaml"
    f.write_text(text)
    t = time.monotonic()
    out = _check(f, tmp_path)
    assert time.monotonic() - t < 120  # the billion laughs used to never return (a slow machine: 39 s once)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert says in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2  # the count, then the one problem
    assert SECRET not in out.stderr and SECRET[:12] not in out.stderr
    assert not (tmp_path / "x.duckdb").exists()


@pytest.mark.parametrize("data", [os.urandom(4000), b"name: t\x00\x01\x02", b"\xff\xfe" + "é".encode("latin-1"),
                                  b"name: x\n" + b"# pad\n" * 60_000])
def test_binary_and_oversized_files_are_one_line(tmp_path, data):
    f = tmp_path / "c.yaml"
    f.write_bytes(data)
    out = _check(f, tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr


def test_a_workload_file_of_the_wrong_format_fails_the_check(tmp_path):
    (tmp_path / "convs.json").write_text("this is not JSON")
    f = tmp_path / "c.yaml"
    f.write_text(BASE.replace("workload: chat", f"workload: {tmp_path / 'convs.json'}"))
    out = _check(f, tmp_path)
    assert out.returncode == 2 and "not a ShareGPT JSON" in out.stderr and "Traceback" not in out.stderr


def test_a_campaign_path_works_from_any_folder(tmp_path):
    out = _check(Path("data/campaigns/kv-study.yaml"), tmp_path)
    assert out.returncode == 0, out.stderr
    assert "no problem found" in out.stdout
    missing = _check(Path("data/campaigns/nope.yaml"), tmp_path)
    assert missing.returncode == 2 and "data/campaigns/data" not in missing.stderr


def test_the_service_refuses_a_campaign_carrying_a_shell_command(tmp_path):
    shell = BASE.replace(TWIN, "sglang: {model: glm-4.6, template: {start: 'touch pwned; : {command}'}}}")
    with pytest.raises(BadInput) as e:
        parse_campaign(shell, "pasted.yaml")  # what the page and the queue call
    assert "refused: a campaign queued on capbench serve carries its own shell command" in str(e.value)
    assert len(str(e.value).splitlines()) == 2
    local = BASE.replace(TWIN, "sglang: {model: glm-4.6}}")  # a launch on the service's host: refused too
    with pytest.raises(BadInput, match="would launch SGLang on the service's host"):
        parse_campaign(local, "pasted.yaml")
    f = tmp_path / "c.yaml"
    f.write_text(shell)
    assert _check(f, tmp_path).returncode == 0  # the user's own file on the command line: accepted


def test_the_operators_templates_are_named_not_written(tmp_path):
    ops = tmp_path / "templates.yaml"
    ops.write_text("slurm: {start: 'srun --gpus 8 {command}', stop: 'scancel --name capbench', host: gpu-node-1}\n")
    templates = operator_templates(ops)
    named = BASE.replace(TWIN, "sglang: {model: glm-4.6, template: slurm}}")
    dep = parse_campaign(named, "q.yaml", templates).deployments[0]
    assert dep.template.start.startswith("srun") and dep.template.host == "gpu-node-1"
    with pytest.raises(BadInput, match="no launch template named 'slurm'"):
        parse_campaign(named, "q.yaml")  # a service started without --templates
    f = tmp_path / "c.yaml"
    f.write_text(named)
    assert _check(f, tmp_path, "--templates", str(ops)).returncode == 0
    ops.write_text("bad: {start: 'rm -rf {home} {command}'}\n")
    out = _check(f, tmp_path, "--templates", str(ops))
    assert out.returncode == 2 and "unknown placeholder(s) home" in out.stderr


def test_the_queue_moves_refused_files_to_rejected_with_the_reason(tmp_path):
    db = tmp_path / "c.duckdb"
    store = Store(db)
    submit(db, "shell.yaml", BASE.replace(TWIN, "sglang: {model: glm-4.6, template: {start: 'touch "
                                                f"{tmp_path}/pwned; : {{command}}'}}}}}}"))
    submit(db, "x" * 300 + ".yaml", BASE)  # a 300-character name: kept short in the folder
    submit(db, "laughs.yaml", LAUGHS)
    folder = pending(db)[0].parent
    (folder / "9-binary.yaml").write_bytes(b"\xff\xfe\x00\x01garbage")
    ids = take_submissions(store, db)
    assert len(ids) == 1 and pending(db) == []
    reasons = {p.name.split("-", 1)[1]: p.read_text() for p in (folder / "rejected").glob("*.reason.txt")}
    assert set(reasons) == {"shell.yaml.reason.txt", "laughs.yaml.reason.txt", "binary.yaml.reason.txt"}
    assert "carries its own shell command" in reasons["shell.yaml.reason.txt"]
    assert "not UTF-8" in reasons["binary.yaml.reason.txt"] and "aliases" in reasons["laughs.yaml.reason.txt"]
    assert not (tmp_path / "pwned").exists()


def test_secret_flags_stay_in_the_environment(tmp_path):
    """--api-key env:NAME: `capbench sglang-launch` fills the value in inside the server's own process; its
    command line (what `ps` shows), its printed exec line and the campaign text hold only the name."""
    fake = tmp_path / "fake" / "sglang"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "launch_server.py").write_text(
        "import json, os, sys, time\n"
        "cmdline = open(f'/proc/{os.getpid()}/cmdline', 'rb').read().decode()\n"
        "open(os.environ['CB_SAID'], 'w').write(json.dumps({'argv': sys.argv[1:], 'cmdline': cmdline}))\n")
    from engine_patches.launch import PatchOptions, build_command

    argv, env = build_command(PatchOptions(), ["--model-path", "m", "--api-key", "env:CB_TEST_KEY"])
    env = {**env, "CB_TEST_KEY": SECRET, "PYTHONPATH": f"{fake.parent}{os.pathsep}{env['PYTHONPATH']}",
           "CB_SAID": str(tmp_path / "said.json")}
    subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    said = json.loads((tmp_path / "said.json").read_text())
    assert said["argv"][-2:] == ["--api-key", SECRET]  # what SGLang parses
    assert SECRET not in said["cmdline"] and "env:CB_TEST_KEY" in said["cmdline"]  # what ps shows
    dry = subprocess.run([CAPBENCH, "sglang-launch", "--dry-run", "--", "--model-path", "m", "--api-key",
                          "env:CB_TEST_KEY"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "CB_TEST_KEY": SECRET})
    assert dry.returncode == 0 and SECRET not in dry.stdout + dry.stderr and "env:CB_TEST_KEY" in dry.stdout
    unset = subprocess.run([CAPBENCH, "sglang-launch", "--", "--model-path", "m", "--api-key", "env:CB_UNSET_KEY"],
                           capture_output=True, text=True, timeout=60)
    assert unset.returncode == 2 and "CB_UNSET_KEY" in unset.stderr and "Traceback" not in unset.stderr


def test_a_hung_stop_command_is_killed_with_its_children(tmp_path):
    fake = Path(__file__).with_name("fake_sglang.py")
    marker = f"hung-stop-{os.getpid()}-{time.time_ns()}"
    pids = tmp_path / "pids"
    pids.write_text("")
    f = tmp_path / "c.yaml"
    f.write_text(BASE.replace(TWIN, f"sglang: {{model: glm-4.6, tp: 8, template: {{start: '{sys.executable} {fake} "
                                    f"--port {{port}} --mode ok --pids {pids} -- {{command}}', stop: 'sh -c \"sleep "
                                    f"300; echo {marker}\" & sleep 300 # {marker}'}}}}, health_timeout: 60}}"))
    t = time.monotonic()
    out = subprocess.run([CAPBENCH, "campaign", str(f), "--db", str(tmp_path / "c.duckdb")], capture_output=True,
                         text=True, timeout=240, cwd=tmp_path, env={**os.environ, "CAPBENCH_STOP_TIMEOUT_S": "3"})
    assert out.returncode in (0, 1) and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert time.monotonic() - t < 200
    log = next((tmp_path / "campaign-logs").rglob("*.log")).read_text()
    assert "the stop command did not finish within 3 s: killed" in log
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert left == [], left  # neither the stop command nor its children are left running
    for pid in (int(x) for x in pids.read_text().split()):  # nor the server the template started
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
