"""The capacity command as a user runs it: a real process, stdout, stderr and exit codes."""

import json
import subprocess
import sys

import pytest


def capbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=60)


def test_json_has_the_figures():
    out = capbench("capacity", "--model", "kimi-k2-thinking", "--gpu", "h200", "--tp", "8",
                   "--kv-dtype", "fp8_e4m3", "--weights", "int4-g32", "--json")
    assert out.returncode == 0, out.stderr
    fig = json.loads(out.stdout)
    for key in ("model", "gpu", "tp", "kv_dtype", "weights", "kv_bytes_per_token_per_gpu", "weight_bytes_per_gpu",
                "mem_fraction_static", "kv_pool_tokens", "max_running_requests",
                "max_concurrent_sequences_at_context", "fits"):
        assert key in fig
    assert fig["kv_bytes_per_token_per_gpu"] == 35136
    assert fig["fits"] is True
    assert fig["ratios"]["kv_pool_tokens"] == pytest.approx(2.0, rel=1e-4)


def test_compare_prints_four_rows_and_multi_node_note():
    out = capbench("capacity", "--model", "glm-4.6", "--gpu", "h100-sxm", "--tp", "16", "--compare")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("int4-g32") == 2 and out.stdout.count("fp8_e4m3") == 2
    assert "spans 2 nodes" in out.stdout


@pytest.mark.parametrize("args,message", [
    (["--model", "kimi", "--gpu", "h200", "--tp", "8"], "unknown model 'kimi'; valid:"),
    (["--model", "glm-4.6", "--gpu", "h300", "--tp", "8"], "unknown GPU 'h300'; valid:"),
    (["--model", "glm-4.6", "--gpu", "h200", "--tp", "6"], "power of two"),
    (["--model", "glm-4.6", "--gpu", "h200", "--tp", "8", "--context", "999999"], "beyond"),
    (["--model", "kimi-k2-instruct", "--gpu", "h100-sxm", "--tp", "8"], "does not fit"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    out = capbench("capacity", *args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
    assert "Traceback" not in out.stderr


def test_plan_gives_your_deployment_its_interval_and_evidence_beside_the_recommendation():
    """The demo's question (answered from the shipped plan cache), asked by someone who runs Kimi's native INT4
    experts: the recommendation is another configuration, and theirs still gets its own interval and the sentence
    that only 3 published cases stand behind it, with what those delivered."""
    out = capbench("plan", "--model", "kimi-k2-thinking", "--gpus", "h200", "--gpu", "h200", "--tp", "8",
                   "--kv-dtype", "fp8_e4m3", "--weights", "native", "--no-pd", "--details")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    yours = text.split("Yours: h200 x8 tp8, int4-g32 experts (native), fp8_e4m3 KV:", 1)
    assert len(yours) == 2, text[:2000]
    assert "Answer, colocated:" in yours[0] and "INT4" not in yours[0].split("Range:")[0]
    assert "80 % interval" in yours[1] and "Only 3 published cases for INT4 experts, MLA on Hopper (they delivered" \
        in yours[1] and "measure before buying" in yours[1]
