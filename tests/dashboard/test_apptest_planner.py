"""The Planner page: the figures are the plan's own, the same as `capbench plan --json` and `capbench report`
give for the same question, and each input moves the figures it should."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from bench.model import Question, capacity, catalog, make_plan
from bench.model.answer import make_headline
from bench.model.pd import versus as pd_versus
from bench.report import build, wording
from bench.report.content import answer_lines
from tests.dashboard.apptest import ROOT, metric, no_exception

CAPBENCH = str(Path(sys.executable).parent / "capbench")


def planner() -> AppTest:
    return AppTest.from_file(str(ROOT / "dashboard" / "views" / "planner.py"), default_timeout=900).run()


@pytest.fixture(scope="module")
def at():
    return planner()


def test_planner_cli_and_report_give_one_answer(at):
    no_exception(at)
    # the page's defaults: Kimi K2 Thinking on 8 x H200, FP8 KV, native weights, chat, 10 req/s, H200 searched
    dep = capacity.Deployment(catalog.model("kimi-k2-thinking"), catalog.gpu("h200"), 8, kv_dtype="fp8_e4m3")
    q = Question(model="kimi-k2-thinking", gpu="h200", tp=8, gpus=8, kv_dtype="fp8_e4m3", context=dep.context_len,
                 workload="chat", price_per_gpu_hour=3.79, search_gpus=("h200",))
    plan = make_plan(q)
    assert metric(at, "KV pool tokens") == capacity.capacity(dep).kv_pool_tokens
    assert metric(at, "Max rate within SLO") == round(plan.chosen.prediction.rate_rps, 2)
    assert metric(at, "GPUs needed for 10 req/s") == plan.chosen.gpus_needed
    assert metric(at, "$ per 1M output tokens") == round(plan.chosen.usd_per_m_output, 2)
    rec = plan.recommended
    # the answer (colocated or disaggregated, whichever is cheaper), from the one headline the CLI and the report
    # print, with every role's launch lines
    head = make_headline(plan, pd_versus.compare(plan))
    lines = wording.headline_lines(head, 10**6, launch=False)
    assert at.success[0].value == "  \n".join(lines)
    assert any(c.value == "\n".join(head.launch) for c in at.code)
    assert any("80 % interval" in c.value for c in at.caption)
    first = subprocess.run([CAPBENCH, "plan", "--model", "kimi-k2-thinking", "--gpus", "h200", "--gpu", "h200",
                            "--tp", "8", "--kv-dtype", "fp8_e4m3", "--rate", "10", "--price", "3.79"],
                           capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "100"})
    assert first.returncode == 0, first.stderr[-2000:]
    screen = [x for x in first.stdout.splitlines() if x.strip()][:15]
    assert all(len(x) <= 100 for x in screen)
    assert " ".join(" ".join(screen).split()).startswith(" ".join(" ".join(lines).split()))
    commands = [c for c in head.launch if not c.startswith("#")]
    if len(commands) == 1:  # the whole command, as shell lines, on the first screen
        wrapped = wording.shell_wrapped(commands[0], 100)
        assert "Launch:" in screen and screen[screen.index("Launch:") + 1:][:len(wrapped)] == wrapped
    else:
        assert any(x.startswith(f"Launch: {len(commands)} commands") for x in screen)

    cli = subprocess.run([CAPBENCH, "plan", "--model", "kimi-k2-thinking", "--gpus", "h200", "--gpu", "h200",
                          "--tp", "8", "--kv-dtype", "fp8_e4m3", "--rate", "10", "--price", "3.79", "--json"],
                         capture_output=True, text=True, timeout=900)
    assert cli.returncode == 0, cli.stderr[-2000:]
    out = json.loads(cli.stdout)
    for key in ("rate_rps", "output_tps", "usd_per_m_output", "gpus_needed", "monthly_cost", "config"):
        assert out["recommended"][key] == rec.to_row()[key], key
    chosen = next(r for r in out["configurations"] if r["chosen"])
    assert chosen["rate_rps"] == plan.chosen.prediction.rate_rps

    report = build(q, None)
    assert report.plan.recommended.to_row()["monthly_cost"] == rec.monthly_cost
    assert answer_lines(report)[:len(lines)] == lines


def test_planner_follows_its_inputs(at):
    gpus_10, cost = metric(at, "GPUs needed for 10 req/s"), metric(at, "$ per 1M output tokens")
    at.selectbox(key="kv_dtype").set_value("bf16").run()
    no_exception(at)
    bf16 = capacity.Deployment(catalog.model("kimi-k2-thinking"), catalog.gpu("h200"), 8, kv_dtype="bf16")
    fp8 = capacity.Deployment(catalog.model("kimi-k2-thinking"), catalog.gpu("h200"), 8, kv_dtype="fp8_e4m3")
    assert metric(at, "KV pool tokens") == capacity.capacity(bf16).kv_pool_tokens
    # FP8 halves the bytes per token; flashmla's 64-token pages (the FP8 backend) round the pool down a little
    assert 1.99 < capacity.capacity(fp8).kv_pool_tokens / metric(at, "KV pool tokens") <= 2.0
    at.selectbox(key="kv_dtype").set_value("fp8_e4m3").run()

    at.number_input(key="target_rate").set_value(40.0).run()  # four times the load: at least as many GPUs
    gpus_40 = metric(at, "GPUs needed for 40 req/s")
    assert gpus_40 >= gpus_10 and gpus_40 > 8
    assert metric(at, "Monthly cost for 40 req/s") == round(gpus_40 * 3.79 * 730)

    at.number_input(key="price_h200").set_value(7.58).run()  # the price scales the cost per token
    assert abs(metric(at, "$ per 1M output tokens") - 2 * cost) < 0.02

    at.selectbox(key="model").set_value("glm-4.6").run()  # another model: its own capacity and commands
    no_exception(at)
    glm = capacity.Deployment(catalog.model("glm-4.6"), catalog.gpu("h200"), 8, kv_dtype="fp8_e4m3")
    assert metric(at, "KV pool tokens") == capacity.capacity(glm).kv_pool_tokens
    assert any("GLM-4.6" in h.value for h in at.subheader)
    # the answer's launch lines (colocated or each PD role), through capbench's patched launcher
    assert any("capbench sglang-launch" in c.value and "glm-4.6" in c.value.lower() for c in at.code)


def test_planner_says_what_is_wrong_with_bad_input():
    at = planner()
    at.selectbox(key="workload").set_value("custom").run()
    at.number_input(key="context_kimi-k2-thinking").set_value(1024).run()
    no_exception(at)
    assert any("exceed the context length 1024" in e.value for e in at.error)
