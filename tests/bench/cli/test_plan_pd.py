"""`capbench plan` with prefill/decode disaggregation and `capbench validate`'s disaggregated cases, as a user runs
them: real processes, stdout, stderr and exit codes."""

import json
import subprocess
import sys


def capbench(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:  # 127 s alone on a slow 2-core day
    return subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_plan_puts_the_cheapest_disaggregated_answer_beside_the_colocated_one():
    out = capbench("plan", "--model", "kimi-k2-thinking", "--gpus", "h200", "--input-len", "8000", "--output-len",
                   "300", "--rate", "4", "--slo", "ttft=5s,tpot=60ms", "--max-nodes", "2", "--workers", "1", "--json")
    assert out.returncode == 0, out.stderr
    pd = json.loads(out.stdout)["disaggregated"]
    assert pd["winner"] in ("colocated", "disaggregated")
    d = pd["disaggregated"]
    assert d is not None and d["gpus_total"] == d["prefill_instances"] * d["prefill_gpus"] + \
        d["decode_instances"] * d["decode_gpus"]
    assert d["kv_tokens_per_rank"] <= d["kv_pool_per_rank"]
    assert d["prefill_gpus"] <= 16 and d["decode_gpus"] <= 16  # --max-nodes 2
    assert d["tpot_s"] <= 0.06 and d["ttft_s"] <= 5.0
    assert pd["disaggregated_serving"] >= 1 and pd["disaggregated_searched"] >= pd["disaggregated_serving"]
    assert any("month" in w for w in pd["why"]) and any("assumptions" in e for e in pd["evidence"])


def test_plan_prints_the_comparison_and_every_launch_line():
    out = capbench("plan", "--model", "kimi-k2-thinking", "--gpus", "h200", "--input-len", "8000", "--output-len",
                   "300", "--rate", "4", "--slo", "ttft=5s,tpot=60ms", "--max-nodes", "2", "--workers", "1",
                   "--details")
    assert out.returncode == 0, out.stderr
    assert "Colocated vs prefill/decode disaggregated" in out.stdout
    assert "little evidence" in out.stdout
    commands = out.stdout.replace(" \\\n  ", " ")  # shell lines joined by backslashes within 120 columns
    assert "--disaggregation-mode prefill" in commands and "--disaggregation-mode decode" in commands
    assert "sglang_router.launch_router --pd-disaggregation" in commands


def test_no_pd_leaves_the_plan_as_it_was():
    out = capbench("plan", "--model", "kimi-k2-thinking", "--gpus", "h200", "--input-len", "8000", "--output-len",
                   "300", "--rate", "4", "--slo", "ttft=5s,tpot=60ms", "--no-pd", "--workers", "1", "--json")
    assert out.returncode == 0, out.stderr
    assert "disaggregated" not in json.loads(out.stdout)


def test_bad_max_nodes_is_one_line_and_exit_2():
    out = capbench("plan", "--model", "kimi-k2-thinking", "--max-nodes", "0", timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--max-nodes" in lines[0] and "Traceback" not in out.stderr


def test_validate_reports_the_disaggregated_cases_apart_with_their_errors():
    out = capbench("validate", "--case", "large-scale-ep", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    pd = {r["case"]: r for r in report["disaggregated"]}
    assert len(pd) == 6 and not [c for c in report["cases"] if c["case"] in pd]  # apart from the colocated corpus
    for case, r in pd.items():
        assert r["why_not"] is None, case
        (figure, err), = r["errors"].items()
        assert r["predicted"][figure] > 0 and -1 < err < 10
    first = capbench("validate", "--case", "large-scale-ep")  # the first screen counts them; --details shows them
    said = " ".join(first.stdout.split())
    assert first.returncode == 0 and "and 6 disaggregated" in said and "More: --details" in said
    text = capbench("validate", "--case", "large-scale-ep", "--details")
    assert text.returncode == 0 and "Prefill/decode disaggregated, wide-EP published runs" in text.stdout
    assert "little evidence" in text.stdout
