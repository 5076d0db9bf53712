"""KV page checksums on SGLang's real pools, paged allocator and radix cache (CPU).

Prints the detection and false-positive figures (run with -s to see them)."""

from __future__ import annotations

import random
from array import array
from dataclasses import dataclass

import pytest
import torch
from prometheus_client import REGISTRY
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import match_kv_cache, release_kv_cache
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.runtime_context import get_context, get_parallel
from sglang.srt.sampling.sampling_params import SamplingParams

from engine_patches.kv_checksum.checksum import pool_buffers
from engine_patches.kv_checksum.events import read_events
from engine_patches.kv_checksum.radix import ChecksummedRadixCache, buffer_layers

DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


@dataclass
class Geometry:
    kind: str  # "mha" | "mla"
    dtype: str  # "bf16" | "fp8"
    page_size: int = 16
    pages: int = 64
    layers: int = 3
    heads: int = 2  # mha: kv heads on this rank
    head_dim: int = 32
    kv_lora: int = 64  # mla
    rope: int = 16


class KVSetup:
    """One pool of a given geometry behind a real allocator and a ChecksummedRadixCache."""

    def __init__(self, g: Geometry, mode: str = "verify", log: str | None = None, **cache_kw):
        self.g = g
        size = g.pages * g.page_size
        dtype = DTYPES[g.dtype]
        if g.kind == "mha":
            self.pool = MHATokenToKVPool(size, g.page_size, dtype, g.heads, g.head_dim, g.layers, "cpu", False)
        else:
            self.pool = MLATokenToKVPool(size, g.page_size, dtype, g.kv_lora, g.rope, g.layers, "cpu", False)
        self.allocator = PagedTokenToKVPoolAllocator(size, g.page_size, dtype, "cpu", self.pool, need_sort=False)
        self.req_pool = ReqToTokenPool(8, size, "cpu", False)
        params = CacheInitParams(disable=False, req_to_token_pool=self.req_pool,
                                 token_to_kv_pool_allocator=self.allocator, page_size=g.page_size)
        self.cache = ChecksummedRadixCache(params, mode=mode, integrity_log=log, **cache_kw)
        self.layers = [RadixAttention(max(g.heads, 1), g.head_dim, g.head_dim**-0.5, g.heads, layer_id=i)
                       for i in range(g.layers)]
        self.gen = torch.Generator().manual_seed(1234)

    def write(self, loc: torch.Tensor) -> None:
        """Random KV for the slots `loc`, through the pool's own set_kv_buffer."""
        g, n = self.g, len(loc)
        with get_parallel().override(dcp_enabled=False, attn_dcp_size=1, attn_dcp_rank=0):
            for layer in self.layers:
                if g.kind == "mha":
                    k = torch.randn(n, g.heads, g.head_dim, generator=self.gen) * 4
                    v = torch.randn(n, g.heads, g.head_dim, generator=self.gen) * 4
                    self.pool.set_kv_buffer(layer, loc, k.to(torch.bfloat16), v.to(torch.bfloat16))
                else:
                    kv = torch.randn(n, 1, g.kv_lora + g.rope, generator=self.gen) * 4
                    self.pool.set_kv_buffer(layer, loc, kv.to(torch.bfloat16), None)

    def ensure(self, tokens: list[int], verify: bool = True) -> int:
        """Reuse what the tree holds of `tokens`, compute (write) the rest and seal it: a request's life.
        Returns the tokens reused. verify=False looks the prefix up without checking it (test bookkeeping)."""
        m = self.match(tokens) if verify else self.lookup(tokens)
        reused = m.device_prefix_len
        prefix = self.cache.path_device_indices(m.last_device_node)
        rest = len(tokens) - reused
        if rest:
            loc = self.allocator.alloc(rest)
            assert loc is not None, "pool exhausted"
            self.write(loc)
            self.cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=torch.cat([prefix, loc])))
        return reused

    def match(self, tokens: list[int], req=None):
        return self.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens)), req=req))

    def lookup(self, tokens: list[int]):
        """SGLang's own match, without the checksum verification."""
        return RadixCache.match_prefix(self.cache, MatchPrefixParams(key=RadixKey(array("q", tokens))))

    def buffers(self) -> list[torch.Tensor]:
        return pool_buffers(self.pool)


