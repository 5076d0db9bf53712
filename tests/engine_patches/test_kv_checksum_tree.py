"""KV page checksums on SGLang's default tree (UnifiedRadixCache, Rust tree core), driven through SGLang's own
scheduler-side functions (tests/engine_patches/kv_server.py): admission, chunked prefill, release and checkpoint.
Every test checks after every scheduler step that each page is owned exactly once (free list, tree, or a live
request) and that the free list holds no page twice."""

from __future__ import annotations

import random

import pytest
from prometheus_client import REGISTRY
from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.managers.schedule_policy import SchedulePolicy
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.runtime_context import get_context, get_parallel

from engine_patches.kv_checksum.events import read_events
from engine_patches.kv_checksum.tree import ChecksummedUnifiedRadixCache
from tests.engine_patches.kv_server import Geometry, Server

GEOMETRIES = [Geometry("mha", page_size=16, pages=48), Geometry("mha", page_size=1, pages=768),
              Geometry("mla", "fp8", page_size=16, pages=48), Geometry("mla", "fp8", page_size=1, pages=768)]


def metric(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels or None) or 0.0


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, 40_000) for _ in range(n)]


@pytest.fixture
def server(request, tmp_path):
    servers = []

    def make(g: Geometry, **kw) -> Server:
        s = Server(g, log=str(tmp_path / f"log{len(servers)}.jsonl"), **kw)
        servers.append(s)
        return s

    yield make
    for s in reversed(servers):
        s.close()


def run_checked(s: Server, max_steps: int = 2000) -> None:
    for _ in range(max_steps):
        if s.idle():
            return
        s.step()
        s.check_slots()
    raise AssertionError("requests did not finish")


def actions(s: Server) -> list[dict]:
    return [e["detail"] for e in read_events(s.log) if e["kind"] == "kv_checksum_action"]


def test_default_server_args_build_sglangs_unified_tree_and_the_backend_subclasses_it():
    """SGLang's own selection with its default server arguments, then with our backend: same tree, same core."""
    g = Geometry("mha")
    s = Server(g)
    try:
        override = get_context().override_server_args()
        args = override.install()
        ctx = TreeCacheBuildContext(
            server_args=args, params=CacheInitParams(disable=False, req_to_token_pool=s.req_pool,
                                                         token_to_kv_pool_allocator=s.allocator, page_size=16),
            is_hybrid_swa=False, is_hybrid_ssm=False, enable_hierarchical_cache=False, disable_radix_cache=False,
            tp_worker=None, model_config=s.model_config, tp_size=1, tp_rank=0, tp_group=None)
        with get_parallel().override(tp_rank=0):
            default = create_tree_cache(ctx)
        override.restore()
        assert type(default) is UnifiedRadixCache
        assert isinstance(s.tree, ChecksummedUnifiedRadixCache) and isinstance(s.tree, UnifiedRadixCache)
        assert type(s.tree.tree_core) is type(default.tree_core)
        assert type(default.tree_core).__name__ == "RustUnifiedTreeCore"
    finally:
        s.close()


@pytest.mark.parametrize("mode", ["verify", "strict"])
@pytest.mark.parametrize("g", GEOMETRIES, ids=lambda g: g.name)
def test_a_held_node_found_corrupt_is_never_reinserted_served_or_freed_twice(g, mode, server):
    """Request a holds its prompt's node while it decodes; b finds a page of it corrupt at admission. Through
    SGLang's release path, a never re-inserts or re-seals that page, nothing a computed after it is cached, every
    slot is freed once, and the node leaves the tree when a lets go."""
    s = server(g, mode=mode)
    rng = random.Random(f"{g.name}-{mode}")
    prompt = tokens(rng, 64)
    a = s.submit("a", prompt, tokens(rng, 40))
    s.step()
    s.check_slots()
    assert a in s.running.reqs and a.kv.cache_protected_len == 64 // g.page_size * g.page_size
    bad = s.page_of(a, 16)
    s.flip(bad, buffer=1, byte=5, bit=3)
    mismatches = metric("capbench_kv_checksum_mismatch_total", source="admission")

    b = s.submit("b", prompt + [7, 8, 9], tokens(rng, 5))
    s.step()
    s.check_slots()
    assert b.admitted_prefix == 16  # cut before the corrupt page: b recomputes from there
    assert metric("capbench_kv_checksum_mismatch_total", source="admission") == mismatches + 1
    event = [e for e in read_events(s.log) if e["kind"] == "kv_checksum_mismatch"][-1]
    part = "k" if g.kind == "mha" else "kv"  # buffer 1 of k0 k1 v0 v1, or of kv0 kv1
    assert (event["page"], event["layer"], event["detail"]["part"]) == (bad, 1, part)
    run_checked(s)
    if mode == "strict":
        assert isinstance(b.finished_reason, FINISH_ABORT)
    truncated = [d for d in actions(s) if d["action"] == "insert_truncated"]
    assert {d["rid"] for d in truncated} >= {"a"} and all(d["at"] <= 16 for d in truncated)

    # The next admission drops the node a held (now unlocked) and the prompt is cached afresh.
    c = s.submit("c", prompt + [1], [2, 3])
    run_checked(s)
    assert c.admitted_prefix == 16 and "dropped" in [d["action"] for d in actions(s)]
    d = s.submit("d", prompt + [4], [5])
    run_checked(s)
    assert d.admitted_prefix == 64
    # Nothing a computed after the corrupt page was cached: its decode KV is not in the tree.
    e = s.submit("e", prompt + list(a.output_ids[:32]) + [6], [7])
    run_checked(s)
    assert e.admitted_prefix == 64
    assert s.served.corrupt == 0 and s.served.pages > 0
    assert s.allocator.available_size() + len(s.tree.all_values_flatten()) == g.pages * g.page_size


