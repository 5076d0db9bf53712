"""KV page checksum on this CPU: the torch reference's throughput and the Triton kernel's speed under the
interpreter (a correctness tool, not a speed figure). No GPU figures here: those come from
`python -m engine_patches.kv_checksum.gpu_check` on a CUDA machine.

    TRITON_INTERPRET=1 .venv/bin/python -m engine_patches.kv_checksum.benchmark [--pages 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from engine_patches.kv_checksum.checksum import page_checksums_reference
from engine_patches.kv_checksum.kernel import PageChecksummer


def median_s(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pages", type=int, default=64, help="pages checksummed per call (reference)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    page = 64
    print(f"torch {torch.__version__}, {args.threads} thread(s), page {page} tokens, TRITON_INTERPRET="
          f"{os.environ.get('TRITON_INTERPRET', '0')}")
    # Kimi K2 MLA latent rows (576 wide), 4 of its 61 layers: per-page work scales linearly with layers.
    for name, dtype in (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
        bufs = [(torch.randn(args.pages * page, 1, 576, generator=gen)).to(dtype) for _ in range(4)]
        bufs = [b.view(torch.uint8) if dtype == torch.float8_e4m3fn else b for b in bufs]
        pages = torch.arange(args.pages)
        nbytes = sum(b.numel() * b.element_size() for b in bufs)
        t = median_s(lambda bufs=bufs, pages=pages: page_checksums_reference(bufs, pages, page), args.reps)
        print(f"reference  MLA {name:5} {args.pages:4d} pages x 4 layers: {t * 1e3:8.2f} ms  "
              f"{nbytes / t / 1e9:6.3f} GB/s")
    if os.environ.get("TRITON_INTERPRET") == "1":
        bufs = [torch.randn(4 * page, 1, 576, generator=gen).to(torch.bfloat16) for _ in range(2)]
        ck = PageChecksummer(bufs, page)
        pages = torch.arange(4)
        nbytes = sum(b.numel() * b.element_size() for b in bufs)
        t = median_s(lambda: ck(pages), max(2, args.reps // 2))
        print(f"interpreted kernel MLA bf16 4 pages x 2 layers: {t * 1e3:8.1f} ms  {nbytes / t / 1e6:6.2f} MB/s "
              "(correctness only: the interpreter runs numpy per block)")


if __name__ == "__main__":
    main()
