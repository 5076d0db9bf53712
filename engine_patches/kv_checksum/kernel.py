"""Triton kernel: checksums of many KV pages over every layer in one launch, bit-identical to checksum.py.

Grid (pages, buffers): one program reads one page of one layer buffer through a table of buffer base pointers,
mixes each 64-bit word with its position key in uint64 and adds it up. The per-buffer partial sums are added
mod 2^64 afterwards; addition commutes, so the grid shape never changes the result. The word sums use
tl.sum, a built-in reduction, which stays fast under TRITON_INTERPRET=1 (a custom tl.reduce would not).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine_patches.kv_checksum.checksum import GOLDEN, MIX1, MIX2, SEED, paged_words

BLOCK = 1024


@triton.jit
def _page_checksum_kernel(
    buffer_ptrs,  # int64 [buffers]: data_ptr of each layer buffer
    page_words,  # int64 [buffers]: 64-bit words per page in each buffer
    pages,  # int64 [n]: page ids (slot ids with ROWS); with SCATTER, -1 means "skip"
    partial,  # int64 [n, buffers] out, or with SCATTER the table [pool pages, buffers] written at row `page`
    n_buffers,
    page_size,
    GOLDEN: tl.constexpr,
    SEED: tl.constexpr,
    MIX1: tl.constexpr,
    MIX2: tl.constexpr,
    BLOCK: tl.constexpr,
    SCATTER: tl.constexpr,
    ROWS: tl.constexpr,
):
    i = tl.program_id(0)
    b = tl.program_id(1)
    page = tl.load(pages + i)
    wanted = page >= 0
    page = tl.maximum(page, 0)
    words = tl.where(wanted, tl.load(page_words + b), 0)
    key_at = page * 0
    if ROWS:  # one slot row: its words, keyed by their position in the slot's page
        words = words // page_size
        key_at = (page % page_size) * words
    base = tl.load(buffer_ptrs + b).to(tl.pointer_type(tl.uint64))
    start = base + page * words
    offs = tl.arange(0, BLOCK)
    key_hi = (b.to(tl.uint64) << 32) + key_at.to(tl.uint64)
    acc = tl.zeros([BLOCK], dtype=tl.uint64)
    for w0 in range(0, words, BLOCK):
        w = w0 + offs
        live = w < words
        x = tl.load(start + w, mask=live, other=0)
        x = x ^ (((key_hi + w.to(tl.uint64)) * GOLDEN) ^ SEED)
        x = x ^ (x >> 30)
        x = x * MIX1
        x = x ^ (x >> 27)
        x = x * MIX2
        x = x ^ (x >> 31)
        acc += tl.where(live, x, 0)
    row = page if SCATTER else i
    tl.store(partial + row * n_buffers + b, tl.sum(acc, axis=0).to(tl.int64, bitcast=True), mask=wanted)


class PageChecksummer:
    """Holds one pool's pointer table so each call is a single launch over the requested pages."""

    def __init__(self, buffers: list[torch.Tensor], page_size: int, block: int = BLOCK, num_warps: int = 4,
                 device: torch.device | None = None):
        """`device`: where the kernel runs, when the buffers are host memory registered with CUDA (read by the GPU
        through the same pointers, over PCIe); by default the buffers' own device."""
        words = [paged_words(buf, page_size).shape[1] for buf in buffers]
        device = device or buffers[0].device
        self.buffers = buffers  # keep the storage alive while the pointers are in use
        self.page_size = page_size
        # Small pages (page_size 1: 32..144 words a buffer) would leave most of a large block masked off.
        self.block = min(block, triton.next_power_of_2(max(words)))
        self.num_warps = num_warps
        self.row_block = min(block, triton.next_power_of_2(max(words) // page_size))
        self.ptrs = torch.tensor([buf.data_ptr() for buf in buffers], dtype=torch.int64, device=device)
        self.words = torch.tensor(words, dtype=torch.int64, device=device)

    def partials(self, pages: torch.Tensor) -> torch.Tensor:
        """Per-buffer sums [pages, buffers]; a page's checksum is their row sum (mod 2^64)."""
        pages = pages.to(device=self.ptrs.device, dtype=torch.int64).contiguous()
        n, nb = pages.numel(), len(self.buffers)
        partial = torch.empty((n, nb), dtype=torch.int64, device=pages.device)
        if n:
            _page_checksum_kernel[(n, nb)](
                self.ptrs, self.words, pages, partial, nb, self.page_size,
                GOLDEN=GOLDEN, SEED=SEED, MIX1=MIX1, MIX2=MIX2, BLOCK=self.block, SCATTER=False, ROWS=False,
                num_warps=self.num_warps,
            )  # fmt: skip
        return partial

    def partials_into(self, table: torch.Tensor, pages: torch.Tensor) -> None:
        """Write each page's per-buffer sums into row `page` of `table` [pool pages, buffers]; pages < 0 are
        skipped. Nothing is read back to the host, so a decode step can seal its filled pages without a sync."""
        pages = pages.to(device=self.ptrs.device, dtype=torch.int64).contiguous()
        if pages.numel():
            _page_checksum_kernel[(pages.numel(), len(self.buffers))](
                self.ptrs, self.words, pages, table, len(self.buffers), self.page_size,
                GOLDEN=GOLDEN, SEED=SEED, MIX1=MIX1, MIX2=MIX2, BLOCK=self.block, SCATTER=True, ROWS=False,
                num_warps=self.num_warps,
            )  # fmt: skip

    def row_sums(self, slots: torch.Tensor, buffers: int | None = None) -> torch.Tensor:
        """Each slot row's share of its page's checksum over the first `buffers` buffers (all by default; see
        checksum.row_sums_reference), one launch."""
        slots = slots.to(device=self.ptrs.device, dtype=torch.int64).contiguous()
        n, nb = slots.numel(), buffers or len(self.buffers)
        partial = torch.empty((n, nb), dtype=torch.int64, device=slots.device)
        if n:
            _page_checksum_kernel[(n, nb)](
                self.ptrs, self.words, slots, partial, nb, self.page_size,
                GOLDEN=GOLDEN, SEED=SEED, MIX1=MIX1, MIX2=MIX2, BLOCK=self.row_block, SCATTER=False, ROWS=True,
                num_warps=1,
            )  # fmt: skip
        return partial.sum(dim=1)

    def __call__(self, pages: torch.Tensor) -> torch.Tensor:
        return self.partials(pages).sum(dim=1)


def page_checksums_triton(buffers: list[torch.Tensor], pages: torch.Tensor, page_size: int) -> torch.Tensor:
    return PageChecksummer(buffers, page_size)(pages)
