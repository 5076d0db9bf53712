"""A twin of a prefill/decode-disaggregated deployment, served as one endpoint (where the router would be).

A request joins the prefill instance's queue (its own scheduler: PDPerfModel's prefill step times, a chunk per DP
rank per step); when its prompt is prefilled, its KV crosses to the decode instance in the modelled transfer time
(interconnect.kv_transfer_s, plus the router's latency), lands there as cached blocks, and the decode instance's
scheduler (the Twin's own loop, on PDPerfModel's decode step times) produces every output token, the first
included, as SGLang's decode server does. Both loops run in scaled real time on the twin's one asyncio loop."""

from __future__ import annotations

import asyncio
import time

from bench.model import Request, Scheduler, capacity, interconnect
from bench.model.pd import disagg
from bench.twin.config import TwinConfig, pd_shape
from bench.twin.server import Twin, TwinRequest
from bench.twin.text import BLOCK


class DecodeScheduler(Scheduler):
    """The decode instance: a request's cached tokens are what the prefill instance's cache held (the KV that
    crossed over lands as cached blocks but is no cache hit); Scheduler otherwise."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.prefill_cached: dict[Request, int] = {}

    def commit(self, step, now: float):
        first, done = super().commit(step, now)
        for req in first:
            req.cached_tokens = self.prefill_cached.pop(req, 0)
        return first, done


class PDTwin(Twin):
    def __init__(self, config: TwinConfig) -> None:
        super().__init__(config)
        shape = self.shape = pd_shape(config)
        dec, pre = shape.deployment("decode"), shape.deployment("prefill")
        pool = disagg.decode_pool(shape)
        self.pool = min(pool.tokens_per_rank * dec.dp, config.max_total_tokens or 1 << 62)
        self.max_running = config.max_running_requests or pool.max_running_per_rank * dec.dp
        self.sched = DecodeScheduler(disagg.PDPerfModel(shape, "decode", self.eff), self.pool, self.max_running,
                                     self.chunk, BLOCK)
        pcap = capacity.capacity(pre, with_ratios=False)
        self.prefill = Scheduler(disagg.PDPerfModel(shape, "prefill", self.eff), pcap.kv_pool_tokens_total,
                                 pcap.max_running_requests, disagg.chunk(shape) * pre.dp, BLOCK)
        self.prefill_wake = asyncio.Event()
        self.shadows: dict[Request, TwinRequest] = {}
        self.shadow_of: dict[TwinRequest, Request] = {}
        self.crossing: set[TwinRequest] = set()  # prefilled, its KV on the wire to the decode instance
        self.router_s = interconnect.assumptions()["router_ms"] * 1e-3
        self.transfers = 0

    def _enqueue(self, req: TwinRequest) -> None:
        shadow = Request(rid=req.rid, prompt_len=req.prompt_len, max_new=1, arrival=req.arrival,
                         prompt_keys=req.prompt_keys)
        self.shadows[shadow] = req
        self.shadow_of[req] = shadow
        self.prefill.submit(shadow)
        self.prefill_wake.set()

    def transfer_s(self, req: TwinRequest) -> float:
        return interconnect.kv_transfer_s(self.dep.gpu, disagg.kv_bytes(self.shape, req.prompt_len)) + self.router_s

    def _arrive(self, req: TwinRequest) -> None:
        """The KV has crossed: the prompt's blocks are in the decode instance's cache; it decodes from there."""
        if req not in self.crossing:  # its client left on the way
            return
        self.crossing.discard(req)
        self.sched.cache.add_free(req.prompt_keys)
        self.sched.submit(req)
        self.transfers += 1
        self.wake.set()

    async def run(self) -> None:
        await asyncio.gather(super().run(), self._prefill_loop())

    async def _prefill_loop(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        scale = self.config.time_scale
        while True:
            step = self.prefill.plan()
            if step is None:
                self.prefill_wake.clear()
                await self.prefill_wake.wait()
                continue
            now = loop.time()
            due = (due if now - due < 5e-3 else now) + step.duration / scale
            wait = due - loop.time()
            await asyncio.sleep(wait if wait > 1e-3 else 0)
            _, done = self.prefill.commit(step, time.time())
            for shadow in done:
                req = self.shadows.pop(shadow)
                del self.shadow_of[req]
                self.sched.prefill_cached[req] = shadow.cached_tokens
                self.crossing.add(req)
                loop.call_later(self.transfer_s(req) / scale, self._arrive, req)

    def abort(self, req: TwinRequest) -> None:
        """Aborted on both instances, as SGLang's router does: in prefill, on the wire or decoding."""
        shadow = self.shadow_of.pop(req, None)
        if shadow is not None:
            del self.shadows[shadow]
            self.prefill.abort(shadow)
            self.prefill_wake.set()
            req.state = "aborted"
        elif req in self.crossing:
            self.crossing.discard(req)
            self.sched.prefill_cached.pop(req, None)
            req.state = "aborted"
        super().abort(req)  # decoding (or done: nothing)

    def idle(self) -> bool:
        p = self.prefill
        return super().idle() and not (self.shadows or self.crossing or p.waiting or p.inbox or p.num_running)

    def flush(self) -> None:
        """Both instances' prefix caches, as SGLang's router flushes every worker."""
        self.prefill.flush_cache()
        super().flush()

    def server_info(self) -> dict:
        info = super().server_info()
        info["disaggregation"] = {"prefill_gpus": self.shape.prefill_gpus, "decode_gpus": self.shape.decode_gpus,
                                  "transfer_backend": "modelled", "kv_transfers": self.transfers}
        return info
