"""Measuring commands: `run` (a load test into the DB), `worker` (a remote Locust worker), `runs`, `export`, and
`calibrate` (fit the performance model to measured runs)."""

from __future__ import annotations

import sys

import typer

from bench.errors import BadInput

DB = typer.Option("data/capbench.duckdb", help="Results DB.")
DB_READ = typer.Option("data/capbench.duckdb", help="Results DB (opened read-only).")


def run(
    target: str = typer.Option(..., help="OpenAI-compatible server URL, or twin:SPEC to start a twin for the run "
                               "(e.g. twin:kimi-k2-thinking@h200x8,kv=fp8_e4m3)."),
    profile: str = typer.Option("poisson", help="users | constant | poisson | gamma | ramp | steps | spike | "
                                "diurnal | sweep | trace, or a profile YAML path."),
    rate: float = typer.Option(None, help="Requests/s (open-loop profiles)."),
    users: int = typer.Option(None, help="Concurrent users (closed loop: profile users)."),
    duration: float = typer.Option(None, help="Seconds of measured load."),
    max_concurrency: int = typer.Option(None, help="Open loop: at most N requests in flight; arrivals past it wait "
                                        "in the client for a slot (bench_serving's --max-concurrency)."),
    param: list[str] = typer.Option(None, help="Any other profile parameter, KEY=VALUE (repeatable), "
                                    "e.g. --param burstiness=0.5."),
    workload: str = typer.Option(None, help="Workload name (data/workloads), YAML path, or ShareGPT JSON "
                                 "(default: chat)."),
    input_len: str = typer.Option(None, help="Synthetic prompts of N tokens, or uniform:A-B (instead of --workload)."),
    output_len: str = typer.Option(None, help="Answers of N tokens, or uniform:A-B (with --input-len)."),
    db: str = DB,
    label: str = typer.Option("", help="A label for the run."),
    model: str = typer.Option(None, help="Model name to send (default: the server's first /v1/models entry)."),
    api_key_env: str = typer.Option(None, help="Name of the env var holding the API key (never stored)."),
    extra_body: str = typer.Option(None, help="A JSON object merged into every request's body (temperature, top_p, "
                                   "response_format, reasoning_effort, ...)."),
    header: list[str] = typer.Option(None, help="NAME=env:VAR: a header sent with every request, its value from "
                                     "the environment (never stored). Repeatable."),
    also_target: list[str] = typer.Option(None, help="Another server URL (a fleet, a router's backends); "
                                          "requests are spread over --target and these. Repeatable."),
    route: str = typer.Option("round-robin", help="With several targets: round-robin (per request) or session "
                              "(every turn of a session to one target)."),
    cancel: str = typer.Option(None, help="SHARE[:after=SECONDS]: that share of requests (seeded) is closed by the "
                               "client at its first token, or SECONDS after it was sent; recorded as cancelled, "
                               "not as errors nor in the latency percentiles."),
    slo: str = typer.Option(None, help="SLO for goodput: ttft=2s,tpot=50ms[,e2e=30s] (each request judged alone)."),
    warmup: float = typer.Option(0.0, help="Seconds of warm-up before the measured phase (marked, not counted)."),
    workers: int = typer.Option(0, help="Locust worker processes on this machine (0: one process)."),
    expect_workers: int = typer.Option(0, help="Workers that join from other machines (capbench worker)."),
    master_bind: str = typer.Option("127.0.0.1", help="Address the Locust master listens on (for remote workers)."),
    master_port: int = typer.Option(5557, help="Port the Locust master listens on."),
    seed: int = typer.Option(0, help="Seed of the schedule and the prompts."),
    api: str = typer.Option(None, help="chat | completions | embeddings (default: the workload's)."),
    stream: bool = typer.Option(True, help="Stream responses (SSE); --no-stream for one JSON answer."),
    timeout: float = typer.Option(600.0, help="Seconds one request may take in all."),
    max_inflight: int = typer.Option(None, help="Open loop: Locust users that carry the schedule (default: 20 x "
                                     "peak rate, 32..4096)."),
    live: bool = typer.Option(True, help="Live display (--no-live for logs and CI)."),
    gpu_metrics: list[str] = typer.Option(None, help="A GPU node's Prometheus endpoint (NVIDIA DCGM exporter, e.g. "
                                          "http://node1:9400/metrics), scraped during the run into the GPU samples "
                                          "per node and GPU. Repeatable."),
    gpu_metrics_interval: float = typer.Option(1.0, help="Seconds between scrapes of --gpu-metrics."),
    repeat: int = typer.Option(1, help="Run the load N times (each a run in the DB, one repeat group) and print "
                               "each figure with its 90 % interval across the runs; with --until-ci, the most runs."),
    until_ci: str = typer.Option(None, help="FIGURE:WIDTH, e.g. tok_s:5% or ttft_p99:0.05 (seconds): stop "
                                 "repeating once that figure's 90 % interval half-width is within the width (at most "
                                 "--repeat runs, 10 if not given)."),
) -> None:
    """A load test: Locust (headless, as a library) with a load profile and a workload; every request in the DB."""
    import yaml

    from bench import runner
    from bench.model import parse_slo
    from loadgen import cancel as cancelling

    overrides = {"rate": rate, "users": users, "duration": duration, "max_concurrency": max_concurrency}
    for kv in param or []:
        key, _, value = kv.partition("=")
        if not key or not value:
            raise BadInput(f"--param takes KEY=VALUE, not {kv!r}")
        overrides[key] = yaml.safe_load(value)
    if workers < 0 or expect_workers < 0:
        raise BadInput("--workers and --expect-workers are counts >= 0")
    if (input_len is None) != (output_len is None):
        raise BadInput("give both --input-len and --output-len (N or uniform:A-B), or neither")
    if input_len is not None and workload is not None:
        raise BadInput("give --workload or --input-len/--output-len, not both")
    shape = runner.request_shape(extra_body, header or [], also_target or [], route)
    if cancel is not None:
        shape["cancel"] = cancelling.parse(cancel)
        if shape["cancel"]["after_s"] is None and not stream:
            raise BadInput("--cancel without after=SECONDS cuts at the first token: that needs streaming (drop "
                           "--no-stream, or give after=SECONDS)")
    opts = runner.RunOptions(
        target=target, profile=profile, overrides=overrides, workload=workload or "chat",
        lengths=(input_len, output_len) if input_len is not None else None, db=db, label=label,
        model=model, api_key_env=api_key_env, slo=parse_slo(slo), warmup_s=warmup, workers=workers,
        expect_workers=expect_workers, master_bind=master_bind, master_port=master_port, seed=seed, api=api,
        stream=stream, timeout_s=timeout, max_inflight=max_inflight, live=live,
        request_shape=shape,
        gpu_metrics=tuple(gpu_metrics or ()), gpu_metrics_interval_s=gpu_metrics_interval)
    if repeat != 1 or until_ci:
        from bench.repeat import UNTIL_CI_RUNS, run_repeated

        results = run_repeated(opts, UNTIL_CI_RUNS if until_ci and repeat == 1 else repeat, until_ci)
    else:
        results = runner.run(opts)
    sys.exit(exit_status(results))


