"""`capbench report`: a self-contained page (tables, inline SVG charts, no script, no external reference) that
answers the question from the plan, with and without measured runs."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.model import Question, make_plan
from bench.report import build, render, wording
from tests.rundb import RUNS, fill

Q = Question(model="kimi-k2-thinking", gpu="h200", tp=8, workload="chat", target_rate_rps=20, search_gpus=("h200",))
CAPBENCH = str(Path(sys.executable).parent / "capbench")


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "capbench.duckdb"
    return path, fill(path)


def assert_self_contained(page: str) -> None:
    assert "<script" not in page.lower()
    assert not re.search(r"<link\b", page, re.I)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert not re.search(r"@import|url\(\s*['\"]?https?:", page, re.I)


def test_report_with_runs_has_tables_charts_and_the_measurements(db):
    path, ids = db
    r = build(Q, path)
    page = render(r, "html")
    assert_self_contained(page)
    assert page.count("<table>") >= 6  # configs, capacity, predicted, measured, vs, integrity
    assert page.count("<svg") >= 6  # 4 plan charts, measured latency, measured vs predicted
    kimi_runs = [label for label, config, *_ in RUNS if config["model"] == "kimi-k2-thinking"]
    assert {m.label.rsplit(" · ", 1)[-1].strip("'") for m in r.runs} == set(kimi_runs)  # the model's, not GLM's
    assert all(" · measured on " in m.label for m in r.runs)  # every run says what it ran and where
    for label in kimi_runs:
        assert label in page
    for heading in ("The question", "The answer", "Configurations compared", "Measured results",
                    "Predicted vs measured", "KV cache integrity", "Launch commands"):
        assert heading in page
    assert "Nothing was measured" not in page
    rec = make_plan(Q).recommended
    # the answer first, the CLI's and the Planner's headline (colocated or disaggregated, whichever is cheaper)
    head = r.headline
    answer = html.escape(wording.headline_lines(head, 10**6, launch=False)[1], quote=True)
    assert answer in page and page.index(answer) < page.index("Configurations compared")
    assert f"${head.monthly_cost:,.0f} a month" in page
    if head.kind == "disaggregated":  # its every role's lines, then the colocated runner-up's
        assert all(html.escape(c, quote=True) in page for c in head.launch if not c.startswith("#"))
        assert "Not modelled: prefill/decode" not in page
    # launch commands: one node, and one instance over two nodes
    assert "capbench sglang-launch --kv-checksum verify" in page
    assert rec.launch()[0] in page  # the priced command: every flag of the recommended configuration
    assert "80 % interval" in page and "Intervals: every predicted figure carries" in page
    you = r.plan.chosen  # the asker's own deployment, when not the answer, gets its interval and evidence too
    assert you.config == rec.config or f"Your choice, {you.label}:" in page
    if head.kind == "colocated" and "int4" in rec.weights + wording.experts(rec):  # thin evidence, said
        assert "only 3 published cases for int4 experts, mla on hopper (they delivered" in page.lower()
    assert "--tp 16" in page and "--nnodes 2 --node-rank 1 --dist-init-addr" in page


def test_report_without_runs_is_a_planning_report(tmp_path):
    r = build(Question(model="glm-4.6", gpu="h200", tp=8, workload="chat", search_gpus=("h200", "b200")),
              tmp_path / "none.duckdb")
    page = render(r, "html")
    assert_self_contained(page)
    assert not r.measured
    assert "Nothing was measured" in page and "no results database" in page
    assert page.count("<table>") == 5  # configs, capacity, predicted, other GPUs, expert formats
    # 4 plan charts, latency against load, the curves over concurrency, two Pareto views, the GPU comparison
    assert page.count("<svg") == 9
    assert "Throughput per GPU against speed per user, over concurrency" in page
    for heading in ("Latency against load", "Every configuration that meets the SLO",
                    "Each GPU at its cheapest configuration for the target load"):
        assert heading in page
    assert "Each other GPU's cheapest configuration" in page
    rec = r.plan.recommended
    assert {o.config.gpu for o in r.other_gpus} | {rec.config.gpu} == {"h200", "b200"}  # each GPU's best
    assert all(o.serves and o.monthly_cost >= rec.monthly_cost for o in r.other_gpus)
    assert "capbench run --target" in page  # how to measure
    md = render(r, "md")
    first = r.plan.four_way()[0]  # the baseline of the comparison: the recommended parallelism's BF16-KV variant
    assert "## Capacity (SGLang 0.5.23 memory arithmetic)" in md and f"| {first.short_label} |" in md
    assert "Nothing was measured" in md and "<svg" not in md


def test_cli_writes_the_report_and_refuses_bad_input(db, tmp_path):
    path, ids = db
    out = tmp_path / "r.html"
    done = subprocess.run([CAPBENCH, "report", "--db", str(path), "--runs", f"{ids[0]},{ids[1]}", "--model",
                           "kimi-k2-thinking", "--gpu", "h200", "--tp", "8", "--gpus", "h200", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "measured: 2 run(s)" in done.stdout
    page = out.read_text()
    assert_self_contained(page)
    assert RUNS[0][0] in page and RUNS[1][0] in page and RUNS[2][0] not in page
    bad = subprocess.run([CAPBENCH, "report", "--db", str(path), "--runs", "nope", "--out", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: unknown run id(s): nope (see `capbench runs`)"


def test_launch_commands_are_accepted_by_the_patched_launcher(tmp_path):
    """The report's commands, run through `capbench sglang-launch --dry-run`, start SGLang with the patches."""
    import shlex

    from typer.testing import CliRunner

    from bench.cli import app
    from bench.model import launch as sglang_cmd

    scales = tmp_path / "kv_scales.json"
    scales.write_text('{"kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": {"0": 1.0}}}}')
    single, multi = sglang_cmd.commands("kimi-k2-thinking", "h100-sxm", 16, "fp8_e4m3", "native")
    assert single is None and len(multi) == 2 and all("--tp 16 " in c for c in multi)  # 16 GPUs: two 8-GPU nodes
    commands = [sglang_cmd.single_node("kimi-k2-thinking", 8, "fp8_e4m3", "native", 262144,
                                      attention=sglang_cmd.attention_backend("kimi-k2-thinking", "h200", "fp8_e4m3")),
                *sglang_cmd.multi_node("glm-4.6", "h200", 8, "bf16", "int4-g32")]
    for cmd in commands:
        argv = shlex.split(cmd.replace("kv_scales.json", str(scales)))
        assert argv[:2] == ["capbench", "sglang-launch"]
        out = CliRunner().invoke(app, [argv[1], "--dry-run", *argv[2:]], catch_exceptions=False)
        assert out.exit_code == 0, out.output
        assert "kv_checksum: verify" in out.output
        exec_line = next(line for line in out.output.splitlines() if line.startswith("exec: "))
        assert "-m sglang.launch_server" in exec_line and "--radix-cache-backend capbench_kv_checksum" in exec_line
        assert argv[argv.index("--") + 1] in exec_line  # the server arguments pass through


