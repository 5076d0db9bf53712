"""A small SGLang serving loop on the CPU for the KV checksum tests.

SGLang's own parts: the published ServerArgs defaults, the KV pools, the allocator SGLang picks for the page
size, the tree built by its selection function (`create_tree_cache`, our backend registered with SGLang's
registry), Req, PrefillAdder (admission, chunking, HiCache load-back), ScheduleBatch (prepare_for_extend /
prepare_for_decode allocation, filter_batch / merge_batch), checkpoint_kv_cache / release_kv_cache, and with
HiCache its controller, host pool and events.

What stands in: the model forward (KV written through the pool's own set_kv_buffer as a fixed function of token
and position, then the seal-on-fill hook on its out_cache_loc, as the ModelRunner.forward wrapper does; with
`derive`, attention too: a request that reads KV which is not the KV of its tokens computes different KV, so
damage propagates into everything computed from it, as it does in a model),
sampling (each request's output tokens are given in advance), and two CUDA-only HiCache primitives (host-memory
registration and the host<->device copy kernel), done with torch on CPU.

Oracle: before a request's first prefill "forward", the cached prefix it was handed (from the device tree, or
loaded from host) is compared with the KV its tokens should have (written the same way into a shadow pool): a
difference is a served corrupt page. (A request's later chunks read its own KV, not the cache's.)
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import torch
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache
from sglang.srt.runtime_context import get_context, get_memory, get_parallel
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from engine_patches.kv_checksum import hooks
from engine_patches.kv_checksum.checksum import pool_buffers
from engine_patches.kv_checksum.patch import register_backend

DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
DERIVED_FROM_DAMAGE = 1_009  # token offset of the stand-in model's KV when it read damaged KV


@dataclass
class Geometry:
    kind: str  # "mha" | "mla"
    dtype: str = "bf16"  # "bf16" | "fp8"
    page_size: int = 16
    pages: int = 64
    layers: int = 2
    heads: int = 1  # mha: KV heads on this rank
    head_dim: int = 32
    kv_lora: int = 48  # mla
    rope: int = 16

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.dtype}-p{self.page_size}"


def model_dir() -> str:
    """A tiny Llama config.json for SGLang's ModelConfig (the batch reads vocab size and encoder flags)."""
    d = Path(tempfile.gettempdir()) / "capbench-kv-tiny-llama"
    d.mkdir(exist_ok=True)
    text = json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 2, "vocab_size": 50_000,
        "max_position_embeddings": 65_536, "torch_dtype": "bfloat16"})
    # other test processes read it meanwhile: a rename is atomic, a rewrite in place is not (one read it empty)
    with tempfile.NamedTemporaryFile("w", dir=d, suffix=".tmp", delete=False) as f:
        f.write(text)
    os.replace(f.name, d / "config.json")
    return str(d)


TRANSFER_WATCHERS: list = []  # called with (src_layers, src_indices, dst_indices) before each HiCache copy


def hicache_on_cpu() -> None:
    """HiCache's two CUDA-only primitives, on CPU: host buffers need no cudaHostRegister, and the copy kernel
    (sgl_kernel's transfer_kv_direct, absent without CUDA) is an index copy per layer."""
    import sglang.srt.mem_cache.pool_host.common as common
    import sglang.srt.mem_cache.pool_host.mha as mha
    import sglang.srt.mem_cache.pool_host.mla as mla

    def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
        for watch in TRANSFER_WATCHERS:
            watch(src_layers, src_indices, dst_indices)
        for src, dst in zip(src_layers, dst_layers, strict=True):
            dst[dst_indices.to(dst.device)] = src[src_indices.to(src.device)]

    common._cuda_host_register = lambda buffer, granularity=None: None
    mha.transfer_kv_direct = mla.transfer_kv_direct = transfer_kv_direct


class _Worker:
    """What create_unified_radix_cache asks of the TP worker when HiCache is on."""

    def register_hicache_layer_transfer_counter(self, counter) -> None:
        self.counter = counter


def make_pool(g: Geometry):
    size = g.pages * g.page_size
    if g.kind == "mha":
        return MHATokenToKVPool(size, g.page_size, DTYPES[g.dtype], g.heads, g.head_dim, g.layers, "cpu", False)
    return MLATokenToKVPool(size, g.page_size, DTYPES[g.dtype], g.kv_lora, g.rope, g.layers, "cpu", False)


