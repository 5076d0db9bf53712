"""HiCache with KV page checksums on CPU: SGLang's unified tree with its HybridCacheController and real host
pools (MHA and MLA, layer_first), write-through and write-back; only host-memory registration and the copy
kernel are CPU stand-ins (kv_server.hicache_on_cpu). Seals travel with offloaded pages; a load asked for in an
admission step is copied first and its pages checked on the device at the request's next admission (nothing is
admitted over pages still being loaded); a PD restore, or CAPBENCH_KV_HOST_CHECK_INLINE=1, checks the host copy
on the CPU before the copy. A flip in host memory is never served, whenever it happens before the copy."""

from __future__ import annotations

import random

import pytest
from prometheus_client import REGISTRY
from sglang.srt.mem_cache.base_prefix_cache import EvictParams

from engine_patches.kv_checksum.events import read_events
from tests.engine_patches.kv_server import TRANSFER_WATCHERS, Geometry, Server, flip_page

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
    s.step()
    assert b in s.waiting and b.host_hit_length == 64  # its load was started; b waits for it
    run_checked(s)
    assert b.admitted_prefix == 64  # all of it loaded back from host (the device held nothing), checked there
    assert metric("capbench_kv_verifications_total", source="load") == loads  # no host-copy check on the CPU
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