@pytest.mark.parametrize("mode", ["verify", "strict"])
@pytest.mark.parametrize("g", [GEOMETRIES[0], GEOMETRIES[3]], ids=lambda g: g.name)
def test_a_chunked_request_on_a_corrupt_prefix_caches_nothing_after_it(g, mode, server):
    """Chunked prefill checkpoints (the scheduler's stash) stop before a bad page in the prefix the request holds;
    strict mode aborts the still-running request."""
    s = server(g, mode=mode, chunk=32)
    rng = random.Random(g.name)
    prompt = tokens(rng, 96)
    a = s.submit("a", prompt, tokens(rng, 4))
    s.step()
    s.step()  # chunk 1 stashed into the tree, chunk 2 prefilled
    s.check_slots()
    assert s.chunked is a and a.kv.cache_protected_len == 32
    s.flip(s.page_of(a, 16), buffer=0)
    b = s.submit("b", prompt[:40] + [5], [6])
    found = metric("capbench_kv_checksum_mismatch_total", source="insert")
    s.step()  # a's chunk 2 stash re-checks the prefix a holds and finds page 16; b's admission is cut before it
    s.check_slots()
    assert metric("capbench_kv_checksum_mismatch_total", source="insert") == found + 1
    run_checked(s)
    assert b.admitted_prefix == 16
    assert any(d["action"] == "insert_truncated" and d["rid"] == "a" for d in actions(s))
    if mode == "strict":
        assert isinstance(a.finished_reason, FINISH_ABORT)
    c = s.submit("c", prompt + [1], [2])
    run_checked(s)
    # a's chunks after the corrupt page were never cached: c gets at most the prompt[:40] b recomputed (in strict
    # mode a is aborted at its stash, so its node is dropped early and b's clean pages are cached)
    assert c.admitted_prefix <= 40 // g.page_size * g.page_size
    assert s.served.corrupt == 0


@pytest.mark.parametrize("mode", ["verify", "strict"])
@pytest.mark.parametrize("g", GEOMETRIES, ids=lambda g: g.name)
def test_pages_seal_when_they_fill_and_damage_during_the_run_is_caught_before_sharing(g, mode, server):
    """A page is sealed by the forward that completes it (prefill chunk end or decode step), before any insert;
    damage to it while its request still runs is found when the request checkpoints, and the page never enters
    the tree. Partial tail pages are never sealed and never inserted."""
    P = g.page_size
    seen = []

    def after_forward(batch):
        req = batch.reqs[0]
        n = len(req.origin_input_ids) + len(req.output_ids)  # tokens whose KV is written now
        pages = [s.page_of(req, i) for i in range(0, n, P)]
        seen.append((n, [bool(s.tree.kv_seals.sealed[p]) for p in pages]))
        if n == 48 + P:  # the decode step that fills the page holding token 48
            s.flip(s.page_of(req, 48), buffer=0, byte=1, bit=0)

    s = server(g, mode=mode, after_forward=after_forward)
    rng = random.Random(g.name)
    prompt = tokens(rng, 40)
    a = s.submit("a", prompt, tokens(rng, 30))
    run_checked(s)
    n, sealed = seen[0]  # after the prefill forward, before its checkpoint
    assert n == 40 and sealed == [(i + 1) * P <= 40 for i in range(len(sealed))]
    assert all(all(flags[:-1]) for _, flags in seen if len(flags) > 1)  # every full page sealed at its forward
    assert any(d["action"] == "insert_truncated" and d["rid"] == "a" and d["at"] == 48 for d in actions(s))
    assert metric("capbench_kv_checksum_mismatch_total", source="insert") >= 1
    assert s.tree.tree_core.match_full_device_prefix(_key(prompt + list(a.output_ids)))[0] == 48
    b = s.submit("b", prompt + list(a.output_ids) + [1], [2])
    run_checked(s)
    assert b.admitted_prefix == 48  # a's pages up to the damaged one are shared, none after
    assert s.served.corrupt == 0


