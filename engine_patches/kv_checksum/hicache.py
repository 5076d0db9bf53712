"""HiCache with KV page checksums: the seals travel with pages offloaded to the host pool, and a loaded copy is
checked against them before any forward reads it.

- Offload (device -> host): the node's device pages are checked first; a bad page refuses the backup (SGLang then
  keeps the node device-only, or drops it under write-back). Otherwise the pages' seals are copied to the host
  page ids the controller allocated. The copy itself runs later; whatever changes the bytes before or during it
  is caught after the load, because the seals are the ones taken when the pages were filled.
- Load (host -> device), in an admission step (the default): load first, check the bytes the forward will read,
  on the device. The load is committed as SGLang commits it, with no CPU work on the host copy (only its known-bad
  flags are looked up), its copy started at once (`start_loading`; SGLang starts loads only with a batch that
  consumes them), and the new device pages carry the host copy's seals, PENDING until the load is acknowledged.
  The loading request is deferred (`init_load_back` returns None: SGLang's retry, the request stays queued), and
  no admission is made over PENDING pages (hooks.install_load_wait): every request whose match reaches them waits.
  At the next admission after the acknowledgement the pages are LATE and the step's batched admission check
  (step.py) compares them with their seals on the device, like any cached page: damage to the host copy before or
  during its copy, or in transfer, is found there; the match is cut before it, the request recomputes from there,
  and the host copy it came from is marked bad (refused at its next load, then rewritten, as below). If SGLang's
  three load slots are busy, the load is not committed and the request retries at a later step; if the loaded
  node is evicted before the request's next admission (its match just touched it: it is among the last), the
  request loads it again. Window: none of its own; what is compared is the device bytes after they arrived, so
  what remains is the device window every cached page has, between an admission check and the forward.
  Cost: no host checksum on the scheduler thread; the loading request waits for its whole load plus one step (no
  layer-wise overlap for it); the loaded pages join that step's one device check.
- Load outside an admission step (a PD decode server restoring a retracted request: no step to retry in), or with
  CAPBENCH_KV_HOST_CHECK_INLINE=1, or for trees with state components beside the KV (mamba, SWA: their load binds
  request state): the host pages are checksummed on the CPU in the device's word order and compared with the
  carried seals before the copy is queued, in the same call, on the scheduler thread (~1 GB/s). Window: damage
  to the host copy between that check and the copy (started later in the same step) reaches the loading
  request's forward; the page keeps its original seal, so its insert and the next admission find it.
- A refused load: SGLang's admission recomputes those tokens; the bad host copy is never loaded. Once the
  recomputed KV is back in the tree (the insert gives the host-only node a device copy again), it is written over
  the bad host copy, with its seals, by the host pool's own device-to-host copy.

Not covered: storage backends (L3), refused at construction; host layouts other than layer_first, page_first and
page_first_direct; HND device pools and FP4 scale buffers (the host pool does not mirror them).
"""

from __future__ import annotations

import logging
import os
import time

import torch

from engine_patches.kv_checksum.checksum import mix64, position_keys

HOST_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
# Opt-in until a lent GPU has timed and checked it (`capbench gpu-check`): the host-copy check as a GPU kernel that
# reads SGLang's registered host pool over PCIe, instead of torch on the scheduler's CPU thread.
HOST_CHECK_ON_GPU = "CAPBENCH_KV_HOST_CHECK_ON_GPU"
# 1: every load's host copy checksummed on the CPU before its copy is queued (the old path, for comparison)
HOST_CHECK_INLINE = "CAPBENCH_KV_HOST_CHECK_INLINE"
logger = logging.getLogger(__name__)


