"""What KV page checksums cost a decode step, measured on pools shaped like SGLang's (kv_checksum.gpu_check's
make_pool: [slots, heads, dim] per layer, FP8 stored as uint8), page 64:

- seal: `PageSeals.seal_filled` over one decode step's out_cache_loc (one slot a request), no host sync: CUDA events;
- admission: `PageSeals.check` over a request's cached context pages, the host sync that reads the verdict back
  included: host clock around the whole call;
- insert: the same check over the pages a request read and wrote (context + output), run at the end of its
  prefill (context) and at its release (context + output): the tree re-checks the prefix a request held before
  its KV is cached (kv_checksum/tree.py, derived KV);
- per decode step: seal + batch x (admission + both inserts) / output_len, the checks spread over the request's
  output tokens; its share of the decode step is taken against each attention backend's step (run.py).
The pages checked are spread over the whole pool, as a long-running server's are, so they come from HBM."""

from __future__ import annotations

import torch

from engine_patches.gpu_check.kernels import load
from engine_patches.gpu_check.timing import device_ms, host_ms
from engine_patches.kv_checksum.gpu_check import PoolShape, make_pool


def costs(pool: PoolShape, dtype, batches: list[int], contexts: list[int], output_len: int, page_size: int,
          pool_gib: float, device, sizes: dict) -> list[dict]:
    load("checksum")
    from engine_patches.kv_checksum.seals import PageSeals

    buffers_per_layer = 1 if pool.kind == "mla" else 2
    page_bytes = pool.layers * buffers_per_layer * page_size * pool.kv_heads * pool.head_dim * dtype.itemsize
    pages = max(8, int(pool_gib * 2**30 // page_bytes))
    buffers = make_pool(pool, dtype, pages * page_size, device)
    seals = PageSeals.of_buffers(buffers, page_size)
    seals.seal(torch.arange(pages, device=device))
    gen = torch.Generator(device=device).manual_seed(5)

    def spread(n: int) -> torch.Tensor:
        return torch.randint(1, pages, (n,), generator=gen, device=device)

    def check_ms(tokens: int) -> float:
        chosen = spread(max(1, tokens // page_size))
        return host_ms(lambda: seals.check(chosen), device, sizes["warmup"], sizes["iters"])

    rows = []
    for bs in batches:
        loc = spread(bs) * page_size + page_size - 1  # every request completes a page: the worst step
        seal, mode = device_ms(lambda loc=loc: seals.seal_filled(loc), device, sizes["warmup"], sizes["iters"])
        for ctx in contexts:
            admission, insert_prefill, insert_release = check_ms(ctx), check_ms(ctx), check_ms(ctx + output_len)
            per_step = seal + bs * (admission + insert_prefill + insert_release) / output_len
            rows.append({"batch": bs, "context": ctx, "seal_ms": seal, "seal_timing": mode,
                         "admission_check_ms": admission, "insert_checks_ms": insert_prefill + insert_release,
                         "checks_timing": "host clock around PageSeals.check (host sync included)",
                         "per_step_ms": per_step, "page_bytes": page_bytes, "pool_pages": pages,
                         "kernel": "capbench triton page checksum (PageChecksummer)" if device.type == "cuda"
                         else "torch reference (CPU)"})
    return rows