@dataclass
class Served:
    pages: int = 0  # cached pages handed to a request at admission
    corrupt: int = 0  # of those, pages whose bytes were not the KV of their tokens


@dataclass
class Server:
    g: Geometry
    mode: str = "verify"
    hicache: bool = False
    scrub_pages_per_s: float = 0.0
    log: str | None = None
    clock: object = None
    chunk: int | None = None  # chunked prefill size
    server_args: dict = field(default_factory=dict)
    max_reqs: int = 16
    after_forward: object = None  # called with the batch after its KV is written and sealed (fault injection)
    derive: bool = False  # KV computed over a damaged prefix is itself wrong (see _reads_clean)
    received: bool = False  # prefill KV stands for KV a PD decode server receives: no forward hook seals it

    def __post_init__(self):
        self.context = get_context().override_server_args(
            radix_cache_backend=self._backend(), **self.server_args)
        self.args = self.context.install()
        self.parallel = get_parallel().override(tp_rank=0, pp_rank=0, dcp_enabled=False, attn_dcp_size=1,
                                                attn_dcp_rank=0)
        self.parallel.__enter__()
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        from sglang.srt.configs.model_config import ModelConfig

        g = self.g

        hooks.install_admission_mark()
        hooks.install_load_wait()
        self.model_config = ModelConfig(model_dir())
        self.pool, self.shadow = make_pool(g), make_pool(g)
        size = g.pages * g.page_size
        if g.page_size == 1:
            self.allocator = TokenToKVPoolAllocator(size, DTYPES[g.dtype], "cpu", self.pool, need_sort=False)
        else:
            self.allocator = PagedTokenToKVPoolAllocator(size, g.page_size, DTYPES[g.dtype], "cpu", self.pool,
                                                         need_sort=False)
        self.req_pool = ReqToTokenPool(self.max_reqs, 4 * size, "cpu", False)
        memory = get_memory()  # the fields kv_cache_builder fills from the server arguments
        params = CacheInitParams(disable=False, req_to_token_pool=self.req_pool,
                                 token_to_kv_pool_allocator=self.allocator, page_size=g.page_size,
                                 eviction_policy=memory.radix_eviction_policy,
                                 eviction_policy_config=memory.radix_eviction_policy_config,
                                 enable_session_radix_cache=memory.enable_session_radix_cache)
        if self.hicache:
            hicache_on_cpu()
        ctx = TreeCacheBuildContext(
            server_args=self.args, params=params, is_hybrid_swa=False, is_hybrid_ssm=False,
            enable_hierarchical_cache=self.hicache, disable_radix_cache=False, tp_worker=_Worker(),
            model_config=self.model_config, tp_size=1, tp_rank=0, tp_group=None)
        self.tree = create_tree_cache(ctx)
        self.layers = [RadixAttention(g.heads, g.head_dim, g.head_dim**-0.5, g.heads, layer_id=i)
                       for i in range(g.layers)]
        self.waiting: list[Req] = []
        self.running: ScheduleBatch | None = None
        self.chunked: Req | None = None
        self.finished: list[Req] = []
        self.served = Served()

    def _backend(self) -> str:
        name = f"capbench_test_{uuid.uuid4().hex[:8]}"
        options = {} if self.clock is None else {"clock": self.clock}
        register_backend(self.mode, self.scrub_pages_per_s, self.log, name=name, **options)
        return name

    def close(self) -> None:
        self.parallel.__exit__(None, None, None)
        self.context.restore()

    # ---- requests ----

    def submit(self, rid: str, prompt: list[int], output: list[int]) -> Req:
        req = Req(rid, "", array("q", prompt), SamplingParams(max_new_tokens=len(output)))
        req.sampling_params.normalize(None)
        req.script = list(output)
        self.waiting.append(req)
        return req

    def idle(self) -> bool:
        return not self.waiting and self.chunked is None and (self.running is None or self.running.is_empty())

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if self.idle():
                return
            self.step()
        raise AssertionError("requests did not finish")

    # ---- one scheduler iteration ----

    def step(self) -> None:
        if self.hicache:
            self.tree.check_hicache_events()
        if not self._prefill() and self.running is not None and not self.running.is_empty():
            self._decode()

    def _prefill(self) -> bool:
        if self.chunked is not None:
            checkpoint_kv_cache(self.chunked, self.tree)  # the scheduler's stash of a chunked request
        # new_token_ratio 1.0: admission reserves each request's whole output, so decode never runs out of pages
        # and this loop needs no retraction (SGLang's scheduler starts lower and retracts when it must).
        adder = PrefillAdder(self.g.page_size, self.tree, self.allocator, self.running, 1.0, 1 << 30, self.chunk)
        if self.chunked is not None:
            self.chunked.init_next_round_input()
            self.chunked = adder.add_chunked_req(self.chunked)
        with self.tree.kv_step(lambda: self.waiting):  # as hooks.install_step_batching wraps the scheduler's pass
            for req in list(self.waiting):
                req.init_next_round_input(self.tree)
                if adder.add_one_req(req, has_chunked_req=self.chunked is not None,
                                     truncation_align_size=None) != AddReqResult.CONTINUE:
                    break
        admitted = adder.can_run_list
        if not admitted:
            return False
        self.waiting = [r for r in self.waiting if r not in admitted]
        if adder.new_chunked_req is not None:
            self.chunked = adder.new_chunked_req
        batch = ScheduleBatch.init_new(admitted, self.req_pool, self.allocator, self.tree, self.model_config,
                                       False, SpeculativeAlgorithm.NONE, chunked_req=self.chunked)
        if self.hicache:
            batch.hicache_consumer_index = self.tree.ready_to_load_host_cache()
        batch.prepare_for_extend()
        self._forward(batch, prefill=True)
        for req in batch.reqs:
            if req is self.chunked:
                continue
            self._sample(req)
            if req.finished():
                release_kv_cache(req, self.tree, checkpoint=True)
                self.finished.append(req)
            else:
                checkpoint_kv_cache(req, self.tree)
        batch.filter_batch(reqs_to_exclude=self.chunked)
        if not batch.is_empty():
            if self.running is None or self.running.is_empty():
                self.running = batch
            else:
                self.running.merge_batch(batch)
        return True

    def _decode(self) -> None:
        batch = self.running
        batch.prepare_for_decode()
        self._forward(batch, prefill=False)
        for req in batch.reqs:
            self._sample(req)
            if req.finished():
                release_kv_cache(req, self.tree, checkpoint=True)
                self.finished.append(req)
        batch.filter_batch()

    def _sample(self, req: Req) -> None:
        req.output_ids.append(req.script.pop(0))
        req.update_finish_state()

    # ---- the model ----

    def _forward(self, batch: ScheduleBatch, prefill: bool) -> None:
        locs, tokens, positions = [], [], []
        for req in batch.reqs:
            if prefill:
                ids = req.full_untruncated_fill_ids
                start, end = req.prefix_len, req.extend_end
                if not hasattr(req, "admitted_prefix"):  # its first chunk: the prefix came from the cache
                    req.admitted_prefix = req.prefix_len
                    self._check_served(req, ids)
            else:
                ids = req.origin_input_ids + req.output_ids
                start, end = len(ids) - 1, len(ids)
            row = self.req_pool.req_to_token[req.kv.req_pool_idx, start:end].to(torch.int64)
            locs.append(row)
            garbage = self.derive and not self._reads_clean(req, ids, start)
            tokens.append(torch.tensor(ids[start:end], dtype=torch.int64) + (DERIVED_FROM_DAMAGE if garbage else 0))
            positions.append(torch.arange(start, end))
        loc = torch.cat(locs)
        assert torch.equal(loc, batch.out_cache_loc.to(torch.int64)), "rows and out_cache_loc disagree"
        write_kv(self.pool, self.layers, self.g, loc, torch.cat(tokens), torch.cat(positions))
        if not (prefill and self.received):
            hooks.seal_after_forward(self.pool, batch.out_cache_loc)
        if self.after_forward is not None:
            self.after_forward(batch)

    def _reads_clean(self, req: Req, ids, start: int) -> bool:
        """Whether the KV this request's attention reads (its row before `start`) is the KV of its tokens."""
        if start == 0:
            return True
        slots = self.req_pool.req_to_token[req.kv.req_pool_idx, :start].to(torch.int64)
        write_kv(self.shadow, self.layers, self.g, slots, torch.tensor(ids[:start], dtype=torch.int64),
                 torch.arange(start))
        return all(torch.equal(real[slots].view(torch.uint8), shadow[slots].view(torch.uint8))
                   for real, shadow in zip(pool_buffers(self.pool), pool_buffers(self.shadow), strict=True))

    def _check_served(self, req: Req, ids) -> None:
        """Compare the cached prefix the request is about to read with the KV of its tokens."""
        n = req.prefix_len // self.g.page_size * self.g.page_size
        if n == 0:
            return
        slots = self.req_pool.req_to_token[req.kv.req_pool_idx, :n].to(torch.int64)
        write_kv(self.shadow, self.layers, self.g, slots, torch.tensor(ids[:n], dtype=torch.int64), torch.arange(n))
        P = self.g.page_size
        bad = torch.zeros(n // P, dtype=torch.bool)
        for real, shadow in zip(pool_buffers(self.pool), pool_buffers(self.shadow), strict=True):
            a = real[slots].view(torch.uint8).view(n // P, -1)
            b = shadow[slots].view(torch.uint8).view(n // P, -1)
            bad |= (a != b).any(dim=1)
        self.served.pages += n // P
        self.served.corrupt += int(bad.sum())

    # ---- faults ----

    def page_of(self, req: Req, position: int) -> int:
        """The page holding token `position` of a live request's row."""
        return int(self.req_pool.req_to_token[req.kv.req_pool_idx, position]) // self.g.page_size

    def flip(self, page: int, buffer: int = 0, byte: int = 3, bit: int = 2) -> None:
        """Flip one bit of one device page, in one buffer of the pool."""
        flip_page(pool_buffers(self.pool)[buffer], page, self.g.page_size, byte, bit)

    # ---- accounting ----

    def check_slots(self) -> None:
        """Every page of the pool is exactly once in the free list, the tree, or a live request's own rows."""
        P = self.g.page_size
        free = self.allocator.get_all_free_pages()
        assert len(torch.unique(free)) == len(free), "a page is on the free list twice"
        tree = self.tree.all_values_flatten().to(torch.int64)
        owned = [free.to(torch.int64), tree[::P] // P]
        live = [] if self.running is None else list(self.running.reqs)
        live += [self.chunked] if self.chunked is not None and self.chunked not in live else []
        for req in live:
            if req.kv.holds_kv:
                row = self.req_pool.req_to_token[req.kv.req_pool_idx]
                start = (req.kv.cache_protected_len + P - 1) // P * P
                own = row[start:req.kv.kv_allocated_len].to(torch.int64)
                owned.append(torch.unique(own // P))
        pages = torch.sort(torch.cat(owned)).values
        expected = torch.arange(1, self.g.pages + 1)
        assert torch.equal(pages, expected), f"pages owned twice or lost: {_diff(pages, expected)}"


def _diff(pages: torch.Tensor, expected: torch.Tensor) -> str:
    counts = torch.bincount(pages, minlength=len(expected) + 1)[1:]
    twice = (counts > 1).nonzero().flatten().add(1).tolist()[:8]
    lost = (counts == 0).nonzero().flatten().add(1).tolist()[:8]
    return f"twice {twice}, lost {lost}"


def flip_page(buf: torch.Tensor, page: int, page_size: int, byte: int, bit: int) -> None:
    page_bytes = page_size * buf[0].numel() * buf.element_size()
    assert byte < page_bytes
    buf.view(-1).view(torch.uint8)[page * page_bytes + byte] ^= 1 << bit


def write_kv(pool, layers, g: Geometry, loc: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> None:
    """The stand-in model's KV: a fixed function of (token, position, layer), written by the pool itself."""
    n = len(loc)
    if n == 0:
        return
    for layer in layers:
        # token ids are below the modulus, so the KV depends on the token as well as on its position
        base = (tokens * 65_537 + positions * 7_919 + layer.layer_id * 104_729) % 1_000_003
        width = 2 * g.heads * g.head_dim if g.kind == "mha" else g.kv_lora + g.rope
        rows = (torch.sin((base[:, None].double() + torch.arange(width)) * 0.618) * 4).float()
        if g.kind == "mha":
            k, v = rows.view(n, 2, g.heads, g.head_dim).unbind(1)
            pool.set_kv_buffer(layer, loc, k.to(torch.bfloat16), v.to(torch.bfloat16))
        else:
            pool.set_kv_buffer(layer, loc, rows.view(n, 1, -1).to(torch.bfloat16), None)