FLIP_GEOMETRIES = [
    Geometry("mha", "bf16", heads=1, head_dim=128, layers=4),  # GLM-4.6 at tp 8: one KV head of 128
    Geometry("mha", "fp8", heads=1, head_dim=128, layers=4),
    Geometry("mla", "bf16", kv_lora=512, rope=64, layers=3),  # Kimi K2 latent: 512 + 64
    Geometry("mla", "fp8", kv_lora=512, rope=64, layers=3),
]
FLIP_TRIALS = 250  # per geometry
CLEAN_VERIFICATIONS = 100_000  # over all geometries


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Small int64 tensor ops: a second intra-op thread only adds synchronisation on a busy 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def metric(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels or None) or 0.0


def sequences(page_size: int, rng: random.Random) -> list[list[int]]:
    """Three requests sharing a 3-page system prompt, two of them sharing one more page."""
    system = [rng.randrange(1, 50_000) for _ in range(3 * page_size)]
    turn = [rng.randrange(1, 50_000) for _ in range(page_size)]
    tail = lambda n: [rng.randrange(1, 50_000) for _ in range(n * page_size)]  # noqa: E731
    return [system + turn + tail(2), system + turn + tail(3), system + tail(4)]


def flip_bit(buf: torch.Tensor, byte: int, bit: int) -> None:
    buf.view(-1).view(torch.uint8)[byte] ^= 1 << bit


def page_bytes(buf: torch.Tensor, page_size: int) -> int:
    return page_size * buf[0].numel() * buf.element_size()


def flip_in_page(buf: torch.Tensor, page: int, page_size: int, offset: int, bit: int) -> None:
    assert offset < page_bytes(buf, page_size)
    flip_bit(buf, page * page_bytes(buf, page_size) + offset, bit)


