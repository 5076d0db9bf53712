"""FP8 block-128 and NVFP4 expert weights in the layouts SGLang 0.5.23 loads, and INT4 input unpacked again.

- FP8 block-128 (DeepSeek-style, `quant_method: fp8`, `weight_block_size: [128, 128]`, read by layers/quantization/
  fp8.py): `weight` float8_e4m3fn and `weight_scale_inv` fp32 [ceil(rows/128), ceil(cols/128)], one multiplier per
  block = amax / 448, so weight * scale_inv is the value.
- NVFP4 weight-only (compressed-tensors `nvfp4-pack-quantized`, group 16, strategy tensor_group, no input
  activations: CompressedTensorsW4A16Nvfp4MoE): `weight_packed` uint8 [rows, cols/2] holding E2M1 codes (sign in
  bit 3, magnitude index of 0, .5, 1, 1.5, 2, 3, 4, 6), the even column in the low nibble; `weight_scale`
  float8_e4m3fn [rows, cols/16]; `weight_global_scale` fp32 [1], a divisor: value = e2m1 * weight_scale /
  global_scale, global_scale = 448 * 6 / amax. SGLang needs one global scale for an expert's gate and up
  (compressed_tensors_w4a16_nvfp4_moe.py refuses them apart), so both are quantised against their joint amax.
  The layout is compressed-tensors' own (tests check it against its unpack_fp4_from_uint8).
"""

from __future__ import annotations

import math

import torch

FP8_MAX = 448.0
FP4_MAX = 6.0
NVFP4_GROUP = 16
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_INT4_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int64)


def quantize_fp8_block(weight: torch.Tensor, block: int = 128) -> tuple[dict[str, torch.Tensor], float, float]:
    """[rows, cols] -> ({weight, weight_scale_inv}, squared error, squared norm) of the stored values."""
    w = weight.float()
    rows, cols = w.shape
    br, bc = math.ceil(rows / block), math.ceil(cols / block)
    padded = torch.zeros(br * block, bc * block)
    padded[:rows, :cols] = w
    blocks = padded.view(br, block, bc, block)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.clamp(amax / FP8_MAX, min=torch.finfo(torch.float32).tiny)
    full = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)[:rows, :cols]
    q = (w / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    err = (q.float() * full - w).square().sum()
    return {"weight": q, "weight_scale_inv": scale}, float(err), float(w.square().sum())


def nvfp4_global_scale(amax: float) -> torch.Tensor:
    return torch.tensor([FP8_MAX * FP4_MAX / max(amax, torch.finfo(torch.float32).tiny)], dtype=torch.float32)


def _to_e2m1_index(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 code (ties to the even code, as compressed-tensors' cast_to_fp4 thresholds do)."""
    mag = x.abs().clamp(max=FP4_MAX)
    idx = (mag.unsqueeze(-1) - _E2M1).abs().argmin(-1)
    # the thresholds of cast_to_fp4: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4
    for tie, lower in ((0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6)):
        idx = torch.where(mag == tie, torch.tensor(lower), idx)
    return idx.to(torch.uint8) | (torch.signbit(x).to(torch.uint8) << 3)


def quantize_nvfp4(weight: torch.Tensor, amax: float | None = None) -> tuple[dict[str, torch.Tensor], float, float]:
    """[rows, cols] -> ({weight_packed, weight_scale, weight_global_scale}, squared error, squared norm); amax: the
    joint amax its global scale is taken from (gate and up of one expert share it), else its own."""
    w = weight.float()
    rows, cols = w.shape
    if cols % NVFP4_GROUP:
        raise ValueError(f"expert weight of shape {tuple(w.shape)}: in_features must be a multiple of {NVFP4_GROUP}")
    gs = nvfp4_global_scale(float(w.abs().max()) if amax is None else amax)
    groups = w.view(rows, cols // NVFP4_GROUP, NVFP4_GROUP)
    scale = (groups.abs().amax(-1) / FP4_MAX * gs).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
    step = scale.float() / gs
    codes = _to_e2m1_index(torch.where(step.unsqueeze(-1) > 0, groups / step.unsqueeze(-1).clamp(min=1e-30),
                                       torch.zeros_like(groups)))
    values = _E2M1[(codes & 7).long()] * torch.where(codes >= 8, -1.0, 1.0)
    err = (values * step.unsqueeze(-1) - groups).square().sum()
    flat = codes.view(rows, cols)
    packed = flat[:, 0::2] | (flat[:, 1::2] << 4)
    return ({"weight_packed": packed.contiguous(), "weight_scale": scale, "weight_global_scale": gs}, float(err),
            float(w.square().sum()))


def dequant_nvfp4(packed: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    rows = packed.shape[0]
    codes = torch.stack([packed & 15, packed >> 4], -1).view(rows, -1)
    values = _E2M1[(codes & 7).long()] * torch.where(codes >= 8, -1.0, 1.0)
    step = (scale.float() / global_scale.float()).repeat_interleave(NVFP4_GROUP, 1)
    return values * step


def dequant_int4(packed: torch.Tensor, scale: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
    """compressed-tensors pack-quantized INT4 (pack.py's layout) back to fp32 [rows, cols]."""
    rows, cols = (int(x) for x in shape.tolist())
    words = packed.to(torch.int64) & 0xFFFFFFFF
    q = ((words.unsqueeze(-1) >> _INT4_SHIFTS) & 15).view(rows, -1)[:, :cols] - 8
    group = cols // scale.shape[1]
    return q.float() * scale.float().repeat_interleave(group, 1)


def nvfp4_config(ignore: list[str]) -> dict:
    """config.json's quantization_config for weight-only NVFP4 experts (CompressedTensorsConfig reads it)."""
    weights = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": NVFP4_GROUP,
               "strategy": "tensor_group", "dynamic": False, "observer": "minmax"}
    return {"config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None, "format": "nvfp4-pack-quantized"}},
            "quant_method": "compressed-tensors", "kv_cache_scheme": None, "format": "nvfp4-pack-quantized",
            "quantization_status": "compressed", "global_compression_ratio": None, "ignore": list(ignore),
            "moe_sparsity_config": None}


# Non-expert modules an FP8-experts checkpoint keeps in BF16 (Fp8Config ignored_layers: module-path matches)
FP8_IGNORED = ["lm_head", "self_attn", "shared_experts", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "mlp.gate",
               "eh_proj", "shared_head"]


def fp8_block_config() -> dict:
    return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
            "ignored_layers": list(FP8_IGNORED)}
