"""Let GLM-4.x (MHA) and Kimi K2 / DeepSeek-V3 (MLA) load per-layer FP8 KV scales, and make FP8 MLA writes and
reads use them on every attention backend that keeps them (data/attention_backends.yaml).

SGLang 0.5.23 calls `model.load_kv_cache_scales(path)` after loading weights when `--kv-cache-dtype fp8_e4m3`
and `--quantization-param-path` are given, and raises if the model lacks the method: glm4_moe.py and
deepseek_v2.py lack it. We add it.

- MHA (GLM): the scales go on each layer's RadixAttention (`k_scale`/`v_scale` tensors, `*_scale_float`), which
  the MHA pool divides by on write and fa3, flashinfer, triton and trtllm_mha descale by on read.
- MLA (Kimi): one scale per layer on `attn_mqa` (the absorbed attention), also tagged for backends.py. The MLA
  pool's `set_mla_kv_buffer` (fa3's and flashinfer's MLA writes, and the MHA-prefill path that writes the latent
  through `attn_mha`) casts to FP8 with no scale: we make it divide by the layer's scale, and make
  `get_mla_kv_buffer` (the MHA-prefill read of cached prefix chunks) multiply it back. triton divides and descales
  by itself; what fa3, flashinfer, flashmla and trtllm_mla leave out is done in backends.py.
"""

from __future__ import annotations

import logging

import torch

from engine_patches.fp8_scales import backends, draft
from engine_patches.fp8_scales.scales_file import read_draft_scales, read_kv_scales

logger = logging.getLogger(__name__)

# layer -> scale, for the MLA pool's write/read paths; filled by DeepseekV2's load_kv_cache_scales in this process.
# Keyed by draft.layer_id: an MTP draft layer by its checkpoint layer, so it never takes the target's layer 0.
MLA_SCALES: dict[int, float] = {}


def set_attention_scales(attn, k_scale: float, v_scale: float, device: torch.device) -> None:
    """Scales on a RadixAttention: tensors for the pool and fa3, floats for the triton kernels."""
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        current = getattr(attn, name, None)
        if isinstance(current, torch.Tensor):
            current.data.fill_(value)
        else:
            current = torch.tensor(value, dtype=torch.float32, device=device)
            setattr(attn, name, current)
        setattr(attn, f"{name}_float", float(current))  # the fp32 value the pool divides by, so reads match writes


def _tp_layout(model) -> tuple[int, int]:
    from sglang.srt.layers.linear import resolve_linear_parallel_group

    try:
        return resolve_linear_parallel_group("tp")
    except Exception:  # outside a running engine (tests): a single rank
        return 0, 1


def _device(model) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _attention_modules(model, scales: dict, attr: str, path: str):
    """(layer, attention module, (k_scale, v_scale)) of each decoder layer this rank holds that has a scale.
    A NextN draft model (Glm4MoeForCausalLMNextN, DeepseekV3ForCausalLMNextN: they inherit the loader) has one
    `model.decoder` whose attention SGLang numbers 0; it takes the scale recorded for its checkpoint layer
    (draft.py), or keeps 1.0."""
    inner = model.model
    draft_layer = draft.draft_layer_id(model)
    if draft_layer is not None:
        draft.tag(model)
        scales = read_draft_scales(path)
        layers = [inner.decoder]
    else:
        layers = list(inner.layers)
    for layer in layers:
        if not hasattr(layer, "self_attn"):  # PPMissingLayer on other pipeline ranks
            continue
        attn = getattr(layer.self_attn, attr)
        key = draft.layer_id(attn)
        if key in scales:
            yield key, attn, scales[key]
        elif draft_layer is not None:
            logger.warning("capbench: the calibration run recorded no MTP draft layer %d; it keeps scale 1.0", key)
        else:
            logger.warning("capbench: no FP8 KV scale for layer %d; it keeps scale 1.0", key)


def glm4_moe_load_kv_cache_scales(self, quantization_param_path: str) -> None:
    tp_rank, tp_size = _tp_layout(self)
    scales = read_kv_scales(quantization_param_path, tp_rank, tp_size, self.config.num_hidden_layers, None)
    device = _device(self)
    for _, attn, (k, v) in _attention_modules(self, scales, "attn", quantization_param_path):
        set_attention_scales(attn, k, v, device)
    logger.info("capbench: loaded FP8 KV scales for %d MHA layers from %s", len(scales), quantization_param_path)


def deepseek_v2_load_kv_cache_scales(self, quantization_param_path: str) -> None:
    tp_rank, tp_size = _tp_layout(self)
    scales = read_kv_scales(quantization_param_path, tp_rank, tp_size, self.config.num_hidden_layers, None)
    device = _device(self)
    for layer_id, attn, kv in _attention_modules(self, scales, "attn_mqa", quantization_param_path):
        s = max(kv)  # one cached row (latent | rope), one descale in the kernels
        set_attention_scales(attn, s, s, device)
        setattr(attn, backends.SCALE_ATTR, s)
        MLA_SCALES[layer_id] = s
    logger.info("capbench: loaded FP8 KV scales for %d MLA layers from %s", len(scales), quantization_param_path)


def install_mla_pool_scaling() -> None:
    """FP8 MLA pool: divide by the layer's scale in set_mla_kv_buffer, multiply back in get_mla_kv_buffer."""
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    orig_set = MLATokenToKVPool.set_mla_kv_buffer
    orig_get = MLATokenToKVPool.get_mla_kv_buffer

    def set_mla_kv_buffer(self, layer, loc_info, cache_k_nope, cache_k_rope, layer_id_override=None):
        s = MLA_SCALES.get(draft.layer_id(layer, layer_id_override))
        if s is not None and s != 1.0 and self.dtype != cache_k_nope.dtype and not self.use_dsa:
            cache_k_nope = cache_k_nope / s
            if cache_k_rope is not None and cache_k_rope.numel() > 0:
                cache_k_rope = cache_k_rope / s
        return orig_set(self, layer, loc_info, cache_k_nope, cache_k_rope, layer_id_override=layer_id_override)

    def get_mla_kv_buffer(self, layer, loc, dst_dtype=None):
        nope, rope = orig_get(self, layer, loc, dst_dtype)
        s = MLA_SCALES.get(draft.layer_id(layer))
        if s is not None and s != 1.0 and self.dtype != (dst_dtype or self.dtype) and not self.use_dsa:
            nope = nope * s
            rope = rope * s if rope is not None else None
        return nope, rope

    MLATokenToKVPool.set_mla_kv_buffer = set_mla_kv_buffer
    MLATokenToKVPool.get_mla_kv_buffer = get_mla_kv_buffer


def install() -> None:
    """Give the two model classes their loader and the MLA pool its scaled write/read (this process)."""
    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM
    from sglang.srt.models.glm4_moe import Glm4MoeForCausalLM

    draft.install_tagging()  # the MLA pool looks a draft layer's scale up by its checkpoint layer
    Glm4MoeForCausalLM.load_kv_cache_scales = glm4_moe_load_kv_cache_scales
    DeepseekV2ForCausalLM.load_kv_cache_scales = deepseek_v2_load_kv_cache_scales  # DeepseekV3 inherits it
    install_mla_pool_scaling()
    backends.install()
