"""Pool layouts and formats: HND pools (SGLANG_USE_HND_KVCACHE=1) are checked end to end; FP4 and MXFP8 pools'
per-block scale buffers are part of each page's checksum; what cannot be checksummed is refused up front."""

from __future__ import annotations

import random

import pytest
import torch
from sglang.srt.mem_cache.memory_pool import (
    MHATokenToKVPool,
    MHATokenToKVPoolFP4,
    MHATokenToKVPoolMXFP8,
    MLATokenToKVPoolFP4,
)

from engine_patches.kv_checksum.checksum import page_partials_reference, pool_buffers
from engine_patches.kv_checksum.seals import PageSeals
from tests.engine_patches.kv_server import Geometry, Server, flip_page


@pytest.mark.parametrize("page_size", [16, 1])
def test_hnd_pools_are_checked_end_to_end(page_size, monkeypatch, tmp_path):
    """With the HND layout the first insert used to fail (the page view assumed token rows); now an HND page is
    one contiguous block, sealed, checked and cut at exactly as an NHD page."""
    monkeypatch.setenv("SGLANG_USE_HND_KVCACHE", "1")
    g = Geometry("mha", page_size=page_size, pages=48 if page_size == 16 else 768, heads=2, head_dim=32)
    s = Server(g, log=str(tmp_path / "log.jsonl"))
    try:
        assert s.pool.kv_cache_layout == "hnd" and s.pool.k_buffer[0].dim() == 4
        rng = random.Random(page_size)
        prompt = [rng.randrange(1, 40_000) for _ in range(64)]
        a = s.submit("a", prompt, [rng.randrange(1, 40_000) for _ in range(20)])
        s.step()
        s.flip(s.page_of(a, 32), buffer=3, byte=7, bit=5)
        b = s.submit("b", prompt + [1], [2])
        for _ in range(500):
            if s.idle():
                break
            s.step()
            s.check_slots()
        assert b.admitted_prefix == 32 and s.served.corrupt == 0 and s.served.pages > 0
        c = s.submit("c", prompt + [3], [4])  # drops the node a let go of, recomputes and caches afresh
        s.run()
        d = s.submit("d", prompt + [5], [6])
        s.run()
        assert (c.admitted_prefix, d.admitted_prefix) == (32, 64) and s.served.corrupt == 0
    finally:
        s.close()


SCALED = [
    (MHATokenToKVPoolFP4, (64, 16, torch.float4_e2m1fn_x2, 2, 64, 2, "cpu", False), "k_scale"),
    (MLATokenToKVPoolFP4, (64, 16, torch.float4_e2m1fn_x2, 512, 64, 2, "cpu", False), "kv_scale"),
    (MHATokenToKVPoolMXFP8, (64, 16, torch.float8_e4m3fn, 2, 64, 2, "cpu", False), "k_scale"),
]


@pytest.mark.parametrize("cls,args,scale_part", SCALED, ids=lambda x: getattr(x, "__name__", ""))
def test_scale_buffers_are_part_of_every_page_checksum(cls, args, scale_part):
    pool = cls(*args)
    seals = PageSeals(pool, page_size=16)
    gen = torch.Generator().manual_seed(0)
    for buf in seals.buffers:
        raw = buf.view(-1).view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    pages = torch.tensor([1, 2, 3, 4])
    seals.seal(pages)
    assert torch.equal(seals.sums[pages], page_partials_reference(seals.buffers, pages, 16))
    assert seals.check(pages).bad_rows == []
    scale = next(i for i, (_, part) in enumerate(seals.layers) if part == scale_part)
    flip_page(seals.buffers[scale], 3, 16, byte=11, bit=6)  # one bit of one block scale
    check = seals.check(pages)
    assert check.bad_rows == [2] and check.mismatched == [(3, 0, scale_part)]


def test_pages_that_are_not_whole_words_are_refused_up_front():
    """MLA FP4 at page size 1: a 576-wide latent has 36 bytes of scales per token, not whole 64-bit words."""
    pool = MLATokenToKVPoolFP4(64, 1, torch.float4_e2m1fn_x2, 512, 64, 2, "cpu", False)
    with pytest.raises(ValueError, match="whole number of 64-bit words"):
        PageSeals(pool, page_size=1)


def test_layouts_that_are_not_token_or_page_major_are_refused():
    pool = MHATokenToKVPool(64, 16, torch.bfloat16, 2, 32, 2, "cpu", False)
    pool.kv_cache_layout = "vectorized_5d"  # ROCm AITER's 5-D layout
    with pytest.raises(ValueError, match="NHD and HND"):
        pool_buffers(pool)
