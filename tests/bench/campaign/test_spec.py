"""The campaign file is checked before anything launches: every problem one line, exit 2, no traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

from bench.campaign import load_campaign, parse_campaign
from bench.errors import BadInput

ROOT = Path(__file__).resolve().parents[3]
GOOD = """
name: small
slo: "ttft=2s,tpot=50ms"
deployments:
  - {name: base, twin: "glm-4.6@h200x8,kv=bf16,time_scale=20"}
  - {name: fp8, twin: "glm-4.6@h200x8,kv=fp8_e4m3,time_scale=20", baseline: base}
  - name: staging
    sglang: {model: kimi-k2-thinking, tp: 8, kv_dtype: fp8_e4m3, kv_checksum: verify,
             flags: [--mem-fraction-static, "0.85"]}
  - {name: up, url: "http://127.0.0.1:30000", model: glm-4.6}
loads:
  - {name: chat, workload: chat, sweep: {start: 1, factor: 1.5}}
  - {name: fixed, workload: chat, profile: poisson, rate: 2}
"""


def test_a_good_file_gives_cells_and_deployments():
    c = parse_campaign(GOOD, inline_templates=True)
    assert [d.kind for d in c.deployments] == ["twin", "twin", "sglang", "url"]
    assert len(c.cells()) == 8 and c.deployment("fp8").kv_dtype == "fp8_e4m3"
    assert c.deployment("base").time_scale == 20 and c.deployment("staging").kv_checksum == "verify"
    assert c.loads[0].sweep.factor == 1.5 and c.loads[1].rate == 2


def test_every_problem_is_one_line():
    bad = GOOD.replace("kimi-k2-thinking", "kimi-k9").replace("kv=fp8_e4m3", "kv=fp7").replace(
        "factor: 1.5", "factor: 1.5, speed: 3").replace("baseline: base", "baseline: nobody").replace(
        "workload: chat, profile", "workload: no-such-workload, profile").replace("--mem-fraction-static", "--port")
    with pytest.raises(BadInput) as e:
        parse_campaign(bad, inline_templates=True)
    lines = str(e.value).splitlines()[1:]
    assert any(x.startswith("deployments[2].sglang.model: unknown model 'kimi-k9'") for x in lines)
    assert any(x.startswith("deployments[1].twin:") for x in lines)
    assert any(x.startswith("loads[0].sweep.speed: unknown key") for x in lines)
    assert any(x.startswith("loads[1].workload: unknown workload 'no-such-workload'") for x in lines)
    assert any(x.startswith("deployments[2].sglang.flags: --port sets port, which the campaign") for x in lines)
    assert len(lines) == 5, lines


def test_the_cli_reports_problems_before_launching(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(GOOD.replace("glm-4.6@h200x8,kv=bf16", "glm-9@h200x8,kv=bf16"))
    out = subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", "campaign", str(f), "--db",
                          str(tmp_path / "x.duckdb")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "deployments[0].twin:" in out.stderr and "glm-9" in out.stderr
    assert not (tmp_path / "x.duckdb").exists()  # nothing ran, nothing was written


def test_the_built_in_demo_campaign_is_valid():
    c = load_campaign("demo")
    models = {d.model for d in c.deployments}
    assert models == {"kimi-k2-thinking", "glm-4.6"} and {d.kv_dtype for d in c.deployments} == {"bf16", "fp8_e4m3"}
    assert {x.name for x in c.loads} == {"long-context", "agentic"} and all(x.sweep for x in c.loads)


def test_a_deployment_names_its_gpu_nodes_metrics_endpoints_and_bad_ones_are_one_line_each():
    good = GOOD.replace("{name: up, url: \"http://127.0.0.1:30000\", model: glm-4.6}",
                        "{name: up, url: \"http://127.0.0.1:30000\", model: glm-4.6, gpu_metrics: "
                        "[\"http://node1:9400/metrics\", \"http://node2:9400/metrics/\"]}")
    c = parse_campaign(good, inline_templates=True)
    assert c.deployment("up").gpu_metrics == ("http://node1:9400/metrics", "http://node2:9400/metrics")
    assert c.deployment("base").gpu_metrics == ()
    for value, said in (("\"http://node1:9400/metrics\"", "a list of URLs"), ("[]", "a list of URLs"),
                        ("[\"http://admin:pw-secret@node1:9400/metrics\"]", "credentials"),
                        ("[\"ftp://node1/metrics\"]", "expected http://HOST:PORT"),
                        ("[\"http://node1:9400/metrics?token=abcdef123456\"]", "like credentials")):
        bad = good.replace("gpu_metrics: [\"http://node1:9400/metrics\", \"http://node2:9400/metrics/\"]",
                           f"gpu_metrics: {value}")
        with pytest.raises(BadInput) as e:
            parse_campaign(bad, inline_templates=True)
        lines = str(e.value).splitlines()[1:]
        assert len(lines) == 1 and lines[0].startswith("deployments[3].gpu_metrics") and said in lines[0], lines
        assert "pw-secret" not in str(e.value)
