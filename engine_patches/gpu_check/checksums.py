"""What KV page checksums cost a decode step, measured on pools shaped like SGLang's (kv_checksum.gpu_check's
make_pool: [slots, heads, dim] per layer, FP8 stored as uint8), page 64:

- seal: `PageSeals.seal_written` over one decode step's out_cache_loc (one slot a request), no host sync: CUDA events;
- admission: `PageSeals.check` over a request's cached context pages, the host sync that reads the verdict back
  included: host clock around the whole call; and, as kv_checksum/step.py batches a step's admissions, one check of
  all the batch's requests' pages (`admission_step_batched_ms`, against batch x the single check);
- insert: the same check over the pages a request read and wrote (context + output), run at the end of its
  prefill (context) and at its release (context + output): the tree re-checks the prefix a request held before
  its KV is cached (kv_checksum/tree.py, derived KV);
- seal: now records each written row too (partial pages: kv_checksum/seals.py), so its figure includes that;
- per decode step: seal + (the batched admission check + batch x both inserts) / answer tokens, the checks spread
  over the request's output tokens, for 128- and 1k-token answers; its share of the decode step is taken against
  each attention backend's step (run.py);
- HiCache load-back over a 4k- and a 32k-token prefix held in host memory: the inline host-copy check
  (kv_checksum/hicache.py HostSeals.partials, torch on the scheduler's CPU thread, host clock;
  CAPBENCH_KV_HOST_CHECK_INLINE=1 and PD restores) beside the device check of the same pages (`device_check_ms`:
  what the default path, load first and check the loaded pages at the next admission, runs on the GPU).
The pages checked are spread over the whole pool, as a long-running server's are, so they come from HBM."""

from __future__ import annotations

import torch

from engine_patches.gpu_check.kernels import load
from engine_patches.gpu_check.timing import device_ms, host_ms
from engine_patches.kv_checksum.gpu_check import PoolShape, make_pool


def costs(pool: PoolShape, dtype, batches: list[int], contexts: list[int], output_lens: list[int], page_size: int,
          pool_gib: float, device, sizes: dict) -> dict:
    """{"steps": a row per batch x context x answer length, "loads": a row per HiCache load-back length}."""
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
        seal, mode = device_ms(lambda loc=loc: seals.seal_written(loc), device, sizes["warmup"], sizes["iters"])
        for ctx in contexts:
            admission, insert_prefill = check_ms(ctx), check_ms(ctx)
            step_batched = check_ms(bs * ctx)  # every request's admission pages in one check (kv_checksum/step.py)
            for out in output_lens:
                insert_release = check_ms(ctx + out)
                per_step = seal + (step_batched + bs * (insert_prefill + insert_release)) / out
                rows.append({"batch": bs, "context": ctx, "answer_tokens": out, "seal_ms": seal, "seal_timing": mode,
                             "admission_check_ms": admission, "admission_step_batched_ms": step_batched,
                             "admission_step_one_by_one_ms": bs * admission,
                             "insert_checks_ms": insert_prefill + insert_release,
                             "checks_timing": "host clock around PageSeals.check (host sync included)",
                             "per_step_ms": per_step, "page_bytes": page_bytes, "pool_pages": pages,
                             "kernel": "capbench triton page checksum (PageChecksummer)" if device.type == "cuda"
                             else "torch reference (CPU)"})
    loads = [load_row(pool, dtype, ctx, page_size, device, sizes, check_ms) for ctx in sizes["load_contexts"]]
    return {"steps": rows, "loads": loads}


def load_row(pool: PoolShape, dtype, tokens: int, page_size: int, device, sizes: dict, check_ms) -> dict:
    """The host-copy check before a HiCache load-back of `tokens` tokens, as hicache.py runs it."""
    from engine_patches.kv_checksum.hicache import HostSeals

    host = make_pool(pool, dtype, (tokens // page_size + 1) * page_size, torch.device("cpu"))
    seals = HostSeals.of_views(host, page_size)
    pages = torch.arange(1, tokens // page_size + 1)
    iters = sizes.get("load_iters", 3)
    host_check = host_ms(lambda: seals.partials(pages), torch.device("cpu"), 1, iters)
    nbytes = sum(v[page_size:].numel() * v.element_size() for v in host)
    row = {"tokens": tokens, "host_check_ms": host_check, "host_GBps": nbytes / host_check / 1e6,
           "device_check_ms": check_ms(tokens), "bytes": nbytes,
           "kernel": "torch on the scheduler's CPU thread (HostSeals.partials); device: PageSeals.check"}
    if device.type == "cuda":  # the opt-in GPU kernel over the registered host pool (hicache.HOST_CHECK_ON_GPU)
        from sglang.srt.mem_cache.pool_host.common import _cuda_host_register

        for view in host:
            _cuda_host_register(view)
        cpu_sums = seals.partials(pages)
        if seals.read_on_gpu(device):
            row["gpu_read_of_host_ms"] = host_ms(lambda: seals.partials(pages), device, 1, iters)
            row["gpu_read_matches_cpu"] = bool(torch.equal(seals.partials(pages), cpu_sums))
        else:
            row["gpu_read_of_host_ms"] = None
        for view in host:
            torch.cuda.cudart().cudaHostUnregister(view.data_ptr())
    return row
