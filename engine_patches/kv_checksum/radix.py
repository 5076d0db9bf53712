"""SGLang's RadixCache with KV page checksums: seal on insert, verify before reuse, evict on mismatch.

Covered paths (SGLang 0.5.23, plain RadixCache selected through --radix-cache-backend):
- Seal: `insert`. In 0.5.23 the old cache_finished_req / cache_unfinished_req became `checkpoint(req, up_to)`
  (called by `release_kv_cache` for finished requests and by chunked prefill for unfinished ones), which calls
  `_insert_cache` -> `insert`; every page that enters the tree gets its per-layer checksums there, once.
- Verify: `match_prefix`, the only way cached pages reach a new request (`match_kv_cache`). All the pages of the
  matched path are checked in one batch (one kernel launch on a GPU, one host sync) before the match is returned.
- On a mismatch the first bad node and its descendants leave the tree (freed now, or quarantined until their
  running readers let go), the match is cut before it so the request recomputes those tokens, the event is
  counted and logged per (layer, page); `strict` mode aborts the request instead of recomputing.
- Scrub: when `scrub_pages_per_s` > 0, idle (unlocked) cached pages are re-verified round-robin at that rate.
  It runs on the scheduler thread at the start of `match_prefix`, so it needs no lock and advances while requests
  arrive (an idle server hands out nothing, and a page is verified again before it is handed out anyway).

Overlap scheduling: the scheduler runs ahead of the GPU, so a chunked-prefill checkpoint may seal pages the
forward in flight is still writing. The factory passes the model runner's forward stream: seals run there (ordered
after the writes) and record an event; a verification waits only on seals that have not completed. (On CPU, as in
the tests, there are no streams; this ordering is not exercised without a GPU.)

Because checksums are taken over the pool's bytes when a page is sealed and when it is reused, they do not
depend on how the KV was written: Python `set_kv_buffer`, fused FA3 / trtllm writers and CUDA-graph replays are
all covered alike. Not covered: corruption of a page while a request that already holds it is running (its
readers are not re-checked), the match inside `checkpoint` (it re-points a request at pages it just inserted),
the debug insert path without values, HiCache host tiers and the UnifiedRadixCache (SGLang's default tree, which
this backend replaces), and KV written after sealing by speculative decoding into tree pages (none known).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, InsertResult, MatchPrefixParams, MatchResult
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixCache, TreeNode

from engine_patches.kv_checksum.checksum import page_partials_reference, pool_buffers
from engine_patches.kv_checksum.events import IntegrityLog
from engine_patches.kv_checksum.metrics import kv_checksum_metrics

logger = logging.getLogger(__name__)

MODES = ("off", "verify", "strict")
MAX_LOGGED_PAGES = 64  # per mismatch: a wholesale overwrite should not flood the log


class _Quarantined:
    """Dict key that parks a corrupt node still locked by running requests: no match or insert can reach it,
    and normal LRU eviction frees it once its readers let go."""

    __slots__ = ("node_id",)

    def __init__(self, node_id: int):
        self.node_id = node_id


def make_page_checksummer(kv_pool, page_size: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """pages -> per-buffer checksums [pages, buffers]: the Triton kernel on a GPU, the torch reference on CPU."""
    buffers = pool_buffers(kv_pool)
    if buffers[0].is_cuda:
        from engine_patches.kv_checksum.kernel import PageChecksummer

        return PageChecksummer(buffers, page_size).partials
    return lambda pages: page_partials_reference(buffers, pages, page_size)


def buffer_layers(kv_pool) -> list[tuple[int, str]]:
    """(layer id, part) of each buffer in checksum order."""
    start = getattr(kv_pool, "start_layer", 0) or 0
    n = len(pool_buffers(kv_pool))
    if hasattr(kv_pool, "kv_buffer"):
        return [(start + i, "kv") for i in range(n)]
    half = n // 2
    return [(start + i % half, "k" if i < half else "v") for i in range(n)]


class ChecksummedRadixCache(RadixCache):
    def __init__(
        self,
        params: CacheInitParams,
        mode: str = "verify",
        scrub_pages_per_s: float = 0.0,
        integrity_log: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        seal_stream: torch.cuda.Stream | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"kv checksum mode must be one of {MODES}, got {mode!r}")
        super().__init__(params)
        pool = params.token_to_kv_pool_allocator.get_kvcache()
        self.kv_mode = mode
        self.kv_partials = make_page_checksummer(pool, self.page_size)
        self.kv_layers = buffer_layers(pool)
        self.kv_metrics = kv_checksum_metrics()
        self.kv_log = IntegrityLog(integrity_log)
        self.scrub_pages_per_s = scrub_pages_per_s
        self._clock = clock
        self._scrub_last = clock()
        self._scrub_budget = 0.0
        self._in_checkpoint = False
        # With overlap scheduling the scheduler runs ahead of the GPU: a chunked-prefill checkpoint can seal pages
        # that the forward in flight is still writing. Sealing on the forward stream orders the checksum after
        # those writes; verification waits only for seals that have not run yet.
        self.seal_stream = seal_stream

    def reset(self):
        super().reset()
        self._scrub_queue: list[TreeNode] = []

    # ---- seal ----

    def insert(self, params: InsertParams) -> InsertResult:
        result = super().insert(params)
        node = result.last_device_node
        if (
            self.kv_mode != "off"
            and params.value is not None
            and node is not None
            and node is not self.root_node
            and getattr(node, "kv_sums", None) is None
        ):
            # Only the new leaf can be unsealed: split nodes inherit their slice of the sums.
            self._seal(node)
        return result

    def _seal(self, node: TreeNode) -> None:
        t0 = time.perf_counter()
        pages = self._pages(node)
        if self.seal_stream is None:
            node.kv_sums = self.kv_partials(pages)
        else:
            here = torch.cuda.current_stream()
            self.seal_stream.wait_stream(here)  # `pages` was computed here
            with torch.cuda.stream(self.seal_stream):
                node.kv_sums = self.kv_partials(pages)
                node.kv_sealed = torch.cuda.Event()
                node.kv_sealed.record(self.seal_stream)
            pages.record_stream(self.seal_stream)
            node.kv_sums.record_stream(here)  # read here later, by _verify
        self.kv_metrics.pages_checksummed.inc(len(pages))
        self.kv_metrics.seconds.inc(time.perf_counter() - t0)

    def _split_node(self, key, child: TreeNode, split_len: int) -> TreeNode:
        sums = getattr(child, "kv_sums", None)
        new_node = super()._split_node(key, child, split_len)
        if sums is not None:
            k = split_len // self.page_size
            new_node.kv_sums, child.kv_sums = sums[:k], sums[k:]
            new_node.kv_sealed = getattr(child, "kv_sealed", None)
        return new_node

    def checkpoint(self, req, *, up_to: int):
        # The match inside checkpoint re-points the request at pages it has just inserted: not a reuse.
        self._in_checkpoint = True
        try:
            super().checkpoint(req, up_to=up_to)
        finally:
            self._in_checkpoint = False

    # ---- verify ----

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        if self.kv_mode == "off" or self._in_checkpoint:
            return super().match_prefix(params)
        self._maybe_scrub()
        result = super().match_prefix(params)
        if result.device_prefix_len == 0:
            return result
        path = self._path(result.last_device_node)
        bad = self._verify(path, source="match")
        if not bad:
            return result
        first = bad[0]
        kept = path[: path.index(first)]
        parent = first.parent
        action = self._drop(first)
        req = params.req
        if self.kv_mode == "strict" and req is not None:
            req.set_finish_with_abort(f"KV page checksum mismatch in a cached prefix (node {first.id}, {action})")
            action += "+aborted"
        self.kv_log.write("kv_checksum_action", None, None, {"node": first.id, "action": action, "mode": self.kv_mode})
        return result._replace(
            device_prefix_len=sum(len(n.value) for n in kept),
            last_device_node=parent,
            last_host_node=parent,
            best_match_node=parent,
        )

    def _pages(self, node: TreeNode) -> torch.Tensor:
        return node.value[:: self.page_size] // self.page_size

    def _path(self, node: TreeNode) -> list[TreeNode]:
        path = []
        while node is not self.root_node:
            path.append(node)
            node = node.parent
        path.reverse()
        return path

    def _verify(self, nodes: list[TreeNode], source: str) -> list[TreeNode]:
        """Check all pages of `nodes` in one batch; return the nodes holding a bad page, in order."""
        sealed = [n for n in nodes if getattr(n, "kv_sums", None) is not None]
        if not sealed:
            return []
        t0 = time.perf_counter()
        for n in sealed:
            event = getattr(n, "kv_sealed", None)
            if event is not None and not event.query():
                torch.cuda.current_stream().wait_event(event)
        pages = torch.cat([self._pages(n) for n in sealed])
        expected = torch.cat([n.kv_sums for n in sealed])
        diff = self.kv_partials(pages) != expected
        bad_rows = diff.any(dim=1).nonzero().flatten().tolist()  # the one host sync
        self.kv_metrics.pages_verified.inc(len(pages))
        self.kv_metrics.seconds.inc(time.perf_counter() - t0)
        if not bad_rows:
            return []
        self.kv_metrics.mismatches.labels(source=source).inc(len(bad_rows))
        owner = torch.repeat_interleave(torch.arange(len(sealed)), torch.tensor([len(n.kv_sums) for n in sealed]))
        page_list = pages.tolist()
        for row in bad_rows[:MAX_LOGGED_PAGES]:
            node = sealed[int(owner[row])]
            for b in diff[row].nonzero().flatten().tolist():
                layer, part = self.kv_layers[b]
                logger.error(
                    "KV checksum mismatch: layer %d (%s) page %d, node %d", layer, part, page_list[row], node.id
                )
                self.kv_log.write(
                    "kv_checksum_mismatch", layer, page_list[row], {"part": part, "node": node.id, "source": source}
                )
        bad_nodes = []
        for row in bad_rows:
            node = sealed[int(owner[row])]
            if not bad_nodes or bad_nodes[-1] is not node:
                bad_nodes.append(node)
        return bad_nodes

    # ---- evict ----

    def _drop(self, node: TreeNode) -> str:
        """Take `node` and its descendants out of the tree so no request is handed their pages again."""
        subtree, stack = [], [node]
        while stack:
            n = stack.pop()
            subtree.append(n)
            n.kv_dropped = True
            stack.extend(n.children.values())
        if node.lock_ref == 0:  # locks reach every ancestor, so the whole subtree is idle
            for n in reversed(subtree):  # leaves first
                self.token_to_kv_pool_allocator.free_segment(n.value, start_pos=0)
                self._delete_leaf(n)
                self.kv_events.record_remove(n)
            return "evicted"
        key = node.key.child_key(self.page_size)
        node.kv_quarantine_key = _Quarantined(node.id)
        node.parent.children[node.kv_quarantine_key] = node.parent.children.pop(key)
        return "quarantined"

    def _delete_leaf(self, node: TreeNode):
        qkey = getattr(node, "kv_quarantine_key", None)
        if qkey is None:
            return super()._delete_leaf(node)
        node.parent.children.pop(qkey)
        self.evictable_size_ -= len(node.key)
        self.evictable_leaves.discard(node)
        self._update_leaf_status(node.parent)

    # ---- scrub ----

    def _maybe_scrub(self) -> None:
        if self.scrub_pages_per_s <= 0:
            return
        now = self._clock()
        rate = self.scrub_pages_per_s
        self._scrub_budget = min(self._scrub_budget + (now - self._scrub_last) * rate, rate)
        self._scrub_last = now
        if self._scrub_budget >= 1:
            self._scrub_budget -= self.scrub(int(self._scrub_budget))

    def scrub(self, max_pages: int) -> int:
        """Re-verify up to about `max_pages` idle cached pages, round-robin; returns the pages checked."""
        nodes, pages, refilled = [], 0, False
        while pages < max_pages:
            if not self._scrub_queue:
                if refilled:
                    break
                self._scrub_queue, refilled = self._idle_sealed_nodes(), True
                continue
            n = self._scrub_queue.pop()
            if n.lock_ref == 0 and not getattr(n, "kv_dropped", False) and self._in_tree(n):
                nodes.append(n)
                pages += len(n.kv_sums)
        for node in self._verify(nodes, source="scrub"):
            if not getattr(node, "kv_dropped", False):
                action = self._drop(node)
                detail = {"node": node.id, "action": action, "mode": "scrub"}
                self.kv_log.write("kv_checksum_action", None, None, detail)
        return pages

    def _idle_sealed_nodes(self) -> list[TreeNode]:
        out, stack = [], list(self.root_node.children.values())
        while stack:
            n = stack.pop()
            if n.lock_ref == 0 and getattr(n, "kv_sums", None) is not None:
                out.append(n)
            stack.extend(n.children.values())
        return out

    def _in_tree(self, node: TreeNode) -> bool:
        parent = node.parent
        return parent is not None and parent.children.get(node.key.child_key(self.page_size)) is node
