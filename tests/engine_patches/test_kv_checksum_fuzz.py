"""Seeded random fuzz of the checksummed tree over SGLang's real serving path (tests/engine_patches/kv_server.py):
thousands of operations (submit, scheduler steps with admission / chunked prefill / decode / release, eviction,
HiCache offload and load, queue ordering, scrub) with bit flips injected into random pages at random times: tree
pages idle or held, requests' own sealed pages, host copies, and free pages.

Asserted per configuration (pool type x page size x mode x HiCache), after every operation:
- served corrupt pages = 0: no request is handed cached KV (from the device tree or loaded from host) whose bytes
  differ from the KV of its tokens;
- false positives = 0: every mismatch reported is on a page with an injected flip that has not been freed since;
- slot accounting: every page is owned exactly once (free list, tree, or a live request) and the free list holds
  no page twice.
Run with -s to see each configuration's figures.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import pytest
import torch
from sglang.srt.managers.schedule_policy import SchedulePolicy
from sglang.srt.mem_cache.base_prefix_cache import EvictParams

from engine_patches.kv_checksum.checksum import pool_buffers
from engine_patches.kv_checksum.events import read_events
from tests.engine_patches.kv_server import TRANSFER_WATCHERS, Geometry, Server, flip_page

OPS = 260  # per configuration: 16 configurations, 4,160 operations
CONFIGS = [(kind, page, mode, hicache) for kind in ("mha", "mla") for page in (1, 16) for mode in ("verify", "strict")
           for hicache in (False, True)]


@dataclass
class Tally:
    ops: int = 0
    flips: int = 0  # flip operations into sealed pages (device or host), one or three bits each
    corrupted: int = 0  # pages those flips corrupted (a page flipped twice before it is freed counts once)
    idle_flips: int = 0  # flips into free pages (nothing should notice: the next owner rewrites them)
    detected: int = 0  # corrupted pages reported as mismatched
    freed_unchecked: int = 0  # corrupted pages freed before anything took them from the cache
    false_positives: int = 0
    slot_checks: int = 0


class Fuzz:
    def __init__(self, kind: str, page: int, mode: str, hicache: bool, log: str, seed: str):
        self.rng = random.Random(seed)
        self.now = [0.0]
        args = {}
        if hicache:
            args = {"enable_hierarchical_cache": True, "hicache_ratio": 2.0, "hicache_io_backend": "direct",
                    "hicache_mem_layout": "layer_first"}
        g = Geometry(kind, "fp8" if kind == "mla" else "bf16", page_size=page, pages=40 if page == 16 else 640)
        self.s = Server(g, mode=mode, hicache=hicache, server_args=args, log=log, scrub_pages_per_s=16.0,
                        clock=lambda: self.now[0], chunk=64)
        self.policy = SchedulePolicy("lpm", self.s.tree, hicache, False, False)
        self.docs = [[self.rng.randrange(1, 40_000) for _ in range(self.rng.choice([48, 80, 128]))] for _ in range(5)]
        self.tainted: set[int] = set()  # device pages flipped since they were last freed
        self.tainted_host: set[int] = set()
        self.reported: set[tuple[str, int]] = set()  # tainted pages reported bad
        self.freed: set[tuple[str, int]] = set()  # tainted pages freed during the current operation
        self.events_seen = 0
        self.tally = Tally()
        self._watch_frees()
        TRANSFER_WATCHERS.append(self._follow_copies)

    def close(self) -> None:
        TRANSFER_WATCHERS.remove(self._follow_copies)
        self.s.close()

    def _follow_copies(self, src_layers, src_indices, dst_indices) -> None:
        """An offload copies a flipped device page's bytes to host: that host page carries the flip; a load copies
        a flipped host page's bytes to the device (where the default path checks them): that device page does."""
        device = {b.data_ptr() for b in pool_buffers(self.s.pool)}
        offload = src_layers[0].data_ptr() in device
        source, tier = (self.tainted, "host") if offload else (self.tainted_host, "device")
        P = self.s.g.page_size
        for src, dst in zip(src_indices[::P].tolist(), dst_indices[::P].tolist(), strict=True):
            if src // P in source:
                self._taint(tier, dst // P)

    def _watch_frees(self) -> None:
        """A page's injected flip stops counting once the page is freed (its next content is new)."""
        seals, host = self.s.tree.kv_seals, self.s.tree.kv_host_seals
        forget = seals.forget

        def forget_and_untaint(pages):
            for p in torch.as_tensor(pages).flatten().tolist():
                if p in self.tainted:
                    self.tainted.discard(p)
                    self._freed("device", p)
            return forget(pages)

        seals.forget = forget_and_untaint
        if host is not None:
            host_forget = host.forget

            def host_forget_and_untaint(indices):
                for p in (indices.cpu()[:: self.s.g.page_size] // self.s.g.page_size).tolist():
                    if p in self.tainted_host:
                        self.tainted_host.discard(p)
                        self._freed("host", p)
                return host_forget(indices)

            host.forget = host_forget_and_untaint

    def _freed(self, tier: str, page: int) -> None:
        self.freed.add((tier, page))
        if (tier, page) not in self.reported:
            self.tally.freed_unchecked += 1  # unless the check that found it frees it in the same operation
        self.reported.discard((tier, page))

    def _taint(self, tier: str, page: int) -> None:
        tainted = self.tainted_host if tier == "host" else self.tainted
        if page not in tainted:
            tainted.add(page)
            self.tally.corrupted += 1

    # ---- operations ----

    def op(self) -> None:
        r = self.rng.random()
        if r < 0.22:
            self.submit()
        elif r < 0.62:
            self.s.step()
        elif r < 0.74:
            self.flip()
        elif r < 0.82:
            self.evict()
        elif r < 0.88:
            self.policy.calc_priority(self.s.waiting)
        else:
            self.now[0] += self.rng.uniform(0.1, 2.0)  # scrub budget; the next match spends it
            if self.s.hicache:
                self.s.tree.check_hicache_events()
        self.tally.ops += 1

    def submit(self) -> None:
        doc = self.rng.choice(self.docs)
        cut = self.rng.randrange(len(doc) // 2, len(doc) + 1)
        prompt = doc[:cut] + [self.rng.randrange(1, 40_000) for _ in range(self.rng.randrange(1, 24))]
        output = [self.rng.randrange(1, 40_000) for _ in range(self.rng.randrange(1, 24))]
        if len(self.s.waiting) < 6:
            self.s.submit(f"r{self.tally.ops}", prompt, output)

    def evict(self) -> None:
        if self.s.hicache:
            self.s.tree.check_hicache_events()
        self.s.tree.evict(EvictParams(num_tokens=self.rng.randrange(1, 6) * 16))

    def flip(self) -> None:
        s, P = self.s, self.s.g.page_size
        where = self.rng.random()
        host = s.tree.kv_host_seals
        if host is not None and where < 0.3:
            pages = host.sealed.nonzero().flatten().tolist()
            if pages:
                page = self.rng.choice(pages)
                view = host.views[self.rng.randrange(len(host.views))]
                flip_page(view, page, P, self.rng.randrange(self._page_bytes(view)), self.rng.randrange(8))
                self._taint("host", page)
                self.tally.flips += 1
            return
        if where < 0.45:  # a free page: its next owner rewrites it before anything seals it
            free = s.allocator.get_all_free_pages().tolist()
            if free:
                self._flip_device(self.rng.choice(free))
                self.tally.idle_flips += 1
            return
        sealed = s.tree.kv_seals.sealed.nonzero().flatten().tolist()
        sealed = [p for p in sealed if p != 0]
        if sealed:
            page = self.rng.choice(sealed)
            self._flip_device(page)
            self._taint("device", page)
            self.tally.flips += 1

    def _flip_device(self, page: int) -> None:
        bufs = pool_buffers(self.s.pool)
        buf = bufs[self.rng.randrange(len(bufs))]
        for _ in range(self.rng.choice([1, 1, 1, 3])):
            flip_page(buf, page, self.s.g.page_size, self.rng.randrange(self._page_bytes(buf)), self.rng.randrange(8))

    def _page_bytes(self, view: torch.Tensor) -> int:
        return self.s.g.page_size * view[0].numel() * view.element_size()

    # ---- oracles ----

    def audit(self) -> None:
        self.s.check_slots()
        self.tally.slot_checks += 1
        assert self.s.served.corrupt == 0, "a corrupt cached page was served"
        events = read_events(self.s.log) if os.path.exists(self.s.log) else []
        for e in events[self.events_seen:]:
            if e["kind"] != "kv_checksum_mismatch":
                continue
            tier = "host" if e["detail"]["part"] == "host" else "device"
            tainted = self.tainted_host if tier == "host" else self.tainted
            if (tier, e["page"]) in self.reported:
                continue  # another buffer of a page already reported
            if e["page"] in tainted:
                self.reported.add((tier, e["page"]))
                self.tally.detected += 1
            elif (tier, e["page"]) in self.freed:  # found, then freed, within one operation
                self.tally.detected += 1
                self.tally.freed_unchecked -= 1
            else:
                self.tally.false_positives += 1
        self.events_seen = len(events)
        self.freed.clear()
        assert self.tally.false_positives == 0, "a mismatch on a page nobody flipped"


@pytest.mark.parametrize("kind,page,mode,hicache", CONFIGS,
                         ids=[f"{k}-p{p}-{m}{'-hicache' if h else ''}" for k, p, m, h in CONFIGS])
def test_fuzz_never_serves_a_corrupt_page(kind, page, mode, hicache, tmp_path):
    fuzz = Fuzz(kind, page, mode, hicache, str(tmp_path / "log.jsonl"), seed=f"{kind}-{page}-{mode}-{hicache}")
    try:
        for _ in range(OPS):
            fuzz.op()
            fuzz.audit()
        fuzz.s.run()  # drain: every request finishes
        fuzz.audit()
        t, served = fuzz.tally, fuzz.s.served
        left = len(fuzz.tainted) + len(fuzz.tainted_host) - len(fuzz.reported)
        print(f"\n{kind}-p{page}-{mode}{'-hicache' if hicache else ''}: {t.ops} ops, {len(fuzz.s.finished)} requests, "
              f"{served.pages} cached pages served, {served.corrupt} corrupt; {t.corrupted} pages corrupted by "
              f"{t.flips} flips (an offload copies a flip to host): {t.detected} detected, {t.freed_unchecked} "
              f"freed before any reuse, {left} still cached unread; {t.idle_flips} flips into free pages; "
              f"{t.false_positives} false positives; "
              f"{t.slot_checks} slot audits, 0 pages owned twice or lost")
        assert served.pages > 0 and t.detected > 0
        assert t.detected + t.freed_unchecked + left == t.corrupted
    finally:
        fuzz.close()
