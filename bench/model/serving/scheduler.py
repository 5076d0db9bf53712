"""Continuous batching on a KV-token budget, the way SGLang 0.5.23's scheduler does it, with step times from the
performance model. Shared by the twin (real time) and `capbench simulate` (virtual time); it never sleeps.

One step is either a prefill batch (new requests and the chunked one, up to chunked_prefill_size tokens) or a
decode step of every running request, prefill first, as SGLang runs without --enable-mixed-chunk
(`mixed_chunk=True` runs both in one step). Admission is first come first served, like SGLang's PrefillAdder:
a request enters while the free + evictable KV tokens cover its uncached prompt plus new_token_ratio times the
output still expected from everyone running (outputs clipped at 4096 tokens; the ratio starts at 0.7 and
decays to 0.098 over 600 decode steps). When a decode step finds no room, the request with the fewest output
tokens is retracted to the front of the queue and recomputed later. --scheduler-recv-interval N takes new requests
in every N decode steps, after any prefill step and when idle (SGLang's recv_skipper.py); till then they wait.

The prefix cache holds KV in blocks of `block_size` tokens keyed by a chain of the tokens before them (the
caller makes the keys): a prompt hits its longest run of cached leading blocks. A request's prompt blocks enter
the cache when its prefill ends (later requests share them at once), its output blocks when it finishes;
unused blocks are evicted least recently used first, deepest first. SGLang's radix cache matches at token
granularity (page_size 1); this cache at block granularity, so hits are rounded down to whole blocks.

Per-request work is O(1) per step: a decoding request's output count is derived from the decode-step
counter, and finishes come off a heap, so `simulate` runs 10k requests in seconds. With MTP (speculative
decoding) a decode step keeps the performance model's accept_length tokens per request on average, so a request
needs ceil(output / accept_length) decode steps and its KV grows by accept_length a step.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from bench.model.serving.prefix_cache import PrefixCache
from bench.model.serving.run_cache import RunCache
from bench.model.step.perfmodel import PerfModel, prefill_pairs

CLIP_MAX_NEW_TOKENS = 4096
INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO, RATIO_DECAY_STEPS = 0.7, 0.7 * 0.14, 600
RETRACT_DECODE_STEPS = 20
MAX_SPAN = 512  # decode steps one span may stand for


@dataclass(eq=False)
class Request:
    rid: str
    prompt_len: int
    max_new: int  # output tokens it will produce (the caller resolves EOS, ignore_eos and max_tokens)
    arrival: float
    prompt_keys: Sequence[Hashable] = field(default_factory=list)  # keys of the prompt's full blocks (or Runs)
    seq_keys: Callable[[int], Sequence[Hashable]] | None = None  # keys of the first n tokens' full blocks, at finish
    state: str = "new"  # waiting | prefill | running | done | aborted
    cached_tokens: int = 0
    prefilled: int = 0
    first_token: float | None = None
    finish: float | None = None
    retractions: int = 0
    # internal accounting
    blocks: Sequence[Hashable] = field(default_factory=list)
    private: int = 0
    gen_base: int = 0
    d0: int = 0
    extend_len: int = 0


@dataclass
class Step:
    prefill: list[tuple[Request, int]]
    decode: int  # running requests that decode one token in this step
    decode_ctx: int
    duration: float
    span: int = 1  # decode steps this step stands for (decode_span: identical steps between two events)


class Scheduler:
    def __init__(self, perf: PerfModel, pool_tokens: int, max_running: int, chunk: int, block_size: int = 16,
                 mixed_chunk: bool = False, recv_interval: int = 1, runs: bool = False) -> None:
        self.perf, self.pool, self.max_running, self.chunk = perf, pool_tokens, max_running, chunk
        self.mixed_chunk, self.recv_interval = mixed_chunk, max(1, recv_interval)
        self.inbox: deque[Request] = deque()  # submitted, not yet taken in (SGLang's --scheduler-recv-interval)
        self.recv_count = 0  # the steps' recv-skipper weights since the last receive
        # DP attention: SGLang divides chunked_prefill_size by the DP size (each rank schedules its own requests),
        # so one request prefills at most chunk // dp tokens a step while the step's total stays `chunk`
        self.rank_chunk = max(1, chunk // max(1, getattr(perf, "dp", 1)))
        self.cache = RunCache(block_size) if runs else PrefixCache(block_size)  # runs: the requests' keys are Runs
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []  # admitted, prompt not done (DP attention: one part-way a rank)
        self.decoding: dict[Request, None] = {}  # ordered by admission: a replay is the same in every process
        self.heap: list[tuple[int, int, Request]] = []  # (decode step it finishes at, tie, request)
        self.steps = 0  # decode steps so far: a decoding request's output is gen_base + accept * (steps - d0)
        self.accept = perf.accept_length  # tokens kept per request per decode step (1 without MTP)
        self.per_step = math.ceil(self.accept)  # KV slots a decode step needs per request
        self.private = 0  # KV tokens held by requests outside cached blocks
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        # sums over decoding requests, so a step's context and reserve are O(1)
        self.sum_prompt = self.sum_gen_base = self.sum_d0 = self.sum_budget = 0
        self.stats = {"prompt_tokens": 0, "cached_tokens": 0, "generation_tokens": 0, "retractions": 0,
                      "finished": 0, "aborted": 0}
        self._tie = 0
        self._head_match: tuple = (None, -1, 0, 0)  # (queue head, cache version, blocks hit, hit unheld)

    # ---- figures
    @property
    def used_tokens(self) -> int:
        """KV tokens in use, evictable cache excluded (SGLang's token_usage numerator)."""
        return self.private + self.cache.tokens - self.cache.evictable_tokens

    @property
    def free_tokens(self) -> int:
        return self.pool - self.private - self.cache.tokens

    @property
    def num_running(self) -> int:
        return len(self.decoding) + len(self.prefilling)

    def generated(self, req: Request) -> int:
        """Output tokens of req so far."""
        if req.state == "running":
            return min(req.max_new, req.gen_base + int(self.accept * (self.steps - req.d0)))
        return req.gen_base

    def _decode_ctx(self) -> int:
        n = len(self.decoding)
        return self.sum_prompt + self.sum_gen_base + int(self.accept * (n * self.steps - self.sum_d0))

    def _reserve(self, ahead: int = 0, ratio: float | None = None) -> float:
        """Output tokens the running requests are still expected to need (SGLang clips each at 4096); `ahead`
        decode steps from now, at that new_token_ratio."""
        n = len(self.decoding)
        gen = self.sum_gen_base + self.accept * (n * (self.steps + ahead) - self.sum_d0)
        pending = sum(min(r.max_new, CLIP_MAX_NEW_TOKENS) - r.gen_base for r in self.prefilling)
        return max(0, self.sum_budget - gen + pending) * (self.new_token_ratio if ratio is None else ratio)

    # ---- requests in and out
    def submit(self, req: Request) -> None:
        req.state = "waiting"
        (self.inbox if self.recv_interval > 1 else self.waiting).append(req)

    def abort(self, req: Request) -> None:
        if req.state == "waiting":
            (self.inbox if req in self.inbox else self.waiting).remove(req)
        elif req.state == "prefill":
            self.prefilling.remove(req)
            self._release(req, insert=False)
        elif req.state == "running":
            self._leave_decode(req)
            self._release(req, insert=False)
        else:
            return
        req.state = "aborted"
        self.stats["aborted"] += 1

    def _release(self, req: Request, insert: bool) -> None:
        bs = self.cache.block_size
        if insert and req.seq_keys is not None:
            total = req.prompt_len + req.gen_base
            keys = req.seq_keys(total)[len(req.blocks):]
            self.cache.add_free(keys)
            self.private -= bs * len(keys)
            req.private -= bs * len(keys)
        self.cache.unlock(req.blocks)
        req.blocks = req.blocks[:0]
        self.private -= req.private
        req.private = 0

    def _join_decode(self, req: Request) -> None:
        req.state, req.d0 = "running", self.steps
        self.decoding[req] = None
        self.sum_prompt += req.prompt_len
        self.sum_gen_base += req.gen_base
        self.sum_d0 += req.d0
        self.sum_budget += min(req.max_new, CLIP_MAX_NEW_TOKENS)
        self._tie += 1
        heapq.heappush(self.heap, (self._finish_step(req), self._tie, req))

    def _finish_step(self, req: Request) -> int:
        """The decode step at which a running request has all its output."""
        return req.d0 + math.ceil((req.max_new - req.gen_base) / self.accept - 1e-9)

    def _leave_decode(self, req: Request) -> None:
        gen = self.generated(req)
        self.decoding.pop(req, None)
        self.sum_prompt -= req.prompt_len
        self.sum_gen_base -= req.gen_base
        self.sum_d0 -= req.d0
        self.sum_budget -= min(req.max_new, CLIP_MAX_NEW_TOKENS)
        req.private += self.accept * (self.steps - req.d0)  # the decode steps' KV, as self.private counted it
        req.gen_base = gen
        req.state = "left"

    # ---- one step
    def _admit(self, budget: int) -> list[tuple[Request, int]]:
        """The prefill batch: the chunked request first, then new ones while KV and the chunk budget allow."""
        batch = []
        for req in self.prefilling:
            n = min(budget, self.rank_chunk, req.extend_len - req.prefilled)
            if n <= 0:
                break
            batch.append((req, n))
            budget -= n
        bs = self.cache.block_size
        while self.waiting and budget > 0 and self.num_running < self.max_running:
            req = self.waiting[0]
            length = req.prompt_len + req.gen_base  # a retracted request recomputes its output too
            matched, unheld = self._head()
            extend = length - matched * bs
            need = extend + min(req.max_new - req.gen_base, CLIP_MAX_NEW_TOKENS) * self.new_token_ratio
            room = self.free_tokens + self.cache.evictable_tokens
            reserve = self._reserve() if self.num_running else 0.0
            if extend > room or self.num_running and need > room - reserve:
                break  # FCFS: everyone behind waits too
            # the hit blocks nobody holds stop being evictable once this request holds them
            room -= bs * unheld
            if extend > room or self.num_running and need > room - reserve:
                break
            self.waiting.popleft()
            req.blocks = req.prompt_keys[:matched]
            self.cache.hold(req.blocks)
            if self.free_tokens < extend:
                self.cache.evict(extend - self.free_tokens)
            req.private = extend
            self.private += extend
            if req.gen_base == 0 and req.retractions == 0:
                req.cached_tokens = matched * bs
                self.stats["prompt_tokens"] += req.prompt_len
                self.stats["cached_tokens"] += req.cached_tokens
            req.prefilled, req.extend_len, req.state = 0, extend, "prefill"
            self.prefilling.append(req)
            n = min(budget, self.rank_chunk, extend)
            batch.append((req, n))
            budget -= n
        return batch

    def _head(self) -> tuple[int, int]:
        """The queue head's cached leading blocks and how many of them nobody holds, computed once per cache state."""
        req, bs = self.waiting[0], self.cache.block_size
        if self._head_match[0] is not req or self._head_match[1] != self.cache.version:
            hit = min(self.cache.match(req.prompt_keys), (req.prompt_len + req.gen_base - 1) // bs)
            self._head_match = (req, self.cache.version, hit, self.cache.unheld(req.prompt_keys, hit))
        return self._head_match[2], self._head_match[3]

    def _head_waits(self, n: int, k: int) -> int:
        """Of the next k decode steps, how many the queue's head stays out through, as _admit judges it before each
        (0: it may enter now). A full house waits for a finish, which ends a span anyway. Else, step j on, the KV
        room shrinks by j x accept x n tokens and the reserve and the head's need follow new_token_ratio's decay;
        evicting for the steps only shortens the head's cached prefix, which keeps it out. Within a hair of the
        bound counts as entering: plan() then decides, step by step."""
        if not self.waiting or self.num_running >= self.max_running:
            return k
        req, bs = self.waiting[0], self.cache.block_size
        matched, unheld = self._head()
        extend = req.prompt_len + req.gen_base - matched * bs
        out = min(req.max_new - req.gen_base, CLIP_MAX_NEW_TOKENS)
        room = self.free_tokens + self.cache.evictable_tokens - bs * unheld
        grow, decay = self.accept * n, (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / RATIO_DECAY_STEPS
        for j in range(k):
            ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio - j * decay)
            room_j, margin = room - j * grow, 1e-6 * (room + extend + out) + 1.0
            if extend <= room_j + margin and extend + out * ratio <= room_j - self._reserve(j, ratio) + margin:
                return j
        return k

    def _make_room(self) -> None:
        """A decode step needs one KV token per running request: evict, then retract (fewest outputs first)."""
        need = self.per_step * len(self.decoding)
        if self.free_tokens < need:
            self.cache.evict(need - self.free_tokens)
        while self.free_tokens < need and len(self.decoding) > 1:
            victim = max(self.decoding, key=lambda r: (r.d0 - r.gen_base, r.prompt_len))
            self._leave_decode(victim)
            self._release(victim, insert=False)
            victim.state = "waiting"
            victim.retractions += 1
            self.stats["retractions"] += 1
            self.waiting.appendleft(victim)
            n = len(self.decoding)
            need = self.per_step * n
            total = self.sum_budget or 1
            gen = self.sum_gen_base + self.accept * (n * self.steps - self.sum_d0)
            self.new_token_ratio = min(1.0, (gen + RETRACT_DECODE_STEPS * n) / total)
            if self.free_tokens < need:
                self.cache.evict(need - self.free_tokens)

    def plan(self) -> Step | None:
        """The next step and its duration, or None when there is nothing to run."""
        if self.recv_count >= self.recv_interval or not self.num_running:  # an idle loop spins in microseconds
            self.waiting.extend(self.inbox)  # the count restarts whether or not any came
            self.inbox, self.recv_count = deque(), 0
        prefill = self._admit(self.chunk)
        decode = bool(self.decoding) and (self.mixed_chunk or not prefill)
        if decode:
            self._make_room()
            if self.free_tokens < self.per_step * len(self.decoding) and prefill:
                decode = False  # mixed step with no room to decode: prefill alone (callers keep prompt +
                # output of one request within the pool, so a lone request always fits)
        n = len(self.decoding) if decode else 0
        if not prefill and not n:
            return None
        ctx = self._decode_ctx() if n else 0
        tokens = pairs = kv = 0
        busiest = (0, 0.0)  # the largest chunk: with DP attention its group sets the step's attention time
        for req, k in prefill:
            prefix = req.prompt_len + req.gen_base - req.extend_len + req.prefilled
            tokens += k
            pairs += prefill_pairs(k, prefix)
            kv += prefix + k
            busiest = max(busiest, (k, prefill_pairs(k, prefix)))
        return Step(prefill, n, ctx, self.perf.step_time(n, ctx, tokens, pairs, kv, busiest=busiest))

    def decode_span(self, gap: float) -> Step | None:
        """Decode steps with nothing between them (no request admitted (_head_waits), arriving within `gap` seconds,
        prefilling or finishing before the last, and KV room for all of them, free or unheld cache), as one Step
        whose duration is their sum: Simpson's rule over the growing context (exact where a step's time is quadratic
        in it). None when fewer than two such steps come next: plan() then takes the next step alone. Virtual time
        only (the twin takes each step)."""
        n = len(self.decoding)
        if not n or self.prefilling or self.inbox:
            return None
        room = self.free_tokens + self.cache.evictable_tokens  # plan() would evict the unheld cache step by step
        k = min(self.heap[0][0] - self.steps if self.heap else 0, room // (self.per_step * n), MAX_SPAN)
        if k < 2 or (k := self._head_waits(n, int(k))) < 2:
            return None
        ctx = self._decode_ctx()
        t0 = self.perf.step_time(n, ctx)
        if t0 > 0 and math.isfinite(gap):
            k = min(k, int(gap / t0))
        while k >= 2:
            grow = self.accept * n
            mid = self.perf.step_time(n, int(ctx + grow * (k - 1) / 2))
            total = k * (t0 + 4 * mid + self.perf.step_time(n, int(ctx + grow * (k - 1)))) / 6
            if total <= gap:
                self._evict_for_span(n, k)
                return Step([], n, ctx, total, span=k)
            k = min(k - 1, int(k * gap / total))
        return None

    def _evict_for_span(self, n: int, k: int) -> None:
        """The blocks plan()'s _make_room would evict over k decode steps, evicted now: its step j needs
        per_step * n tokens free after j - 1 steps' accept * n, and each eviction rounds up to whole blocks, so
        over the span it evicts exactly the blocks that cover the last step's need, oldest first. Nothing enters
        or leaves the cache between (a span ends at the first finish), so the cache ends the span as it would."""
        need = self.per_step * n + self.accept * n * (k - 1) - self.free_tokens
        if need > 0:
            self.cache.evict(need)

    def commit(self, step: Step, now: float) -> tuple[list[Request], list[Request]]:
        """Apply a planned step that ended at `now`: (requests that got their first token, requests done)."""
        first, done = [], []
        k = step.span
        self.recv_count += self.recv_interval if step.prefill else k
        if step.decode:
            self.steps += k
            self.private += self.accept * len(self.decoding) * k
            self.stats["generation_tokens"] += self.accept * len(self.decoding) * k
            self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio
                                       - k * (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / RATIO_DECAY_STEPS)
            while self.heap and self.heap[0][0] <= self.steps:
                _, _, req = heapq.heappop(self.heap)
                if req.state == "running" and self._finish_step(req) == self.steps:
                    self._finish(req, now)
                    done.append(req)
        for req, k in step.prefill:
            if req.state != "prefill":
                continue  # aborted meanwhile
            req.prefilled += k
            if req.prefilled < req.extend_len:
                continue
            self.prefilling.remove(req)
            self._cache_prompt(req)
            req.gen_base += 1
            self.stats["generation_tokens"] += 1
            req.private += 1
            self.private += 1
            if req.first_token is None:
                req.first_token = now
                first.append(req)
            if req.gen_base >= req.max_new:
                req.state = "left"
                self._finish(req, now)
                done.append(req)
            else:
                self._join_decode(req)
        return first, done

    def _cache_prompt(self, req: Request) -> None:
        """After prefill the prompt's full blocks go into the cache, held by this request."""
        keys = req.prompt_keys[len(req.blocks):]
        self.cache.hold(keys)
        req.blocks += keys
        req.private -= self.cache.block_size * len(keys)
        self.private -= self.cache.block_size * len(keys)

    def _finish(self, req: Request, now: float) -> None:
        if req.state == "running":
            self._leave_decode(req)
        self._release(req, insert=True)
        req.state, req.finish = "done", now
        self.stats["finished"] += 1

    def flush_cache(self) -> None:
        self.cache.clear()
