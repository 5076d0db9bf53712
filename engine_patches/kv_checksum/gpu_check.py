"""One-call GPU check of the KV page checksum kernel (under 5 minutes on an H200).

    python -m engine_patches.kv_checksum.gpu_check                      # CUDA, realistic pools
    python -m engine_patches.kv_checksum.gpu_check --device cpu --quick  # the same logic, tiny sizes

For each pool (Kimi K2 MLA: 61 layers x 576; GLM-4.6 GQA at tp 8: 92 layers x 1 KV head x 128, K and V), bf16
and fp8, page 64, it measures:
- the card's copy bandwidth: a torch copy of the pool's bytes, (read + write bytes) / time;
- the checksum kernel over every page of the pool, bytes read / time, for a few block sizes; the best one is
  compared with the copy bandwidth (goal: >= 80 %), after a bit-identity check against the torch reference;
- a decode step's attention over a realistic batch (SGLang's Triton decode-attention kernel when the sglang wheel
  imports, else a torch bmm/softmax step; which one is recorded), all layers;
- the checksum work one decode step causes on average: pages sealed (each request fills a page every
  page_size tokens) plus pages verified at admission (cached prefix / output length per request and step);
  its time relative to the decode attention step (goal: < 0.5 %), and relative to the KV-read floor (the
  step's KV bytes at copy bandwidth) as a stricter bound.
Prints a table and writes JSON (default data/calibration/kv_checksum_gpu.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine_patches.kv_checksum.checksum import page_partials_reference
from engine_patches.kv_checksum.kernel import PageChecksummer

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "data" / "calibration" / "kv_checksum_gpu.json"


@dataclass(frozen=True)
class PoolShape:
    name: str
    kind: str  # "mla" | "gqa"
    layers: int
    kv_heads: int  # per GPU
    head_dim: int  # mla: latent + rope width
    q_heads: int  # per GPU
    v_dim: int


POOLS = [
    PoolShape("kimi-k2 (MLA)", "mla", 61, 1, 576, 8, 512),  # 64 heads / tp 8; latent 512 + rope 64
    PoolShape("glm-4.6 (GQA, tp8)", "gqa", 92, 1, 128, 12, 128),  # 96 q / 8 kv heads, tp 8
]
QUICK = [
    PoolShape("kimi-k2 (MLA, tiny)", "mla", 3, 1, 64, 2, 48),
    PoolShape("glm-4.6 (GQA, tiny)", "gqa", 3, 1, 32, 2, 32),
]


def timed(fn, device: torch.device, reps: int) -> float:
    """Median seconds of fn() over reps calls, after one warm-up."""
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def make_pool(shape: PoolShape, dtype: torch.dtype, pages: int, page_size: int, device) -> list[torch.Tensor]:
    """Per-layer buffers laid out as SGLang's pools: [slots, heads, dim]; fp8 stored as uint8; random bytes."""
    n_buffers = shape.layers * (1 if shape.kind == "mla" else 2)
    store = torch.uint8 if dtype == torch.float8_e4m3fn else dtype
    out = []
    for _ in range(n_buffers):
        raw = torch.randint(0, 256, (pages * page_size, shape.kv_heads, shape.head_dim * dtype.itemsize),
                            dtype=torch.uint8, device=device)
        if dtype == torch.float8_e4m3fn or store == torch.uint8:
            out.append(raw)
        else:  # random bf16 bits may be NaN: harmless to a checksum, but keep the bytes plausible
            out.append((raw.view(torch.int16) & 0x3FFF).view(dtype))
    return out


def attention_step(shape: PoolShape, dtype: torch.dtype, batch: int, context: int, device) -> tuple[float, str]:
    """Seconds of one decode step's attention (all layers) over batch x context tokens, and the implementation."""
    reps = 5 if device.type == "cuda" else 2
    act = torch.bfloat16
    tokens = batch * context
    kv = (torch.randn(tokens, shape.kv_heads, shape.head_dim, device=device) * 0.5).to(act)
    q = torch.randn(batch, shape.q_heads, shape.head_dim, device=device).to(act)
    if device.type == "cuda":
        try:
            return timed(sglang_decode(shape, q, kv, batch, context), device, reps) * shape.layers, "sglang triton"
        except Exception as e:  # the wheel may not import here (no transformers, ...): say so and fall back
            print(f"note: SGLang's decode kernel unavailable ({type(e).__name__}: {str(e)[:120]}); torch step")
    k = kv.view(batch, context, shape.kv_heads, shape.head_dim)[:, :, 0]  # [B, C, D]; one KV head per GPU
    v = k[..., : shape.v_dim] if shape.kind == "mla" else torch.randn_like(k)
    scale = shape.head_dim**-0.5

    def step():
        scores = torch.bmm(q, k.transpose(1, 2)) * scale
        p = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        return torch.bmm(p, v)

    return timed(step, device, reps) * shape.layers, "torch bmm"