class HostSeals:
    """Seals of the host pool's pages, kept in host memory, and the CPU checksum of host pages."""

    def __init__(self, host_pool, device_buffers: list[torch.Tensor], page_size: int):
        self.page_size = page_size
        self.views, self.page_major = host_buffers(host_pool)
        if len(self.views) != len(device_buffers):
            raise ValueError(f"the host pool mirrors {len(self.views)} KV buffers of the device's "
                             f"{len(device_buffers)} (FP4 scales and layer-sharded pools do not travel to host)")
        for view, dev in zip(self.views, device_buffers, strict=True):
            host_row = view[0, 0] if self.page_major else view[0]
            if host_row.numel() * host_row.element_size() != dev[0].numel() * dev.element_size():
                raise ValueError("host and device KV rows differ in size; checksums cannot follow pages to host")
        pages = host_pool.size // page_size + 1
        self.sums = torch.zeros((pages, len(self.views)), dtype=torch.int64)
        self.sealed = torch.zeros(pages, dtype=torch.bool)
        self.bad = torch.zeros(pages, dtype=torch.bool)

    @classmethod
    def of_views(cls, views: list[torch.Tensor], page_size: int) -> HostSeals:
        """Host seals over bare layer-first [slots, ...] host buffers (the GPU check's load-back rows)."""
        seals = cls.__new__(cls)
        seals.page_size, seals.views, seals.page_major = page_size, views, False
        pages = views[0].shape[0] // page_size
        seals.sums = torch.zeros((pages, len(views)), dtype=torch.int64)
        seals.sealed = torch.zeros(pages, dtype=torch.bool)
        seals.bad = torch.zeros(pages, dtype=torch.bool)
        return seals

    def pages_of(self, host_indices: torch.Tensor) -> torch.Tensor:
        slots = host_indices.cpu().to(torch.int64).view(-1, self.page_size)
        first = slots[:, 0]
        aligned = (first % self.page_size == 0) & (slots == first[:, None] + torch.arange(self.page_size)).all(dim=1)
        if not bool(aligned.all()):
            raise ValueError("host slots are not whole aligned pages")
        return first // self.page_size

    def carry(self, host_pages: torch.Tensor, sums: torch.Tensor) -> None:
        self.sums[host_pages] = sums
        self.sealed[host_pages] = True
        self.bad[host_pages] = False

    def forget(self, host_indices: torch.Tensor) -> None:
        pages = host_indices.cpu().to(torch.int64)[:: self.page_size] // self.page_size
        self.sealed[pages] = False
        self.bad[pages] = False

    def read_on_gpu(self, device: torch.device) -> bool:
        """Checksum host pages with the GPU kernel from now on, reading the host buffers through their own pointers
        (CUDA-registered host memory is device-accessible at the same address where the GPU supports it). Only for
        contiguous layer-first views; checked once against the CPU reference, else it stays on the CPU."""
        from engine_patches.kv_checksum.kernel import PageChecksummer

        if self.page_major or not all(v.is_contiguous() for v in self.views):
            return False
        reader = PageChecksummer(self.views, self.page_size, device=device)
        probe = torch.tensor([0])
        if not torch.equal(reader.partials(probe).cpu(), self._partials_cpu(probe)):
            logger.warning("KV checksums: the GPU could not read the host pool through its pointers; the host-copy "
                           "check stays on the CPU")
            return False
        self._reader = reader
        return True

    def partials(self, host_pages: torch.Tensor) -> torch.Tensor:
        """Per-buffer sums [pages, buffers] of host pages, read in the device's word order."""
        reader = getattr(self, "_reader", None)
        if reader is not None:
            return reader.partials(host_pages).cpu()
        return self._partials_cpu(host_pages)

    def _partials_cpu(self, host_pages: torch.Tensor) -> torch.Tensor:
        out = torch.empty((len(host_pages), len(self.views)), dtype=torch.int64)
        slots = (host_pages[:, None] * self.page_size + torch.arange(self.page_size)).flatten()
        for b, view in enumerate(self.views):
            rows = view.index_select(0, host_pages if self.page_major else slots).contiguous()
            words = rows.view(torch.uint8).view(torch.int64).view(len(host_pages), -1)
            out[:, b] = mix64(words ^ position_keys(b, words.shape[1], "cpu")).sum(dim=1)
        return out

    def bad_pages(self, host_pages: torch.Tensor) -> tuple[list[int], list[int]]:
        """Rows of `host_pages` that are unsealed, known bad, or differ from their seals; and the rows found bad
        by this check."""
        known = self.bad[host_pages] | ~self.sealed[host_pages]
        new = (self.partials(host_pages) != self.sums[host_pages]).any(dim=1) & ~known
        self.bad[host_pages] |= new
        return (known | new).nonzero().flatten().tolist(), new.nonzero().flatten().tolist()


