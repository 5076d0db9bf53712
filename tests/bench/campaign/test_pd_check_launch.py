"""`capbench campaign --check` finds what a disaggregated launch would hit (issue 39, item 5): counts past the
stated bound, ports past 65535 (also as instances count up), ports that collide on one node across every role,
bootstrap and router ports, a KV scales file that is missing or not SGLang's, PD twins of an impossible shape.
Each is exit 2 with its line, run as a user runs it (the installed CLI, a scratch folder); nothing launches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.campaign import parse_campaign

CAPBENCH = str(Path(sys.executable).parent / "capbench")
NODES = ("      nodes:\n        g1: {start: 'ssh g1 {command}', host: g1}\n"
         "        g2: {start: 'ssh g2 {command}', host: g2}\n")
P = "      prefill: {tp: 8, dp: 8, ep: 8, node: g1%s}\n"
D = "      decode: {tp: 8, dp: 8, ep: 8, node: g2%s}\n"
R = "      router: {node: g1%s}\n"


def _pd(prefill: str = "", decode: str = "", router: str = "", top: str = "") -> str:
    return ("name: pd\nslo: \"ttft=4s,tpot=100ms\"\ndeployments:\n  - name: kimi-pd\n    disaggregated:\n"
            f"      model: kimi-k2-thinking\n      kv_dtype: fp8_e4m3\n{top}{NODES}{P % prefill}{D % decode}"
            f"{R % router}loads:\n  - {{name: x, workload: campaign-prefill-heavy, sweep: {{start: 0.5}}}}\n")


def _twin(prefill_tp: str) -> str:
    return ("name: t\nslo: \"ttft=4s,tpot=100ms\"\ndeployments:\n  - {name: pd, twin: "
            f"\"kimi-k2-thinking@h200x8,dp=8,kv=fp8_e4m3,prefill_tp={prefill_tp}\"}}\n"
            "loads:\n  - {name: x, workload: campaign-prefill-heavy, sweep: {start: 0.5}}\n")


BAD = {
    "decode-count-1e6": (_pd(decode=", count: 1000000"), "decode.count: 1000000 is out of range (at most 256)"),
    "gpus-past-4096": (_pd(decode=", count: 200, tp: 32, dp: 32, ep: 32"), "6,400 GPUs; a role has at most 4,096"),
    "decode-port-70000": (_pd(decode=", port: 70000"), "decode.port: 70000 is out of range (at most 65535)"),
    "bootstrap-99999": (_pd(prefill=", bootstrap_port: 99999"), "bootstrap_port: 99999 is out of range"),
    "router-port-70000": (_pd(router=", port: 70000"), "router.port: 70000 is out of range"),
    "ports-count-past-65535": (_pd(decode=", count: 4, port: 65534"), "take ports 65534 to 65537, past 65535"),
    "prefill-and-decode-one-port": (_pd(decode=", port: 31000", prefill=", port: 31000").replace(
        "node: g2", "node: g1"), "decode[0]'s port 31000 on g1 is prefill[0]'s port's too"),
    "router-on-bootstrap-port": (_pd(router=", port: 8998"),
                                 "router's port 8998 on g1 is prefill[0]'s bootstrap port's too"),
    "decode-ports-over-router": (_pd(decode=", count: 3, port: 7999").replace("node: g2", "node: g1"),
                                 "router's port 8000 on g1 is decode[1]'s port's too"),
    "kv-scales-missing": (_pd(top="      kv_scales: /nonexistent/scales.json\n"),
                          "kv_scales: /nonexistent/scales.json: no such KV scales file"),
    "kv-scales-not-json": (_pd(top="      kv_scales: scales.json\n"), "not a KV scales JSON"),
    "twin-prefill_tp-0": (_twin("0"), "prefill_tp is the prefill instance's GPUs, 1 to 4096"),
    "twin-prefill_tp-3": (_twin("3"), "prefill: kimi-k2-thinking (native weights) does not fit 3x h200"),
    "twin-prefill_tp-1e9": (_twin("1e9"), "bad value for prefill_tp"),
    "twin-prefill_tp-1000000000": (_twin("1000000000"), "prefill_tp is the prefill instance's GPUs, 1 to 4096"),
}


def _check(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    (tmp_path / "c.yaml").write_text(text)
    return subprocess.run([CAPBENCH, "campaign", "c.yaml", "--check"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("case", sorted(BAD))
def test_check_refuses_what_a_launch_would_hit(tmp_path, case):
    text, line = BAD[case]
    (tmp_path / "scales.json").write_text("{not json")
    r = _check(tmp_path, text)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert line in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 2, r.stderr  # the header and the one problem


def test_a_good_file_passes_and_a_valid_scales_file_is_accepted(tmp_path):
    scales = {"model_type": "kimi_k2", "kv_cache": {"dtype": "float8_e4m3fn",
                                                    "scaling_factor": {"0": {"0": 0.02, "1": 0.03}}}}
    (tmp_path / "s.json").write_text(json.dumps(scales))
    r = _check(tmp_path, _pd(top=f"      kv_scales: {tmp_path / 's.json'}\n"))
    assert r.returncode == 0, r.stderr
    assert "no problem found" in r.stdout


def test_a_count_of_150_launches_exactly_150():
    from bench.campaign.pd_launch import plan

    dep = parse_campaign(_pd(decode=", count: 150"), inline_templates=True).deployments[0]
    parts = plan(dep, free=iter(range(40000, 41000)).__next__)
    assert sum(p.role == "decode" for p in parts) == 150 and sum(p.role == "prefill" for p in parts) == 1
    router = parts[-1]
    assert router.argv.count("--decode") == 150 and len(router.workers["decode"]) == 150
    assert len({(p.host, p.port) for p in parts}) == len(parts)  # 152 launches, 152 ports
