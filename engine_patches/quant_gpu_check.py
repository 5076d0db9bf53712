"""One-call GPU check (< 5 min on an H200): what FP8 KV and INT4 experts buy in SGLang's own Triton kernels.

    python -m engine_patches.quant_gpu_check [--out data/calibration/quant_gpu_<gpu>.json] [--tiny]

Needs torch, triton and the sglang wheel (installed with --no-deps; no sgl-kernel, no server). Without a CUDA device
it runs tiny shapes on the CPU (TRITON_INTERPRET=1) and marks the file `"pending": true`: shapes, not figures.

Measured, each as the median of `iters` timed calls after warm-up:
- decode_attention: SGLang's Triton decode kernel (`decode_attention_fwd`, what `--attention-backend triton` runs)
  for one layer at each (ctx, bs), with a BF16 and an FP8 e4m3 KV buffer (scale folded in as SGLang does).
  Shapes per GPU at TP8: GLM-4.6 GQA (12 q heads, 1 kv head, dim 128) and Kimi K2 MLA (8 q heads, latent 512 +
  rope 64). `gbps` = KV bytes read / time; `rel_err` (FP8 rows) = |o_fp8 - o_bf16| / |o_bf16|.
- moe_gemm: SGLang's fused MoE Triton kernels (`invoke_fused_moe_kernel`: W4A16 gptq/awq kernel for INT4 group 32,
  the plain kernel for BF16) for one MoE layer's local experts (EP8) at M tokens, top-8, SwiGLU: both GEMMs and
  the activation. SGLang's default (untuned) kernel configs for both. `gbps` = expert weight bytes / time.
- fp8_kv_speedup / int4_moe_speedup: median over cases of bf16_ms / quantized_ms, per model and overall.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from engine_patches.gpu_check.timing import device_ms

ATTN_MODELS = {  # per GPU at TP8
    "glm-4.6": {"q_heads": 12, "kv_heads": 1, "k_dim": 128, "v_dim": 128, "mla": False},
    "kimi-k2": {"q_heads": 8, "kv_heads": 1, "k_dim": 576, "v_dim": 512, "mla": True},
}
MOE_MODELS = {  # local experts at EP8, hidden, moe_intermediate, top-k
    "glm-4.6": {"experts": 20, "hidden": 5120, "inter": 1536, "top_k": 8},
    "kimi-k2": {"experts": 48, "hidden": 7168, "inter": 2048, "top_k": 8},
}
FULL = {"ctx": [4096, 16384, 65536, 131072], "bs": [1, 8, 32, 64], "max_tokens": 1 << 22, "moe_m": [1, 16, 64, 256],
        "warmup": 2, "iters": 10, "kv_splits": 16}
TINY = {"ctx": [32, 64], "bs": [1, 2], "max_tokens": 64, "moe_m": [4], "warmup": 0, "iters": 1, "kv_splits": 2}
TINY_ATTN = {"glm-4.6": {"q_heads": 4, "kv_heads": 1, "k_dim": 64, "v_dim": 64, "mla": False},
             "kimi-k2": {"q_heads": 2, "kv_heads": 1, "k_dim": 288, "v_dim": 256, "mla": True}}
TINY_MOE = {"glm-4.6": {"experts": 4, "hidden": 128, "inter": 64, "top_k": 2},
            "kimi-k2": {"experts": 4, "hidden": 128, "inter": 128, "top_k": 2}}
GROUP = 32
E4M3_MAX = 448.0
PEAK_HBM_TBPS = {"H200": 4.8, "H100": 3.35}  # data/gpus.yaml; this script must run where PyYAML may be absent


def timed(fn, sizes: dict, device: torch.device) -> float:
    """Median milliseconds of `iters` calls after `warmup` calls (which also compile the kernels). On a GPU the call
    is captured in a CUDA graph, as SGLang decodes, so Python launch overhead does not count; eager if capture fails."""
    ms, mode = device_ms(fn, device, sizes["warmup"], sizes["iters"])
    if "graph capture failed" in mode:
        print(f"  ({mode})", flush=True)
    return ms


def decode_inputs(shape: dict, ctx: int, bs: int, kv: str, dtype, device, splits: int) -> dict:
    """One layer's decode batch: bs requests of ctx tokens each, scattered over the pool like real pages. The same
    seed gives the same K/V for "bf16" and "fp8"; FP8 stores K/scale and V/scale and descales by scale."""
    gen = torch.Generator(device=device).manual_seed(ctx * 31 + bs)  # generated where it is used: GBs at 128k
    tokens = ctx * bs
    k = torch.randn(tokens, shape["kv_heads"], shape["k_dim"], generator=gen, device=device) * 2.0
    v = k[..., : shape["v_dim"]] if shape["mla"] else torch.randn(tokens, shape["kv_heads"], shape["v_dim"],
                                                                   generator=gen, device=device)
    scale = float(k.abs().max()) / E4M3_MAX if kv == "fp8" else 1.0
    store = (lambda t: (t / scale).to(torch.float8_e4m3fn)) if kv == "fp8" else (lambda t: t.to(dtype))
    k_buf = store(k)
    v_buf = k_buf[..., : shape["v_dim"]] if shape["mla"] else store(v)
    del k, v
    return {
        "q": torch.randn(bs, shape["q_heads"], shape["k_dim"], generator=gen, device=device).to(dtype),
        "k_buffer": k_buf, "v_buffer": v_buf, "scale": scale, "mla": shape["mla"], "splits": splits,
        "o": torch.empty(bs, shape["q_heads"], shape["v_dim"], dtype=dtype, device=device),
        "kv_indptr": torch.arange(0, tokens + 1, ctx, dtype=torch.int32, device=device),
        "kv_indices": torch.randperm(tokens, generator=gen, device=device).to(torch.int32),
        "attn_logits": torch.empty(bs, shape["q_heads"], splits, shape["v_dim"], dtype=torch.float32, device=device),
        "attn_lse": torch.empty(bs, shape["q_heads"], splits, dtype=torch.float32, device=device),
        "num_kv_splits": torch.full((bs,), splits, dtype=torch.int32, device=device),
    }


def decode(inp: dict) -> torch.Tensor:
    """SGLang's Triton decode attention (the triton backend's call, k/v scales as its layer.k_scale_float)."""
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

    decode_attention_fwd(inp["q"], inp["k_buffer"], inp["v_buffer"], inp["o"], inp["kv_indptr"], inp["kv_indices"],
                         inp["attn_logits"], inp["attn_lse"], inp["num_kv_splits"], inp["splits"],
                         inp["q"].shape[-1] ** -0.5, inp["scale"], inp["scale"], has_mla=inp["mla"])
    return inp["o"]


def decode_case(shape: dict, ctx: int, bs: int, kv: str, dtype, device, sizes: dict, bf16_out=None):
    inp = decode_inputs(shape, ctx, bs, kv, dtype, device, sizes["kv_splits"])
    ms = timed(lambda: decode(inp), sizes, device)
    k_buf, v_buf = inp["k_buffer"], inp["v_buffer"]
    kv_bytes = k_buf.numel() * k_buf.element_size() + (0 if shape["mla"] else v_buf.numel() * v_buf.element_size())
    row = {"ctx": ctx, "bs": bs, "kv": kv, "ms": ms, "gbps": kv_bytes / ms / 1e6}
    if bf16_out is not None:
        row["rel_err"] = float((inp["o"].float() - bf16_out.float()).norm() / bf16_out.float().norm())
    return row, inp["o"].clone()


def pack_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric group-32 INT4 in the layout CompressedTensorsWNA16TritonMoE gives the kernel:
    [E, rows, in/2] uint8 (low nibble first, offset 8) and [E, rows, in/32] scales."""
    e, rows, cols = w.shape
    g = w.float().view(e, rows, cols // GROUP, GROUP)
    scale = g.abs().amax(-1).clamp_min(1e-8) / 7.5
    q = (torch.round(g / scale[..., None]).clamp(-8, 7) + 8).to(torch.uint8).view(e, rows, cols)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).contiguous(), scale.to(w.dtype)


