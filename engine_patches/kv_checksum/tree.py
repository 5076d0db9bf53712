"""SGLang 0.5.23's default tree, UnifiedRadixCache, with KV page checksums (see README "KV page checksums").

When pages are checked (PageSeals holds the seals):
- Admission: the match the scheduler makes to admit a request (`Req.init_next_round_input`, marked by the hook
  in hooks.py) checks every device page of the matched path; the admissions of one scheduler step are checked
  together, with one read-back and one agreement across ranks (step.py). The match is cut before the first bad
  page, so the request recomputes from there (strict mode aborts it instead). The many other matches the
  scheduler makes while it orders its queue check nothing: they only steer scheduling, and skip nodes already
  known bad.
- Insert: a checkpoint (chunk end, end of prefill, release) checks every page the request has read, the cached
  prefix it holds as well as its own pages, before its KV enters the tree, and looks up the bad marks of tree
  pages its insert would share. The insert stops before the first bad page: nothing at or after a corrupt page is
  cached, and the pages the request keeps are freed once by SGLang's own release. Re-checking the held prefix is
  what keeps KV *derived* from a damaged page out of the tree: a page damaged while a request decodes makes all
  it computes afterwards wrong, and with HiCache write-through the damaged page itself can later leave the device
  unchecked (eviction drops a backed-up copy), so the prefix must be checked while the request that read it still
  holds it. Any damage a request's KV depends on happened before its last forward, hence before its insert, and a
  held page cannot be freed or reused before then. Cost: one checksum read of the held prefix per checkpoint (at
  least two a request: end of prefill, release; one more per chunk), i.e. one more read of the KV the request's
  attention reads at every decode step.
- Scrub: idle sealed pages are checked round-robin at `scrub_pages_per_s`.
- HiCache offload and load: hicache.py.

A node found bad is dropped as soon as it is an unlocked device leaf without a host copy (SGLang's own
drop_subtree_no_host, called only after the lock anchors show it unlocked: it fails on a locked node); until then
(a request holds it, or it has children) matches are cut before it and inserts stop before it, so it is neither
served nor extended, and ordinary eviction reclaims it. Decisions that change the tree are agreed across
tensor-parallel ranks (the smallest cut wins, one CPU all-reduce), so every rank's tree stays the same.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace

import torch
from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams, MatchResult
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from engine_patches.kv_checksum.events import IntegrityLog
from engine_patches.kv_checksum.hicache import HiCacheChecksums
from engine_patches.kv_checksum.hooks import register_seals
from engine_patches.kv_checksum.metrics import kv_checksum_metrics
from engine_patches.kv_checksum.seals import Check, PageSeals, forget_on_free
from engine_patches.kv_checksum.step import StepChecks, pack, unpack

logger = logging.getLogger(__name__)

MODES = ("verify", "strict")
MAX_LOGGED_PAGES = 64  # per check: a wholesale overwrite should not flood the log
NO_CUT = 1 << 62


class ChecksummedUnifiedRadixCache(HiCacheChecksums, UnifiedRadixCache):
    def __init__(
        self,
        params: CacheInitParams,
        *,
        mode: str = "verify",
        scrub_pages_per_s: float = 0.0,
        integrity_log: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        step_batch: int = 256,
    ):
        if mode not in MODES:
            raise ValueError(f"kv checksum mode must be one of {MODES}, got {mode!r}")
        allocator = params.token_to_kv_pool_allocator
        kv_pool = allocator.get_kvcache()
        # Hybrid sliding-window models: the tree's FULL values index the full-attention sub-pool.
        kv_pool = getattr(kv_pool, "full_kv_pool", kv_pool)
        allocator = getattr(allocator, "full_attn_allocator", allocator)
        self.kv_mode = mode
        self.kv_seals = PageSeals(kv_pool, params.page_size)
        register_seals(kv_pool, self.kv_seals)
        self.kv_metrics = kv_checksum_metrics()
        self.kv_log = IntegrityLog(integrity_log)
        self.kv_bad_nodes: set[int] = set()
        self.kv_anchors: Counter[int] = Counter()  # lock anchors: a lock holds its node's whole root path
        self._kv_unlocked = False  # a lock went away since bad nodes were last dropped
        self.kv_admitting = None
        self.kv_load_wait = None  # the request whose admission match reached pages still being loaded
        self.kv_step_checks: StepChecks | None = None
        self.step_batch = step_batch
        self.scrub_pages_per_s = scrub_pages_per_s
        self._clock = clock
        self._scrub_last = clock()
        self._scrub_budget = 0.0
        self._scrub_next = 1  # page 0 is SGLang's padding page
        super().__init__(params)
        forget_on_free(allocator, self.kv_seals)

    def reset(self) -> None:
        super().reset()
        self.kv_seals.state.zero_()  # the pool's pages are all free again; SGLang clears its allocator without freeing
        self.kv_bad_nodes.clear()
        self.kv_anchors.clear()

    @contextmanager
    def kv_admission(self, req):
        """Marks the scheduler's admission match for `req` (see hooks.py)."""
        self.kv_admitting = req
        self.kv_load_wait = None
        try:
            yield
        finally:
            self.kv_admitting = None

    @contextmanager
    def kv_step(self, candidates: Callable[[], list]):
        """One scheduler step's admissions: `candidates()` lists the waiting queue in admission order; the pages of
        the first `step_batch` of them are checked together at the step's first admission match (step.py)."""
        self.kv_step_checks = StepChecks(self, candidates, self.step_batch)
        try:
            yield self.kv_step_checks
        finally:
            self.kv_step_checks = None

    # ---- match ----

    def _match_tree(self, params: MatchPrefixParams) -> MatchResult:
        if self.disable:
            return super()._match_tree(params)
        self._maybe_scrub()
        if self.kv_bad_nodes and self._kv_unlocked:
            self._drop_bad_nodes()  # here, before any walk: the scheduler holds no node it has not locked
        admission = params.req is not None and params.req is self.kv_admitting
        cut = self._safe_prefix(params, admission) if admission or self.kv_bad_nodes else None
        if cut is None:
            return super()._match_tree(params)
        # The cut match splits a node at the first bad page: the clean head gets a new id, the bad rest keeps its
        # id. Only then are bad nodes dropped, so the clean head stays cached.
        result = super()._match_tree(replace(params, key=self._limited(params.key, cut)))
        self._drop_bad_nodes()
        return result

    def _safe_prefix(self, params: MatchPrefixParams, admission: bool) -> int | None:
        """Key position before the first bad page of the device path `params.key` would match, or None."""
        matched, node_id, _ = self.tree_core.match_full_device_prefix(params.key)  # read-only walk
        path = [n for n in self.tree_core.collect_path_info([node_id])[0] if n.path_start < matched] if matched else []
        cut = min((n.path_start for n in path if n.node_id in self.kv_bad_nodes), default=NO_CUT)
        step = self.kv_step_checks if admission and matched else None
        agreed = step.verdict(params.req, matched) if step is not None else None
        wait = NO_CUT
        if agreed is not None:
            agreed, wait = agreed
            cut = min(cut, agreed)  # both agreed already: the bad nodes are the same on every rank
        elif admission:
            with self.kv_seals.side():
                slots = self.path_device_indices(node_id)[: min(matched, cut)]
                check = self._check(self.kv_seals.pages_of(slots), source="admission")
            if check.bad_rows:
                cut = min(cut, check.bad_rows[0] * self.page_size)
            if check.pending_rows:
                wait = check.pending_rows[0] * self.page_size
            cut, wait = unpack(self._agree_min(pack(cut, wait)))
        else:
            cut = self._agree_min(cut)
        if admission and wait < cut:
            self.kv_load_wait = params.req  # pages still being loaded (hicache.py): the request waits (hooks.py)
        if cut >= matched:
            return None
        self._condemn([n for n in path if n.path_end > cut])
        if admission and self.kv_mode == "strict":
            params.req.to_finish = FINISH_ABORT(f"KV page checksum mismatch in a cached prefix at token {cut}")
            self._log_action("aborted", at=cut, source="admission", rid=params.req.rid)
        return cut

    def _limited(self, key: RadixKey, cut: int) -> RadixKey:
        raw = cut + (1 if key.is_bigram or self.tree_core.is_eagle else 0)  # a bigram key spans one more token
        if key.limit is not None:
            raw = min(raw, key.limit)
        return RadixKey(key.token_ids, key.extra_key, is_bigram=key.is_bigram, limit=raw, cache_salt=key.cache_salt)

    # ---- insert ----

    def checkpoint_into_tree(self, req, *, up_to: int, **kwargs) -> None:
        if self.disable:
            return super().checkpoint_into_tree(req, up_to=up_to, **kwargs)
        if self.kv_bad_nodes and self._kv_unlocked:
            self._drop_bad_nodes()  # the request holds its own path locked; nothing else is pinned here
        protected = req.kv.cache_protected_len
        aligned = up_to // self.page_size * self.page_size
        limit = self._agree_min(self._insertable(req, protected, aligned))
        if limit < aligned:
            # At most what the request already holds: SGLang re-walks its own path and inserts nothing new.
            up_to = max(limit, protected)
        super().checkpoint_into_tree(req, up_to=up_to, **kwargs)
        if self.kv_host_seals is not None and self._kv_rewrites:
            self.kv_rewrite_host_copies()
        if limit < aligned:
            self._log_action("insert_truncated", at=limit, rid=req.rid)
            if self.kv_mode == "strict" and not req.finished():
                req.to_finish = FINISH_ABORT(f"KV page checksum mismatch in the request's KV at token {limit}")
                self._log_action("aborted", at=limit, source="insert", rid=req.rid)

    def _insertable(self, req, protected: int, aligned: int) -> int:
        """How much of the request's row may enter the tree: up to its first bad page, whether in the prefix it
        holds or in its own pages (both checked: it read them), or in tree pages its insert would share instead of
        its own (bad marks only: the insert would re-point the request at them; the request never read them)."""
        if aligned == 0:
            return 0
        with self.kv_seals.side():  # see PageSeals.side
            row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :aligned]
            pages = self.kv_seals.pages_of(row)
            positions = torch.arange(len(pages)) * self.page_size
            unread = torch.zeros(len(pages), dtype=torch.bool)
            key = RadixKey(req.full_untruncated_fill_ids[:aligned], req.extra_key,
                           is_bigram=self.tree_core.is_eagle, cache_salt=req.cache_salt)
            matched, node_id, _ = self.tree_core.match_full_device_prefix(key)
            if matched > protected:
                shared = self.kv_seals.pages_of(self.path_device_indices(node_id)[protected:matched])
                pages = torch.cat([pages, shared.to(pages.device)])
                positions = torch.cat([positions, protected + torch.arange(len(shared)) * self.page_size])
                unread = torch.cat([unread, torch.ones(len(shared), dtype=torch.bool)])
            check = self._check(pages, source="insert", known_only=unread.to(pages.device))
            return min((int(positions[r]) for r in check.bad_rows), default=aligned)

    def inc_lock_ref(self, node_id, skip_lock_components=()):
        result = super().inc_lock_ref(node_id, skip_lock_components)
        if not self.disable:
            self.kv_anchors[node_id] += 1
        return result

    def dec_lock_ref(self, node_id, params, skip_swa: bool = False):
        result = super().dec_lock_ref(node_id, params, skip_swa)
        if not self.disable:
            self.kv_anchors[node_id] -= 1
            if self.kv_anchors[node_id] <= 0:
                del self.kv_anchors[node_id]
                self._kv_unlocked = True
        return result

    # ---- bad nodes ----

    def _condemn(self, path_nodes) -> None:
        self.kv_bad_nodes.update(n.node_id for n in path_nodes)

    def _drop_bad_nodes(self) -> None:
        """Drop bad nodes that are unlocked device leaves without a host copy, leaves first, until none is left
        to drop; forget the ones already gone. (SGLang's drop refuses a locked node by failing, so the locks
        are looked up first.)"""
        if self.buffer_pipeline is not None:
            return  # buffer-mode HiCache pins paths outside the lock counts
        self._kv_unlocked = False
        progress = True
        while progress:
            progress = False
            locked = {n.node_id for path in self.tree_core.collect_path_info(list(self.kv_anchors)) for n in path}
            for node_id in list(self.kv_bad_nodes - locked):
                try:
                    info = self.tree_core.collect_path_info([node_id])[0][-1]
                except (KeyError, IndexError):
                    self.kv_bad_nodes.discard(node_id)
                    continue
                if (
                    info.num_children
                    or info.full_value_len is None
                    or self.tree_core.is_backuped(node_id)
                    or any(node_id in w.publish_node_ids for w in self.ongoing_write_through.values())
                    or node_id in self.ongoing_load_back
                ):
                    continue
                result = self.tree_core.drop_subtree_no_host(node_id)  # declines when anything in it is locked
                dropped = result.is_dropped
                self._apply_eviction_result(result)
                if dropped:
                    self.kv_bad_nodes.discard(node_id)
                    self._log_action("dropped", node=node_id)
                    progress = True

    # ---- scrub ----

    def _maybe_scrub(self) -> None:
        if self.scrub_pages_per_s <= 0:
            return
        now = self._clock()
        rate = self.scrub_pages_per_s
        self._scrub_budget = min(self._scrub_budget + (now - self._scrub_last) * rate, rate)
        self._scrub_last = now
        if self._scrub_budget >= 1:
            n = int(self._scrub_budget)
            self._scrub_budget -= n
            self.scrub(n)

    def scrub(self, max_pages: int) -> int:
        """Check the next `max_pages` pages of the pool round-robin (only sealed ones are compared); bad ones
        are marked, so the next admission or insert that meets them stops before them."""
        total = self.kv_seals.num_pages
        n = min(max_pages, total - 1)
        pages = (torch.arange(n) + (self._scrub_next - 1)) % (total - 1) + 1
        self._scrub_next = int(pages[-1]) % (total - 1) + 1 if n else self._scrub_next
        sealed = self.kv_seals.sealed[pages.to(self.kv_seals.device)]
        self._check(pages, source="scrub", known_only=~sealed, seal_missing=False)
        return n

    # ---- helpers ----

    def _check(self, pages: torch.Tensor, source: str, known_only=None, seal_missing: bool = True) -> Check:
        t0 = time.perf_counter()
        check = self.kv_seals.check(pages, known_only=known_only, seal_missing=seal_missing)
        if self.kv_host_seals is not None:
            self.kv_loaded_pages_checked(pages, check, known_only)
        m = self.kv_metrics
        m.verifications.labels(source=source).inc()
        m.pages_verified.inc(check.compared)
        m.pages_checksummed.inc(check.late + check.filled)
        if check.new_rows:
            m.mismatches.labels(source=source).inc(len(check.new_rows))
            for page, layer, part in check.mismatched[:MAX_LOGGED_PAGES]:
                when = "before it filled" if part == "rows" else "after its seal"
                logger.error("KV checksum mismatch: layer %s (%s) page %d, damaged %s, found at %s", layer, part, page,
                             when, source)
                self.kv_log.write("kv_checksum_mismatch", layer, page, {"part": part, "source": source})
        for page, record in check.seal_damaged[:MAX_LOGGED_PAGES]:
            m.record_damage.labels(record=record).inc()
            logger.warning("KV checksum %s record of page %d damaged (the page's bytes match its other record): "
                           "%s", record, page, "repaired" if record == "seal" else "dropped, page seal kept")
            self.kv_log.write("kv_checksum_record_damage", None, page, {"record": record, "source": source})
        for page, byte, kept in check.flag_damaged[:MAX_LOGGED_PAGES]:
            m.flag_damage.inc()
            logger.error("KV checksum state byte of page %d damaged (0x%02x is no state): page %s", page, byte,
                         "matches both records, kept" if kept else "dropped")
            self.kv_log.write("kv_checksum_flag_damage", None, page, {"byte": byte, "kept": kept, "source": source})
        m.seconds.inc(time.perf_counter() - t0)
        return check

    def _agree_min(self, value: int) -> int:
        """The smallest value over the ranks that share this tree (one collective; nothing with one rank)."""
        if self.tp_world_size <= 1 and self.pp_size <= 1:
            return value
        t = torch.tensor(value, dtype=torch.int64, device="cpu")
        self._all_reduce(t, torch.distributed.ReduceOp.MIN)
        return int(t.item())

    def _agree_all(self, values: list[int]) -> list[int]:
        """Each value's minimum over the ranks, in one collective for the whole vector."""
        if (self.tp_world_size <= 1 and self.pp_size <= 1) or not values:
            return values
        t = torch.tensor(values, dtype=torch.int64, device="cpu")
        self._all_reduce(t, torch.distributed.ReduceOp.MIN)
        return t.tolist()

    def _log_action(self, action: str, **detail) -> None:
        self.kv_log.write("kv_checksum_action", None, None, {"action": action, "mode": self.kv_mode, **detail})
