"""The main job on a laptop: what FP8 KV and INT4 experts buy Kimi K2 Thinking and GLM-4.6 on 8x H200.

Capacity from SGLang's arithmetic; the highest rate each deployment serves within the SLO, from `simulate`;
then load tests against twins of the four deployments (three profiles each: Poisson chat with shared system
prompts, long-context documents, agentic-coding sessions), everything into the DuckDB store, a capacity report,
and a summary. The twins run TIME_SCALE times faster than the GPUs they model, so a short demo covers minutes of
serving: rates are offered TIME_SCALE times faster, SLOs are judged TIME_SCALE times tighter, and the summary
converts throughput and goodput back to the modelled GPUs.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench.model import Slo, catalog, usd_per_million
from bench.model import capacity as cap
from bench.report import terminal
from bench.runner import RunOptions
from bench.runner import run as run_load
from bench.twin import Target


@dataclass(frozen=True)
class Config:
    model: str
    kv_dtype: str
    weights: str
    title: str

    def spec(self) -> str:
        return f"twin:{self.model}@h200x8,kv={self.kv_dtype},weights={self.weights},time_scale={TIME_SCALE:g}"

    def deployment(self) -> cap.Deployment:
        return cap.Deployment(catalog.model(self.model), catalog.gpu("h200"), 8, kv_dtype=self.kv_dtype,
                              weights=self.weights)


@dataclass(frozen=True)
class Load:
    name: str
    profile: str
    overrides: dict  # rates in requests per second of the modelled GPUs
    workload: str
    slo: Slo  # on the modelled GPUs


TIME_SCALE = 4.0


CONFIGS = [
    Config("kimi-k2-thinking", "bf16", "native", "Kimi K2 Thinking, BF16 KV (INT4 experts as shipped)"),
    Config("kimi-k2-thinking", "fp8_e4m3", "int4-g32", "Kimi K2 Thinking, FP8 KV + INT4 experts"),
    Config("glm-4.6", "bf16", "native", "GLM-4.6, BF16 KV, BF16 weights"),
    Config("glm-4.6", "fp8_e4m3", "native", "GLM-4.6, FP8 KV, BF16 weights"),
]
LOADS = [
    Load("chat", "poisson", {"rate": 2.0}, "chat", Slo(ttft_s=2.0, tpot_s=0.05)),
    Load("long-context", "poisson", {"rate": 0.25}, "demo-long-context", Slo(ttft_s=20.0, tpot_s=0.1)),
    Load("agentic", "users", {"users": 8}, "agentic-coding", Slo(ttft_s=5.0, tpot_s=0.05)),
]
SIMULATED = {"chat": "chat", "long-context": "long-context", "agentic": "agentic-coding"}


def _capacity_tables() -> list[Table]:
    out = []
    for model_id in dict.fromkeys(c.model for c in CONFIGS):
        dep = cap.Deployment(catalog.model(model_id), catalog.gpu("h200"), 8)
        out.append(terminal.compare_table(cap.compare(dep)))
    return out


def _scaled(load: Load) -> tuple[dict, Slo]:
    """The load and SLO as offered to a twin TIME_SCALE times faster than the GPUs."""
    over = {k: v * TIME_SCALE if k == "rate" else v for k, v in load.overrides.items()}
    return over, load.slo.scaled(TIME_SCALE)


def _predict(configs: list[Config], loads: list[Load], progress) -> dict:
    """Highest request rate within each load's SLO (p90), converged (model/rate.py): {(config, load): Prediction}."""
    from bench.model import load_workload, search_rate

    out = {}
    for c in configs:
        for load in loads:
            out[(c, load.name)] = search_rate(c.deployment(), load_workload(SIMULATED[load.name]), load.slo)
            progress()
    return out


