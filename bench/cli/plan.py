"""Planning commands: `capacity` (what fits) and `simulate` (throughput and latency at a rate, or a sweep)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import typer

from bench.cli.prices import parse_price, prices_json
from bench.errors import BadInput

MODEL = typer.Option(..., help="Model id from data/models (e.g. kimi-k2-thinking, glm-4.6).")
GPU = typer.Option(..., help="GPU id from data/gpus.yaml (e.g. h200).")
KV_DTYPE = typer.Option("bf16", help="bf16 | fp8_e4m3 | fp8_e5m2")
WEIGHTS = typer.Option("native", help="native | bf16 | fp8 | int4-g32 | int4-g128 (routed experts)")
SIMULATE_MAX_REQUESTS = 2_000_000  # a rate x seconds that a simulation finishes in minutes, not hours
DP = typer.Option(1, help="DP-attention size inside those GPUs (SGLang --dp with --enable-dp-attention).")


def capacity(
    model: str = MODEL,
    gpu: str = GPU,
    tp: int = typer.Option(..., help="Tensor-parallel size = GPUs of one instance (a power of two)."),
    dp: int = DP,
    kv_dtype: str = KV_DTYPE,
    weights: str = WEIGHTS,
    context: int = typer.Option(None, help="Context length of each sequence (default: the model's maximum)."),
    mem_fraction: float = typer.Option(None, help="Override SGLang's default mem_fraction_static."),
    page_size: int = typer.Option(None, help="SGLang --page-size (default: SGLang's on that GPU, 64 on B200, else 1)."),
    mtp: bool = typer.Option(False, help="Count the MTP draft layer's KV (speculative decoding)."),
    compare: bool = typer.Option(False, help="Four-way matrix: BF16 vs FP8 KV, native vs INT4 experts."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
) -> None:
    """KV-cache tokens, sequences and contexts that fit, computed as SGLang 0.5.23 computes them."""
    from bench.model import Deployment, catalog
    from bench.model import capacity as cap
    from bench.report import terminal

    dep = Deployment(catalog.model(model), catalog.gpu(gpu), tp, dp, kv_dtype, weights, context, mem_fraction,
                     page_size, mtp)
    if compare:
        caps = cap.compare(dep)
        if as_json:
            print(json.dumps([c.to_dict() for c in caps], indent=2))
        else:
            terminal.print_tables(terminal.compare_table(caps))
    else:
        result = cap.capacity(dep)
        if as_json:
            print(json.dumps(result.to_dict(), indent=2))
        else:
            terminal.print_tables(terminal.capacity_table(result))
        if not result.fits:
            raise BadInput(f"{model} ({weights} weights, {result.weight_bytes_per_gpu / 1e9:.1f} GB per GPU) does "
                           f"not fit {tp} x {gpu}: short by {result.short_by_bytes_per_gpu / 1e9:.1f} GB per GPU")
    if dep.nodes > 1 and not as_json:
        print(f"note: tp {tp} spans {dep.nodes} nodes of {dep.gpu.gpus_per_node} GPUs "
              "(SGLang --nnodes/--dist-init-addr).")


def simulate(
    model: str = MODEL,
    gpu: str = GPU,
    tp: int = typer.Option(..., help="Tensor-parallel size = GPUs of one instance."),
    dp: int = DP,
    kv_dtype: str = KV_DTYPE,
    weights: str = WEIGHTS,
    context: int = typer.Option(None, help="Context length (default: the model's maximum)."),
    workload: str = typer.Option(None, help="A workload name (data/workloads: chat, long-context, agentic-coding, "
                                 "...) or a workload YAML path."),
    input_len: str = typer.Option(None, help="Prompt tokens: N, or uniform:A-B (instead of --workload)."),
    output_len: str = typer.Option(None, help="Output tokens: N, or uniform:A-B (instead of --workload)."),
    rate: float = typer.Option(None, help="Offered requests per second (Poisson); 'inf' sends all at once."),
    sweep: bool = typer.Option(False, help="Sweep rates up to saturation; find the highest rate meeting --slo."),
    compare_kv: bool = typer.Option(False, help="Run BF16-KV and FP8-KV side by side."),
    slo: str = typer.Option("ttft=2s,tpot=50ms,p=90", help="SLO: ttft=2s,tpot=50ms[,e2e=30s][,p=50|90|99]; a rate "
                            "meets it when those percentiles do."),
    num_requests: int = typer.Option(1000, help="Requests per simulated rate (at least)."),
    min_seconds: float = typer.Option(300, help="Arrivals per rate last at least this many simulated seconds."),
    seed: int = typer.Option(0, help="Seed of arrivals and lengths."),
    max_concurrency: int = typer.Option(None, help="At most this many requests in flight (with --rate: Poisson "
                                        "arrivals wait for a free slot, as bench_serving --max-concurrency)."),
    calibration: str = typer.Option(None, help="Efficiency factors file (JSON/YAML) over data/calibration."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    details: bool = typer.Option(False, "--details", help="Also each rate's achieved req/s, TTFT and TPOT p50, "
                                 "running requests, cache hit rate and retractions."),
) -> None:
    """The twin's scheduler and performance model offline (no HTTP): latency, throughput, cost at a rate or a sweep
    (first the answer; --details: every figure of each rate)."""
    from rich.progress import Progress

    from bench.model import Deployment, catalog, fixed_workload, load_efficiency, load_workload, parse_slo
    from bench.model import simulate as sim
    from bench.model.serving import sweep as rate_sweep
    from bench.report import simulated

    dep = Deployment(catalog.model(model), catalog.gpu(gpu), tp, dp, kv_dtype, weights, context)
    if workload and (input_len or output_len):
        raise BadInput("give --workload or --input-len/--output-len, not both")
    if workload:
        wl = load_workload(workload)
    elif input_len and output_len:
        wl = fixed_workload(input_len, output_len)
    else:
        raise BadInput("give --workload NAME or both --input-len and --output-len (N or uniform:A-B)")
    target = parse_slo(slo)
    eff = load_efficiency(gpu, calibration)
    if num_requests < 10:
        raise BadInput(f"--num-requests must be at least 10, got {num_requests}")
    if not sweep:
        if rate is None or rate <= 0 or math.isnan(rate):
            raise BadInput("give --rate R (requests per second, > 0; 'inf' for all at once) or --sweep")
        if math.isfinite(rate) and rate * min_seconds > SIMULATE_MAX_REQUESTS:
            raise BadInput(f"--rate {rate:g} for --min-seconds {min_seconds:g} is {rate * min_seconds:.3g} simulated "
                           f"requests; at most {SIMULATE_MAX_REQUESTS:,}: lower one of them")
        kvs = ("bf16", "fp8_e4m3") if compare_kv else (dep.kv_dtype,)
        if max_concurrency is not None and max_concurrency < 1:
            raise BadInput(f"--max-concurrency must be at least 1, got {max_concurrency}")
        points = [sim.run(replace(dep, kv_dtype=kv), wl, rate, num_requests, seed, eff, min_seconds, max_concurrency)
                  for kv in kvs]
        if as_json:
            print(json.dumps(_json_safe([
                {"kv_dtype": kv, **p.to_dict(), "interval": simulated.point_intervals(
                    replace(dep, kv_dtype=kv), p, target.percentile, math.isinf(p.rate))}
                for kv, p in zip(kvs, points, strict=True)]), indent=2))
        else:
            simulated.print_points(list(zip(kvs, points, strict=True)), target, dep, wl, num_requests, details)
            _own_factors(calibration)
        return
    if max_concurrency is not None:
        raise BadInput("--max-concurrency applies to one --rate; a --sweep offers open-loop Poisson rates")
    if not target.bounded:
        raise BadInput("--sweep looks for the highest rate within the SLO: give at least one bound, e.g. "
                       "--slo ttft=2s,tpot=50ms")
    with Progress(transient=True, disable=as_json) as bar:
        task = bar.add_task("simulating", total=(len(sim.GRID) + 7) * (2 if compare_kv else 1))
        tick = lambda: bar.advance(task)  # noqa: E731
        sweeps = (rate_sweep.compare_kv(dep, wl, target, num_requests, seed, eff, tick, min_seconds) if compare_kv
                  else [rate_sweep.sweep(dep, wl, target, num_requests, seed, eff, tick, min_seconds=min_seconds)])
    if as_json:
        print(json.dumps(_json_safe([{**s.to_dict(), "intervals": simulated.sweep_intervals(dep, s)} for s in sweeps]),
                         indent=2))
    else:
        simulated.print_sweeps(sweeps, dep, wl, num_requests, min_seconds, details)
        _own_factors(calibration)


def _own_factors(calibration: str | None) -> None:
    from bench.report import screen

    if calibration:
        screen.show([f"The intervals measure the shipped factors' errors on the published corpus, not those of "
                     f"{calibration}: factors fitted to your own runs have no interval until their runs are scored "
                     "like the corpus."])


def plan(
    model: str = typer.Option(..., help="Model id from data/models (e.g. kimi-k2-thinking, glm-4.6)."),
    workload: str = typer.Option(None, help="A workload name (data/workloads) or YAML path (default: chat)."),
    input_len: int = typer.Option(None, help="Fixed prompt tokens instead of --workload (with --output-len)."),
    output_len: int = typer.Option(None, help="Fixed output tokens instead of --workload."),
    rate: float = typer.Option(10.0, help="Target load to serve, requests per second."),
    slo: str = typer.Option("ttft=2s,tpot=50ms,p=90", help="SLO: ttft=2s,tpot=50ms[,e2e=30s][,p=50|90|99]; a rate "
                            "meets it when those percentiles do."),
    gpus: str = typer.Option(None, help="Comma-separated GPU ids to search (default: every GPU in the catalog)."),
    gpu: str = typer.Option("h200", help="Your GPU (its price may be --price; always shown)."),
    tp: int = typer.Option(8, help="Your tensor-parallel size (always shown beside the search)."),
    kv_dtype: str = typer.Option("bf16", help="Your KV dtype (always shown)."),
    weights: str = typer.Option("native", help="Your expert weights (always shown)."),
    price: str = typer.Option(None, help="$ per GPU-hour: one figure for --gpu (3.10), or one per GPU "
                              "(h200=3.10,b200=5.20); a GPU given none is costed at the catalog's indicative price, "
                              "and the answer says which."),
    context: int = typer.Option(None, help="Context length (default: the model's maximum)."),
    workers: int = typer.Option(None, help="Processes for the search (default: the machine's cores)."),
    pd: bool = typer.Option(True, "--pd/--no-pd", help="Also search prefill/decode disaggregated shapes (wide EP) "
                            "on --gpus (default: --gpu) and show the cheapest beside the colocated answer."),
    max_nodes: int = typer.Option(16, help="Nodes one PD prefill or decode instance may span (1 to 64)."),
    max_concurrency: int = typer.Option(None, help="The client keeps at most this many requests in flight to each "
                                        "instance (bench_serving --max-concurrency with the rate): arrivals wait "
                                        "for a free slot and the wait counts in TTFT."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (every configuration) instead of tables."),
    details: bool = typer.Option(False, "--details", help="After the answer, the tables: Pareto fronts, each GPU's "
                                 "best, every configuration and why the rest lost, colocated vs disaggregated."),
    campaign: str = typer.Option(None, help="Also write a campaign file that measures this answer (FILE.yaml): the "
                                 "recommended deployment against BF16 KV and the shipped weights, and yours, under "
                                 "this workload and SLO; check it with `capbench campaign FILE --check`."),
) -> None:
    """The deployment search: GPU x tp x DP attention x EP x KV dtype x expert weights x replicas, for a workload,
    SLO and target load. Prints the recommendation, the Pareto fronts, each GPU's best, and why the rest lost;
    with --pd, the cheapest prefill/decode disaggregated answer beside it, why one wins, and its launch commands."""
    import os

    from rich.progress import Progress

    from bench.model import Question, make_plan, parse_slo
    from bench.model.answer import make_headline
    from bench.report import screen, terminal, wording

    if workload and (input_len or output_len):
        raise BadInput("give --workload or --input-len/--output-len, not both")
    if not 1 <= max_nodes <= 64:
        raise BadInput(f"--max-nodes must be between 1 and 64, got {max_nodes}")
    if (input_len is None) != (output_len is None):
        raise BadInput("give both --input-len and --output-len, or neither")
    q = Question(model=model, gpu=gpu, tp=tp, kv_dtype=kv_dtype, weights=weights, context=context,
                 workload=None if input_len else (workload or "chat"), input_tokens=input_len or 2000,
                 output_tokens=output_len or 500, slo=parse_slo(slo), target_rate_rps=rate,
                 search_gpus=tuple(g.strip() for g in gpus.split(",") if g.strip()) if gpus else None,
                 max_concurrency=max_concurrency, **parse_price(price, gpu))
    q.check()
    with Progress(transient=True, disable=as_json) as bar:
        task = bar.add_task("sizing", total=None)
        result = make_plan(q, lambda stage, done, total: bar.update(task, description=stage, completed=done,
                                                                   total=total), workers or os.cpu_count() or 1,
                           curves=as_json)
    if campaign:
        from bench.cli.plan_campaign import write_campaign

        write_campaign(result, campaign)
    versus = None
    if pd:
        with Progress(transient=True, disable=as_json) as bar:
            bar.add_task("searching prefill/decode disaggregated shapes", total=None)
            versus = _versus(result, max_nodes)
    head = make_headline(result, versus)
    if as_json:
        print(json.dumps({"question": _question_json(q), "headline": _json_safe(head.to_json()),
                          "recommended": _row(result.recommended),
                          "configurations": [_finite(r) for r in result.rows()], "curves": result.curves(),
                          "notes": result.notes}
                         | ({"disaggregated": _finite(versus.to_json())} if versus else {}), indent=1, default=str))
        return
    print("\n".join(wording.headline_lines(head, min(screen.width(), screen.SCREEN))))
    screen.show([wording.prices(q)])  # given or catalog
    you = result.chosen
    if not details:
        if you is not result.recommended and you.serves:  # the deployment asked about (--gpu, --tp, ...)
            print(f"Yours: {you.label}: {you.gpus_needed} GPUs, {wording.money(you.monthly_cost)} a month")
        print(screen.more("the tables, why the rest lost, every launch line"))
        return
    console = screen.tables_console()
    rec = result.recommended
    if rec:
        console.print(wording.interval(rec, q.slo.percentile))
    if you is not rec and you.serves:
        console.print(f"[bold]Yours:[/bold] {wording.choice(you, q.slo.percentile)}")
    sim = sorted(result.simulated, key=lambda o: (o.monthly_cost is None, o.monthly_cost or 0))
    console.print(terminal.plan_table([o for o in sim if o.pareto], "Pareto front: output tokens/s per GPU vs tokens/s "
                                      "per user", q))
    console.print(terminal.plan_table([o for o in sim if o.pareto_cost], "Pareto front: $ per 1M output tokens vs "
                                      f"E2E p{q.slo.percentile}", q))
    console.print(terminal.plan_table(result.by_gpu(), "Each GPU's cheapest configuration", q))
    console.print(terminal.plan_table(sim, f"Every simulated configuration ({len(sim)})", q))
    console.print(terminal.rejected_table(result.options))
    for note in result.notes:
        console.print(f"note: {note}")
    if versus:
        _print_versus(console, versus)
    if head.kind == "colocated" and len(head.launch) > 1:
        console.print("Launch commands of the answer, one per node:")
        _print_commands(console, head.launch)


def _versus(result, max_nodes: int):
    from bench.model.pd import versus as pd_versus

    return pd_versus.compare(result, max_nodes)


def _print_versus(console, versus) -> None:
    from bench.report import pd as pd_report

    console.print(pd_report.versus_table(versus))
    for line in pd_report.versus_lines(versus):
        console.print(line, markup=False)
    lines = pd_report.launch_lines(versus)
    if lines:
        console.print("Launch commands of the disaggregated answer (replace the *_NODE0 hosts):")
        _print_commands(console, lines)


def _print_commands(console, lines: list[str]) -> None:
    """Shell commands as lines within the tables' width, joined by backslashes (comments as they are)."""
    from bench.report import screen, wording

    for line in lines:
        for part in [line] if line.startswith("#") else wording.shell_wrapped(line, screen.TABLES):
            console.print(part, markup=False, soft_wrap=True)


def _json_safe(obj):
    """JSON has no inf/nan: they become null, in nested lists, tuples and dicts too."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    return obj


def _finite(row: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def _row(option) -> dict | None:
    return None if option is None else _finite(option.to_row())


def _question_json(q) -> dict:
    from dataclasses import asdict

    return {k: (v.text() if k == "slo" else v) for k, v in asdict(q).items() if k != "slo"} | {"slo": q.slo.text()} \
        | {"prices": prices_json(q)}
