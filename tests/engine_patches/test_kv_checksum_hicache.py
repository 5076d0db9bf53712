"""HiCache with KV page checksums on CPU: SGLang's unified tree with its HybridCacheController and real host
pools (MHA and MLA, layer_first), write-through and write-back; only host-memory registration and the copy
kernel are CPU stand-ins (kv_server.hicache_on_cpu). Seals travel with offloaded pages, host copies are checked
before they are loaded back, and a flip in host memory is detected and never loaded."""

from __future__ import annotations

import random

import pytest
from prometheus_client import REGISTRY
from sglang.srt.mem_cache.base_prefix_cache import EvictParams

from engine_patches.kv_checksum.events import read_events
from tests.engine_patches.kv_server import Geometry, Server, flip_page

GEOMETRIES = [Geometry("mha", page_size=16, pages=32), Geometry("mha", page_size=1, pages=512),
              Geometry("mla", "fp8", page_size=16, pages=32), Geometry("mla", "fp8", page_size=1, pages=512)]


def metric(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels or None) or 0.0


def hicache(policy: str = "write_through") -> dict:
    return {"enable_hierarchical_cache": True, "hicache_ratio": 4.0, "hicache_io_backend": "direct",
            "hicache_mem_layout": "layer_first", "hicache_write_policy": policy}


@pytest.fixture
def make(tmp_path):
    servers = []

    def build(g: Geometry, policy: str = "write_through", **kw) -> Server:
        s = Server(g, hicache=True, server_args=hicache(policy), log=str(tmp_path / f"log{len(servers)}.jsonl"),
                   **kw)
        servers.append(s)
        return s

    yield build
    for s in reversed(servers):
        s.close()


def run_checked(s: Server) -> None:
    for _ in range(2000):
        if s.idle():
            s.tree.check_hicache_events()  # let write-through acks land
            s.check_slots()
            return
        s.step()
        s.check_slots()
    raise AssertionError("requests did not finish")


def offload_all(s: Server) -> None:
    """Evict every device copy the tree holds: backed-up nodes become host-only."""
    s.tree.check_hicache_events()
    s.tree.evict(EvictParams(num_tokens=1 << 30))
    s.check_slots()


def host_pages(s: Server) -> list[int]:
    return s.tree.kv_host_seals.sealed.nonzero().flatten().tolist()


def flip_host(s: Server, host_page: int, buffer: int = 0, byte: int = 6, bit: int = 1) -> None:
    seals = s.tree.kv_host_seals
    view = seals.views[buffer]
    assert not seals.page_major and view.is_contiguous()
    flip_page(view, host_page, s.g.page_size, byte, bit)


@pytest.mark.parametrize("g", GEOMETRIES, ids=lambda g: g.name)
def test_seals_travel_to_host_and_a_clean_host_copy_is_loaded_back(g, make):
    s = make(g)
    rng = random.Random(g.name)
    prompt = [rng.randrange(1, 40_000) for _ in range(64)]
    s.submit("a", prompt + [1], [2])
    run_checked(s)
    pages = 64 // g.page_size
    assert len(host_pages(s)) == len(s.tree.all_values_flatten()) // g.page_size  # written through, sealed
    offload_all(s)
    assert s.tree.evictable_size() == 0
    loads, bad = metric("capbench_kv_verifications_total", source="load"), metric(
        "capbench_kv_checksum_mismatch_total", source="load")
    b = s.submit("b", prompt + [3], [4])
    run_checked(s)
    assert b.admitted_prefix == 64 and b.host_hit_length == 64  # all of it loaded back from host
    assert metric("capbench_kv_verifications_total", source="load") == loads + 1
    assert metric("capbench_kv_checksum_mismatch_total", source="load") == bad
    assert s.served.corrupt == 0 and s.served.pages == pages
    # The loaded pages carry the original seals: damage to them on the device is caught at the next admission.
    dev = s.tree.kv_seals.pages_of(s.tree.path_device_indices(
        s.tree.tree_core.match_full_device_prefix(key(prompt))[1]))
    assert not bool(s.tree.kv_seals.pending[dev].any()) and bool(s.tree.kv_seals.sealed[dev].all())
    s.flip(int(dev[1]))
    c = s.submit("c", prompt + [5], [6])
    run_checked(s)
    assert c.admitted_prefix == g.page_size  # cut before the second page
    assert s.served.corrupt == 0