def moe_config(m: int, experts: int) -> dict:
    """SGLang 0.5.23's default (untuned) Triton MoE config for non-FP8 kernels (get_default_config)."""
    if m <= experts:
        return {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}


def moe_cases(name: str, shape: dict, dtype, device, sizes: dict) -> list[dict]:
    from engine_patches.int4_moe.kernel import align_block_size, fused_moe

    gen = torch.Generator(device=device).manual_seed(7)
    e, k, n = shape["experts"], shape["hidden"], shape["inter"]
    w13 = (torch.randn(e, 2 * n, k, generator=gen, device=device) * 0.02).to(dtype)
    w2 = (torch.randn(e, k, n, generator=gen, device=device) * 0.02).to(dtype)
    q13, s13 = pack_int4(w13)
    q2, s2 = pack_int4(w2)
    rows = []
    for m in sizes["moe_m"]:
        x = torch.randn(m, k, generator=gen, device=device).to(dtype)
        topk_w, topk_ids = torch.rand(m, e, generator=gen, device=device).topk(shape["top_k"], dim=-1)
        topk_ids = topk_ids.to(torch.int32)
        cfg = moe_config(m, e)
        aligned = align_block_size(topk_ids, e, cfg["BLOCK_SIZE_M"])
        out = {}
        for kind, args in (("bf16", (w13, w2, None, None, 0)), ("int4", (q13, q2, s13, s2, GROUP))):
            def run(kind=kind, args=args, x=x, topk_w=topk_w, topk_ids=topk_ids, cfg=cfg, out=out, al=aligned):
                out[kind] = fused_moe(x, args[0], args[1], topk_w, topk_ids, args[2], args[3], args[4], cfg, al)

            ms = timed(run, sizes, device)
            wbytes = sum(t.numel() * t.element_size() for t in args[:4] if t is not None)
            rows.append({"model": name, "m": m, "experts": e, "hidden": k, "inter": n, "top_k": shape["top_k"],
                         "weights": kind, "ms": ms, "gbps": wbytes / ms / 1e6})
        rows[-1]["rel_err"] = float((out["int4"].float() - out["bf16"].float()).norm() / out["bf16"].float().norm())
        rows[-1]["speedup"] = rows[-2]["ms"] / rows[-1]["ms"]
    return rows


