"""The main job on a laptop: what FP8 KV buys Kimi K2 Thinking (INT4 experts as shipped) and GLM-4.6 on 8x H200.

Capacity from SGLang's arithmetic; then the built-in campaign (data/campaigns/demo.yaml): twins of the four
deployments swept to saturation on a long-context mix and on coding agents, everything into the DuckDB store; the
campaign report (the highest rate within the SLO per cell and its $ per 1M output tokens, FP8 KV's gain at
saturation measured next to the model's answer to the same sweep), and the capacity report. The twins run
time_scale times faster than the GPUs they model; every figure is converted back to the modelled GPUs.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from bench.campaign import load_campaign, run_campaign
from bench.model import Question, catalog
from bench.model import capacity as cap
from bench.report import gain_line, terminal

MODELS = ("kimi-k2-thinking", "glm-4.6")


def run_demo(db: Path = Path("data/capbench.duckdb"), report: Path = Path("reports/demo.html"),
             duration_s: float | None = None, campaign: str = "demo") -> dict:
    """Runs the campaign (`duration_s`: seconds per sweep stage instead of the file's); returns its id, its FP8 KV
    gains (measured and predicted) and the time it took."""
    from bench import report as rep

    console = Console(width=max(Console().width, 140))
    started = time.monotonic()
    console.print("[bold]1. What fits[/bold]: SGLang 0.5.23's memory arithmetic on 8x H200")
    for model_id in MODELS:
        console.print(terminal.compare_table(cap.compare(cap.Deployment(catalog.model(model_id), catalog.gpu("h200"),
                                                                        8))))
    spec = load_campaign(campaign)
    if duration_s is not None:
        spec = replace(spec, loads=[replace(x, duration_s=duration_s) for x in spec.loads])
    console.print(f"[bold]2. Campaign[/bold] {spec.name}: {len(spec.deployments)} twins x {len(spec.loads)} loads "
                  f"({', '.join(x.name for x in spec.loads)}), each swept to saturation, into {db}")
    cid = run_campaign(spec, db, source=campaign, say=lambda line: console.print(f"  {line}", highlight=False))
    matrix = rep.campaign_matrix(db, cid)
    console.print(rep.campaign_tables(matrix))
    gains = [g for g in matrix.gains if g["what"] == "FP8 KV"]
    for g in gains:
        console.print(f"FP8 KV, {gain_line(g)}", highlight=False)
    if gains:
        console.print(f"({rep.PREDICTED_GAIN})", highlight=False)
    report.parent.mkdir(parents=True, exist_ok=True)
    campaign_html = rep.write_campaign(matrix, report.with_name(report.stem + "-campaign.html"))
    reports = []  # one section per model the campaign ran, each with that model's best run per cell
    for model in dict.fromkeys(c["model"] for c in matrix.cells if c.get("model")):
        q = report_question(model)
        runs = [c["best_run"] for c in matrix.cells if c.get("model") == model and c.get("best_run")]
        reports.append(rep.build(q, db, runs or None))
    rep.write(reports, report)
    elapsed = time.monotonic() - started
    console.print(f"\n[bold]3. Reports[/bold]: {campaign_html} (the campaign), {report} (capacity)   "
                  f"[bold]Dashboard[/bold]: capbench dashboard --db {db} (or capbench demo --dashboard)\n"
                  f"demo took {elapsed:.0f} s")
    return {"elapsed_s": elapsed, "campaign_id": cid, "gains": gains, "cells": matrix.cells}


def report_question(model: str) -> Question:
    """The question of the demo's capacity report for one model (the shipped plan cache answers it: `make
    plan-cache`)."""
    return Question(model=model, gpu="h200", tp=8, kv_dtype="fp8_e4m3", weights="native", workload="chat",
                    search_gpus=("h200",))