def sglang_decode(shape: PoolShape, q, kv, batch: int, context: int):
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

    splits = 16
    v = kv[..., : shape.v_dim] if shape.kind == "mla" else torch.randn_like(kv)
    o = torch.empty(batch, shape.q_heads, shape.v_dim, dtype=q.dtype, device=q.device)
    indptr = torch.arange(0, batch + 1, device=q.device, dtype=torch.int32) * context
    indices = torch.arange(batch * context, device=q.device, dtype=torch.int64)
    logits = torch.empty(batch, shape.q_heads, splits, shape.v_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(batch, shape.q_heads, splits, dtype=torch.float32, device=q.device)
    num_splits = torch.full((batch,), splits, dtype=torch.int32, device=q.device)

    def step():
        decode_attention_fwd(q, kv, v, o, indptr, indices, logits, lse, num_splits, splits, shape.head_dim**-0.5,
                             1.0, 1.0, has_mla=shape.kind == "mla")

    return step


def check_pool(shape: PoolShape, dtype: torch.dtype, args, device, copy_bw: float) -> dict:
    page_size = args.page_size
    page_bytes = (shape.layers * (1 if shape.kind == "mla" else 2) * page_size * shape.kv_heads * shape.head_dim
                  * dtype.itemsize)
    pages = max(8, int(args.pool_gib * 2**30 // page_bytes))
    buffers = make_pool(shape, dtype, pages, page_size, device)
    all_pages = torch.randperm(pages, device=device)
    sample = all_pages[:4]
    reps = 10 if device.type == "cuda" else 2

    identical = torch.equal(PageChecksummer(buffers, page_size).partials(sample),
                            page_partials_reference(buffers, sample, page_size))
    sweep = {}
    for block, warps in args.configs:
        ck = PageChecksummer(buffers, page_size, block=block, num_warps=warps)
        t = timed(lambda ck=ck: ck(all_pages), device, reps)
        sweep[f"block{block}_warps{warps}"] = pages * page_bytes / t / 1e9
    best = max(sweep, key=sweep.get)
    best_block, best_warps = (int(x) for x in best.replace("block", "").split("_warps"))
    ck = PageChecksummer(buffers, page_size, block=best_block, num_warps=best_warps)
    verify_pages = max(1, args.prefix // page_size)
    t_verify = timed(lambda: ck(all_pages[:verify_pages]), device, reps)  # one request's admission batch
    t_per_page = pages * page_bytes / (sweep[best] * 1e9) / pages
    del buffers

    t_attn, attn_impl = attention_step(shape, dtype, args.batch, args.context, device)
    # Pages checksummed per decode step, on average over a request's life: one page sealed per page_size
    # generated tokens, plus its cached prefix verified once per output_len steps.
    pages_per_step = args.batch / page_size + args.batch * (args.prefix / page_size) / args.output_len
    t_ck_step = pages_per_step * t_per_page
    step_kv_bytes = args.batch * args.context * page_bytes / page_size
    floor = step_kv_bytes / (copy_bw * 1e9 / 2)  # the step must read its KV at least once
    return {
        "pool": shape.name, "kv_dtype": "fp8_e4m3" if dtype == torch.float8_e4m3fn else "bf16",
        "layers": shape.layers, "page_size": page_size, "page_bytes": page_bytes, "pool_pages": pages,
        "pool_gb": pages * page_bytes / 1e9, "bit_identical": bool(identical),
        "kernel_gbps": sweep[best], "kernel_config": best, "sweep_gbps": sweep,
        "copy_gbps": copy_bw, "kernel_vs_copy": sweep[best] / copy_bw,
        "verify_pages": verify_pages, "verify_ms": t_verify * 1e3,
        "attention_impl": attn_impl, "attention_step_ms": t_attn * 1e3, "kv_read_floor_ms": floor * 1e3,
        "checksum_pages_per_step": pages_per_step, "checksum_ms_per_step": t_ck_step * 1e3,
        "overhead_vs_attention": t_ck_step / t_attn, "overhead_vs_kv_floor": t_ck_step / floor,
        "naive_full_pass_vs_attention": (step_kv_bytes / page_bytes) * t_per_page / t_attn,
    }


def copy_bandwidth(device, gib: float) -> float:
    n = int(gib * 2**30)
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), device, 10 if device.type == "cuda" else 3)
    return 2 * n / t / 1e9


def run(args) -> dict:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device (use --device cpu --quick for the CPU run)")
    torch.manual_seed(0)
    copy_bw = copy_bandwidth(device, args.pool_gib)
    shapes = QUICK if args.quick else POOLS
    rows = [check_pool(s, d, args, device, copy_bw) for s in shapes for d in (torch.bfloat16, torch.float8_e4m3fn)]
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
        "quick": args.quick, "batch": args.batch, "context": args.context, "prefix": args.prefix,
        "output_len": args.output_len, "copy_gbps": copy_bw,
        "goals": {"kernel_vs_copy_min": 0.8, "overhead_vs_attention_max": 0.005},
        "pools": rows,
        "all_bit_identical": all(r["bit_identical"] for r in rows),
        "min_kernel_vs_copy": min(r["kernel_vs_copy"] for r in rows),
        "max_overhead_vs_attention": max(r["overhead_vs_attention"] for r in rows),
    }
    return result


def print_table(result: dict) -> None:
    print(f"{result['device']}: copy bandwidth {result['copy_gbps']:.0f} GB/s (read + write)")
    head = (f"{'pool':<22}{'kv':<10}{'kernel GB/s':>12}{'vs copy':>9}{'verify ms':>11}{'attn ms':>10}"
            f"{'ck ms/step':>12}{'overhead':>12}{'vs floor':>12}  identical")
    print(head)
    for r in result["pools"]:
        print(f"{r['pool']:<22}{r['kv_dtype']:<10}{r['kernel_gbps']:>12.1f}{r['kernel_vs_copy']:>9.1%}"
              f"{r['verify_ms']:>11.3f}{r['attention_step_ms']:>10.3f}{r['checksum_ms_per_step']:>12.4f}"
              f"{r['overhead_vs_attention']:>12.3%}{r['overhead_vs_kv_floor']:>12.3%}  {r['bit_identical']}")
    print(f"goals: kernel >= 80% of copy ({result['min_kernel_vs_copy']:.1%}), "
          f"overhead < 0.5% of decode attention ({result['max_overhead_vs_attention']:.3%})")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="tiny pools and batch (CPU tests)")
    p.add_argument("--pool-gib", type=float, default=None, help="bytes of each pool checked (default 8, quick 0.0005)")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=None, help="decode batch (default 64, quick 2)")
    p.add_argument("--context", type=int, default=None, help="tokens per request (default 8192, quick 128)")
    p.add_argument("--prefix", type=int, default=None, help="cached prefix tokens per request (default 4096)")
    p.add_argument("--output-len", type=int, default=1024, help="generated tokens per request")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    args = p.parse_args(argv)
    q = args.quick
    args.pool_gib = args.pool_gib or (0.0005 if q else 8.0)
    args.batch = args.batch or (2 if q else 64)
    args.context = args.context or (128 if q else 8192)
    args.prefix = args.prefix or (64 if q else 4096)
    args.configs = [(256, 4)] if q else [(512, 4), (1024, 4), (2048, 8), (4096, 8)]
    if min(args.pool_gib, args.page_size, args.batch, args.context, args.output_len) <= 0:
        p.error("sizes must be positive")
    if math.gcd(args.context, args.page_size) != args.page_size:
        p.error("--context must be a multiple of --page-size")
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    result = run(args)
    print_table(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**result, "args": {k: v for k, v in vars(args).items() if k != "configs"}},
                              indent=2) + "\n")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