def speedups(rows: list[dict], key: str, fast: str, slow: str, group_keys: tuple[str, ...]) -> dict:
    by_model: dict[str, list[float]] = {}
    index = {tuple(r[g] for g in group_keys) + (r[key],): r for r in rows}
    for r in rows:
        if r[key] == fast:
            base = index.get(tuple(r[g] for g in group_keys) + (slow,))
            if base:
                by_model.setdefault(r["model"], []).append(base["ms"] / r["ms"])
    out = {m: statistics.median(v) for m, v in by_model.items()}
    out["overall"] = statistics.median([x for v in by_model.values() for x in v]) if by_model else None
    return out


def factors(gpu: str, attention: list[dict], moe: list[dict]) -> dict | None:
    """Efficiency factors in the flat form bench/model/step/perfmodel.py reads with --calibration (`jq .factors FILE`):
    hbm_eff = median decode-attention bandwidth at the largest batch x context / datasheet peak;
    int4_dequant_factor = INT4 / BF16 MoE time at the largest M measured (the model applies it to expert compute)."""
    peak = next((v for k, v in PEAK_HBM_TBPS.items() if k in gpu), None)
    if peak is None or not attention or not moe:
        return None
    biggest = max(r["ctx"] * r["bs"] for r in attention)
    gbps = [r["gbps"] for r in attention if r["ctx"] * r["bs"] == biggest]
    top_m = max(r["m"] for r in moe)
    ratios = [r["ms"] / next(b["ms"] for b in moe if b["model"] == r["model"] and b["m"] == top_m
                             and b["weights"] == "bf16")
              for r in moe if r["m"] == top_m and r["weights"] == "int4"]
    return {"hbm_eff": statistics.median(gbps) / (peak * 1e3), "int4_dequant_factor": statistics.median(ratios),
            "source": f"engine_patches/quant_gpu_check.py on {gpu}"}