@pytest.mark.parametrize("g", GEOMETRIES, ids=lambda g: g.name)
def test_a_flip_in_host_memory_is_detected_never_loaded_and_rewritten(g, make):
    """The request that meets the bad host copy recomputes; its recomputed KV is then written over the host copy
    (with fresh seals), so the next request loads a good copy from host again."""
    s = make(g)
    rng = random.Random(g.name)
    prompt = [rng.randrange(1, 40_000) for _ in range(64)]
    s.submit("a", prompt + [1], [2])
    run_checked(s)
    offload_all(s)
    host = host_pages(s)
    flip_host(s, host[len(host) // 2], buffer=1)
    refused = metric("capbench_kv_checksum_mismatch_total", source="load")
    r0 = s.submit("r0", prompt + [3], [9])
    run_checked(s)
    assert r0.admitted_prefix == 0 and s.served.corrupt == 0  # never loaded: recomputed
    assert metric("capbench_kv_checksum_mismatch_total", source="load") == refused + 1
    events = read_events(s.log)
    assert [e["detail"]["part"] for e in events if e["kind"] == "kv_checksum_mismatch"] == ["host"]
    done = [e["detail"]["action"] for e in events if e["kind"] == "kv_checksum_action"]
    assert "load_refused" in done and "host_copy_rewritten" in done
    for i in (1, 2):
        offload_all(s)
        r = s.submit(f"r{i}", prompt + [3 + i], [9])
        run_checked(s)
        assert r.admitted_prefix == 64 and r.host_hit_length == 64  # the rewritten host copy, loaded and clean
    assert s.served.corrupt == 0
    assert metric("capbench_kv_checksum_mismatch_total", source="load") == refused + 1


@pytest.mark.parametrize("g", [GEOMETRIES[0], GEOMETRIES[3]], ids=lambda g: g.name)
def test_a_page_damaged_on_the_device_never_reaches_host_memory(g, make):
    """Write-back offloads at eviction; a page damaged after it was cached fails the offload check, so the
    host copy is never written (SGLang then drops the subtree) and the prefix is recomputed."""
    s = make(g, policy="write_back")
    rng = random.Random(g.name)
    prompt = [rng.randrange(1, 40_000) for _ in range(64)]
    s.submit("a", prompt + [1], [2])
    run_checked(s)
    assert host_pages(s) == []  # write-back: nothing offloaded yet
    matched, node, _ = s.tree.tree_core.match_full_device_prefix(key(prompt))
    dev = s.tree.kv_seals.pages_of(s.tree.path_device_indices(node)[:matched])
    s.flip(int(dev[-1]))
    offload_all(s)
    assert metric("capbench_kv_checksum_mismatch_total", source="offload") >= 1
    assert len(host_pages(s)) < len(dev)  # the damaged node was not written to host
    b = s.submit("b", prompt + [3], [4])
    run_checked(s)
    assert b.admitted_prefix < 64 and s.served.corrupt == 0


def key(ids):
    from array import array

    from sglang.srt.mem_cache.radix_cache import RadixKey

    return RadixKey(array("q", ids))


def test_storage_backends_are_refused_with_checksums_on(tmp_path):
    with pytest.raises(ValueError, match="storage backends"):
        Server(Geometry("mha"), hicache=True, server_args={**hicache(), "hicache_storage_backend": "file",
                                                           "file_storage_path": str(tmp_path)})


@pytest.mark.parametrize("g", [GEOMETRIES[0], GEOMETRIES[2]], ids=lambda g: g.name)
def test_the_host_copy_check_runs_off_the_scheduler_thread_and_the_load_waits_for_it(g, make, monkeypatch):
    """With CAPBENCH_KV_HOST_CHECK_WORKER=1, inside an admission step the load's host-copy check runs on the worker
    thread; the load is deferred to a later step until its verdict is in, so a damaged host copy is refused before
    anything loads it."""
    import threading

    monkeypatch.setenv("CAPBENCH_KV_HOST_CHECK_WORKER", "1")
    s = make(g)
    rng = random.Random(g.name)
    prompt = [rng.randrange(1, 40_000) for _ in range(64)]
    s.submit("a", prompt + [1], [2])
    run_checked(s)
    hs = s.tree.kv_host_seals
    ran_on, partials = [], hs._partials_cpu
    hs._partials_cpu = lambda pages: ran_on.append(threading.get_ident()) or partials(pages)
    for damaged in (False, True):
        offload_all(s)
        if damaged:
            flip_host(s, host_pages(s)[0], buffer=0)
        r = s.submit(f"r{damaged}", prompt + [3], [9])
        deferred = 0
        while r in s.waiting:
            s.step()
            deferred += 1
            s.tree.kv_host_worker.drain()
        run_checked(s)
        assert deferred >= 2  # the first step submitted the check and kept the request queued
        assert r.admitted_prefix == (0 if damaged else 64) and s.served.corrupt == 0
    assert ran_on and threading.get_ident() not in ran_on  # the scheduler thread never ran a host-copy check
