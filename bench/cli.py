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
    page_size: int = typer.Option(1, help="SGLang --page-size."),
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
def demo() -> None:
    """The main job, no GPU needed: capacity, throughput and cost of FP8 KV and INT4 experts."""
    from bench.demo import run_demo

    run_demo()


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
    from bench.store import Store, export_run

    for path in export_run(Store(db, read_only=True), run, fmt, out):
        print(path)


def main() -> None:
    try:
        app(standalone_mode=True)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
