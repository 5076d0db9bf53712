"""The 64-bit KV page checksum: definition and torch reference.

A page's checksum covers every buffer of the pool for that page: every layer's K and V rows (MHA/GQA pools)
or latent rows (MLA pools), and the per-token scale rows of FP4/MXFP8 pools. Each buffer's page is read as
little-endian 64-bit words (bf16 quads, fp8 octets; fp8 pools store uint8 and are read the same way), and

    checksum(page) = sum over (buffer b, word w) of mix64(word[b, w] XOR key(b, w))   (mod 2^64)
    key(b, w)      = ((b << 32) | w) * GOLDEN XOR SEED                               (mod 2^64)
    mix64          = the splitmix64 finalizer (xor-shift, multiply by an odd constant, twice, xor-shift)

Why this function:
- Certain detection of any single-bit flip, and of any corruption confined to one 64-bit word: XOR with a fixed
  key and mix64 are both bijections, so a changed word changes exactly one term, by a nonzero amount, and a
  sum mod 2^64 changed in one term cannot come back to the same value.
- Random multi-word corruption escapes with probability about 2^-64: mix64 spreads every input bit over all
  64 output bits, so the terms of corrupted words behave like independent uniform values.
- Position keys make moved or swapped words (a page copied to the wrong layer or offset) count as corruption.
- Additions commute, so a GPU kernel may sum words in any order, over any grid, and still equal this reference
  bit for bit; nothing depends on floating point.
- 64-bit words rather than 32-bit ones halve the integer work per byte (two 64-bit multiplies per 8 bytes),
  which keeps the kernel bound by memory bandwidth on an H200 rather than by its integer units.

torch has no full uint64 arithmetic, so the reference uses int64: multiplication and addition wrap exactly as
uint64 would; right shifts are arithmetic on int64, so logical shifts are emulated with a mask.
"""

from __future__ import annotations

import torch

GOLDEN = 0x9E3779B97F4A7C15
SEED = 0x243F6A8885A308D3
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
_U64 = 1 << 64


def as_int64(value: int) -> int:
    """A uint64 constant as the int64 with the same bits."""
    value %= _U64
    return value - _U64 if value >= 1 << 63 else value