@pytest.mark.parametrize("inline", [False, True], ids=["device", "inline"])
@pytest.mark.parametrize("g", GEOMETRIES, ids=lambda g: g.name)
def test_a_flip_in_host_memory_is_detected_never_served_and_rewritten(g, inline, make, monkeypatch):
    """Inline, the host copy is checked before the copy and refused whole: the request recomputes all of it. On the
    device (the default) the loaded pages are checked at the request's next admission: it is served the clean pages
    before the bad one and recomputes from there, and the host copy is marked bad. Either way the next load of the
    bad copy is refused, the recomputed KV is written over it (with fresh seals), and later requests load a good
    copy from host again."""
    if inline:
        monkeypatch.setenv("CAPBENCH_KV_HOST_CHECK_INLINE", "1")
    s = make(g)
    rng = random.Random(g.name)
    prompt = [rng.randrange(1, 40_000) for _ in range(64)]
    s.submit("a", prompt + [1], [2])
    run_checked(s)
    offload_all(s)
    host = host_pages(s)
    flip_host(s, host[len(host) // 2], buffer=1)
    on_load = metric("capbench_kv_checksum_mismatch_total", source="load")
    on_admission = metric("capbench_kv_checksum_mismatch_total", source="admission")
    r0 = s.submit("r0", prompt + [3], [9])
    run_checked(s)
    assert r0.admitted_prefix == (0 if inline else 32) and s.served.corrupt == 0  # nothing at or after the flip
    assert metric("capbench_kv_checksum_mismatch_total", source="load") == on_load + inline
    assert metric("capbench_kv_checksum_mismatch_total", source="admission") == on_admission + (not inline)
    events = read_events(s.log)
    parts = [e["detail"]["part"] for e in events if e["kind"] == "kv_checksum_mismatch"]
    assert parts == ["host"] if inline else (len(parts) == 1 and parts[0] in ("k", "v", "kv"))  # found on device
    done = [e["detail"]["action"] for e in events if e["kind"] == "kv_checksum_action"]
    assert ("load_refused" in done and "host_copy_rewritten" in done) if inline else "loaded_copy_bad" in done
    for i in (1, 2, 3):
        offload_all(s)
        r = s.submit(f"r{i}", prompt + [3 + i], [9])
        run_checked(s)
        # on the device path the bad copy is refused at r1's load (known bad), r1 recomputes and rewrites it
        assert r.admitted_prefix == (0 if i == 1 and not inline else 64)
    assert s.served.corrupt == 0
    done = [e["detail"]["action"] for e in read_events(s.log) if e["kind"] == "kv_checksum_action"]
    assert "load_refused" in done and "host_copy_rewritten" in done
    assert metric("capbench_kv_checksum_mismatch_total", source="load") == on_load + inline


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


def offloaded(s: Server) -> list[int]:
    rng = random.Random(s.g.name)
    prompt = [rng.randrange(1, 40_000) for _ in range(64)]
    s.submit("a", prompt + [1], [2])
    run_checked(s)
    offload_all(s)
    return prompt


@pytest.mark.parametrize("inline", [False, True], ids=["device", "inline"])
@pytest.mark.parametrize("g", [GEOMETRIES[0], GEOMETRIES[2]], ids=lambda g: g.name)
def test_host_damage_after_the_load_is_asked_for_and_before_its_copy(g, inline, make, monkeypatch):
    """The host copy is damaged after the load was asked for and before the copy reads it (a worker thread's whole
    window; the inline check's too, between its check and the copy). Default: the loaded pages are checked on the
    device before any forward reads them, nothing over the damage is served, and the scheduler thread checksums no
    host page. Inline (for comparison): the loading request's own forward reads the damaged page, once."""
    if inline:
        monkeypatch.setenv("CAPBENCH_KV_HOST_CHECK_INLINE", "1")
    s = make(g)
    prompt = offloaded(s)
    hs = s.tree.kv_host_seals
    host_checksums = []
    partials, bad_pages = hs.partials, hs.bad_pages
    hs.partials = lambda pages: host_checksums.append(len(pages)) or partials(pages)
    hs.bad_pages = lambda pages: host_checksums.append(len(pages)) or bad_pages(pages)
    victim = host_pages(s)[-1]

    def damage_before_copy(src_layers, src_indices, dst_indices):
        if src_layers[0].data_ptr() == hs.views[0].data_ptr() and victim * g.page_size in src_indices.tolist():
            flip_host(s, victim, buffer=0)
            TRANSFER_WATCHERS.remove(damage_before_copy)

    TRANSFER_WATCHERS.append(damage_before_copy)
    try:
        r = s.submit("r", prompt + [3], [9])
        s.step()
        assert damage_before_copy not in TRANSFER_WATCHERS and (r in s.waiting) != inline  # copied; r waits?
        run_checked(s)
    finally:
        if damage_before_copy in TRANSFER_WATCHERS:
            TRANSFER_WATCHERS.remove(damage_before_copy)
    if inline:
        assert s.served.corrupt == 1 and host_checksums  # the window: checked, then damaged, then read
        return
    assert s.served.corrupt == 0 and r.admitted_prefix == 64 - g.page_size  # cut before the damaged last page
    assert host_checksums == []
    events = read_events(s.log)
    assert any(e["kind"] == "kv_checksum_action" and e["detail"]["action"] == "loaded_copy_bad" for e in events)
    assert bool(hs.bad[victim])  # refused at its next load, then rewritten


@pytest.mark.parametrize("g", [GEOMETRIES[0], GEOMETRIES[3]], ids=lambda g: g.name)
def test_nothing_is_admitted_over_pages_still_being_loaded(g, make, monkeypatch):
    """Until the load is acknowledged its pages are PENDING: neither the loading request nor another that shares
    the prefix is admitted over them, step after step; once acknowledged both get the checked pages."""
    s = make(g)
    prompt = offloaded(s)
    reap = s.tree.loading_check
    monkeypatch.setattr(s.tree, "loading_check", lambda finish_count=None: None)
    r = s.submit("r", prompt + [3], [9])
    s.step()
    other = s.submit("o", prompt + [4], [9])
    for _ in range(4):
        s.step()
        assert r in s.waiting and other in s.waiting and s.served.pages == 0
    monkeypatch.setattr(s.tree, "loading_check", reap)
    run_checked(s)
    assert r.admitted_prefix == 64 and other.admitted_prefix == 64 and s.served.corrupt == 0


@pytest.mark.parametrize("damaged", [False, True])
def test_a_pd_restore_outside_a_step_checks_the_host_copy_inline(damaged, make):
    """A PD decode server restores a retracted request's prefix with `init_load_back` outside any admission step
    (decode_hicache_mixin): there is no step to retry in, so the host copy is checksummed before the copy."""
    from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams, MatchPrefixParams

    g = GEOMETRIES[2]
    s = make(g)
    prompt = offloaded(s)
    if damaged:
        flip_host(s, host_pages(s)[1], buffer=0)
    loads = metric("capbench_kv_verifications_total", source="load")
    req = s.submit("restore", prompt + [3], [9])
    s.waiting.remove(req)
    match = s.tree.match_prefix(MatchPrefixParams(key=key(prompt), req=req))
    req.last_node = match.last_device_node
    loaded, _ = s.tree.init_load_back(InitLoadBackParams(best_match_node=match.best_match_node,
                                                         host_hit_length=match.host_hit_length, req=req))
    assert metric("capbench_kv_verifications_total", source="load") == loads + 1
    assert loaded == (0 if damaged else 64)
    s.tree.ready_to_load_host_cache()


def test_a_load_waits_uncommitted_while_sglangs_load_slots_are_busy(make, monkeypatch):
    """SGLang keeps three load events; starting a fourth load before the oldest finished fails its own assert. While
    every slot is busy the load is not committed (no device pages, no copy) and the request asks again later."""
    s = make(GEOMETRIES[0])
    prompt = offloaded(s)
    monkeypatch.setattr(s.tree, "has_free_load_back_slot", lambda: False)
    r = s.submit("r", prompt + [3], [9])
    for _ in range(3):
        s.step()
        assert r in s.waiting and not s.tree.ongoing_load_back and s.tree.evictable_size() == 0
    monkeypatch.undo()
    run_checked(s)
    assert r.admitted_prefix == 64 and s.served.corrupt == 0