def test_one_report_for_every_model_with_plain_words(db, tmp_path):
    """The demo's report: a section per model, each with its own runs; savings say what they risk; no "$n/a",
    no "max rate 0.00", and a "does not fit" that does not offer FP8 KV when the weights alone do not fit."""
    from bench.model import Option
    from bench.report import wording

    path, ids = db
    qs = [Question(model=m, gpu="h200", tp=8, workload="chat", search_gpus=("h200",))
          for m in ("kimi-k2-thinking", "glm-4.6")]
    reports = [build(q, path, [i for i, (_, c, *_) in zip(ids, RUNS, strict=True) if c["model"] == q.model])
               for q in qs]
    page = render(reports, "html")
    assert_self_contained(page)
    assert "href='#kimi-k2-thinking'" in page and "href='#glm-4.6'" in page
    assert "id='kimi-k2-thinking'" in page and "id='glm-4.6'" in page
    assert "glm fp8-kv checksum" in page.split("id='glm-4.6'")[1]
    assert "glm fp8-kv checksum" not in page.split("id='glm-4.6'")[0].split("id='kimi-k2-thinking'")[1]
    for bad in ("$n/a", "n/a $", "Recommended against", "0.00 req/s", "max rate 0.00"):
        assert bad not in page, bad
    assert "quality not yet checked" in page  # FP8 KV / converted experts without a drift run
    # a configuration whose weights do not fit: more GPUs or INT4, never FP8 KV (the KV cache is not the problem)
    plan = reports[1].plan
    big = next(o for o in plan.options if not o.capacity.fits and o.kv_dtype == "bf16" and o.weights == "native")
    assert isinstance(big, Option)
    hint = wording.does_not_fit(big)
    assert hint.startswith("Does not fit: the weights alone need") and "FP8 KV" not in hint
    assert "INT4 experts" in hint
