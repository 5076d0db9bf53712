"""Run SGLang's fused MoE Triton kernels (`invoke_fused_moe_kernel`: the INT4 W4A16 gptq/awq kernel, or the BF16
one) without the CUDA-only sgl-kernel package: the token/expert alignment, done by sgl-kernel in SGLang, is done
here in torch. Used by the CPU tests (TRITON_INTERPRET=1) and by the GPU check, where only the sglang wheel is
present.

Weight layouts are the ones SGLang's CompressedTensorsWNA16TritonMoE produces from a compressed-tensors checkpoint:
w13 [E, 2N, K/2] uint8 (gate rows then up rows, two INT4 values a byte, low nibble first, offset 8), w2 [E, K, N/2],
scales [E, rows, in/group].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DEFAULT_CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}


def align_block_size(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """SGLang's moe_align_block_size contract: slots (token*top_k + j) sorted by expert, each expert's run padded
    to a multiple of block_m with the sentinel topk_ids.numel(); one expert id per block of block_m slots."""
    flat = topk_ids.flatten().long()
    sentinel = flat.numel()
    slots, experts = [], []
    for e in range(num_experts):
        idx = (flat == e).nonzero().flatten()
        if idx.numel() == 0:
            continue
        pad = (-idx.numel()) % block_m
        slots.append(torch.cat([idx, torch.full((pad,), sentinel, dtype=torch.long, device=flat.device)]))
        experts += [e] * ((idx.numel() + pad) // block_m)
    sorted_ids = torch.cat(slots).to(torch.int32)
    expert_ids = torch.tensor(experts, dtype=torch.int32, device=flat.device)
    return sorted_ids, expert_ids, torch.tensor([sorted_ids.numel()], dtype=torch.int32, device=flat.device)


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    group_size: int = 0,
    config: dict | None = None,
    aligned: tuple | None = None,
) -> torch.Tensor:
    """SwiGLU MoE forward with SGLang's kernels: INT4 W4A16 when scales are given, else plain (bf16/fp16).
    `aligned`: align_block_size's result, precomputed (it syncs with the host; keep it out of timed loops)."""
    import triton.language as tl
    from sglang.kernels.ops.moe.fused_moe_triton_kernels import invoke_fused_moe_kernel

    config = config or DEFAULT_CONFIG
    int4 = w13_scale is not None
    tokens, top_k = topk_ids.shape
    num_experts, two_n = w13.shape[0], w13.shape[1]
    compute_type = tl.float16 if x.dtype == torch.float16 else tl.bfloat16
    sorted_ids, expert_ids, n_post_pad = aligned or align_block_size(topk_ids, num_experts, config["BLOCK_SIZE_M"])
    quant = {"use_fp8_w8a8": False, "use_int8_w8a8": False, "use_int8_w8a16": False, "use_int4_w4a16": int4,
             "per_channel_quant": False, "block_shape": [0, group_size] if int4 else None}
    up = torch.empty(tokens, top_k, two_n, dtype=x.dtype, device=x.device)
    invoke_fused_moe_kernel(x, w13, None, up, None, w13_scale, None, topk_weights, topk_ids, sorted_ids, expert_ids,
                            n_post_pad, False, top_k, config, compute_type, **quant)
    gate, lin = up.view(-1, two_n).float().chunk(2, dim=-1)
    act = (F.silu(gate) * lin).to(x.dtype)
    down = torch.empty(tokens, top_k, w2.shape[1], dtype=x.dtype, device=x.device)
    invoke_fused_moe_kernel(act, w2, None, down, None, w2_scale, None, topk_weights, topk_ids, sorted_ids, expert_ids,
                            n_post_pad, True, 1, config, compute_type, **quant)
    return down.float().sum(dim=1).to(x.dtype)


def reference_moe(x, gate, up, down, topk_weights, topk_ids) -> torch.Tensor:
    """fp32 reference from dequantized per-expert weights [E, N, K], [E, N, K], [E, K, N]."""
    xf = x.float()
    out = torch.zeros(xf.shape, dtype=torch.float32, device=x.device)
    for j in range(topk_ids.shape[1]):
        for e in topk_ids[:, j].unique().tolist():
            rows = (topk_ids[:, j] == e).nonzero().flatten()
            h = F.silu(xf[rows] @ gate[e].float().T) * (xf[rows] @ up[e].float().T)
            out[rows] += topk_weights[rows, j, None].float() * (h @ down[e].float().T)
    return out
