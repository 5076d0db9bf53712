"""The capacity command as a user runs it: a real process, stdout, stderr and exit codes."""

import json
import subprocess
import sys

import pytest


def capbench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=timeout)


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


def test_plan_recommends_a_pool_that_holds_the_context_with_its_interval_and_evidence():
    """The demo's question (answered from the shipped plan cache), asked by someone who runs Kimi's native INT4
    experts with FP8 KV: FP8-block experts (a conversion) serve the load for less, but their KV pool holds no
    sequence at Kimi's 262,144-token context, so the answer is the shipped INT4 with FP8 KV, with its own interval
    and the sentence that only 3 published cases stand behind it."""
    out = capbench("plan", "--model", "kimi-k2-thinking", "--gpus", "h200", "--gpu", "h200", "--tp", "8",
                   "--kv-dtype", "fp8_e4m3", "--weights", "native", "--no-pd", "--details", timeout=900)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    answer = text.split("Answer, colocated:", 1)[1].split(" GPUs, $", 1)[0]
    assert "INT4-G32 experts (shipped), FP8 KV" in answer, answer
    assert "80 % interval" in text and "Only 3 published cases for INT4 experts, MLA on Hopper (they delivered" \
        in text and "measure before buying" in text
