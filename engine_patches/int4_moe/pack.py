"""Symmetric group-wise INT4 for expert weights, in compressed-tensors' `pack-quantized` layout.

Written here rather than called from compressed-tensors: importing compressed-tensors imports transformers'
PreTrainedModel, which imports torchvision whenever it is installed, and a torchvision built for another torch
(PyPI's CUDA wheel beside a CPU torch) then kills the process. The converter needs none of that. The layout is the
one SGLang's WNA16 MoE schemes load (tests check it bit for bit against compressed-tensors' own compressor):

- scale per (row, group of `group_size` input columns) = max|w| / 7.5, stored as bf16 rounded up (never down, so
  a group's largest weight stays within the grid);
- q = round_half_even(w / scale) clamped to [-8, 7];
- `weight_packed` int32 [rows, cols / 8]: q + 8 as nibbles, column 8k + j in bits 4j..4j+3 of word k;
- `weight_shape` int64 [rows, cols].
"""

from __future__ import annotations

import torch

FP8_BLOCK = 128
IGNORE = ["lm_head", r"re:.*self_attn.*", r"re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
          r"re:.*mlp\.gate$", r"re:.*eh_proj.*", r"re:.*shared_head.*"]
_NIBBLE_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int64)


def quantization_config(group_size: int) -> dict:
    """The config.json block SGLang's CompressedTensorsConfig reads (the shape Kimi K2 Thinking ships, with our
    ignore list: attention, shared experts, dense MLPs, router, MTP projections and lm_head stay unquantized)."""
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "group_size": group_size, "strategy": "group",
               "dynamic": False, "observer": "minmax"}
    return {"config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None, "format": None}},
            "quant_method": "compressed-tensors", "kv_cache_scheme": None, "format": "pack-quantized",
            "quantization_status": "compressed", "global_compression_ratio": None, "ignore": list(IGNORE),
            "moe_sparsity_config": None}


def dequant_fp8_block(weight: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """DeepSeek-style FP8: one fp32 multiplier per 128x128 block."""
    rows, cols = weight.shape
    s = scale_inv.float().repeat_interleave(FP8_BLOCK, 0)[:rows].repeat_interleave(FP8_BLOCK, 1)[:, :cols]
    return weight.float() * s


def bf16_round_up(x: torch.Tensor) -> torch.Tensor:
    """Positive fp32 scales to bf16, never downwards: a scale rounded down would push a group's max past +7.5
    steps, where the symmetric INT4 grid (-8..7) clamps it by more than half a step."""
    y = x.to(torch.bfloat16)
    up = (y.view(torch.int16) + 1).view(torch.bfloat16)
    return torch.where(y.float() < x, up, y)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """int values in [-8, 7], [..., cols] -> int32 [..., cols / 8]."""
    u = (q.to(torch.int64) + 8).unflatten(-1, (-1, 8))
    words = (u << _NIBBLE_SHIFTS).sum(-1)  # disjoint bits: the sum is the bitwise or
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def quantize(weight: torch.Tensor, group_size: int) -> tuple[dict[str, torch.Tensor], float, float]:
    """One expert projection [rows, cols] -> ({weight_packed, weight_scale, weight_shape}, squared error, squared
    norm). The error is that of the stored (packed, bf16-scaled) values against `weight` in fp32."""
    w = weight.float()
    if w.ndim != 2 or w.shape[1] % group_size:
        raise ValueError(f"expert weight of shape {tuple(w.shape)}: in_features must be a multiple of {group_size}")
    groups = w.unflatten(-1, (-1, group_size))
    amax = groups.abs().amax(-1, keepdim=True)
    scale = bf16_round_up(torch.clamp(amax / 7.5, min=torch.finfo(torch.bfloat16).tiny)).float()
    q = torch.clamp(torch.round(groups / scale), -8, 7)
    err = (q * scale - groups).square().sum()
    return ({"weight_packed": _pack_nibbles(q.flatten(-2)), "weight_scale": scale.squeeze(-1).to(torch.bfloat16),
             "weight_shape": torch.tensor(w.shape)}, float(err), float(w.square().sum()))
