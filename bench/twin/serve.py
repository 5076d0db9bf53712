"""Serving a twin: in this process until cancelled (`capbench twin`), or on a background thread (tests, runs).

Same API as SGLang 0.5.23 (OpenAI /v1/chat/completions and /v1/completions, /v1/models, /v1/tokenize, /health,
/health_generate, /server_info, /get_server_info, /flush_cache, /metrics), with capacity from model/capacity.py
and latencies from model/scheduler.py + model/perfmodel.py, played in real time divided by `time_scale`.
Server-side timestamps (time.time(), the store's clock) of each request: response headers
X-Capbench-Request-Id / -Arrival (and -First-Token / -Finish when not streaming), and GET
/capbench/requests/{id}.
"""

from __future__ import annotations

import asyncio
import sys
import threading

from aiohttp import web

from bench.twin.config import TwinConfig
from bench.twin.pd import PDTwin
from bench.twin.server import Twin


async def start(config: TwinConfig) -> tuple[Twin, web.AppRunner, asyncio.Task]:
    twin = PDTwin(config) if config.prefill_tp else Twin(config)
    runner = web.AppRunner(twin.app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, backlog=4096)
    await site.start()
    config.port = runner.addresses[0][1]
    return twin, runner, asyncio.create_task(twin.run())


def own_process() -> None:
    """For a process that is the twin's alone (`capbench twin`, a run's or campaign's twin): the parser thread holds
    the GIL for up to the switch interval at a time, and at Python's 5 ms the scheduler loop would wait that long
    for it and lose its modelled pace (a 30x twin's decode step is 1-2 ms). Not set for a twin on a thread of
    another program, whose own threads it would slow."""
    sys.setswitchinterval(min(sys.getswitchinterval(), 0.001))


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
