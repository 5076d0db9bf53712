"""The twin's commands: `twin` (an SGLang-compatible server that models a deployment) and `demo` (the main job on
twins, no GPU needed)."""

from __future__ import annotations

import typer

from bench.errors import BadInput


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

    from bench.twin import TwinConfig, own_process, serve_forever

    if not 0 <= port <= 65535:
        raise BadInput(f"--port must be between 0 and 65535, got {port}")
    config = TwinConfig(model, gpu, tp, dp, kv_dtype, weights, context, None, host, port, time_scale, seed, drift,
                        calibration, max_total_tokens=max_total_tokens)
    own_process()
    try:
        asyncio.run(serve_forever(config, ready=print_figures))
    except KeyboardInterrupt:
        pass
    except OSError as e:
        raise BadInput(f"cannot serve on {host}:{port}: {e.strerror or e}") from None


def print_figures(twin) -> None:
    """What `capbench twin` prints before it serves: the capacity and performance figures it models."""
    from rich.console import Console

    from bench.model import perfmodel
    from bench.report import terminal

    console = Console()
    console.print(terminal.capacity_table(twin.cap))
    s = perfmodel.summary(twin.dep, 4096, twin.eff)
    console.print(f"modelled: {s['single_stream_tok_s']:.0f} tok/s single stream; "
                  f"{s['decode_tok_s_at_max_batch']:,.0f} tok/s decoding {s['max_batch_at_context']} x 4k-token "
                  f"sequences (TPOT {s['tpot_ms_at_max_batch']:.0f} ms, ${s['usd_per_million_output_tokens']:.2f} "
                  f"per 1M output tokens); prefill {s['prefill_tok_s']:,.0f} tok/s")
    console.print(f"KV pool {twin.pool:,} tokens, max_running_requests {twin.max_running}, chunked prefill "
                  f"{twin.chunk}, time scale {twin.config.time_scale:g}x")
    console.print(f"serving {twin.name} on http://{twin.config.host}:{twin.config.port} (OpenAI /v1, /metrics, "
                  "/server_info)", highlight=False)


def demo(
    db: str = typer.Option("data/capbench.duckdb", help="Results DB (runs are added; earlier ones are kept)."),
    out: str = typer.Option("reports/demo.html", help="Where to write the capacity report (the campaign report goes "
                            "beside it, as NAME-campaign.html)."),
    duration: float = typer.Option(None, help="Seconds of load per sweep stage (default: the campaign file's)."),
    campaign: str = typer.Option("demo", help="The campaign to run (default: the built-in data/campaigns/demo.yaml)."),
    open_dashboard: bool = typer.Option(False, "--dashboard", help="Start the dashboard at the end."),
) -> None:
    """The main job, no GPU needed: what FP8 KV buys Kimi K2 Thinking and GLM-4.6 on 8x H200, measured at
    saturation on twins next to the model's prediction."""
    from pathlib import Path

    from bench.cli.report import dashboard
    from bench.demo import run_demo

    if duration is not None and duration <= 0:
        raise BadInput(f"--duration must be positive, got {duration}")
    run_demo(Path(db), Path(out), duration, campaign)
    if open_dashboard:
        dashboard(db=db, port=8501, host="127.0.0.1")
