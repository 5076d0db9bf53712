"""The twin's engine and HTTP handlers: the scheduler loop in (scaled) real time and SGLang's API over it.
The package's __init__ is its public face (TwinConfig, serve_in_thread, parse_twin_spec)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from aiohttp import web

from bench.errors import BadInput
from bench.model import PerfModel, Request, Scheduler, load_efficiency
from bench.model import capacity as cap
from bench.twin.api import (
    ApiError,
    GenParams,
    chunk,
    merge_logprobs,
    output_length,
    parse,
    response,
    token_logprobs,
    usage,
    usage_chunk,
)
from bench.twin.config import TwinConfig
from bench.twin.metrics import Metrics
from bench.twin.text import BLOCK, WORDS, Synth, Tokenizer, chain_keys, prompt_digest

KEEP_RECORDS = 100_000
# A scheduler loop woken up to this late makes the time up on its next steps (they run without sleeping), so the
# modelled clock keeps its pace and a token leaves at most this late. On a 2-core host shared with the load
# generator, wake-ups 5-20 ms late are common (the OS, a co-tenant's steal time), and dropping them stretched a
# 30x twin's modelled clock by 5-9 % in a stage; past this the loop does not catch up: the host's CPU then shows.
CATCH_UP_S = 0.020


@dataclass(eq=False)
class TwinRequest(Request):
    params: GenParams | None = None
    synth: Synth | None = None
    finish_reason: str = "length"
    arrival_wall: float = 0.0
    first_token_wall: float | None = None
    finish_wall: float | None = None
    last_token_wall: float = 0.0
    streamed: int = 0  # output tokens handed to the socket
    event: asyncio.Event | None = None


class _SSEResponse(web.StreamResponse):
    """Headers leave with the first token's chunk, one send instead of two (aiohttp's Response does the same)."""

    _send_headers_immediately = False


class Twin:
    """Scheduler loop + HTTP handlers. Everything runs on one asyncio loop: no locks."""

    def __init__(self, config: TwinConfig) -> None:
        self.config = config
        self.dep = config.deployment()
        self.cap = cap.capacity(self.dep, with_ratios=False)
        if not self.cap.fits:
            raise BadInput(f"{config.model} does not fit {config.tp} x {config.gpu} with {config.weights} weights")
        if config.time_scale <= 0:
            raise BadInput(f"time_scale must be positive, got {config.time_scale}")
        self.eff = load_efficiency(config.gpu, config.calibration)
        self.pool = min(self.cap.kv_pool_tokens_total, config.max_total_tokens or 1 << 62)
        self.max_running = config.max_running_requests or self.cap.max_running_requests
        self.chunk = cap.memory_tier(self.dep.gpu, self.dep.tp)[0]
        self.sched = Scheduler(PerfModel(self.dep, self.eff), self.pool, self.max_running, self.chunk, BLOCK,
                               config.mixed_chunk)
        self.tok = Tokenizer(self.dep.model.vocab_size)
        self.name = config.served_model_name or self.dep.model.hf_repo
        self.metrics = Metrics(self.name)
        self.records: OrderedDict[str, TwinRequest] = OrderedDict()
        self.wake = asyncio.Event()
        self.nonce = self.peak_running = 0
        self.last_gen = (time.time(), 0)
        self.gen_throughput = 0.0
        self.parser = ThreadPoolExecutor(1, thread_name_prefix="twin-parse")  # one thread: requests keep their order
        self.behind_s = 0.0  # wall seconds the scheduler loop fell behind its modelled pace and did not make up

    # ---- the scheduler loop
    async def run(self) -> None:
        """Plan a step, wait out its modelled duration / time_scale, commit it, wake the requests it served. Waits
        under a millisecond add up on `due` and are slept once they pass 1 ms (a timer costs that much), and a late
        wake-up is made up on the next steps, up to CATCH_UP_S: past it the twin's overhead shows."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            step = self.sched.plan()
            if step is None:
                self.wake.clear()
                await self.wake.wait()
                due = loop.time()  # idle is not behind
                continue
            self.peak_running = max(self.peak_running, self.sched.num_running)
            running = list(self.sched.decoding) if step.decode else []
            now = loop.time()
            if now - due >= CATCH_UP_S:  # too late to make up: the modelled clock loses it (the host's CPU shows)
                self.behind_s += now - due
                due = now
            due += step.duration / self.config.time_scale
            wait = due - loop.time()
            await asyncio.sleep(wait if wait > 1e-3 else 0)
            now = time.time()
            first, done = self.sched.commit(step, now)
            every = self.config.stream_interval
            for req in running:
                self.metrics.itl.observe(now - req.last_token_wall)
                req.last_token_wall = now
                # a non-streamed request only needs its finish; a streamed one its tokens, every `every` of them
                # as SGLang's --stream-interval sends them (fewer wake-ups: a faster twin keeps up)
                if req.params.stream and (every == 1 or self.sched.generated(req) - req.streamed >= every):
                    req.event.set()
            for req in first:
                req.first_token_wall = req.last_token_wall = now
                self.metrics.ttft.observe(now - req.arrival_wall)
                req.event.set()
            for req in done:
                req.finish_wall = now
                self.metrics.e2e.observe(now - req.arrival_wall)
                req.event.set()
                req.prompt_keys, req.seq_keys, req.params.prompt_ids = [], None, []  # keep records small

    def parse(self, raw: bytes, chat: bool) -> tuple[GenParams, list[int]]:
        """A request body's parameters and its prompt's block keys: the CPU-heavy part of taking a request (a
        coding agent's ~12k tokens: 2-5 ms), run on the parser thread so the scheduler loop keeps its pace."""
        p = parse(raw, chat, self.tok)
        return p, chain_keys(p.prompt_ids, len(p.prompt_ids) // BLOCK)

    def submit(self, p: GenParams, prompt_keys: list[int] | None = None) -> TwinRequest:
        ids = p.prompt_ids
        ctx = self.dep.context_len
        if len(ids) >= ctx:
            raise ApiError(f"The input ({len(ids)} tokens) is longer than the model's context length ({ctx} tokens).",
                           "prompt")
        if len(ids) + 1 > self.pool:
            raise ApiError(f"The input ({len(ids)} tokens) does not fit the KV cache ({self.pool} tokens).", "prompt")
        self.nonce += 1
        synth = Synth(prompt_digest(ids), self.config.seed, self.config.drift,
                      0 if p.temperature == 0 else self.nonce)
        max_new, reason = output_length(p, synth, min(ctx, self.pool) - len(ids))
        rid = uuid.uuid4().hex
        word_ids = self.tok.word_ids

        def seq_keys(n: int) -> list[int]:
            out = [word_ids[synth.word(i)] for i in range(n - len(ids))]
            return chain_keys(ids + out, n // BLOCK)

        req = TwinRequest(rid=rid, prompt_len=len(ids), max_new=max_new, arrival=time.time(),
                          prompt_keys=chain_keys(ids, len(ids) // BLOCK) if prompt_keys is None else prompt_keys,
                          seq_keys=seq_keys, params=p, synth=synth,
                          finish_reason=reason, event=asyncio.Event())
        req.arrival_wall = req.arrival
        self.records[rid] = req
        if len(self.records) > KEEP_RECORDS:
            self.records.popitem(last=False)
        self._enqueue(req)
        self.metrics.requests_total += 1
        return req

    def _enqueue(self, req: TwinRequest) -> None:
        """Hand a new request to the engine (a disaggregated twin sends it to its prefill instance first)."""
        self.sched.submit(req)
        self.wake.set()

    def abort(self, req: TwinRequest) -> None:  # the client left: free what it holds (SGLang's abort_request)
        self.sched.abort(req)
        self.wake.set()

    def timestamps(self, req: TwinRequest) -> dict:
        return {"id": req.rid, "state": req.state, "arrival": req.arrival_wall, "first_token": req.first_token_wall,
                "finish": req.finish_wall, "prompt_tokens": req.prompt_len,
                "completion_tokens": self.sched.generated(req), "cached_tokens": req.cached_tokens,
                "retractions": req.retractions}

    def headers(self, req: TwinRequest) -> dict:
        h = {"X-Capbench-Request-Id": req.rid, "X-Capbench-Arrival": repr(req.arrival_wall)}
        if req.finish_wall is not None:
            h["X-Capbench-First-Token"] = repr(req.first_token_wall)
            h["X-Capbench-Finish"] = repr(req.finish_wall)
        return h

    # ---- generation endpoints
    async def generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival = time.time()
        try:
            raw = await request.read()
            p, keys = await asyncio.get_running_loop().run_in_executor(self.parser, self.parse, raw, chat)
            req = self.submit(p, keys)
        except ApiError as e:
            return web.Response(status=e.status, body=e.body(), content_type="application/json")
        req.arrival_wall = arrival
        created = int(arrival)
        try:
            if p.stream:
                return await self._stream(request, req, created)
            return await self._complete(req, created)
        except asyncio.CancelledError:
            self.abort(req)
            raise
        except ConnectionResetError:  # the client left mid-stream: free its KV; there is no one to answer
            self.abort(req)
            return web.Response(status=499)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self.generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.generate(request, chat=False)

    def _text(self, req: TwinRequest, start: int, end: int) -> str:
        return "".join(" " + WORDS[req.synth.word(i)] for i in range(start, end))

    async def _complete(self, req: TwinRequest, created: int) -> web.Response:
        while req.state != "done":
            await req.event.wait()
            req.event.clear()
        p = req.params
        n = req.max_new
        logprobs = None
        if p.logprobs is not None:
            offset, parts = 0, []
            for i in range(n):
                parts.append(token_logprobs(p, req.synth, i, offset))
                offset += len(WORDS[req.synth.word(i)]) + 1
            logprobs = merge_logprobs(p, parts)
        body = response(p, req.rid, created, self.name, self._text(req, 0, n), req.finish_reason, logprobs,
                        usage(req.prompt_len, n, req.cached_tokens))
        return web.Response(body=json.dumps(body).encode(), content_type="application/json",
                            headers=self.headers(req))

    async def _stream(self, request: web.Request, req: TwinRequest, created: int) -> web.StreamResponse:
        resp = _SSEResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           **self.headers(req)})
        await resp.prepare(request)
        p, sent, offset = req.params, 0, 0
        while sent < req.max_new:
            await req.event.wait()
            req.event.clear()
            upto = req.max_new if req.state == "done" else self.sched.generated(req)
            out = []
            if sent == 0 and upto > 0:  # a streamed request's first token counts when it is handed to the socket
                req.first_token_wall = time.time()
            for i in range(sent, upto):
                word = WORDS[req.synth.word(i)]
                lp = token_logprobs(p, req.synth, i, offset) if p.logprobs is not None else None
                offset += len(word) + 1
                last = i == req.max_new - 1
                out.append(chunk(p, req.rid, created, self.name, " " + word, req.finish_reason if last else None,
                                 lp, first=i == 0))
            sent = req.streamed = max(sent, upto)
            if sent >= req.max_new:  # the last tokens, usage, [DONE] and the end of the body in one send
                if p.include_usage:
                    u = usage(req.prompt_len, req.max_new, req.cached_tokens)
                    out.append(usage_chunk(p, req.rid, created, self.name, u))
                out.append(b"data: [DONE]\n\n")
                await resp.write_eof(b"".join(out))
                return resp
            if out:
                await resp.write(b"".join(out))
        return resp

    # ---- the rest of SGLang's surface
    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
             "root": self.name, "max_model_len": self.dep.context_len}]})

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
            prompt = body["prompt"] if isinstance(body, dict) else None
            if not isinstance(prompt, str):
                raise ValueError
        except (ValueError, KeyError):
            return web.Response(status=400, content_type="application/json",
                                body=ApiError("'prompt' must be a string", "prompt").body())
        ids = self.tok.encode(prompt)
        return web.json_response({"tokens": ids, "count": len(ids), "max_model_len": self.dep.context_len})

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(status=200)

    async def health_generate(self, _: web.Request) -> web.Response:
        req = self.submit(GenParams(chat=False, prompt_ids=[0], max_tokens=1, ignore_eos=True, temperature=0))
        while req.state != "done":
            await req.event.wait()
            req.event.clear()
        return web.Response(status=200)

    def idle(self) -> bool:
        s = self.sched
        return not (s.waiting or s.inbox or s.num_running)

    def flush(self) -> None:
        self.sched.flush_cache()

    async def flush_cache(self, request: web.Request) -> web.Response:
        """SGLang 0.5.23's: only with no request running or waiting (a request still running would put its prefix
        back after the flush); `?timeout=S` waits up to S wall seconds for that, else 400 at once."""
        try:
            timeout = max(0.0, float(request.query.get("timeout") or 0.0))
        except ValueError:
            return web.Response(status=400, text="timeout: a number of seconds\n")
        deadline = time.monotonic() + timeout
        while not self.idle() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if not self.idle():
            return web.Response(status=400, text="Timed out waiting for idle state." if timeout else
                                "Flush cache failed.\n")
        self.flush()
        return web.Response(text="Cache flushed.\n")

    def server_info(self) -> dict:
        c, dep = self.cap, self.dep
        _, max_bs = cap.memory_tier(dep.gpu, dep.tp)
        graph_gib = max_bs * 2 / 1024 + (1.5 if dep.model.attention == "mla" else 0)  # estimate, not measured
        st = self.sched.stats
        return {
            "model_path": dep.model.hf_repo, "served_model_name": self.name, "tp_size": dep.tp, "dp_size": dep.dp,
            "enable_dp_attention": dep.dp > 1, "kv_cache_dtype": "auto" if dep.kv_dtype == "bf16" else dep.kv_dtype,
            "quantization": None if dep.weights == "native" else dep.weights, "page_size": 1,
            "chunked_prefill_size": self.chunk, "max_running_requests": self.max_running,
            "mem_fraction_static": c.mem_fraction_static, "context_length": dep.context_len,
            "enable_metrics": True, "enable_cache_report": True, "stream_interval": self.config.stream_interval,
            "host": self.config.host, "port": self.config.port,
            "max_total_num_tokens": self.pool, "max_req_input_len": min(dep.context_len, self.pool) - 1,
            "version": "0.5.23-capbench-twin",
            "internal_states": [{
                "memory_usage": {"weight": round(c.weight_bytes_per_gpu / cap.GIB, 2),
                                 "kvcache": round(self.pool / dep.dp * c.kv_bytes_per_token_per_gpu / cap.GIB, 2),
                                 "token_capacity": self.pool, "graph": round(graph_gib, 2)},
                "last_gen_throughput": self.gen_throughput, "num_running_reqs": self.sched.num_running,
                "num_queue_reqs": len(self.sched.waiting), "peak_running_reqs": self.peak_running,
                "token_usage": self.sched.used_tokens / self.pool, "retractions": st["retractions"],
            }],
            "capbench": {"twin": asdict(self.config), "capacity": c.to_dict(), "efficiency": self.eff.to_dict(),
                         "behind_s": self.behind_s},
        }

    async def server_info_handler(self, _: web.Request) -> web.Response:
        return web.json_response(self.server_info())

    async def request_record(self, request: web.Request) -> web.Response:
        req = self.records.get(request.match_info["rid"])
        if req is None:
            return web.Response(status=404, content_type="application/json",
                                body=ApiError("no such request", None, 404).body())
        return web.json_response(self.timestamps(req))

    async def metrics_handler(self, _: web.Request) -> web.Response:
        st, s = self.sched.stats, self.sched
        now = time.time()
        t0, g0 = self.last_gen
        if now - t0 >= 0.5:
            self.gen_throughput = (st["generation_tokens"] - g0) / (now - t0)
            self.last_gen = (now, st["generation_tokens"])
        gb = self.cap.kv_bytes_per_token_per_gpu * self.pool / self.dep.dp / 1e9
        gauges = {
            "sglang:num_running_reqs": ("The number of running requests.", s.num_running),
            "sglang:num_queue_reqs": ("The number of requests in the waiting queue.", len(s.waiting)),
            "sglang:token_usage": ("The token usage.", s.used_tokens / self.pool),
            "sglang:gen_throughput": ("The generation throughput (token/s).", self.gen_throughput),
            "sglang:cache_hit_rate": ("The prefix cache hit rate.",
                                      st["cached_tokens"] / st["prompt_tokens"] if st["prompt_tokens"] else 0.0),
            "sglang:max_total_num_tokens": ("Maximum total number of tokens in the KV cache pool.", self.pool),
            "sglang:kv_cache_memory_usage_gb": ("KV cache memory per GPU (GB).", round(gb, 3)),
            "sglang:weight_memory_usage_gb": ("Weight memory per GPU (GB).", round(self.cap.weight_bytes_per_gpu
                                                                                    / 1e9, 3)),
        }
        counters = {
            "sglang:prompt_tokens": ("Number of prefill tokens processed.", st["prompt_tokens"]),
            "sglang:generation_tokens": ("Number of generation tokens processed.", st["generation_tokens"]),
            "sglang:cached_tokens": ("Number of cached prompt tokens.", st["cached_tokens"]),
            "sglang:num_requests": ("Number of requests processed.", self.metrics.requests_total),
            "sglang:num_retracted_reqs": ("Number of retracted requests.", st["retractions"]),
        }
        return web.Response(text=self.metrics.render(gauges, counters), content_type="text/plain",
                            charset="utf-8")

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.add_routes([
            web.post("/v1/chat/completions", self.chat_completions), web.post("/v1/completions", self.completions),
            web.get("/v1/models", self.models), web.post("/v1/tokenize", self.tokenize),
            web.get("/health", self.health), web.get("/health_generate", self.health_generate),
            web.get("/server_info", self.server_info_handler), web.get("/get_server_info", self.server_info_handler),
            web.post("/flush_cache", self.flush_cache), web.get("/metrics", self.metrics_handler),
            web.get("/capbench/requests/{rid}", self.request_record),
        ])
        return app
