"""Planning commands: `capacity` (what fits) and `simulate` (throughput and latency at a rate, or a sweep)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import typer

from bench.errors import BadInput

MODEL = typer.Option(..., help="Model id from data/models (e.g. kimi-k2-thinking, glm-4.6).")
GPU = typer.Option(..., help="GPU id from data/gpus.yaml (e.g. h200).")
KV_DTYPE = typer.Option("bf16", help="bf16 | fp8_e4m3 | fp8_e5m2")
WEIGHTS = typer.Option("native", help="native | bf16 | fp8 | int4-g32 | int4-g128 (routed experts)")
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
    calibration: str = typer.Option(None, help="Efficiency factors file (JSON/YAML) over data/calibration."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """The twin's scheduler and performance model offline (no HTTP): latency, throughput, cost at a rate or a sweep."""
    from rich.progress import Progress

    from bench.model import Deployment, catalog, fixed_workload, load_efficiency, load_workload, parse_slo
    from bench.model import simulate as sim
    from bench.report import terminal

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
        kvs = ("bf16", "fp8_e4m3") if compare_kv else (dep.kv_dtype,)
        points = [sim.run(replace(dep, kv_dtype=kv), wl, rate, num_requests, seed, eff, min_seconds) for kv in kvs]
        if as_json:
            print(json.dumps([{"kv_dtype": kv, **p.to_dict()} for kv, p in zip(kvs, points, strict=True)], indent=2))
        else:
            for kv, p in zip(kvs, points, strict=True):
                terminal.print_point(p, target, replace(dep, kv_dtype=kv), wl, num_requests)
        return
    if not target.bounded:
        raise BadInput("--sweep looks for the highest rate within the SLO: give at least one bound, e.g. "
                       "--slo ttft=2s,tpot=50ms")
    with Progress(transient=True, disable=as_json) as bar:
        task = bar.add_task("simulating", total=(len(sim.GRID) + 7) * (2 if compare_kv else 1))
        tick = lambda: bar.advance(task)  # noqa: E731
        sweeps = (sim.compare_kv(dep, wl, target, num_requests, seed, eff, tick, min_seconds) if compare_kv
                  else [sim.sweep(dep, wl, target, num_requests, seed, eff, tick, min_seconds=min_seconds)])
    if as_json:
        print(json.dumps([s.to_dict() for s in sweeps], indent=2))
    else:
        terminal.print_sweeps(sweeps, dep, wl, num_requests, min_seconds)
