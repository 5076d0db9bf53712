"""A load's eval stage: its keys checked like the file's others (every problem one line), and a campaign of two twins
(BF16 KV, and FP8 KV against it) whose cells carry an eval stage, run as users run it: each cell's result holds its
eval run, and the report puts quality beside the gain, saying that twins answered."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.campaign import parse_campaign
from bench.errors import BadInput

ROOT = Path(__file__).resolve().parents[3]
FILE = """
name: q
slo: "ttft=10s,tpot=200ms"
duration: 1.5
deployments:
  - {name: bf16, twin: "glm-4.6@h200x8,kv=bf16,time_scale=10"}
  - {name: fp8, twin: "glm-4.6@h200x8,kv=fp8_e4m3,time_scale=10", baseline: bf16}
loads:
  - {name: chat, workload: chat, profile: poisson, rate: 1, eval: EVAL}
"""


def test_an_eval_stage_is_read_with_its_defaults():
    c = parse_campaign(FILE.replace("EVAL", "{suites: [humaneval, bfcl-simple], limit: 3}"))
    stage = c.loads[0].eval
    assert (stage.suites, stage.limit, stage.seed, stage.when) == ("humaneval,bfcl-simple", 3, 0, "after")
    assert parse_campaign(FILE.replace(", eval: EVAL", "")).loads[0].eval is None


@pytest.mark.parametrize(("value", "said"), [
    ("{suites: humaneval, speed: 3}", "loads[0].eval.speed: unknown key"),
    ("{suites: nope}", "loads[0].eval.suites: unknown suite 'nope'"),
    ("{suites: long}", "loads[0].eval.suites: long compares two endpoints"),
    ("{limit: 0}", "loads[0].eval.limit: a whole number from 1 to 100000, got 0"),
    ("{limit: 2.5}", "loads[0].eval.limit: a whole number"),
    ("{when: sometimes}", "loads[0].eval.when: 'sometimes' is not one of after, during"),
    ("{timeout: .inf}", "loads[0].eval.timeout: seconds from 1 to 86400"),
    ("humaneval", "loads[0].eval: a mapping with suites"),
])
def test_every_problem_of_an_eval_stage_is_one_line(value, said):
    with pytest.raises(BadInput) as e:
        parse_campaign(FILE.replace("EVAL", value))
    assert said in str(e.value)
    assert all(line.count(":") >= 1 for line in str(e.value).splitlines()[1:])


def test_the_stage_runs_capbench_eval_and_keeps_its_run_and_pass_rates(tmp_path):
    from bench.benchmarks.fake_eval import humaneval_fake, serve
    from bench.campaign.eval_stage import EvalStage, finish, start

    url, server = serve(humaneval_fake(set()))  # every answer wrong
    proc = start(EvalStage("humaneval", limit=3, when="during"), url, tmp_path / "s.duckdb", "campaign x eval", None)
    got = finish(proc, kv_scales=True)
    down = finish(start(EvalStage("humaneval", limit=2), "http://127.0.0.1:9", tmp_path / "s.duckdb", "x", None),
                  kv_scales=False)
    server.shutdown()
    assert got["kv_scales"] is True and got["twin"] is False and got["suites"]["humaneval"]["passed"] == 0
    assert got["suites"]["humaneval"]["scored"] == 3 and got["run_id"]
    assert "cannot read the model name" in down["error"]  # said in place of the quality, not raised


@pytest.mark.slow  # two twins, a load point and an eval stage each (about a minute on 2 busy cores)
def test_a_campaign_of_twins_puts_quality_beside_the_gain(tmp_path):
    f = tmp_path / "q.yaml"
    f.write_text(FILE.replace("EVAL", "{suites: humaneval, limit: 3}"))
    db, report = tmp_path / "q.duckdb", tmp_path / "q.html"
    out = subprocess.run([sys.executable, "-c", "from bench.cli import main; main()", "campaign", str(f), "--db",
                          str(db), "--report", str(report)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "chat: eval humaneval (after the load)" in out.stderr
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        results = {c: json.loads(r) for c, r in con.execute("SELECT cell, result FROM campaign_cells").fetchall()}
        answers = con.execute("SELECT count(*) FROM eval_answers").fetchone()[0]
    assert answers == 6
    for r in results.values():
        assert r["quality"]["twin"] is True and r["quality"]["suites"]["humaneval"]["scored"] == 3
    html = report.read_text()
    assert "Throughput and quality" in html and "FP8 KV, scale 1.0: " in html
    assert "HumanEval " in html and "answered by twins: synthetic text, not a model&#x27;s quality" in html
