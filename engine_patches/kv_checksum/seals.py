"""The seal table of one KV pool: for every page, the per-buffer checksums taken when the page was sealed, whether
it is sealed, and whether it has been found bad.

A page is sealed when it becomes full (`seal_filled`, after each forward) and never changes until it is freed,
so checking it later against its seal finds any damage in between. Pages that reach a check without a seal
(written by a path the fill hook does not see: a retraction restore, a disaggregated transfer) are sealed there,
trusting their bytes as they are then ("late" seals). Freeing a page forgets its seal and its bad mark
(`forget_on_free`), so a recycled page never carries a stale seal into a false positive.

All state lives on the pool's device. Sealing never reads anything back to the host; a check reads back one
small flag tensor (one host sync) per batch of pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_patches.kv_checksum.checksum import buffer_layers, page_partials_reference, paged_words, pool_buffers


@dataclass
class Check:
    """The outcome of checking a batch of pages: row positions (into the checked page list) that are bad."""

    bad_rows: list[int]  # found bad now or before, in order
    new_rows: list[int]  # found bad by this check
    compared: int  # pages compared against a seal
    late: int  # pages sealed here because they had no seal yet
    mismatched: list[tuple[int, int, str]]  # (page, layer, part) of each newly bad buffer page, for the log


class PageSeals:
    def __init__(self, kv_pool, page_size: int):
        self._init(pool_buffers(kv_pool), buffer_layers(kv_pool), page_size)

    @classmethod
    def of_buffers(cls, buffers: list[torch.Tensor], page_size: int) -> PageSeals:
        """A seal table over bare [slots, ...] buffers (the GPU check's pools, shaped like SGLang's)."""
        seals = cls.__new__(cls)
        seals._init(buffers, [(i, "kv") for i in range(len(buffers))], page_size)
        return seals

    def _init(self, buffers: list[torch.Tensor], layers: list[tuple[int, str]], page_size: int) -> None:
        self.buffers, self.layers = buffers, layers
        for b in self.buffers:
            paged_words(b, page_size)  # refuse pages that are not whole 64-bit words now, not at the first seal
        self.page_size = page_size
        self.num_pages = self.buffers[0].shape[0] // page_size
        self.device = self.buffers[0].device
        shape = (self.num_pages, len(self.buffers))
        self.sums = torch.zeros(shape, dtype=torch.int64, device=self.device)
        self.sealed = torch.zeros(self.num_pages, dtype=torch.bool, device=self.device)
        self.bad = torch.zeros(self.num_pages, dtype=torch.bool, device=self.device)
        self.pending = torch.zeros(self.num_pages, dtype=torch.bool, device=self.device)  # sealed, bytes in flight
        self._filled = torch.zeros((), dtype=torch.int64, device=self.device)  # fill seals not yet counted
        self._kernel = None
        if self.device.type == "cuda":
            from engine_patches.kv_checksum.kernel import PageChecksummer

            self._kernel = PageChecksummer(self.buffers, page_size)

    def partials(self, pages: torch.Tensor) -> torch.Tensor:
        """Current per-buffer sums [pages, buffers] of the given page ids."""
        if self._kernel is not None:
            return self._kernel.partials(pages)
        return page_partials_reference(self.buffers, pages, self.page_size)

    def pages_of(self, slots: torch.Tensor) -> torch.Tensor:
        """Page ids of page-aligned slot runs (tree values, request rows)."""
        return (slots[:: self.page_size] // self.page_size).to(torch.int64)

    # ---- seal ----

    def seal(self, pages: torch.Tensor) -> None:
        self.sums[pages] = self.partials(pages)
        self.sealed[pages] = True
        self.bad[pages] = False

    def seal_filled(self, slots: torch.Tensor) -> None:
        """Seal the pages that the KV just written at `slots` completed: a page is full once its last slot
        is written (pages fill in slot order). No host sync; the count is read at the next check."""
        slots = slots.to(torch.int64)
        last = slots % self.page_size == self.page_size - 1
        self._filled += last.sum()
        if self._kernel is not None:
            pages = torch.where(last, slots // self.page_size, -1)
            self._kernel.partials_into(self.sums, pages)
            rows = torch.where(last, pages, 0)  # page 0 is SGLang's padding page: scratch for the others
            self.sealed[rows] = last
            self.bad[rows] = self.bad[rows] & ~last
        elif bool(last.any()):
            self.seal(slots[last] // self.page_size)

    def take_fill_count(self) -> int:
        n = int(self._filled)
        self._filled.zero_()
        return n

    def forget(self, pages: torch.Tensor) -> None:
        self.sealed[pages] = False
        self.bad[pages] = False
        self.pending[pages] = False

    def mark_bad(self, pages: torch.Tensor) -> None:
        self.bad[pages] = True

    # ---- check ----

    def check(self, pages: torch.Tensor, known_only: torch.Tensor | None = None, seal_missing: bool = True) -> Check:
        """Compare `pages` with their seals and report bad pages. `known_only` marks pages (same length) that are
        only looked up for an earlier bad mark, not recomputed; unsealed pages are sealed now unless
        `seal_missing` is off. Pages whose bytes are still being loaded are not compared."""
        n = pages.numel()
        if n == 0:
            return Check([], [], 0, 0, [])
        pages = pages.to(device=self.device, dtype=torch.int64)
        recompute = ~self.pending[pages]
        if known_only is not None:
            recompute &= ~known_only.to(self.device)
        expected = self.sums[pages]
        was_sealed, known = self.sealed[pages], self.bad[pages]
        now = self.partials(pages)
        diff = (now != expected) & (was_sealed & recompute)[:, None]
        new = diff.any(dim=1) & ~known
        late = ~was_sealed & ~known & recompute & seal_missing
        self.sums[pages] = torch.where(late[:, None], now, expected)
        self.sealed[pages] = was_sealed | late
        self.bad[pages] = known | new
        flags = torch.stack([new, known, late, was_sealed & recompute & ~known]).cpu()  # the one host sync
        new_rows = flags[0].nonzero().flatten().tolist()
        bad_rows = (flags[0] | flags[1]).nonzero().flatten().tolist()
        mismatched = []
        if new_rows:
            for row, b in diff[new_rows].nonzero().tolist():
                layer, part = self.layers[b]
                mismatched.append((int(pages[new_rows[row]]), layer, part))
        return Check(bad_rows, new_rows, int(flags[3].sum()), int(flags[2].sum()), mismatched)


def forget_on_free(allocator, seals: PageSeals) -> None:
    """Make the allocator forget a page's seal whenever it takes the page back. Hooks the one method every free
    of the allocator goes through: the paged allocator's page release, or the token allocator's free (page
    size 1: slots are pages)."""
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

    if type(allocator) is PagedTokenToKVPoolAllocator:
        release = allocator._release_page_ids

        def release_and_forget(*page_ids: torch.Tensor):
            for ids in page_ids:
                seals.forget(ids)
            return release(*page_ids)

        allocator._release_page_ids = release_and_forget
    elif type(allocator) is TokenToKVPoolAllocator:
        free = allocator.free

        def free_and_forget(free_index: torch.Tensor):
            if free_index.numel():
                seals.forget(free_index.to(torch.int64))
            return free(free_index)

        allocator.free = free_and_forget
    else:
        raise ValueError(f"KV checksums support SGLang's paged and token allocators, not {type(allocator).__name__}")