def as_uint64(value: int) -> int:
    return value % _U64


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    return (x >> s) & ((1 << (64 - s)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    x = x ^ _shr(x, 30)
    x = x * as_int64(MIX1)
    x = x ^ _shr(x, 27)
    x = x * as_int64(MIX2)
    return x ^ _shr(x, 31)


def position_keys(buffer_index: int, words: int, device: torch.device | str) -> torch.Tensor:
    w = torch.arange(words, dtype=torch.int64, device=device)
    return ((w | (buffer_index << 32)) * as_int64(GOLDEN)) ^ as_int64(SEED)


def pool_buffers(kv_pool) -> list[torch.Tensor]:
    """The per-layer buffers of an SGLang KV pool, in checksum order, each as [slots, ...] rows whose page p is
    rows [p * page_size, (p + 1) * page_size): MLA latents, or all K then all V; FP4 pools add their per-token
    scale buffers after the data. HND pools store [pages, heads, page_size, dim]: a page is still one contiguous
    block, so those buffers are viewed as page_size rows a page."""
    layout = getattr(kv_pool, "kv_cache_layout", "nhd")
    if layout not in ("nhd", "hnd"):
        raise ValueError(f"KV checksums cover NHD and HND pools, not the {layout!r} layout")
    if hasattr(kv_pool, "kv_buffer"):
        buffers = [*kv_pool.kv_buffer, *_scales(kv_pool, "kv_scale_buffer")]
    elif hasattr(kv_pool, "k_buffer"):
        buffers = [*kv_pool.k_buffer, *kv_pool.v_buffer, *_scales(kv_pool, "k_scale_buffer"),
                   *_scales(kv_pool, "v_scale_buffer")]
    else:
        raise ValueError(f"KV checksums do not know the buffers of {type(kv_pool).__name__}")
    if layout == "hnd":
        buffers = [b.view(b.shape[0] * kv_pool.page_size, -1) for b in buffers]
    return buffers


def _scales(kv_pool, name: str) -> list[torch.Tensor]:
    """A pool's per-layer scale buffers (FP4, MXFP8), or none (plain pools leave the attribute None or unset)."""
    return list(getattr(kv_pool, name, None) or [])


def buffer_layers(kv_pool) -> list[tuple[int, str]]:
    """(layer id, part) of each buffer of `pool_buffers`, for logging a mismatch."""
    start = getattr(kv_pool, "start_layer", 0) or 0
    if hasattr(kv_pool, "kv_buffer"):
        parts = ["kv"] + (["kv_scale"] if _scales(kv_pool, "kv_scale_buffer") else [])
    else:
        parts = ["k", "v"] + (["k_scale", "v_scale"] if _scales(kv_pool, "k_scale_buffer") else [])
    layers = kv_pool.layer_num
    return [(start + i, part) for part in parts for i in range(layers)]


def paged_words(buffer: torch.Tensor, page_size: int) -> torch.Tensor:
    """A [rows, ...] slot buffer as [pages, words per page] int64, without copying."""
    if not buffer.is_contiguous():
        raise ValueError("KV buffer must be contiguous (token-major rows)")
    rows = buffer.shape[0]
    row_bytes = buffer[0].numel() * buffer.element_size()
    if (page_size * row_bytes) % 8:
        raise ValueError(f"a page of {page_size} rows x {row_bytes} bytes is not a whole number of 64-bit words")
    pages = rows // page_size
    flat = buffer[: pages * page_size].reshape(-1).view(torch.uint8)
    return flat.view(torch.int64).view(pages, page_size * row_bytes // 8)


def page_partials_reference(
    buffers: list[torch.Tensor], pages: torch.Tensor, page_size: int, chunk_pages: int = 8
) -> torch.Tensor:
    """Per-buffer sums [pages, buffers] (int64 bits of uint64 values); a page's checksum is their row sum."""
    pages = pages.to(device=buffers[0].device, dtype=torch.int64)
    out = torch.empty((pages.numel(), len(buffers)), dtype=torch.int64, device=pages.device)
    for b, buffer in enumerate(buffers):
        words = paged_words(buffer, page_size)
        keys = position_keys(b, words.shape[1], words.device)
        for start in range(0, pages.numel(), chunk_pages):
            sel = pages[start : start + chunk_pages]
            out[start : start + chunk_pages, b] = mix64(words[sel] ^ keys).sum(dim=1)
    return out


def row_words(buffer: torch.Tensor) -> int | None:
    """64-bit words per slot row of a buffer, or None when its rows are not whole words (FP4 scale rows)."""
    row_bytes = buffer[0].numel() * buffer.element_size()
    return None if row_bytes % 8 else row_bytes // 8


def row_buffers(buffers: list[torch.Tensor]) -> int:
    """How many leading buffers row records cover: those whose rows are whole 64-bit words. Data buffers come
    first in checksum order and always qualify; FP4/MXFP8 per-token scale rows may not."""
    n = 0
    while n < len(buffers) and row_words(buffers[n]) is not None:
        n += 1
    if n == 0:
        raise ValueError("KV rows are not whole 64-bit words: rows cannot be recorded")
    return n


def row_sums_reference(buffers: list[torch.Tensor], slots: torch.Tensor, page_size: int) -> torch.Tensor:
    """Each slot row's share of its page's checksum, over the given buffers (int64 bits of uint64 values): the terms
    of the row's words, keyed by their position in the page, so a page's checksum over those buffers is the sum of
    its rows' sums."""
    slots = slots.to(device=buffers[0].device, dtype=torch.int64)
    out = torch.zeros(slots.numel(), dtype=torch.int64, device=slots.device)
    for b, buffer in enumerate(buffers):
        words = paged_words(buffer, page_size)
        rw = row_words(buffer)
        keys = position_keys(b, words.shape[1], words.device).view(page_size, rw)
        out += mix64(words.view(-1, rw)[slots] ^ keys[slots % page_size]).sum(dim=1)
    return out


def page_checksums_reference(buffers: list[torch.Tensor], pages: torch.Tensor, page_size: int) -> torch.Tensor:
    """The 64-bit checksum (as int64 bits) of each given page id."""
    return page_partials_reference(buffers, pages, page_size).sum(dim=1)