@pytest.mark.parametrize("g", FLIP_GEOMETRIES, ids=lambda g: f"{g.kind}-{g.dtype}")
def test_single_bit_flips_are_all_detected_and_never_served(g, tmp_path):
    log = tmp_path / "integrity.jsonl"
    s = KVSetup(g, log=str(log))
    rng = random.Random(f"{g.kind}-{g.dtype}")
    seqs = sequences(g.page_size, rng)
    names = buffer_layers(s.pool)
    detected = 0
    for _ in range(FLIP_TRIALS):
        for t in seqs:  # recompute what earlier trials evicted
            s.ensure(t, verify=False)
        t = rng.choice(seqs)
        path = s.cache._path(s.lookup(t).last_device_node)
        node = rng.choice(path)
        page = rng.choice(s.cache._pages(node).tolist())
        b = rng.randrange(len(s.buffers()))
        buf = s.buffers()[b]
        byte = page * page_bytes(buf, g.page_size) + rng.randrange(page_bytes(buf, g.page_size))
        flip_bit(buf, byte, rng.randrange(8))

        before = metric("capbench_kv_checksum_mismatch_total", source="match")
        m = s.match(t)
        if metric("capbench_kv_checksum_mismatch_total", source="match") == before + 1:
            detected += 1
        served = (s.cache.path_device_indices(m.last_device_node) // g.page_size).tolist()
        assert page not in served
        assert m.device_prefix_len == sum(len(n.value) for n in path[: path.index(node)])
        assert not s.cache._in_tree(node)
        event = [e for e in read_events(log) if e["kind"] == "kv_checksum_mismatch"][-1]
        assert (event["layer"], event["detail"]["part"], event["page"]) == (*names[b], page)
    print(f"\n{g.kind} {g.dtype}: {detected}/{FLIP_TRIALS} single-bit flips detected")
    assert detected == FLIP_TRIALS


@pytest.mark.parametrize("kind,dtype", [("mha", "bf16"), ("mha", "fp8"), ("mla", "bf16"), ("mla", "fp8")])
def test_no_false_positive_over_many_clean_verifications(kind, dtype):
    # Small rows, many pages: the point is that the same bytes always give the same sums.
    g = Geometry(kind, dtype, page_size=4, pages=256, layers=2, heads=1, head_dim=16, kv_lora=32, rope=16)
    s = KVSetup(g)
    rng = random.Random(7)
    seqs = [[rng.randrange(1, 9999) for _ in range(120 * g.page_size)] for _ in range(2)]
    for t in seqs:
        s.ensure(t)
    verified0 = metric("capbench_kv_pages_verified_total")
    mismatch0 = metric("capbench_kv_checksum_mismatch_total", source="match")
    target = CLEAN_VERIFICATIONS // 4
    while metric("capbench_kv_pages_verified_total") - verified0 < target:
        for t in seqs:
            assert s.match(t).device_prefix_len == len(t)
    verified = metric("capbench_kv_pages_verified_total") - verified0
    print(f"\n{kind} {dtype}: {verified:.0f} clean page verifications, "
          f"{metric('capbench_kv_checksum_mismatch_total', source='match') - mismatch0:.0f} false positives")
    assert metric("capbench_kv_checksum_mismatch_total", source="match") == mismatch0


def test_seal_and_reuse_count_pages():
    g = Geometry("mla", "bf16", pages=32)
    s = KVSetup(g)
    seqs = sequences(g.page_size, random.Random(3))
    sealed0 = metric("capbench_kv_pages_checksummed_total")
    for t in seqs:
        s.ensure(t)
    unique_pages = 3 + 1 + 2 + 3 + 4
    assert metric("capbench_kv_pages_checksummed_total") - sealed0 == unique_pages
    verified0 = metric("capbench_kv_pages_verified_total")
    assert s.ensure(seqs[0]) == len(seqs[0])  # fully reused, nothing written
    assert metric("capbench_kv_pages_verified_total") - verified0 == len(seqs[0]) // g.page_size


def test_whole_page_overwrite_is_detected():
    g = Geometry("mha", "bf16")
    s = KVSetup(g)
    t = sequences(g.page_size, random.Random(5))[0]
    s.ensure(t)
    page = int(s.cache._pages(s.cache._path(s.match(t).last_device_node)[0])[1])
    buf = s.buffers()[2]
    buf[page * g.page_size:(page + 1) * g.page_size] = torch.randn_like(buf[:g.page_size], dtype=torch.float32).to(
        buf.dtype)
    assert s.match(t).device_prefix_len == 0  # the bad page sits in the first node


def test_locked_corrupt_node_is_quarantined_then_freed():
    g = Geometry("mla", "fp8", pages=32)
    s = KVSetup(g)
    seqs = sequences(g.page_size, random.Random(11))
    for t in seqs:
        s.ensure(t)
    running = s.match(seqs[0]).last_device_node
    s.cache.inc_lock_ref(running)  # a running request holds the whole path
    first = s.cache._path(running)[0]
    page = int(s.cache._pages(first)[0])
    flip_in_page(s.buffers()[1], page, g.page_size, 7, 4)
    m = s.match(seqs[2])  # a new request sharing the system prompt
    assert m.device_prefix_len == 0 and m.last_device_node is s.cache.root_node
    assert not s.cache._in_tree(first)
    # It is recomputed into fresh pages, and nothing reaches the quarantined ones.
    assert s.ensure(seqs[2]) == 0
    assert page not in (s.cache.path_device_indices(s.match(seqs[2]).last_device_node) // g.page_size).tolist()
    # Once the running request lets go, ordinary eviction frees the quarantined pages.
    s.cache.dec_lock_ref(running)
    s.cache.evict(EvictParams(num_tokens=10**9))
    assert s.cache.evictable_size() == 0 and s.cache.protected_size() == 0
    assert s.allocator.available_size() == g.pages * g.page_size


def test_strict_mode_aborts_the_request(tmp_path):
    g = Geometry("mha", "fp8")
    s = KVSetup(g, mode="strict", log=str(tmp_path / "log.jsonl"))
    t = sequences(g.page_size, random.Random(13))[1]
    s.ensure(t)
    node = s.cache._path(s.match(t).last_device_node)[-1]
    flip_in_page(s.buffers()[5], int(s.cache._pages(node)[0]), g.page_size, 3, 0)
    req = Req("r-strict", "", array("q", t), SamplingParams())
    with get_parallel().override(tp_rank=0):
        s.match(t, req=req)
    assert req.to_finish is not None  # FINISH_ABORT: the request ends instead of recomputing
    actions = [e for e in read_events(tmp_path / "log.jsonl") if e["kind"] == "kv_checksum_action"]
    assert actions[-1]["detail"]["action"] == "evicted+aborted"


def test_scrub_finds_idle_corruption_at_its_rate():
    now = [0.0]
    g = Geometry("mla", "bf16", pages=32)
    s = KVSetup(g, scrub_pages_per_s=4.0, clock=lambda: now[0])
    seqs = sequences(g.page_size, random.Random(17))
    for t in seqs:
        s.ensure(t)
    victim = s.cache._path(s.match(seqs[2]).last_device_node)[-1]  # an idle leaf
    flip_in_page(s.buffers()[0], int(s.cache._pages(victim)[-1]), g.page_size, 3 * 160 + 100, 6)
    scrubbed0 = metric("capbench_kv_pages_verified_total")
    mismatch0 = metric("capbench_kv_checksum_mismatch_total", source="scrub")
    now[0] += 1.0  # one second: a budget of 4 pages
    s.match([999_999] * g.page_size)  # any request arriving runs the scrub step
    first_step = metric("capbench_kv_pages_verified_total") - scrubbed0
    assert 4 <= first_step <= 4 + 4  # the budget, overshooting by at most one node
    total_pages = 13
    for _ in range(total_pages):
        now[0] += 1.0
        s.match([999_999] * g.page_size)
    assert metric("capbench_kv_checksum_mismatch_total", source="scrub") == mismatch0 + 1
    assert not s.cache._in_tree(victim)


def serve(s: KVSetup, rid: str, prompt: list[int], output: list[int]) -> Req:
    """One request through SGLang's own scheduler-side cache calls: match_kv_cache (reuse, verified), its KV
    computed into fresh pages, then release_kv_cache(checkpoint=True) (checkpoint -> _insert_cache -> insert:
    the seal)."""
    req = Req(rid, "", array("q", prompt), SamplingParams(max_new_tokens=len(output)))
    match_kv_cache(req, s.cache)
    if req.to_finish is not None:
        return req  # strict mode aborted it: the scheduler finishes it without running it
    req.lock = s.cache.lock(req.last_node)
    s.req_pool.alloc([req])
    prefix = s.cache.path_device_indices(req.last_node)
    req.kv.cache_protected_len = len(prefix)
    total = len(prompt) + len(output)
    loc = s.allocator.alloc(total - len(prefix))
    s.write(loc)
    s.req_pool.write((req.kv.req_pool_idx, slice(0, total)), torch.cat([prefix, loc]).to(torch.int32))
    req.output_ids = array("q", output)
    req.kv.kv_allocated_len = req.kv.kv_committed_len = total
    req.finished_len = len(output)
    release_kv_cache(req, s.cache, checkpoint=True)
    return req


@pytest.fixture
def scheduler_context():
    override = get_context().override_server_args()
    override.install()
    with get_parallel().override(tp_rank=0):
        yield
    override.restore()


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_request_lifecycle_seals_on_release_and_verifies_on_match(kind, scheduler_context):
    g = Geometry(kind, "fp8", pages=32)
    s = KVSetup(g)
    rng = random.Random(19)
    P = g.page_size
    prompt = [rng.randrange(1, 999) for _ in range(3 * P)]
    sealed0, verified0 = metric("capbench_kv_pages_checksummed_total"), metric("capbench_kv_pages_verified_total")
    a = serve(s, "a", prompt, [rng.randrange(1, 999) for _ in range(2 * P)])
    assert a.prefix_len == 0
    assert metric("capbench_kv_pages_checksummed_total") - sealed0 == 5  # prompt + output pages, at release
    b = serve(s, "b", prompt + [7] * P, [rng.randrange(1, 999) for _ in range(P)])
    assert b.prefix_len == 3 * P and metric("capbench_kv_pages_verified_total") - verified0 == 3

    # A bit flips in the cached prompt's second page: the next request recomputes from there, and the page
    # is never part of any request's row.
    first = s.cache._path(s.lookup(prompt).last_device_node)[0]
    bad_page = int(s.cache._pages(first)[1])
    flip_in_page(s.buffers()[-1], bad_page, P, 5, 3)
    mismatch0 = metric("capbench_kv_checksum_mismatch_total", source="match")
    c = serve(s, "c", prompt, [rng.randrange(1, 999) for _ in range(P)])
    assert c.prefix_len == 0  # it got none of the cached pages (the bad one sits in the first node)
    assert metric("capbench_kv_checksum_mismatch_total", source="match") == mismatch0 + 1
    # c's recomputed pages were sealed fresh (the freed page id may be among them, rewritten): clean reuse again.
    assert serve(s, "d", prompt, [3] * P).prefix_len == 3 * P
    assert metric("capbench_kv_checksum_mismatch_total", source="match") == mismatch0 + 1
    # Nothing leaked: every slot is either free or owned by the tree.
    assert s.allocator.available_size() + s.cache.total_size() == g.pages * P


def test_strict_mode_aborts_a_real_request_at_admission(scheduler_context):
    g = Geometry("mla", "bf16", pages=32)
    s = KVSetup(g, mode="strict")
    rng = random.Random(23)
    prompt = [rng.randrange(1, 999) for _ in range(2 * g.page_size)]
    serve(s, "a", prompt, [1] * g.page_size)
    page = int(s.cache._pages(s.cache._path(s.lookup(prompt).last_device_node)[0])[0])
    flip_in_page(s.buffers()[0], page, g.page_size, 0, 7)
    b = serve(s, "b", prompt, [2] * g.page_size)
    assert b.to_finish is not None and b.prefix_len == 0
    assert list(b.origin_input_ids) == [0]  # SGLang's abort stub: the long prefill is skipped