def host_buffers(host_pool) -> tuple[list[torch.Tensor], bool]:
    """The host pool's buffers in the device's checksum order, as [slots, ...] views, or [pages, page_size, ...]
    views for the page-major direct layout (second value True)."""
    layout = host_pool.layout
    if layout not in HOST_LAYOUTS:
        raise ValueError(f"KV checksums cannot follow pages to the {layout!r} HiCache host layout")
    if hasattr(host_pool, "k_buffer"):
        parts = [host_pool.k_buffer, host_pool.v_buffer]
    else:
        parts = [host_pool.kv_buffer]
    views = [part[layer] if layout == "layer_first" else part[:, layer]
             for part in parts for layer in range(host_pool.layer_num)]
    return views, layout == "page_first_direct"


class HiCacheChecksums:
    """Mixin for the checksummed UnifiedRadixCache: its HiCache entry points."""

    kv_host_seals: HostSeals | None = None

    def init_hicache(self, server_args, params) -> None:
        super().init_hicache(server_args, params)
        if self.cache_controller is None:
            return
        if self.enable_storage or getattr(self.cache_controller, "storage_backend", None) is not None:
            raise ValueError("KV checksums do not travel to HiCache storage backends; drop "
                             "--hicache-storage-backend or --kv-checksum")
        if getattr(self.token_to_kv_pool_allocator.get_kvcache(), "kv_cache_layout", "nhd") != "nhd":
            raise ValueError("KV checksums follow pages to HiCache host memory for NHD pools only")
        host_pool = self.cache_controller.mem_pool_host.anchor_entry.host_pool
        self.kv_host_seals = HostSeals(host_pool, self.kv_seals.buffers, self.page_size)
        if os.environ.get(HOST_CHECK_ON_GPU) == "1" and self.kv_seals.device.type == "cuda":
            self.kv_host_seals.read_on_gpu(self.kv_seals.device)
        # load first, check on the device (module docstring); inline for trees whose loads bind request state
        self.kv_check_loads_on_device = os.environ.get(HOST_CHECK_INLINE) != "1" and len(self._components_tuple) == 1
        self._kv_load_deferred = self._kv_load_started = self._kv_loaded_any = False
        self._kv_loading: dict[int, torch.Tensor] = {}  # load ack node id -> device pages in flight
        self._kv_rewrites: dict[int, tuple[torch.Tensor, int, int]] = {}  # node -> bad host copy (indices, span)
        # device page -> host page it was loaded from, until the page's first check after its load arrived (-1)
        seals = self.kv_seals
        self.kv_loaded_from = torch.full((seals.num_pages,), -1, dtype=torch.int64, device=seals.device)
        seals_forget = seals.forget

        def forget_device_pages(pages: torch.Tensor) -> None:
            self.kv_loaded_from[pages.to(seals.device)] = -1
            seals_forget(pages)

        seals.forget = forget_device_pages  # what the allocator's free hook (seals.forget_on_free) calls
        free, load = host_pool.free, self.cache_controller.load

        def free_and_forget(indices: torch.Tensor) -> int:
            self.kv_host_seals.forget(indices)
            freed_cpu = indices.cpu().to(torch.int64)
            freed = set(freed_cpu.tolist())
            if self._kv_loaded_any:
                host_pages = (freed_cpu[:: self.page_size] // self.page_size).to(seals.device)
                gone = torch.isin(self.kv_loaded_from, host_pages)
                self.kv_loaded_from.masked_fill_(gone, -1)
            for node_id, (host, _, _) in list(self._kv_rewrites.items()):
                if freed.intersection(host.tolist()):
                    del self._kv_rewrites[node_id]  # the bad host copy is gone: nothing to rewrite
            return free(indices)

        def checked_load(host_indices: torch.Tensor, *args, node_id: int = -1, **kwargs):
            on_device = bool(host_indices.numel()) and self.kv_check_loads_on_device and \
                self.kv_step_checks is not None
            if on_device and not self.has_free_load_back_slot():  # the same on every rank (acks reaped in lockstep)
                self._kv_load_deferred = True  # nothing committed; the request asks again at a later step
                return None
            if host_indices.numel() and not self._host_copy_clean(host_indices, node_id, checksum=not on_device):
                return None
            device_indices = load(host_indices, *args, node_id=node_id, **kwargs)
            if device_indices is not None and host_indices.numel():
                self._seal_loading(host_indices, device_indices, node_id)
                self._kv_load_started = on_device
            return device_indices

        host_pool.free = free_and_forget
        self.cache_controller.load = checked_load

    def reset(self) -> None:
        super().reset()
        if self.kv_host_seals is not None:
            self.kv_host_seals.sealed.zero_()
            self.kv_host_seals.bad.zero_()
            self.kv_loaded_from.fill_(-1)
            self._kv_loading.clear()
            self._kv_rewrites.clear()

    def _execute_kv_backup(self, node_id, device_value, comp_xfers, sidecar_xfers):
        if self.kv_host_seals is None or device_value.numel() == 0:
            return super()._execute_kv_backup(node_id, device_value, comp_xfers, sidecar_xfers)
        with self.kv_seals.side():  # see PageSeals.side
            pages = self.kv_seals.pages_of(device_value)
            check = self._check(pages, source="offload")
            sums = self.kv_seals.sums[pages].cpu()
        if self._agree_min(0 if check.bad_rows else 1) == 0:
            self.kv_bad_nodes.add(node_id)  # dropped later: this runs inside an insert or match walk
            self._log_action("offload_refused", node=node_id)
            return None
        host_indices = super()._execute_kv_backup(node_id, device_value, comp_xfers, sidecar_xfers)
        if host_indices is not None:
            self.kv_host_seals.carry(self.kv_host_seals.pages_of(host_indices), sums)
        return host_indices

    def init_load_back(self, params):
        """SGLang's load-back. In an admission step with the device check on, a committed load is started here and
        the request deferred (None: SGLang's retry, the request stays queued) until the load has arrived and its
        pages are checked at the request's next admission; None too while SGLang's load slots are all busy."""
        self._kv_load_deferred = self._kv_load_started = False
        result = super().init_load_back(params)
        if self._kv_load_started:
            self._kv_load_started = False
            self.cache_controller.start_loading()  # no batch consumes this load: nothing else would start it
            return None
        return None if self._kv_load_deferred else result

    def _host_copy_clean(self, host_indices: torch.Tensor, node_id: int, checksum: bool) -> bool:
        """Whether the host copy may be loaded: no page known bad or unsealed and, with `checksum` (the inline
        path), none that differs from its seal now (checksummed here, on the scheduler thread). Agreed by ranks."""
        hs = self.kv_host_seals
        host_pages = hs.pages_of(host_indices)
        if checksum:
            t0 = time.perf_counter()
            bad, new = hs.bad_pages(host_pages)
            m = self.kv_metrics
            m.seconds.inc(time.perf_counter() - t0)
            m.verifications.labels(source="load").inc()
            m.pages_verified.inc(len(host_pages))
            if new:
                m.mismatches.labels(source="load").inc(len(new))
            for row in new[:64]:
                self.kv_log.write("kv_checksum_mismatch", None, int(host_pages[row]), {"part": "host",
                                                                                       "source": "load"})
        else:
            bad = (hs.bad[host_pages] | ~hs.sealed[host_pages]).nonzero().flatten().tolist()
        if self._agree_min(0 if bad else 1) == 1:
            return True
        self._log_action("load_refused", node=node_id, host_pages=len(bad))
        path = self.tree_core.collect_path_info([node_id])[0]
        host_only = [n for n in path if n.full_value_len is None]
        if host_only and host_only[-1].node_id == node_id:
            start, end = host_only[0].path_start, host_only[-1].path_end
            if end - start == len(host_indices):
                self._kv_rewrites[node_id] = (host_indices.cpu().clone(), start, end)
        return False

    def kv_loaded_pages_checked(self, pages: torch.Tensor, check, known_only: torch.Tensor | None) -> None:
        """After a device check of `pages`: a loaded page found bad marks the host copy it came from bad (refused
        at its next load, then rewritten); a loaded page that has had its check is no longer tracked."""
        if not self._kv_loaded_any:
            return
        dev = self.kv_loaded_from.device
        if check.new_rows:
            host = self.kv_loaded_from[pages[check.new_rows].to(dev)]
            host = host[host >= 0].cpu()
            if len(host):
                self.kv_host_seals.bad[host] = True
                self._log_action("loaded_copy_bad", host_pages=len(host))
        keep = torch.zeros(len(pages), dtype=torch.bool, device=dev)  # not compared: still tracked
        if check.pending_rows:
            keep[torch.tensor(check.pending_rows, device=dev)] = True
        if known_only is not None:
            keep |= known_only.to(dev)
        idx = pages.to(dev)
        self.kv_loaded_from[idx] = torch.where(keep, self.kv_loaded_from[idx], -1)  # no masked indexing: no sync

    def kv_rewrite_host_copies(self) -> None:
        """Write recomputed KV over host copies that failed their check, once it is back on the device."""
        for node_id, (host, start, end) in list(self._kv_rewrites.items()):
            try:
                path = self.tree_core.collect_path_info([node_id])[0]
            except KeyError:
                del self._kv_rewrites[node_id]
                continue
            if not path or path[-1].path_end != end or any(n.full_value_len is None for n in path):
                continue  # not (wholly) back on the device yet
            device = self.path_device_indices(node_id)[start:end]
            pages = self.kv_seals.pages_of(device)
            if self._agree_min(0 if self._check(pages, source="offload").bad_rows else 1) == 0:
                continue
            cc = self.cache_controller
            entry = cc.mem_pool_host.anchor_entry
            host_idx, device_idx = cc.move_indices(host.to(device.device) if cc.io_backend == "kernel" else host,
                                                   device)
            entry.host_pool.backup_from_device_all_layer(entry.device_pool, host_idx, device_idx, cc.io_backend)
            if device.is_cuda:
                torch.cuda.current_stream().synchronize()  # the bytes are on host before anything can load them
            self.kv_host_seals.carry(self.kv_host_seals.pages_of(host), self.kv_seals.sums[pages].cpu())
            del self._kv_rewrites[node_id]
            self.kv_bad_nodes.difference_update(n.node_id for n in path if n.path_start >= start)  # checked clean
            self._log_action("host_copy_rewritten", node=node_id)

    def _seal_loading(self, host_indices: torch.Tensor, device_indices: torch.Tensor, node_id: int) -> None:
        # The nodes being loaded get new device pages, from a host copy that just passed its check: whatever was
        # found bad in their old device pages is gone.
        for n in self.tree_core.collect_path_info([node_id])[0]:
            if n.full_value_len is None:
                self.kv_bad_nodes.discard(n.node_id)
        seals = self.kv_seals
        pages = seals.pages_of(device_indices)
        sums = self.kv_host_seals.sums[self.kv_host_seals.pages_of(host_indices)].to(seals.device)
        seals.carry(pages, sums)  # bytes still in flight: not compared until the load is acknowledged
        self.kv_loaded_from[pages] = self.kv_host_seals.pages_of(host_indices).to(seals.device)
        self._kv_loaded_any = True
        self._kv_loading[node_id] = pages

    def loading_check(self, finish_count=None) -> None:
        before = set(self.ongoing_load_back)
        super().loading_check(finish_count)
        for node_id in before - set(self.ongoing_load_back):
            pages = self._kv_loading.pop(node_id, None)
            if pages is not None:
                self.kv_seals.arrived(pages)
