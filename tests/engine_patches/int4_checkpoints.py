"""Tiny synthetic safetensors checkpoints shaped like GLM-4.x (BF16) and Kimi K2 (FP8 block-128), for tests."""

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, MOE_INTER, DENSE_INTER, EXPERTS, LAYERS, VOCAB = 256, 128, 256, 4, 3, 96


def _w(gen, out_f, in_f):
    return torch.randn(out_f, in_f, generator=gen) * 0.02


def _fp8_block(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-style: per 128x128 block, scale_inv = amax / 448, weight = w / scale_inv in e4m3."""
    rows, cols = w.shape
    br, bc = math.ceil(rows / 128), math.ceil(cols / 128)
    scale = torch.zeros(br, bc)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(br):
        for j in range(bc):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            s = blk.abs().max() / 448.0
            scale[i, j] = s
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (blk / s).to(torch.float8_e4m3fn)
    return q, scale


def make_checkpoint(root: Path, kind: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """kind: "glm" (BF16, Glm4MoeForCausalLM naming) or "kimi-fp8" (DeepseekV3 naming, FP8 block-128).
    Two shards, plus tokenizer files. Returns the full-precision (fp32) weights by name."""
    gen = torch.Generator().manual_seed(seed)
    root.mkdir(parents=True, exist_ok=True)
    weights: dict[str, torch.Tensor] = {"model.embed_tokens.weight": _w(gen, VOCAB, HIDDEN),
                                        "model.norm.weight": torch.ones(HIDDEN),
                                        "lm_head.weight": _w(gen, VOCAB, HIDDEN)}
    attn = (["q_proj", "k_proj", "v_proj", "o_proj"] if kind == "glm"
            else ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"])
    for n in range(LAYERS):
        p = f"model.layers.{n}."
        weights[p + "input_layernorm.weight"] = torch.ones(HIDDEN)
        for a in attn:
            weights[p + f"self_attn.{a}.weight"] = _w(gen, HIDDEN, HIDDEN)
        if n == 0:  # first dense layer
            for proj, shape in (("gate_proj", (DENSE_INTER, HIDDEN)), ("up_proj", (DENSE_INTER, HIDDEN)),
                                ("down_proj", (HIDDEN, DENSE_INTER))):
                weights[p + f"mlp.{proj}.weight"] = _w(gen, *shape)
            continue
        weights[p + "mlp.gate.weight"] = _w(gen, EXPERTS, HIDDEN)
        for owner in [f"experts.{e}" for e in range(EXPERTS)] + ["shared_experts"]:
            for proj, shape in (("gate_proj", (MOE_INTER, HIDDEN)), ("up_proj", (MOE_INTER, HIDDEN)),
                                ("down_proj", (HIDDEN, MOE_INTER))):
                w = _w(gen, *shape)
                if owner == "experts.1" and proj == "up_proj":
                    w[3, 17] = 0.5  # an outlier the group scale has to absorb
                weights[p + f"mlp.{owner}.{proj}.weight"] = w
    stored: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        if kind == "kimi-fp8" and w.ndim == 2 and "layers." in name and not name.endswith("mlp.gate.weight"):
            q, s = _fp8_block(w)
            stored[name], stored[name + "_scale_inv"] = q, s
            full = s.repeat_interleave(128, 0)[: w.shape[0]].repeat_interleave(128, 1)[:, : w.shape[1]]
            weights[name] = q.float() * full
        else:
            stored[name] = w.to(torch.bfloat16)
            weights[name] = stored[name].float()
    # two shards: layer 2 and lm_head in the second; one FP8 scale kept apart from its weight
    second = {k for k in stored if k.startswith("model.layers.2.") or k.startswith("lm_head")}
    if kind == "kimi-fp8":
        second.add("model.layers.1.mlp.experts.2.down_proj.weight_scale_inv")
    shards = {"model-00001-of-00002.safetensors": {k: v for k, v in stored.items() if k not in second},
              "model-00002-of-00002.safetensors": {k: v for k, v in stored.items() if k in second}}
    for fname, tensors in shards.items():
        save_file(tensors, root / fname, metadata={"format": "pt"})
    index = {"metadata": {"total_size": sum(v.numel() * v.element_size() for v in stored.values())},
             "weight_map": {k: f for f, ts in shards.items() for k in ts}}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {"architectures": ["Glm4MoeForCausalLM" if kind == "glm" else "DeepseekV3ForCausalLM"],
              "model_type": "glm4_moe" if kind == "glm" else "kimi_k2", "hidden_size": HIDDEN,
              "moe_intermediate_size": MOE_INTER, "n_routed_experts": EXPERTS, "num_hidden_layers": LAYERS,
              "first_k_dense_replace": 1, "torch_dtype": "bfloat16"}
    if kind == "kimi-fp8":
        config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                         "weight_block_size": [128, 128]}
    (root / "config.json").write_text(json.dumps(config))
    (root / "tokenizer.json").write_text('{"model": "tiny"}')
    (root / "generation_config.json").write_text('{"temperature": 0.6}')
    return weights