def cached_pages(s: Server, ids: list[int]) -> list[int]:
    """Page ids of the device path the tree holds for `ids`, in token order."""
    matched, node, _ = s.tree.tree_core.match_full_device_prefix(_key(ids))
    return s.tree.kv_seals.pages_of(s.tree.path_device_indices(node)[:matched]).tolist()


def _key(ids):
    from array import array

    from sglang.srt.mem_cache.radix_cache import RadixKey

    return RadixKey(array("q", ids))


@pytest.mark.parametrize("args", [{}, {"radix_eviction_policy": "tlru"}, {"enable_session_radix_cache": True},
                                  {"enable_streaming_session": True}], ids=["default", "tlru", "session", "streaming"])
def test_the_unified_trees_features_keep_working_with_checksums(args, server):
    """T-LRU, the session radix cache (Python tree core) and streaming sessions are accepted by SGLang's tree
    selection with the checksummed tree, which shares, evicts under memory pressure and still cuts at a bad page."""
    g = Geometry("mha", page_size=16, pages=24)
    s = server(g, server_args=args)
    assert isinstance(s.tree, UnifiedRadixCache)
    if args.get("enable_session_radix_cache"):
        assert type(s.tree.tree_core).__name__ == "UnifiedTreeCore"
    rng = random.Random(0)
    system = tokens(rng, 48)
    for i in range(6):  # more than the pool holds at once: forces evictions
        s.submit(f"r{i}", system + tokens(rng, 40), tokens(rng, 8))
        run_checked(s)
    r = s.submit("x", system + [1], [2])
    run_checked(s)
    assert r.admitted_prefix == 48
    s.flip(cached_pages(s, system)[1])
    y = s.submit("y", system + [3], [4])
    run_checked(s)
    assert y.admitted_prefix == 16 and s.served.corrupt == 0


def test_ordering_the_queue_checks_nothing_and_each_admission_checks_once(server):
    """The scheduler matches every waiting request each round to order its queue; only the admission match and
    the inserts run a check (one batched kernel launch and one host read-back each on a GPU)."""
    g = Geometry("mla", "bf16", page_size=16, pages=64)
    s = server(g)
    rng = random.Random(1)
    prefixes = [tokens(rng, 48) for _ in range(3)]
    for i, p in enumerate(prefixes):
        s.submit(f"warm{i}", p + [1], [2])
    run_checked(s)
    waiting = [s.submit(f"w{i}", prefixes[i % 3] + tokens(rng, 5), [3]) for i in range(12)]
    policy = SchedulePolicy("lpm", s.tree, False, False, False)
    before = {src: metric("capbench_kv_verifications_total", source=src) for src in ("admission", "insert")}
    for _ in range(50):
        policy.calc_priority(waiting)
    assert all(w.prefix_len == 48 for w in waiting)  # the ordering matches did find the cached prefixes
    assert metric("capbench_kv_verifications_total", source="admission") == before["admission"]
    assert metric("capbench_kv_verifications_total", source="insert") == before["insert"]
    run_checked(s)
    admitted = metric("capbench_kv_verifications_total", source="admission") - before["admission"]
    print(f"\n600 ordering matches: 0 checks; 12 admissions in one step: {admitted:.0f} admission check")
    assert admitted == 1  # the step's admissions are checked together (step.py)
    assert s.served.corrupt == 0 and s.served.pages == 12 * 3


def test_the_scrub_finds_idle_corruption_at_its_rate(server):
    now = [0.0]
    g = Geometry("mha", page_size=16, pages=32)
    s = server(g, scrub_pages_per_s=4.0, clock=lambda: now[0])
    rng = random.Random(2)
    prompt = tokens(rng, 64)
    s.submit("a", prompt + [1], [2])
    run_checked(s)
    page = cached_pages(s, prompt)[2]  # tokens 32..47
    s.flip(page)
    verified, found = metric("capbench_kv_pages_verified_total"), metric("capbench_kv_checksum_mismatch_total",
                                                                        source="scrub")
    for _ in range(8):  # 8 s at 4 pages/s: two rounds over the 31 pages
        now[0] += 1.0
        s.tree.match_prefix(MatchPrefixParams(key=_key([9] * 16)))
    assert metric("capbench_kv_checksum_mismatch_total", source="scrub") == found + 1
    assert bool(s.tree.kv_seals.bad[page])
    assert 4 <= metric("capbench_kv_pages_verified_total") - verified <= 32  # only sealed pages are compared
    b = s.submit("b", prompt + [3], [4])
    run_checked(s)
    assert b.admitted_prefix == 32 and s.served.corrupt == 0