def exit_status(results: list) -> int:
    """0: completed (some requests may have failed); 130: interrupted; 1 (with the count): rows lost, or not
    one request succeeded."""
    if any(r.status == "aborted" for r in results):
        return 130
    lost = sum(r.lost for r in results)
    errors = [r.error for r in results if r.error]
    if errors:  # the store failed: one line, with the count
        print(f"error: {errors[0]}; the run stopped sending: {lost} of {sum(r.sent for r in results)} requests "
              "sent have no stored row", file=sys.stderr)
        return 1
    if lost or any(r.status == "failed" for r in results):
        print(f"error: {lost} of {sum(r.sent for r in results)} requests sent have no stored row"
              + ("; the run failed (see above)" if any(r.status == "failed" for r in results) else ""),
              file=sys.stderr)
        return 1
    sent = sum(r.sent for r in results)
    if sent and not sum(r.summary.get("succeeded", 0) for r in results):
        print(f"error: none of the {sent} requests sent succeeded (see the errors above)", file=sys.stderr)
        return 1
    return 0


def worker(
    master: str = typer.Option(..., help="Host of the `capbench run` master (its --master-bind address)."),
    master_port: int = typer.Option(5557, help="The master's --master-port."),
    keep: bool = typer.Option(True, help="After a run, wait for the next one (sweep stages, later runs); "
                              "--no-keep leaves after one run."),
    connect_timeout: float = typer.Option(300.0, help="Seconds to wait for a master (each time one is awaited)."),
) -> None:
    """Join a `capbench run --expect-workers N` from another machine: a Locust worker that sends its share."""
    from bench.checks import check_host
    from loadgen.worker import run_worker

    check_host(master, "--master")
    if not run_worker(master, master_port, once=not keep, connect_timeout_s=connect_timeout):
        raise BadInput(f"no capbench run master at {master}:{master_port} within {connect_timeout:g}s")


def runs(db: str = DB_READ) -> None:
    """List the runs in the results DB, newest first."""
    from rich.console import Console

    from bench.report import terminal
    from bench.store import Store, runinfo

    Console(width=max(Console().width, 300)).print(terminal.runs_table(runinfo.list_runs(Store(db, read_only=True))))


def export(
    run: str = typer.Option(..., help="Run id (see `capbench runs`)."),
    fmt: str = typer.Option("parquet", "--format", help="parquet | csv"),
    out: str = typer.Option(..., help="Directory to write <table>.<format> files into."),
    db: str = DB_READ,
) -> None:
    """Export every table's rows of one run (runs, requests, gpu/server samples, integrity events)."""
    from bench.store import Store, export_run

    for path in export_run(Store(db, read_only=True), run, fmt, out):
        print(path)


def calibrate(
    runs: str = typer.Option(..., help="Comma-separated run ids to fit (see capbench runs)."),
    db: str = DB,
    deployment: str = typer.Option(None, help="For runs against a real server: what it ran, as a deployment spec "
                                   "(e.g. kimi-k2-thinking@h200x8,kv=fp8_e4m3). Twin runs carry their own."),
    out: str = typer.Option(None, help="Calibration file to write (default: data/calibration/fitted.json, "
                            "which the twin, simulate, the planner and reports read)."),
) -> None:
    """Fit the performance model's efficiency factors to measured runs; prints the error before and after."""
    from pathlib import Path

    from rich.progress import Progress

    from bench import calibrate as cal
    from bench.model import perfmodel
    from bench.store import Store

    ids = [r.strip() for r in runs.split(",") if r.strip()]
    if not ids:
        raise BadInput("--runs needs at least one run id")
    target = Path(out) if out else perfmodel.FITTED_CALIBRATION
    with Progress(transient=True) as bar:
        task = bar.add_task("fitting", total=None)
        result = cal.calibrate(Store(db), ids, deployment, target, lambda: bar.advance(task))
    cal.print_result(*result, target)
