"""Advice that fits the question: under a wide interval the plan points at a campaign file made for the asked
model, GPU, formats and load (`capbench plan ... --campaign FILE`, the report's download, the Planner's), never a
fixed example of another model; the file it writes passes `capbench campaign FILE --check`. The installed CLI, from
a tmp folder."""

import base64
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import yaml

from bench.benchmarks.plan_cache import planner_question
from bench.model import for_plan, make_plan

EXE = Path(__file__).resolve().parents[3] / ".venv" / "bin" / "capbench"


def capbench(tmp_path: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(EXE), *args], cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def test_the_plan_writes_a_campaign_file_for_its_question_that_checks(tmp_path):
    out = capbench(tmp_path, "plan", "--model", "glm-4.6", "--workload", "chat", "--rate", "10", "--gpus", "h200",
                   "--kv-dtype", "fp8_e4m3", "--slo", "ttft=2s,tpot=50ms,p=90", "--no-pd", "--campaign", "glm.yaml")
    assert out.returncode == 0, out.stderr
    assert "campaign file for this question: glm.yaml (check: capbench campaign glm.yaml --check)" in out.stderr
    assert "kv-study" not in out.stdout
    spec = yaml.safe_load((tmp_path / "glm.yaml").read_text())
    tp = re.search(r"Answer, colocated: \d+ x H200 tp(\d+)", out.stdout).group(1)
    assert spec["slo"] == "ttft=2s,tpot=50ms,p=90" and spec["loads"][0]["workload"] == "chat"
    deps = {d["name"]: d for d in spec["deployments"]}
    assert {d["sglang"]["model"] for d in deps.values()} == {"glm-4.6"}
    assert {d["sglang"]["gpu"] for d in deps.values()} == {"h200"}
    assert deps["recommended"]["sglang"]["tp"] == int(tp)
    if "bf16-kv-shipped-weights" in deps:  # the formats' baseline: what FP8 KV / converted experts buy
        assert deps["recommended"]["baseline"] == "bf16-kv-shipped-weights"
        assert deps["bf16-kv-shipped-weights"]["sglang"]["kv_dtype"] == "bf16"
    assert spec["loads"][0]["sweep"]["start"] > 0
    check = capbench(tmp_path, "campaign", "glm.yaml", "--check", timeout=300)
    assert check.returncode == 0, check.stderr
    assert "no problem found" in check.stdout


def test_a_question_of_fixed_lengths_gets_its_workload_file_beside_it(tmp_path):
    plan = make_plan(planner_question("glm-4.6"), workers=1)
    q = replace(plan.question, workload=None, input_tokens=32000, output_tokens=1000, max_concurrency=16)
    made = for_plan(replace(plan, question=q))
    assert made.workload_name == f"{made.name}-workload.yaml"
    (tmp_path / made.file_name).write_text(made.text)
    (tmp_path / made.workload_name).write_text(made.workload_text)
    spec = yaml.safe_load(made.text)
    assert spec["loads"][0]["workload"] == made.workload_name and spec["loads"][0]["max_concurrency"] == 16
    lengths = yaml.safe_load(made.workload_text)
    assert lengths["input"] == {"dist": "fixed", "value": 32000} and lengths["output"]["value"] == 1000
    check = capbench(tmp_path, "campaign", made.file_name, "--check", timeout=300)
    assert check.returncode == 0, check.stderr


def test_the_report_offers_the_campaign_file_as_a_download(tmp_path):
    out = capbench(tmp_path, "report", "--model", "glm-4.6", "--gpu", "h200", "--tp", "8", "--kv-dtype", "fp8_e4m3",
                   "--gpus", "h200", "--target-rate", "10", "--slo", "ttft=2s,tpot=50ms,p=90", "--workload", "chat",
                   "--db", str(tmp_path / "none.duckdb"), "--out", "r.html")
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "r.html").read_text()
    link = re.search(r"<a download='([^']+)' href='data:text/yaml;base64,([^']+)'>", page)
    assert link is not None and "Measure it: a campaign file for this question" in page
    (tmp_path / link.group(1)).write_bytes(base64.b64decode(link.group(2)))
    assert yaml.safe_load((tmp_path / link.group(1)).read_text())["deployments"][-1]["sglang"]["model"] == "glm-4.6"
    check = capbench(tmp_path, "campaign", link.group(1), "--check", timeout=300)
    assert check.returncode == 0, check.stderr
