"""Detection and false-positive figures per pool type, page size, mode and HiCache: random single-bit flips (any
buffer, page, byte, bit) in cached pages are each caught at the next admission or host load and never served, and
clean checks in between report nothing. Run with -s to see the figures."""

from __future__ import annotations

import random

import pytest
from prometheus_client import REGISTRY
from sglang.srt.mem_cache.base_prefix_cache import EvictParams

from engine_patches.kv_checksum.checksum import pool_buffers
from tests.engine_patches.kv_server import Geometry, Server, flip_page
from tests.engine_patches.test_kv_checksum_tree import cached_pages

TRIALS = 30  # per configuration: 16 configurations, 480 flips
CONFIGS = [(kind, page, mode, hicache) for kind in ("mha", "mla") for page in (1, 16) for mode in ("verify", "strict")
           for hicache in (False, True)]
HICACHE = {"enable_hierarchical_cache": True, "hicache_ratio": 4.0, "hicache_io_backend": "direct",
           "hicache_mem_layout": "layer_first"}


def metric(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels or None) or 0.0


def mismatches() -> float:
    return sum(metric("capbench_kv_checksum_mismatch_total", source=s)
               for s in ("admission", "insert", "scrub", "offload", "load"))


def host_pages_of(s: Server, doc: list[int]) -> list[int]:
    """Host page ids of the host copy a request for `doc` would load (SGLang's own load-back transfer spec)."""
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.components import CacheTransferPhase, ComponentType

    match = s.tree.match_prefix(MatchPrefixParams(key=RadixKey(array("q", doc))))
    assert match.host_hit_length > 0
    transfer = s.tree.tree_core.build_hicache_transfers(ComponentType.FULL, match.best_match_node,
                                                        CacheTransferPhase.LOAD_BACK)[0]
    return s.tree.kv_host_seals.pages_of(transfer.host_indices).tolist()


@pytest.mark.parametrize("kind,page,mode,hicache", CONFIGS,
                         ids=[f"{k}-p{p}-{m}{'-hicache' if h else ''}" for k, p, m, h in CONFIGS])
def test_every_flip_in_a_cached_page_is_caught_before_it_is_served(kind, page, mode, hicache, tmp_path):
    rng = random.Random(f"{kind}{page}{mode}{hicache}")
    g = Geometry(kind, "fp8" if kind == "mla" else "bf16", page_size=page, pages=64 if page == 16 else 1024)
    s = Server(g, mode=mode, hicache=hicache, server_args=HICACHE if hicache else {},
               log=str(tmp_path / "log.jsonl"))
    try:
        docs = [[rng.randrange(1, 40_000) for _ in range(64)] for _ in range(3)]
        detected = clean_pages = 0
        for trial in range(TRIALS):
            # Cache turnover: what is left of earlier trials' bad nodes (a bad node lingers while it has children,
            # unreachable) is evicted, and every document is cached again.
            s.tree.evict(EvictParams(num_tokens=1 << 30))
            for d in docs:
                s.submit(f"warm{trial}", d + [trial + 1], [1])
                s.run()
            before, verified = mismatches(), metric("capbench_kv_pages_verified_total")
            for d in docs:  # a clean round: checks, and nothing to find
                s.submit(f"clean{trial}", d + [trial + 2], [1])
                s.run()
            assert mismatches() == before, "a mismatch with no flip"
            clean_pages += metric("capbench_kv_pages_verified_total") - verified
            if hicache:  # flip a host copy, then make every document come back from host
                s.tree.check_hicache_events()
                s.tree.evict(EvictParams(num_tokens=1 << 30))
                host = s.tree.kv_host_seals
                target = rng.choice(host_pages_of(s, rng.choice(docs)))
                view = host.views[rng.randrange(len(host.views))]
            else:
                target = rng.choice(cached_pages(s, rng.choice(docs)))
                view = pool_buffers(s.pool)[rng.randrange(len(pool_buffers(s.pool)))]
            page_bytes = page * view[0].numel() * view.element_size()
            flip_page(view, target, page, rng.randrange(page_bytes), rng.randrange(8))
            for d in docs:
                s.submit(f"probe{trial}", d + [trial + 3], [1])
                s.run()
            detected += mismatches() - before
            assert s.served.corrupt == 0
            s.check_slots()
        tier = "host" if hicache else "device"
        print(f"\n{kind}-p{page}-{mode}{'-hicache' if hicache else ''}: {detected:.0f}/{TRIALS} single-bit flips in "
              f"cached {tier} pages detected, {s.served.corrupt} served ({s.served.pages} clean cached pages "
              f"served); {clean_pages:.0f} clean page checks, 0 false positives; slots audited every trial")
        assert detected == TRIALS
    finally:
        s.close()
