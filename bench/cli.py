"""The typer app: one thin function per command. Bad input ends in one line on stderr and exit 2."""

from __future__ import annotations

import sys

import typer

from bench.errors import BadInput

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Capacity planning for MoE models on SGLang.")


@app.callback()
def _root() -> None:
    """capbench: how many GPUs a large MoE model needs on SGLang, and what FP8 KV and INT4 experts buy."""


@app.command()
def capacity(
    model: str = typer.Option(..., help="Model id from data/models (e.g. kimi-k2-thinking, glm-4.6)."),
    gpu: str = typer.Option(..., help="GPU id from data/gpus.yaml (e.g. h200)."),
    tp: int = typer.Option(..., help="Tensor-parallel size = GPUs of one instance (a power of two)."),
    dp: int = typer.Option(1, help="DP-attention size inside those GPUs (SGLang --dp with --enable-dp-attention)."),
    kv_dtype: str = typer.Option("bf16", help="bf16 | fp8_e4m3 | fp8_e5m2"),
    weights: str = typer.Option("native", help="native | bf16 | fp8 | int4-g32 | int4-g128 (routed experts)"),
    context: int = typer.Option(None, help="Context length of each sequence (default: the model's maximum)."),
    mem_fraction: float = typer.Option(None, help="Override SGLang's default mem_fraction_static."),
    page_size: int = typer.Option(None, help="SGLang --page-size (default: SGLang's on that GPU, 64 on B200, else 1)."),
    mtp: bool = typer.Option(False, help="Count the MTP draft layer's KV (speculative decoding)."),
    compare: bool = typer.Option(False, help="Four-way matrix: BF16 vs FP8 KV, native vs INT4 experts."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
) -> None:
    """KV-cache tokens, sequences and contexts that fit, computed as SGLang 0.5.23 computes them."""
    import json

    from bench import capacity as cap
    from bench import catalog
    from bench.capacity_table import capacity_table, compare_table, print_tables

    dep = cap.Deployment(catalog.model(model), catalog.gpu(gpu), tp, dp, kv_dtype, weights, context,
                         mem_fraction, page_size, mtp)
    if compare:
        caps = cap.compare(dep)
        if as_json:
            print(json.dumps([c.to_dict() for c in caps], indent=2))
        else:
            print_tables(compare_table(caps))
    else:
        result = cap.capacity(dep)
        if as_json:
            print(json.dumps(result.to_dict(), indent=2))
        else:
            print_tables(capacity_table(result))
        if not result.fits:
            raise BadInput(f"{model} ({weights} weights, {result.weight_bytes_per_gpu / 1e9:.1f} GB per GPU) does "
                           f"not fit {tp} x {gpu}: short by {result.short_by_bytes_per_gpu / 1e9:.1f} GB per GPU")
    if dep.nodes > 1 and not as_json:
        print(f"note: tp {tp} spans {dep.nodes} nodes of {dep.gpu.gpus_per_node} GPUs "
              "(SGLang --nnodes/--dist-init-addr).")


@app.command()
def demo(
    db: str = typer.Option("data/capbench.duckdb", help="Results DB (runs are added; earlier ones are kept)."),
    out: str = typer.Option("reports/demo.html", help="Where to write the capacity report."),
    duration: float = typer.Option(8.0, help="Seconds of load per run (12 runs)."),
    open_dashboard: bool = typer.Option(False, "--dashboard", help="Start the dashboard at the end."),
) -> None:
    """The main job, no GPU needed: what FP8 KV and INT4 experts buy Kimi K2 Thinking and GLM-4.6 on 8x H200."""
    from pathlib import Path

    from bench.demo import run_demo

    if duration <= 0:
        raise BadInput(f"--duration must be positive, got {duration}")
    run_demo(Path(db), Path(out), duration)
    if open_dashboard:
        dashboard(db=db, port=8501, host="127.0.0.1")


@app.command("sglang-launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sglang_launch(
    ctx: typer.Context,
    kv_checksum: str = typer.Option("off", help="KV page checksums: off | verify (evict a bad page and recompute) "
                                    "| strict (abort the request). Sealed on radix insert, verified on match_prefix."),
    kv_scrub_pages_per_s: float = typer.Option(0.0, help="Re-verify idle cached pages at this rate (0: no scrub)."),
    integrity_log: str = typer.Option(None, help="Append integrity events (kind, layer, page, detail) as JSON lines."),
    kv_scales: str = typer.Option(None, help="Per-layer FP8 KV scales (from calibrate-kv-scales) for GLM-4.x / Kimi "
                                  "K2; needs --kv-cache-dtype fp8_e4m3."),
    record_kv_amax: str = typer.Option(None, help="Calibration run (BF16 KV): dump per-layer K/V maxima to "
                                       "PATH.rank<R>.json for calibrate-kv-scales."),
    dry_run: bool = typer.Option(False, help="Print the command and environment instead of starting SGLang."),
) -> None:
    """Start SGLang (python -m sglang.launch_server) with capbench's patches in every SGLang process.

    Everything after `--` goes to sglang.launch_server, e.g.
    capbench sglang-launch --kv-checksum verify -- --model-path moonshotai/Kimi-K2-Thinking --tp 8

    The patches reach SGLang's spawned scheduler processes through engine_patches/boot/sitecustomize.py, put first
    on PYTHONPATH, with the options in the CAPBENCH_PATCHES environment variable.
    """
    from engine_patches.launch import BadLaunch, PatchOptions, launch

    args = list(ctx.args)
    try:
        options = PatchOptions(kv_checksum, kv_scrub_pages_per_s, integrity_log, kv_scales, record_kv_amax)
        launch(options, args, dry_run=dry_run)
    except BadLaunch as e:
        raise BadInput(str(e)) from None


@app.command()
def dashboard(
    db: str = typer.Option("data/capbench.duckdb", help="Results DB to show (opened read-only)."),
    port: int = typer.Option(8501, help="Port on 127.0.0.1."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (default: this machine only)."),
) -> None:
    """Start the Streamlit dashboard: Planner, Runs, Compare, Integrity."""
    import os
    from pathlib import Path

    if not 1 <= port <= 65535:
        raise BadInput(f"--port must be between 1 and 65535, got {port}")
    app_py = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"
    env = {**os.environ, "CAPBENCH_DB": str(Path(db).expanduser().resolve())}
    argv = [sys.executable, "-m", "streamlit", "run", str(app_py), "--server.address", host, "--server.port",
            str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    print(f"capbench dashboard on http://{host}:{port} (DB {env['CAPBENCH_DB']})", flush=True)
    os.execvpe(argv[0], argv, env)


@app.command()
def simulate(
    model: str = typer.Option(..., help="Model id from data/models (e.g. kimi-k2-thinking)."),
    gpu: str = typer.Option(..., help="GPU id from data/gpus.yaml (e.g. h200)."),
    tp: int = typer.Option(..., help="Tensor-parallel size = GPUs of one instance."),
    dp: int = typer.Option(1, help="DP-attention size inside those GPUs."),
    kv_dtype: str = typer.Option("bf16", help="bf16 | fp8_e4m3 | fp8_e5m2"),
    weights: str = typer.Option("native", help="native | bf16 | fp8 | int4-g32 | int4-g128 (routed experts)"),
    context: int = typer.Option(None, help="Context length (default: the model's maximum)."),
    workload: str = typer.Option(None, help="chat | long-context | agentic-coding | a workload YAML path."),
    input_len: int = typer.Option(None, help="Fixed prompt tokens (instead of --workload)."),
    output_len: int = typer.Option(None, help="Fixed output tokens (instead of --workload)."),
    rate: float = typer.Option(None, help="Offered requests per second (Poisson); 'inf' sends all at once."),
    sweep: bool = typer.Option(False, help="Sweep rates up to saturation; find the highest rate meeting --slo."),
    compare_kv: bool = typer.Option(False, help="Run BF16-KV and FP8-KV side by side."),
    slo: str = typer.Option("ttft=2s,tpot=50ms,p=90", help="SLO on TTFT and TPOT percentiles (p=50|90|99)."),
    num_requests: int = typer.Option(1000, help="Requests per simulated rate (at least)."),
    min_seconds: float = typer.Option(300, help="Arrivals per rate last at least this many simulated seconds."),
    seed: int = typer.Option(0, help="Seed of arrivals and lengths."),
    calibration: str = typer.Option(None, help="Efficiency factors file (JSON/YAML) over data/calibration."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """The twin's scheduler and performance model offline (no HTTP): latency, throughput, cost at a rate or a sweep."""
    from bench import capacity as cap
    from bench import catalog
    from bench import simulate as sim
    from bench.perfmodel import load_efficiency
    from bench.workload import fixed_workload, load_workload

    dep = cap.Deployment(catalog.model(model), catalog.gpu(gpu), tp, dp, kv_dtype, weights, context)
    if workload and (input_len or output_len):
        raise BadInput("give --workload or --input-len/--output-len, not both")
    if workload:
        wl = load_workload(workload)
    elif input_len and output_len and input_len > 0 and output_len > 0:
        wl = fixed_workload(input_len, output_len)
    else:
        raise BadInput("give --workload NAME or both --input-len and --output-len (positive)")
    sim.simulate_command(dep, wl, rate, sweep, compare_kv, sim.parse_slo(slo), num_requests, seed,
                         load_efficiency(gpu, calibration), as_json, min_seconds)


@app.command()
def runs(db: str = typer.Option("data/capbench.duckdb", help="Results DB (opened read-only).")) -> None:
    """List the runs in the results DB, newest first."""
    from rich.console import Console

    from bench.queries import runs_table
    from bench.store import Store

    Console().print(runs_table(Store(db, read_only=True).runs()))


@app.command()
def export(
    run: str = typer.Option(..., help="Run id (see `capbench runs`)."),
    fmt: str = typer.Option("parquet", "--format", help="parquet | csv"),
    out: str = typer.Option(..., help="Directory to write <table>.<format> files into."),
    db: str = typer.Option("data/capbench.duckdb", help="Results DB (opened read-only)."),
) -> None:
    """Export every table's rows of one run (runs, requests, gpu/server samples, integrity events)."""
    from bench.export import export_run
    from bench.store import Store

    for path in export_run(Store(db, read_only=True), run, fmt, out):
        print(path)


@app.command("run")
def run_cmd(
    target: str = typer.Option(..., help="OpenAI-compatible server URL, or twin:SPEC to start a twin for the run "
                               "(e.g. twin:kimi-k2-thinking@h200x8,kv=fp8_e4m3)."),
    profile: str = typer.Option("poisson", help="users | constant | poisson | gamma | ramp | steps | spike | "
                                "diurnal | sweep | trace, or a profile YAML path."),
    rate: float = typer.Option(None, help="Requests/s (open-loop profiles)."),
    users: int = typer.Option(None, help="Concurrent users (closed loop: profile users)."),
    duration: float = typer.Option(None, help="Seconds of measured load."),
    param: list[str] = typer.Option(None, help="Any other profile parameter, KEY=VALUE (repeatable), "
                                    "e.g. --param burstiness=0.5."),
    workload: str = typer.Option("chat", help="Workload name (data/workloads), YAML path, or ShareGPT JSON."),
    db: str = typer.Option("data/capbench.duckdb", help="Results DB."),
    label: str = typer.Option("", help="A label for the run."),
    model: str = typer.Option(None, help="Model name to send (default: the server's first /v1/models entry)."),
    api_key_env: str = typer.Option(None, help="Name of the env var holding the API key (never stored)."),
    slo: str = typer.Option(None, help="SLO for goodput, e.g. ttft=2s,tpot=50ms[,e2e=30s]."),
    warmup: float = typer.Option(0.0, help="Seconds of warm-up before the measured phase (marked, not counted)."),
    workers: int = typer.Option(0, help="Locust worker processes on this machine (0: one process)."),
    expect_workers: int = typer.Option(0, help="Workers that join from other machines (capbench worker)."),
    master_bind: str = typer.Option("127.0.0.1", help="Address the Locust master listens on (for remote workers)."),
    master_port: int = typer.Option(5557, help="Port the Locust master listens on."),
    seed: int = typer.Option(0, help="Seed of the schedule and the prompts."),
    api: str = typer.Option(None, help="chat | completions (default: the workload's)."),
    stream: bool = typer.Option(True, help="Stream responses (SSE); --no-stream for one JSON answer."),
    timeout: float = typer.Option(600.0, help="Seconds one request may take in all."),
    max_inflight: int = typer.Option(None, help="Open loop: Locust users that carry the schedule (default: 20 x "
                                     "peak rate, 32..4096)."),
    live: bool = typer.Option(True, help="Live display (--no-live for logs and CI)."),
) -> None:
    """A load test: Locust (headless, as a library) with a load profile and a workload; every request in the DB."""
    from bench import runner

    overrides = {"rate": rate, "users": users, "duration": duration}
    for kv in param or []:
        key, _, value = kv.partition("=")
        if not key or not value:
            raise BadInput(f"--param takes KEY=VALUE, not {kv!r}")
        import yaml

        overrides[key] = yaml.safe_load(value)
    if workers < 0 or expect_workers < 0:
        raise BadInput("--workers and --expect-workers are counts >= 0")
    opts = runner.RunOptions(
        target=target, profile=profile, overrides=overrides, workload=workload, db=db, label=label, model=model,
        api_key_env=api_key_env, slo=runner.parse_slo(slo), warmup_s=warmup, workers=workers,
        expect_workers=expect_workers, master_bind=master_bind, master_port=master_port, seed=seed, api=api,
        stream=stream, timeout_s=timeout, max_inflight=max_inflight, live=live)
    results = runner.run(opts)
    if any(r.status != "completed" for r in results):
        sys.exit(130)


@app.command()
def worker(
    master: str = typer.Option(..., help="Host of the `capbench run` master (its --master-bind address)."),
    master_port: int = typer.Option(5557, help="The master's --master-port."),
    keep: bool = typer.Option(True, help="After a run, wait for the next one (sweep stages, later runs); "
                              "--no-keep leaves after one run."),
) -> None:
    """Join a `capbench run --expect-workers N` from another machine: a Locust worker that sends its share."""
    from loadgen.worker import run_worker

    run_worker(master, master_port, once=not keep)


@app.command()
def twin(
    model: str = typer.Option("kimi-k2-thinking", help="Model id from data/models."),
    gpu: str = typer.Option("h200", help="GPU id from data/gpus.yaml."),
    tp: int = typer.Option(8, help="Tensor-parallel size = GPUs of the modelled instance."),
    dp: int = typer.Option(1, help="DP-attention size inside those GPUs."),
    kv_dtype: str = typer.Option("bf16", help="bf16 | fp8_e4m3 | fp8_e5m2"),
    weights: str = typer.Option("native", help="native | bf16 | fp8 | int4-g32 | int4-g128 (routed experts)"),
    context: int = typer.Option(None, help="Context length (default: the model's maximum)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (default: this machine only)."),
    port: int = typer.Option(30000, help="Port (SGLang's default 30000)."),
    time_scale: float = typer.Option(1.0, help="Run this many times faster than the modelled GPUs."),
    seed: int = typer.Option(0, help="Seed of the synthetic output."),
    drift: float = typer.Option(0.0, help="Fraction of greedy tokens that differ from a drift-0 twin's."),
    calibration: str = typer.Option(None, help="Efficiency factors file (JSON/YAML) over data/calibration."),
    max_total_tokens: int = typer.Option(None, help="Cap the KV pool (SGLang --max-total-tokens)."),
) -> None:
    """An SGLang-compatible server that models MODEL on TP x GPU: same API and metrics, modelled latencies."""
    import asyncio

    from bench.twin import TwinConfig, print_figures, serve_forever

    if not 0 <= port <= 65535:
        raise BadInput(f"--port must be between 0 and 65535, got {port}")
    config = TwinConfig(model, gpu, tp, dp, kv_dtype, weights, context, None, host, port, time_scale, seed, drift,
                        calibration, max_total_tokens=max_total_tokens)
    try:
        asyncio.run(serve_forever(config, ready=print_figures))
    except KeyboardInterrupt:
        pass
    except OSError as e:
        raise BadInput(f"cannot serve on {host}:{port}: {e.strerror or e}") from None


@app.command("calibrate-kv-scales")
def calibrate_kv_scales(
    target: str = typer.Option(..., help="Base URL of a BF16-KV SGLang started by `capbench sglang-launch "
                               "--record-kv-amax PATH` on this host."),
    amax: str = typer.Option(..., help="The PATH given to --record-kv-amax (ranks dump PATH.rank<R>.json)."),
    out: str = typer.Option(..., help="Scales file to write (for --kv-scales / SGLang's --quantization-param-path)."),
    prompts: str = typer.Option(None, help="JSONL with a 'prompt' per line, or one prompt a line "
                                "(default: data/prompts/kv_calibration.jsonl)."),
    margin: float = typer.Option(1.0, help="Headroom over the calibrated maximum (>= 1): scale = amax*margin/448."),
    tp_size: int = typer.Option(None, help="TP size of the FP8 deployment (default: the ranks that dumped)."),
    num_layers: int = typer.Option(None, help="Model layers (default: highest layer seen + 1)."),
    model_type: str = typer.Option(None, help="config.json model_type to record (SGLang's loader checks it)."),
    max_tokens: int = typer.Option(16, help="Tokens to generate per calibration prompt."),
) -> None:
    """Record per-layer K/V maxima on a BF16-KV server and write per-layer FP8 KV scales."""
    try:
        from engine_patches.fp8_scales.calibrate import calibrate

        r = calibrate(target, amax, out, prompts, margin, max_tokens, tp_size, num_layers, model_type)
    except (ValueError, OSError) as e:
        raise BadInput(str(e)) from None
    except ImportError as e:
        raise BadInput(f"calibrate-kv-scales needs the engine extras (pip install 'capbench[engine]'): {e}") from None
    print(f"wrote {r.out}: {r.layers} {r.layout.upper()} layers x {r.ranks} TP ranks, {r.tokens_seen} tokens seen; "
          f"max |K/V| {r.max_amax:.1f}; {r.layers_past_e4m3} layers exceed 448 (saturate at scale 1.0)")


@app.command("quantize-int4")
def quantize_int4(
    src: str = typer.Option(..., "--in", help="Checkpoint directory: safetensors, BF16 or FP8 block-128."),
    out: str = typer.Option(..., "--out", help="New directory for the INT4 checkpoint (written as OUT.partial, "
                            "renamed when complete)."),
    group_size: int = typer.Option(32, help="INT4 group size: 32 (as Kimi K2 Thinking) or 128."),
    tp: int = typer.Option(8, help="Tensor parallelism the checkpoint will be served at (the group size must divide "
                           "each rank's share of the expert intermediate size)."),
    ep: int = typer.Option(1, help="Expert parallelism it will be served at."),
    workers: int = typer.Option(None, help="Worker processes (default: the machine's cores, bounded by memory)."),
    resume: bool = typer.Option(False, help="Continue an interrupted conversion from OUT.partial."),
) -> None:
    """Routed experts of a GLM-4.x / Kimi K2 checkpoint to compressed-tensors INT4 W4A16 (SGLang loads it)."""
    try:
        from engine_patches.int4_moe.convert import convert, print_report

        report = convert(src, out, group_size, tp, ep, workers, resume)
    except (ValueError, OSError) as e:
        raise BadInput(str(e)) from None
    except ImportError as e:
        raise BadInput(f"quantize-int4 needs the engine extras (pip install 'capbench[engine]'): {e}") from None
    print_report(report, out)


@app.command()
def drift(
    target: list[str] = typer.Option(..., help="Two servers, A then B: URLs or twin:SPEC (e.g. twin:glm-4.6@h200x8)."),
    prompts: list[str] = typer.Option(None, help="JSONL prompt files (default: data/prompts/drift.jsonl)."),
    db: str = typer.Option("data/capbench.duckdb", help="Results DB."),
    label: str = typer.Option("", help="A label for the run."),
    model: str = typer.Option(None, help="Model name to send (default: each server's /v1/models)."),
    api_key_env: str = typer.Option(None, help="Environment variable holding the API key."),
    concurrency: int = typer.Option(8, help="Prompts in flight at once."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    max_mean_kl: float = typer.Option(None, help="Gate: fail (exit 1) if any kind's mean KL exceeds this."),
    min_token_agreement: float = typer.Option(None, help="Gate: fail if any kind's token agreement is below this."),
    min_exact_match: float = typer.Option(None, help="Gate: fail if any kind's exact-match share is below this."),
) -> None:
    """Quality drift: the same prompts sent greedily with top logprobs to two servers, compared token by token.
    With a threshold, a rollout gate: exit 1 when any prompt kind misses it (or any prompt fails)."""
    from pathlib import Path

    from bench.drift import Gate, drift_command

    _, failures = drift_command(target, [Path(p) for p in prompts or []], Path(db), label, model, api_key_env,
                                concurrency, as_json, Gate(max_mean_kl, min_token_agreement, min_exact_match))
    if failures:
        raise typer.Exit(1)


@app.command()
def report(
    out: str = typer.Option(..., help="File to write (FILE.html or FILE.md)."),
    fmt: str = typer.Option("html", "--format", help="html (self-contained, inline SVG charts) | md"),
    db: str = typer.Option("data/capbench.duckdb", help="Results DB (read-only); none: a planning report."),
    runs: str = typer.Option(None, help="Comma-separated run ids (default: the newest runs of the model and GPU)."),
    model: str = typer.Option(None, help="Model id (default: the newest run's, else kimi-k2-thinking)."),
    gpu: str = typer.Option(None, help="GPU id (default: the newest run's, else h200)."),
    tp: int = typer.Option(None, help="GPUs per instance (default: the newest run's, else 8)."),
    kv_dtype: str = typer.Option(None, help="Your KV dtype choice (default: the newest run's, else fp8_e4m3)."),
    weights: str = typer.Option(None, help="Your expert weights choice (default: the newest run's, else native)."),
    context: int = typer.Option(None, help="Context length (default: the model's maximum)."),
    workload: str = typer.Option("chat", help="Request mix for the predictions: chat | long-context | "
                                 "agentic-coding | a workload YAML path."),
    input_len: int = typer.Option(None, help="Fixed prompt tokens instead of --workload (with --output-len)."),
    output_len: int = typer.Option(None, help="Fixed output tokens instead of --workload."),
    target_rate: float = typer.Option(10.0, help="Load to plan for, requests per second."),
    slo: str = typer.Option("ttft=2s,tpot=50ms,p=90", help="SLO on TTFT and TPOT percentiles (p=50|90|99)."),
    price: float = typer.Option(None, help="$ per GPU-hour (default: the catalog's indicative price)."),
    fidelity: str = typer.Option("full", help="Simulation effort for the predictions: quick | full."),
) -> None:
    """A self-contained capacity report: question, configurations, capacity, measured vs predicted,
    recommendation with monthly cost and savings, SGLang launch commands."""
    from rich.progress import Progress

    from bench import report as rep
    from bench.plan import Question
    from bench.simulate import parse_slo

    if (input_len is None) != (output_len is None):
        raise BadInput("give both --input-len and --output-len, or neither")
    run_ids = [r.strip() for r in runs.split(",") if r.strip()] if runs else None
    dep = rep.newest_deployment(db, run_ids) if not (model and gpu and tp) else {}
    s = parse_slo(slo)
    q = Question(model=model or dep.get("model", "kimi-k2-thinking"), gpu=gpu or dep.get("gpu", "h200"),
                 tp=int(tp or dep.get("tp", 8)), kv_dtype=kv_dtype or dep.get("kv_dtype", "fp8_e4m3"),
                 weights=weights or dep.get("weights", "native"), context=context,
                 workload=None if input_len else workload, input_tokens=input_len or 2000,
                 output_tokens=output_len or 500, slo_ttft_s=s.ttft_s, slo_tpot_s=s.tpot_s,
                 slo_percentile=s.percentile, price_per_gpu_hour=price, target_rate_rps=target_rate,
                 fidelity=fidelity)
    if fmt not in ("html", "md"):
        raise BadInput(f"--format must be html or md, not {fmt!r}")
    from pathlib import Path

    if not Path(out).expanduser().resolve().parent.is_dir():
        raise BadInput(f"directory of --out does not exist: {Path(out).parent}")
    with Progress(transient=True) as bar:
        task = bar.add_task("simulating configurations and reading runs", total=None)
        r = rep.build(q, db, run_ids, progress=lambda: bar.advance(task))
    path = rep.write(r, out, fmt)
    print(f"wrote {path} ({'measured: ' + str(len(r.runs)) + ' run(s)' if r.measured else 'nothing measured'})")


@app.command()
def calibrate(
    runs: str = typer.Option(..., help="Comma-separated run ids to fit (see capbench runs)."),
    db: str = typer.Option("data/capbench.duckdb", help="Results DB."),
    deployment: str = typer.Option(None, help="For runs against a real server: what it ran, as a twin spec "
                                   "(e.g. kimi-k2-thinking@h200x8,kv=fp8_e4m3). Twin runs carry their own."),
    out: str = typer.Option(None, help="Calibration file to write (default: data/calibration/fitted.json, "
                            "which the twin, simulate, the planner and reports read)."),
) -> None:
    """Fit the performance model's efficiency factors to measured runs; prints the error before and after."""
    from pathlib import Path

    from rich.progress import Progress

    from bench import calibrate as cal
    from bench.perfmodel import FITTED_CALIBRATION
    from bench.store import Store

    ids = [r.strip() for r in runs.split(",") if r.strip()]
    if not ids:
        raise BadInput("--runs needs at least one run id")
    target = Path(out) if out else FITTED_CALIBRATION
    with Progress(transient=True) as bar:
        task = bar.add_task("fitting", total=None)
        result = cal.calibrate(Store(db), ids, deployment, target, lambda: bar.advance(task))
    cal.print_result(*result, target)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("run", "worker", "demo"):  # Locust's gevent wants to patch before the rest
        from gevent import monkey

        monkey.patch_all()
    try:
        app(standalone_mode=True)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