def run_demo(db: Path = Path("data/capbench.duckdb"), report: Path = Path("reports/demo.html"),
             duration_s: float = 8.0, configs: list[Config] | None = None, loads: list[Load] | None = None
             ) -> dict:
    console = Console(width=max(Console().width, 120))
    started = time.monotonic()
    configs, loads = configs or CONFIGS, loads or LOADS
    console.print("[bold]1. What fits[/bold]: SGLang 0.5.23's memory arithmetic on 8x H200")
    for table in _capacity_tables():
        console.print(table)
    columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn()]
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("2. simulating the highest rate within each SLO", total=len(configs) * len(loads))
        predicted = _predict(configs, loads, lambda: bar.advance(task))
    console.print(f"[bold]3. Load tests[/bold] against twins of {len(configs)} deployments "
                  f"({', '.join(x.name for x in loads)}; {duration_s:g} s each at {TIME_SCALE:g}x speed) into {db}")
    results: dict[tuple[Config, str], dict] = {}
    telemetry = os.environ.get("CAPBENCH_GPU_TELEMETRY")
    os.environ["CAPBENCH_GPU_TELEMETRY"] = "off"  # twins model GPUs this machine does not have: nothing to sample
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("starting", total=len(configs) * len(loads))
        for c in configs:
            target = Target(c.spec())
            try:
                for load in loads:
                    bar.update(task, description=f"{c.title}: {load.name}")
                    overrides, slo = _scaled(load)
                    opts = RunOptions(target=target.url, profile=load.profile,
                                      overrides={**overrides, "duration": duration_s}, workload=load.workload,
                                      db=db, label=f"demo {load.name}", slo=slo, live=False, quiet=True,
                                      drain_s=duration_s, run_config={"twin": c.spec(), "demo": load.name})
                    results[(c, load.name)] = run_load(opts)[0].summary
                    bar.advance(task)
            finally:
                target.close()
    if telemetry is None:
        os.environ.pop("CAPBENCH_GPU_TELEMETRY")
    else:
        os.environ["CAPBENCH_GPU_TELEMETRY"] = telemetry
    _print_summary(console, configs, loads, results, predicted)
    from bench import report as rep
    from bench.model import Question

    report.parent.mkdir(parents=True, exist_ok=True)
    reports = []  # one section per model the demo ran, each with that model's runs
    for model in dict.fromkeys(c.model for c in configs):
        last = [c for c in configs if c.model == model][-1]
        q = Question(model=model, gpu="h200", tp=8, kv_dtype=last.kv_dtype, weights=last.weights,
                     workload="chat", search_gpus=("h200",))
        reports.append(rep.build(q, db, [s["run_id"] for (c, _), s in results.items() if c.model == model]))
    rep.write(reports, report)
    elapsed = time.monotonic() - started
    console.print(f"\n[bold]4. Report[/bold]: {report}   [bold]Dashboard[/bold]: capbench dashboard --db {db} "
                  f"(or capbench demo --dashboard)\ndemo took {elapsed:.0f} s")
    return {"elapsed_s": elapsed, "runs": {f"{c.title} / {name}": s["run_id"] for (c, name), s in results.items()}}


def _print_summary(console: Console, configs: list[Config], loads: list[Load], results: dict,
                   predicted: dict) -> None:
    table = Table(title="What FP8 KV and INT4 experts buy on 8x H200 (x: against the same model's first row)")
    for col in ("configuration", "KV pool tokens", "capacity x", "max rate within SLO, chat / long / agentic "
                "(simulated)", "gain x", "$ / 1M output tok at the chat SLO rate (simulated)",
                "goodput at demo load (twin, modelled)", "output tok/s at demo load (twin, modelled)"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    base: dict[str, tuple] = {}
    for c in configs:
        tokens = cap.capacity(c.deployment(), with_ratios=False).kv_pool_tokens
        rates = [p.rate_rps if (p := predicted[(c, x.name)]) else 0.0 for x in loads]
        chat = predicted[(c, loads[0].name)]
        cost = usd_per_million(catalog.gpu("h200").price_per_gpu_hour, 8, chat.output_tps) if chat else None
        good = sum((results[(c, x.name)].get("goodput_rps") or 0.0) for x in loads) / TIME_SCALE
        out_tps = sum((results[(c, x.name)].get("output_tps") or 0.0) for x in loads) / len(loads) / TIME_SCALE
        b_tokens, b_rates = base.setdefault(c.model, (tokens, rates))
        gains = [r / b for r, b in zip(rates, b_rates, strict=True) if b]
        table.add_row(c.title, f"{tokens:,}", f"{tokens / b_tokens:.2f}x", " / ".join(f"{r:.2f}" for r in rates),
                      " / ".join(f"{g:.2f}" for g in gains), f"${cost:,.2f}" if cost else "-",
                      f"{good:.2f} req/s", f"{out_tps:,.0f}")
    console.print(table)
    console.print("SLOs (p90 for the simulated rates; per request for goodput): "
                  + "; ".join(f"{x.name}: TTFT <= {x.slo.ttft_s:g} s, TPOT <= {x.slo.tpot_s * 1000:g} ms"
                              for x in loads)
                  + f". $ per 1M output tokens: at the highest chat rate within the SLO, 8 GPUs at the catalog's "
                  "$/GPU-hour (the plan's one definition). Twin figures: the twins' runs at the demo's light load "
                  f"(chat {loads[0].overrides.get('rate')} req/s, ...), converted to the modelled GPUs' time.")
