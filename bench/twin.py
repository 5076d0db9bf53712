"""The twin: an HTTP server that behaves like SGLang serving a chosen model on chosen GPUs.

Same API as SGLang 0.5.23 (OpenAI /v1/chat/completions and /v1/completions, /v1/models, /v1/tokenize, /health,
/health_generate, /server_info, /get_server_info, /flush_cache, /metrics), with capacity from bench/capacity.py
and latencies from bench/scheduler.py + bench/perfmodel.py, played in real time divided by `time_scale`.
Server-side timestamps (time.time(), the store's clock) of each request: response headers
X-Capbench-Request-Id / -Arrival (and -First-Token / -Finish when not streaming), and GET
/capbench/requests/{id}.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, fields

from aiohttp import web

from bench import catalog
from bench.capacity import Deployment
from bench.errors import BadInput
from bench.twin_server import Twin


@dataclass
class TwinConfig:
    model: str = "kimi-k2-thinking"
    gpu: str = "h200"
    tp: int = 8
    dp: int = 1
    kv_dtype: str = "bf16"
    weights: str = "native"
    context: int | None = None
    mem_fraction: float | None = None
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port
    time_scale: float = 1.0  # 10: ten times faster than the modelled GPUs
    seed: int = 0
    drift: float = 0.0  # fraction of greedy tokens that differ from a drift-0 twin's (quality-drift tests)
    calibration: str | None = None
    served_model_name: str | None = None  # default: the model's Hugging Face repo, as SGLang serves it
    max_running_requests: int | None = None
    max_total_tokens: int | None = None  # SGLang --max-total-tokens: cap the KV pool
    mixed_chunk: bool = False

    def deployment(self) -> Deployment:
        return Deployment(catalog.model(self.model), catalog.gpu(self.gpu), self.tp, self.dp, self.kv_dtype,
                          self.weights, self.context, self.mem_fraction)


_ALIASES = {"kv": "kv_dtype", "scale": "time_scale", "name": "served_model_name"}


def parse_twin_spec(spec: str) -> TwinConfig:
    """'twin:kimi-k2-thinking@h200x8,kv=fp8_e4m3,weights=int4-g32,time_scale=10' -> TwinConfig."""
    text = spec.removeprefix("twin:")
    head, *opts = text.split(",")
    model, _, where = head.partition("@")
    if not model:
        raise BadInput(f"twin spec '{spec}': expected twin:MODEL[@GPUxN][,key=value...]")
    values: dict = {"model": model}
    if where:
        gpu, _, count = where.rpartition("x")
        if not gpu or not count.isdigit():
            raise BadInput(f"twin spec '{spec}': expected GPUxN after @, e.g. h200x8")
        values.update(gpu=gpu, tp=int(count))
    kinds = {f.name: f.type for f in fields(TwinConfig)}
    for opt in filter(None, opts):
        key, sep, val = opt.partition("=")
        key = _ALIASES.get(key.strip(), key.strip().replace("-", "_"))
        if not sep or key not in kinds or key == "model":
            raise BadInput(f"twin spec '{spec}': unknown option '{opt}'; valid: {', '.join(sorted(kinds))}")
        kind = str(kinds[key])
        try:
            if "bool" in kind:
                values[key] = val.strip().lower() in ("1", "true", "yes", "on")
            elif "int" in kind:
                values[key] = int(val)
            elif "float" in kind:
                values[key] = float(val)
            else:
                values[key] = val.strip()
        except ValueError as e:
            raise BadInput(f"twin spec '{spec}': bad value for {key}: '{val}'") from e
    config = TwinConfig(**values)
    config.deployment()  # validate now
    return config


async def start(config: TwinConfig) -> tuple[Twin, web.AppRunner, asyncio.Task]:
    twin = Twin(config)
    runner = web.AppRunner(twin.app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, backlog=4096)
    await site.start()
    config.port = runner.addresses[0][1]
    return twin, runner, asyncio.create_task(twin.run())


async def serve_forever(config: TwinConfig, ready=None) -> None:
    twin, runner, task = await start(config)
    if ready:
        ready(twin)
    try:
        await asyncio.Event().wait()
    finally:
        task.cancel()
        await runner.cleanup()


class TwinHandle:
    """A twin on a background thread: `.url`, `.twin`, `.close()`."""

    def __init__(self, config: TwinConfig) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        started, self.error = threading.Event(), None
        self.thread = threading.Thread(target=self._main, args=(started,), daemon=True, name="capbench-twin")
        self.thread.start()
        started.wait(30)
        if self.error:
            raise self.error

    def _main(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.twin, self.runner, self.task = self.loop.run_until_complete(start(self.config))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            self.error = e
            started.set()
            return
        started.set()
        self.loop.run_forever()

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def close(self) -> None:
        if self.error or not self.loop.is_running():
            return

        async def stop() -> None:
            self.task.cancel()
            await self.runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def __enter__(self) -> TwinHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve_in_thread(config: TwinConfig) -> TwinHandle:
    return TwinHandle(config)


def print_figures(twin: Twin) -> None:
    """What `capbench twin` prints before it serves: the capacity and performance figures it models."""
    from rich.console import Console

    from bench.capacity_table import capacity_table
    from bench.perfmodel import summary

    console = Console()
    console.print(capacity_table(twin.cap))
    s = summary(twin.dep, 4096, twin.eff)
    console.print(f"modelled: {s['single_stream_tok_s']:.0f} tok/s single stream; "
                  f"{s['decode_tok_s_at_max_batch']:,.0f} tok/s decoding {s['max_batch_at_context']} x 4k-token "
                  f"sequences (TPOT {s['tpot_ms_at_max_batch']:.0f} ms, ${s['usd_per_million_output_tokens']:.2f} "
                  f"per 1M output tokens); prefill {s['prefill_tok_s']:,.0f} tok/s")
    console.print(f"KV pool {twin.pool:,} tokens, max_running_requests {twin.max_running}, chunked prefill "
                  f"{twin.chunk}, time scale {twin.config.time_scale:g}x")
    console.print(f"serving {twin.name} on http://{twin.config.host}:{twin.config.port} (OpenAI /v1, /metrics, "
                  "/server_info)", highlight=False)
