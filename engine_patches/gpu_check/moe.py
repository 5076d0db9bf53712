"""One MoE layer's local experts (EP8) at M tokens, top-8, SwiGLU, both GEMMs: INT4 W4A16 group 32 on Marlin (0.5.23's
default on Hopper: CompressedTensorsWNA16MoE -> fused_marlin_moe) and on Triton (`--moe-runner-backend triton`:
invoke_fused_moe_kernel's W4A16 kernel), and BF16 on the same Triton kernel. Weights are random: timing only
(the Triton INT4 path's accuracy is tested in tests/engine_patches/test_int4_moe.py).

The Marlin call follows SGLang's scheme (weights in its transposed packed layout [E, K/8, N], repacked by
gptq_marlin_moe_repack, scales permuted by marlin_moe_permute_scales); it needs sgl-kernel, absent on the machines
this was written on, so it has not run yet: without sgl-kernel it fails by name."""

from __future__ import annotations

import torch

from engine_patches.gpu_check.kernels import load
from engine_patches.quant_gpu_check import GROUP, moe_config, pack_int4


def shape_label(model: str, shape: dict, m: int, weights: str) -> str:
    return (f"{model} {shape['experts']} experts x ({shape['hidden']} -> 2x{shape['inter']} -> {shape['hidden']}), "
            f"top-{shape['top_k']}, M {m}, {weights}")


def routing(m: int, shape: dict, dtype, device, seed: int = 7):
    gen = torch.Generator(device=device).manual_seed(seed + m)
    x = torch.randn(m, shape["hidden"], generator=gen, device=device).to(dtype)
    logits = torch.rand(m, shape["experts"], generator=gen, device=device)
    topk_w, topk_ids = logits.topk(shape["top_k"], dim=-1)
    return x, logits, topk_w, topk_ids.to(torch.int32)


def triton_call(shape: dict, m: int, weights: str, dtype, device):
    """(call, kernel label) for BF16 or INT4 W4A16 experts on SGLang's Triton fused MoE kernel."""
    load("triton_moe")
    from engine_patches.int4_moe.kernel import align_block_size, fused_moe

    gen = torch.Generator(device=device).manual_seed(11)
    e, k, n = shape["experts"], shape["hidden"], shape["inter"]
    w13 = (torch.randn(e, 2 * n, k, generator=gen, device=device) * 0.02).to(dtype)
    w2 = (torch.randn(e, k, n, generator=gen, device=device) * 0.02).to(dtype)
    scales = (None, None, 0)
    if weights == "int4":
        (w13, s13), (w2, s2) = pack_int4(w13), pack_int4(w2)
        scales = (s13, s2, GROUP)
    x, _, topk_w, topk_ids = routing(m, shape, dtype, device)
    cfg = moe_config(m, e)
    aligned = align_block_size(topk_ids, e, cfg["BLOCK_SIZE_M"])  # host sync: outside the timed call
    label = "sglang triton invoke_fused_moe_kernel" + (" (W4A16 g32)" if weights == "int4" else " (bf16)")
    return (lambda: fused_moe(x, w13, w2, topk_w, topk_ids, *scales, cfg, aligned)), label


def marlin_call(shape: dict, m: int, dtype, device):
    """(call, kernel label) for INT4 W4A16 g32 experts on SGLang's Marlin MoE (its Hopper default)."""
    fused_marlin_moe = load("marlin_moe")
    repack = load("marlin_repack")
    permute_scales = load("marlin_utils")
    from sglang.srt.layers.quantization.marlin_utils import marlin_make_workspace

    e, k, n = shape["experts"], shape["hidden"], shape["inter"]
    gen = torch.Generator(device=device).manual_seed(13)

    def packed(rows_in: int, cols_out: int) -> torch.Tensor:  # [E, K/8, N] int32: 8 INT4 values a word
        return torch.randint(-2**31, 2**31 - 1, (e, rows_in // 8, cols_out), generator=gen, device=device,
                             dtype=torch.int32)

    empty = torch.empty((e, 0), dtype=torch.int32, device=device)
    w13 = repack(packed(k, 2 * n), empty, k, 2 * n, 4)
    w2 = repack(packed(n, k), empty, n, k, 4)
    s13 = permute_scales((torch.rand(e, k // GROUP, 2 * n, generator=gen, device=device) * 0.01).to(dtype), k, 2 * n,
                         GROUP)
    s2 = permute_scales((torch.rand(e, n // GROUP, k, generator=gen, device=device) * 0.01).to(dtype), n, k, GROUP)
    workspace = marlin_make_workspace(device, 4)
    x, logits, topk_w, topk_ids = routing(m, shape, dtype, device)
    return (lambda: fused_marlin_moe(x, w13, w2, s13, s2, logits, topk_w, topk_ids, global_num_experts=e,
                                     g_idx1=empty, g_idx2=empty, sort_indices1=empty, sort_indices2=empty,
                                     workspace=workspace, num_bits=4, is_k_full=True)), \
        "sglang fused_marlin_moe (W4A16 g32, Marlin)"


def weight_bytes(shape: dict, weights: str) -> int:
    params = shape["experts"] * 3 * shape["hidden"] * shape["inter"]
    return params // 2 + params // GROUP * 2 if weights == "int4" else params * 2
