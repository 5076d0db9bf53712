"""The checksum function: torch reference against plain Python integers, Triton kernel (interpreted on CPU)
against the reference, and the detection guarantees."""

import os
import random

import pytest
import torch

from engine_patches.kv_checksum.checksum import (
    GOLDEN,
    MIX1,
    MIX2,
    SEED,
    page_checksums_reference,
    page_partials_reference,
    paged_words,
    row_sums_reference,
)
from engine_patches.kv_checksum.kernel import PageChecksummer

M64 = (1 << 64) - 1


def python_checksum(buffers: list[torch.Tensor], page: int, page_size: int) -> int:
    """The definition in checksum.py, in unbounded Python ints: no emulation of uint64 anywhere."""
    total = 0
    for b, buf in enumerate(buffers):
        raw = paged_words(buf, page_size)[page].view(torch.uint8).tolist()
        for w in range(len(raw) // 8):
            x = int.from_bytes(bytes(raw[8 * w : 8 * w + 8]), "little")
            x ^= (((b << 32) | w) * GOLDEN & M64) ^ SEED
            x ^= x >> 30
            x = x * MIX1 & M64
            x ^= x >> 27
            x = x * MIX2 & M64
            x ^= x >> 31
            total = (total + x) & M64
    return total


def pool_like(kind: str, dtype: torch.dtype, rows: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Layer buffers shaped like SGLang's: MHA K and V [rows, heads, dim]; MLA latents [rows, 1, 576]; fp8 stored
    as uint8."""
    shape = (rows, 2, 48) if kind == "mha" else (rows, 1, 72)
    n = 4 if kind == "mha" else 3
    out = []
    for _ in range(n):
        x = torch.randn(*shape, generator=gen) * 8
        out.append(x.to(torch.float8_e4m3fn).view(torch.uint8) if dtype == torch.float8_e4m3fn else x.to(dtype))
    return out


def test_reference_equals_the_definition_in_python_ints():
    gen = torch.Generator().manual_seed(0)
    buffers = pool_like("mla", torch.bfloat16, 16, gen)
    pages = torch.tensor([0, 1, 3])
    ref = page_checksums_reference(buffers, pages, page_size=4)
    for i, p in enumerate(pages.tolist()):
        assert int(ref[i]) & M64 == python_checksum(buffers, p, 4)


@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_triton_kernel_is_bit_identical_to_reference(kind, dtype):
    assert os.environ.get("TRITON_INTERPRET") == "1"  # set by tests/conftest.py: the kernel runs on CPU
    gen = torch.Generator().manual_seed(1)
    page_size = 4
    buffers = pool_like(kind, dtype, 12 * page_size, gen)
    pages = torch.tensor([11, 0, 5, 5, 7])  # any order, repeats allowed
    # A block smaller than a page's words exercises the loop and the masked tail.
    kernel = PageChecksummer(buffers, page_size, block=64)
    assert torch.equal(kernel.partials(pages), page_partials_reference(buffers, pages, page_size))
    assert torch.equal(kernel(pages), page_checksums_reference(buffers, pages, page_size))


def test_the_fill_seal_writes_only_the_pages_it_is_given_into_the_table():
    """The decode-step seal: page ids with -1 for "not full yet", rows written in place, nothing else touched."""
    gen = torch.Generator().manual_seed(6)
    buffers = pool_like("mla", torch.float8_e4m3fn, 10 * 4, gen)
    table = torch.full((10, len(buffers)), 7, dtype=torch.int64)
    PageChecksummer(buffers, 4).partials_into(table, torch.tensor([3, -1, 8, -1]))
    expected = torch.full_like(table, 7)
    expected[[3, 8]] = page_partials_reference(buffers, torch.tensor([3, 8]), 4)
    assert torch.equal(table, expected)


def test_the_gpu_fill_path_seals_like_the_reference_path():
    """PageSeals.seal_written on its kernel path (as on a GPU: masked pages, state set with no host read-back),
    run here with the interpreted kernel, leaves the same seal table and row records as the CPU path; a page
    whose written row was damaged before it filled is marked, not sealed, on both."""
    from engine_patches.kv_checksum.seals import FILL_BAD, SEALED, PageSeals
    from tests.engine_patches.kv_server import Geometry, flip_page, make_pool

    pool = make_pool(Geometry("mla", "fp8", page_size=4, pages=12))
    gen = torch.Generator().manual_seed(7)
    for buf in pool_like_buffers(pool):
        buf.copy_(torch.randint(0, 256, buf.shape, dtype=torch.uint8, generator=gen).view(buf.dtype))
    cpu, gpu_like = PageSeals(pool, 4), PageSeals(pool, 4)
    gpu_like._kernel = PageChecksummer(gpu_like.buffers, 4)
    first = torch.arange(4, 19)  # pages 1..3 full, 4 three rows in
    then = torch.tensor([19, 23, 20, 21, 22])  # page 4 completes, page 5 fills in one forward
    for seals in (cpu, gpu_like):
        seals.mark_bad(torch.tensor([2]))  # a stale bad mark is replaced by a fresh seal
        seals.seal_written(first)
    flip_page(pool_like_buffers(pool)[1], 4, 4, 3, 5)  # a written row of the half-full page 4
    for seals in (cpu, gpu_like):
        seals.seal_written(then)
    assert torch.equal(gpu_like.rows, cpu.rows)
    assert not torch.equal(cpu.rows[first], row_sums_reference(cpu.buffers, first, 4))  # row 16's record: pre-flip
    real = torch.tensor([1, 2, 3, 4, 5])
    assert torch.equal(gpu_like.sums[real], cpu.sums[real])
    assert torch.equal(gpu_like.state[1:], cpu.state[1:])
    assert cpu.state[real].tolist() == [SEALED, SEALED, SEALED, FILL_BAD, SEALED]
    assert cpu.check(real).new_rows == [3] and gpu_like.check(real).new_rows == [3]


def test_row_records_add_up_to_the_page_checksum():
    """A page's checksum is the sum of its rows' records, on the reference and the interpreted kernel alike."""
    gen = torch.Generator().manual_seed(8)
    buffers = pool_like("mha", torch.bfloat16, 32, gen)
    slots = torch.arange(32)
    rows = row_sums_reference(buffers, slots, 4)
    assert torch.equal(rows.view(8, 4).sum(dim=1), page_checksums_reference(buffers, torch.arange(8), 4))
    assert torch.equal(PageChecksummer(buffers, 4).row_sums(slots), rows)


def pool_like_buffers(pool) -> list[torch.Tensor]:
    from engine_patches.kv_checksum.checksum import pool_buffers

    return [b.view(torch.uint8) for b in pool_buffers(pool)]


def test_kernel_handles_buffers_of_different_widths():
    gen = torch.Generator().manual_seed(2)
    k = [torch.randn(16, 2, 64, generator=gen).to(torch.bfloat16) for _ in range(2)]
    v = [torch.randn(16, 2, 32, generator=gen).to(torch.bfloat16) for _ in range(2)]  # v_head_dim != head_dim
    pages = torch.arange(4)
    assert torch.equal(PageChecksummer(k + v, 4, block=32)(pages), page_checksums_reference(k + v, pages, 4))
    tokens = torch.arange(16)  # page_size 1 (SGLang's default): the block shrinks to the page's 32 words
    ck = PageChecksummer(k + v, 1)
    assert ck.block == 32 and torch.equal(ck(tokens), page_checksums_reference(k + v, tokens, 1))


def test_every_single_bit_of_a_page_is_detected():
    """Exhaustive over one fp8 MLA page of 2 layers x 4 rows x 72 bytes: all 4,608 single-bit flips."""
    gen = torch.Generator().manual_seed(3)
    buffers = [x[:8].contiguous() for x in pool_like("mla", torch.float8_e4m3fn, 8, gen)[:2]]
    page = torch.tensor([1])
    clean = int(page_checksums_reference(buffers, page, 4))
    flips = 0
    for buf in buffers:
        flat = buf.view(-1)
        for byte in range(4 * 72, 8 * 72):
            for bit in range(8):
                flat[byte] ^= 1 << bit
                assert int(page_checksums_reference(buffers, page, 4)) != clean
                flat[byte] ^= 1 << bit
                flips += 1
    assert flips == 2 * 4 * 72 * 8
    assert int(page_checksums_reference(buffers, page, 4)) == clean


def test_swapped_words_and_other_pages_do_not_disturb():
    gen = torch.Generator().manual_seed(4)
    buffers = pool_like("mha", torch.bfloat16, 8, gen)
    pages = torch.tensor([0, 1])
    before = page_checksums_reference(buffers, pages, 4)
    words = paged_words(buffers[1], 4)
    a, b = words[1, 3].clone(), words[1, 9].clone()
    assert not torch.equal(a, b)
    words[1, 3], words[1, 9] = b, a  # same bytes, moved within page 1
    after = page_checksums_reference(buffers, pages, 4)
    assert after[0] == before[0] and after[1] != before[1]


def test_random_multiword_corruption_is_detected():
    rng = random.Random(5)
    gen = torch.Generator().manual_seed(5)
    buffers = pool_like("mla", torch.bfloat16, 8, gen)
    pages = torch.tensor([0, 1])
    clean = page_checksums_reference(buffers, pages, 4)
    for _ in range(200):
        buf = rng.choice(buffers)
        flat = buf.view(-1).view(torch.uint8)
        idx = torch.randint(0, flat.numel(), (rng.randint(2, 40),), generator=gen)
        saved = flat[idx].clone()
        flat[idx] ^= torch.randint(1, 256, (len(idx),), generator=gen, dtype=torch.uint8)
        assert not torch.equal(page_checksums_reference(buffers, pages, 4), clean)
        flat[idx] = saved


def test_the_host_copy_check_as_a_kernel_equals_the_cpu_check():
    """HiCache's host-copy check through the page kernel (opt-in on CUDA, where the kernel reads the registered
    host pool through its pointers), here interpreted over the same host views: the same sums as the CPU path."""
    from engine_patches.kv_checksum.hicache import HostSeals

    gen = torch.Generator().manual_seed(9)
    views = pool_like("mla", torch.float8_e4m3fn, 32, gen)
    seals = HostSeals.of_views(views, 4)
    pages = torch.tensor([1, 5, 7])
    cpu = seals.partials(pages)
    assert torch.equal(cpu, page_partials_reference(views, pages, 4))
    assert seals.read_on_gpu(torch.device("cpu"))
    assert torch.equal(seals.partials(pages), cpu)
    views[0].view(-1)[5 * 4 * 72 + 3] ^= 4  # host page 5 of layer 0
    assert seals.partials(pages)[:, 0].ne(cpu[:, 0]).tolist() == [False, True, False]