def run_check(tiny: bool, out_path: Path | None = None, budget_s: float = 240.0) -> dict:
    cuda = torch.cuda.is_available() and not tiny
    if not cuda:  # before any Triton kernel module is imported: triton.jit reads it at decoration
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import triton
    device = torch.device("cuda" if cuda else "cpu")
    sizes = FULL if cuda else TINY
    # bf16 on the GPU; fp16 under the CPU interpreter (its tl.dot mishandles bf16)
    dtype = torch.bfloat16 if cuda else torch.float16
    attn_models, moe_models = (ATTN_MODELS, MOE_MODELS) if cuda else (TINY_ATTN, TINY_MOE)
    t0 = time.time()
    skipped: list[str] = []
    attention = []
    for name, shape in attn_models.items():
        for ctx in sizes["ctx"]:
            for bs in sizes["bs"]:
                if ctx * bs > sizes["max_tokens"]:
                    continue
                if time.time() - t0 > budget_s * 0.6:  # leave time for the MoE cases
                    skipped.append(f"decode {name} ctx {ctx} bs {bs}")
                    continue
                row, ref = decode_case(shape, ctx, bs, "bf16", dtype, device, sizes)
                attention.append({"model": name, **row})
                row, _ = decode_case(shape, ctx, bs, "fp8", dtype, device, sizes, bf16_out=ref)
                attention.append({"model": name, **row, "speedup": attention[-1]["ms"] / row["ms"]})
                print(f"decode {name} ctx {ctx} bs {bs}: bf16 {attention[-2]['ms']:.3f} ms, "
                      f"fp8 {row['ms']:.3f} ms", flush=True)
    moe = []
    for name, shape in moe_models.items():
        if time.time() - t0 > budget_s * 0.8:
            skipped.append(f"moe {name}")
            continue
        moe += moe_cases(name, shape, dtype, device, sizes)
        print(f"moe {name}: " + ", ".join(f"M={r['m']} x{r['speedup']:.2f}" for r in moe if "speedup" in r
                                          and r["model"] == name), flush=True)
    import sglang

    result = {
        "gpu": torch.cuda.get_device_name(0) if cuda else "none (CPU, TRITON_INTERPRET=1)",
        "pending": not cuda,
        "note": "tiny CPU shapes: checks the script and the JSON shape, not GPU figures" if not cuda else
                "one layer per call; SGLang Triton kernels from the sglang wheel; default (untuned) MoE configs",
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "sglang": sglang.__version__},
        "dtype": str(dtype).removeprefix("torch."),
        "decode_attention": attention,
        "moe_gemm": moe,
        "fp8_kv_speedup": speedups(attention, "kv", "fp8", "bf16", ("model", "ctx", "bs")),
        "int4_moe_speedup": speedups(moe, "weights", "int4", "bf16", ("model", "m")),
        "factors": factors(torch.cuda.get_device_name(0), attention, moe) if cuda else None,
        "wall_s": round(time.time() - t0, 1),
        "skipped_for_time": skipped,
    }
    if out_path:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="JSON file (default: data/calibration/quant_gpu_<gpu>.json)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (the CI check)")
    p.add_argument("--budget-s", type=float, default=240.0, help="skip remaining cases past this many seconds")
    args = p.parse_args(argv)
    tiny = args.tiny or not torch.cuda.is_available()
    out = args.out
    if out is None:
        tag = "cpu_tiny" if tiny else torch.cuda.get_device_name(0).lower().replace("nvidia ", "").replace(" ", "_")
        out = Path(__file__).resolve().parents[1] / "data" / "calibration" / f"quant_gpu_{tag}.json"
    result = run_check(tiny, out, args.budget_s)
    print(f"wrote {out} in {result['wall_s']} s: fp8 KV speedup {result['fp8_kv_speedup']}, "
          f"int4 MoE speedup {result['int4_moe_speedup']}")


if __name__ == "__main__":
    main()
