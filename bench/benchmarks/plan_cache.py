"""The answers shipped for the built-in questions: `make plan-cache` runs the plan search for the README's first
question, the Planner's defaults (and its model changed to GLM-4.6) and the demo's capacity report with an empty
cache, with the Planner's latency-against-load curve and every configuration's curve over concurrency, and
`capbench validate`'s replay of every published case, and writes every answer it found to
data/plan-cache/rates.json.
Each answer is keyed by a hash of its inputs and of the simulator's source and data (bench/model/serving/rate.py
`SIMULATOR`, `SIMULATOR_DATA`), so
after a change to the model, the catalog, a workload or the simulator the shipped answers are simply not found:
run this again.

    python -m bench.benchmarks.plan_cache [--questions readme,report,planner,demo,validate]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from bench import demo
from bench.model import Question, Slo, catalog, format_table, make_plan, rate
from bench.report import load

SLO = Slo(ttft_s=2.0, tpot_s=0.05, percentile=90)


def readme_question(target_rate_rps: float = 20.0) -> Question:
    """capbench plan --model kimi-k2-thinking --workload chat --rate 20 --slo ttft=2s,tpot=50ms,p=90 (README.md)."""
    return Question(model="kimi-k2-thinking", gpu="h200", tp=8, kv_dtype="bf16", weights="native", workload="chat",
                    slo=SLO, target_rate_rps=target_rate_rps)


def planner_question(model_id: str = "kimi-k2-thinking") -> Question:
    """The Planner page's inputs as it opens (dashboard/views/planner.py's defaults), or with another model."""
    model = catalog.model(model_id)
    return Question(model=model.id, gpu="h200", tp=8, gpus=8, kv_dtype="fp8_e4m3", weights="native",
                    context=model.max_context, workload="chat", slo=SLO,
                    price_per_gpu_hour=float(catalog.gpu("h200").price_per_gpu_hour), target_rate_rps=10.0,
                    search_gpus=("h200",))


def report_question(model_id: str) -> Question:
    """`capbench report --out report.html` after `make demo` (README's tour): the newest run's deployment (a demo
    twin: 8x H200, FP8 KV, the shipped weights), chat at the report's 10 req/s and its SLO, every GPU searched."""
    return Question(model=model_id, gpu="h200", tp=8, kv_dtype="fp8_e4m3", weights="native", workload="chat",
                    slo=SLO, target_rate_rps=10.0)


QUESTIONS = {"readme": [readme_question(20.0), readme_question(50.0)],
             "report": [report_question(m) for m in demo.MODELS],
             "planner": [planner_question(), planner_question("glm-4.6")],
             "demo": [demo.report_question(m) for m in demo.MODELS]}


def validate_replays() -> int:
    """What `capbench validate` replays (bench/cli/validate.py): every published case but the disaggregated ones,
    on the corpus's factors, remembered."""
    from bench.model import corpus, load_efficiency, validate

    cases = [c for c in corpus.load() if c.kind != "disaggregated"]
    for c in cases:
        validate.remembered(c, load_efficiency(c.gpu, fitted=False))
    return len(cases)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", default=",".join([*QUESTIONS, "validate"]))
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="capbench-plan-cache-") as tmp:
        os.environ["CAPBENCH_CACHE"], os.environ["CAPBENCH_SHIPPED_CACHE"] = tmp, "0"  # computed, never read
        for name in a.questions.split(","):
            if name == "validate":
                t = time.perf_counter()
                print(f"validate: {validate_replays()} published cases replayed in {time.perf_counter() - t:.1f} s")
                continue
            for q in QUESTIONS[name]:
                t = time.perf_counter()
                plan = make_plan(q, workers=a.workers, curves=True)
                if plan.recommended is not None:  # the Planner's latency-against-load curve beside it
                    rec = plan.recommended
                    load.predicted(rec.config.deployment(q.model, q.context), q.request_mix(), q.slo, rec.prediction)
                plan.curves()  # every configuration's curve over concurrency, as the Planner and the report draw them
                if name == "report":  # the report's table of expert formats, each priced by its own search
                    format_table.rows(q.model, q.gpu, q.tp, q.kv_dtype, q.request_mix(), q.slo, q.context,
                                      q.price_per_gpu_hour)
                print(f"{name}: {q.model}, {q.workload}, {q.target_rate_rps:g} req/s: {len(plan.simulated)} "
                      f"simulated in {time.perf_counter() - t:.1f} s")
        answers = json.loads((Path(tmp) / "rates.json").read_text())
    rate.SHIPPED_CACHE.parent.mkdir(parents=True, exist_ok=True)
    rate.SHIPPED_CACHE.write_text(json.dumps(answers, indent=0, sort_keys=True) + "\n")
    print(f"wrote {len(answers)} answers to {rate.SHIPPED_CACHE}")


if __name__ == "__main__":
    main()
