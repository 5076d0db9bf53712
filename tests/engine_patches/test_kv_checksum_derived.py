"""Derived KV under HiCache write-through, through SGLang's own path: its unified tree with the HybridCacheController,
write-through backup at insert, eviction of backed-up device copies, and load-back from host.

Request r holds prefix P, already written through to host. One of P's device pages is damaged while r decodes, so
everything r computes afterwards is wrong (the stand-in model's attention reads the damaged page: Server(derive)).
Eviction then drops P's damaged device copy without a look (it has a clean host copy), so a later request that
loads P from host is handed a clean P: if r's KV had been cached, it would be served behind it. The checksummed
tree re-checks the pages a request read (the prefix it holds) before its insert, so r's KV is never cached."""

from __future__ import annotations

import random

import pytest
from prometheus_client import REGISTRY
from sglang.srt.mem_cache.base_prefix_cache import EvictParams

from engine_patches.kv_checksum.events import read_events
from tests.engine_patches.kv_server import Geometry, Server

GEOMETRIES = [Geometry("mha", page_size=1, pages=640), Geometry("mha", page_size=16, pages=40),
              Geometry("mha", page_size=64, pages=16), Geometry("mla", "fp8", page_size=1, pages=640),
              Geometry("mla", "fp8", page_size=16, pages=40), Geometry("mla", page_size=64, pages=16)]


def metric(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels or None) or 0.0


def write_through() -> dict:
    return {"enable_hierarchical_cache": True, "hicache_ratio": 4.0, "hicache_io_backend": "direct",
            "hicache_mem_layout": "layer_first", "hicache_write_policy": "write_through"}


@pytest.fixture
def make(tmp_path):
    servers = []

    def build(g: Geometry) -> Server:
        s = Server(g, hicache=True, derive=True, server_args=write_through(),
                   log=str(tmp_path / f"log{len(servers)}.jsonl"))
        servers.append(s)
        return s

    yield build
    for s in reversed(servers):
        s.close()


def run_checked(s: Server) -> None:
    for _ in range(5000):
        if s.idle():
            s.tree.check_hicache_events()  # let write-through acks land
            s.check_slots()
            return
        s.step()
        s.check_slots()
    raise AssertionError("requests did not finish")


def evict_device_copies(s: Server) -> None:
    """SGLang's own eviction: backed-up nodes lose their device copy, unchecked."""
    s.tree.check_hicache_events()
    s.tree.evict(EvictParams(num_tokens=1 << 30))
    s.check_slots()


@pytest.mark.parametrize("g", GEOMETRIES, ids=lambda g: g.name)
def test_kv_computed_over_a_damaged_written_through_prefix_is_never_cached_or_served(g, make):
    s = make(g)
    rng = random.Random(g.name)
    n = 4 * max(16, g.page_size)  # P: 4+ pages
    prompt = [rng.randrange(1, 40_000) for _ in range(n)]
    s.submit("a", prompt + [1], [2])
    run_checked(s)
    assert s.tree.kv_host_seals.sealed.sum() >= n // g.page_size  # P written through to host

    out = [rng.randrange(1, 40_000) for _ in range(2 * g.page_size + 3)]  # r fills 2+ pages while it decodes
    r = s.submit("r", prompt + [3], out)
    s.step()  # r's prefill: admitted with P from the device tree
    s.check_slots()
    assert r.admitted_prefix == n and s.served.corrupt == 0
    s.flip(s.page_of(r, n // 2), buffer=1)  # damage one of P's device pages while r decodes
    run_checked(s)
    assert r.finished()

    evict_device_copies(s)  # P's damaged device copy goes unchecked: P has a clean host copy
    q = s.submit("q", prompt + [3] + out + [5], [6])
    s.step()
    assert q in s.waiting and q.host_hit_length >= n  # P's clean host copy, being loaded back (q waits for it)
    run_checked(s)
    assert s.served.corrupt == 0, f"{s.served.corrupt} of {s.served.pages} pages handed to q were computed over " \
                                  "a damaged page"
    # P, and of r's KV only what its prefill computed before the damage (whole pages): nothing from its decode
    assert q.admitted_prefix == (n + 1) // g.page_size * g.page_size
    actions = [e["detail"] for e in read_events(s.log) if e["kind"] == "kv_checksum_action"]
    assert any(d["action"] == "insert_truncated" and d["rid"] == "r" and d["at"] <= n for d in actions)
    assert metric("capbench_kv_checksum_mismatch_total", source="insert") >= 1
