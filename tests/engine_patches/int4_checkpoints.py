"""Tiny synthetic safetensors checkpoints shaped like GLM-4.x (BF16) and Kimi K2 / DeepSeek-V3 (FP8 block-128),
complete enough for SGLang 0.5.23's Glm4MoeForCausalLM / DeepseekV3ForCausalLM to build and load them at tp 8
(8 attention heads, 8 routed experts, expert intermediate 256: 32 rows per rank, one g32 group)."""

import fcntl
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, MOE_INTER, DENSE_INTER, EXPERTS, LAYERS, VOCAB, HEADS = 256, 256, 512, 8, 3, 1024, 8
GLM_KV_HEADS, HEAD_DIM = 2, 32
Q_LORA, KV_LORA, ROPE, NOPE, V_DIM = 64, 64, 16, 32, 32


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


def _attention(gen, kind: str) -> dict[str, torch.Tensor]:
    if kind == "glm":
        q, kv = HEADS * HEAD_DIM, GLM_KV_HEADS * HEAD_DIM
        return {"q_proj.weight": _w(gen, q, HIDDEN), "q_proj.bias": torch.randn(q, generator=gen) * 0.02,
                "k_proj.weight": _w(gen, kv, HIDDEN), "k_proj.bias": torch.randn(kv, generator=gen) * 0.02,
                "v_proj.weight": _w(gen, kv, HIDDEN), "v_proj.bias": torch.randn(kv, generator=gen) * 0.02,
                "o_proj.weight": _w(gen, HIDDEN, q)}
    return {"q_a_proj.weight": _w(gen, Q_LORA, HIDDEN), "q_a_layernorm.weight": torch.ones(Q_LORA),
            "q_b_proj.weight": _w(gen, HEADS * (NOPE + ROPE), Q_LORA),
            "kv_a_proj_with_mqa.weight": _w(gen, KV_LORA + ROPE, HIDDEN),
            "kv_a_layernorm.weight": torch.ones(KV_LORA), "kv_b_proj.weight": _w(gen, HEADS * (NOPE + V_DIM), KV_LORA),
            "o_proj.weight": _w(gen, HIDDEN, HEADS * V_DIM)}


def config(kind: str, moe_inter: int = MOE_INTER) -> dict:
    common = {"hidden_size": HIDDEN, "intermediate_size": DENSE_INTER, "moe_intermediate_size": moe_inter,
              "n_routed_experts": EXPERTS, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1,
              "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "first_k_dense_replace": 1,
              "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "vocab_size": VOCAB,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    if kind == "glm":
        return {**common, "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
                "num_key_value_heads": GLM_KV_HEADS, "head_dim": HEAD_DIM, "partial_rotary_factor": 0.5,
                "attention_bias": True, "use_qk_norm": False, "num_nextn_predict_layers": 0}
    return {**common, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "num_key_value_heads": HEADS, "moe_layer_freq": 1, "q_lora_rank": Q_LORA, "kv_lora_rank": KV_LORA,
            "qk_rope_head_dim": ROPE,
            "qk_nope_head_dim": NOPE, "v_head_dim": V_DIM, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
            "num_nextn_predict_layers": 0, "rope_scaling": {  # Kimi K2's yarn, scaled down
                "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "beta_fast": 1.0,
                "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}, "quantization_config": {
                "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}}


def make_checkpoint(root: Path, kind: str, seed: int = 0, moe_inter: int = MOE_INTER) -> dict[str, torch.Tensor]:
    """kind: "glm" (BF16, Glm4MoeForCausalLM naming) or "kimi-fp8" (DeepseekV3 naming, FP8 block-128).
    Two shards, plus tokenizer files. Returns the full-precision (fp32) weights by name. moe_inter: the expert
    intermediate size (1024 gives 128 rows per rank at tp 8, what FP8 blocks and NVFP4 Marlin tiles need)."""
    gen = torch.Generator().manual_seed(seed)
    root.mkdir(parents=True, exist_ok=True)
    weights: dict[str, torch.Tensor] = {"model.embed_tokens.weight": _w(gen, VOCAB, HIDDEN),
                                        "model.norm.weight": torch.ones(HIDDEN),
                                        "lm_head.weight": _w(gen, VOCAB, HIDDEN)}
    for n in range(LAYERS):
        p = f"model.layers.{n}."
        weights[p + "input_layernorm.weight"] = torch.ones(HIDDEN)
        weights[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN)
        weights.update({p + "self_attn." + k: v for k, v in _attention(gen, kind).items()})
        if n == 0:  # first dense layer
            for proj, shape in (("gate_proj", (DENSE_INTER, HIDDEN)), ("up_proj", (DENSE_INTER, HIDDEN)),
                                ("down_proj", (HIDDEN, DENSE_INTER))):
                weights[p + f"mlp.{proj}.weight"] = _w(gen, *shape)
            continue
        weights[p + "mlp.gate.weight"] = _w(gen, EXPERTS, HIDDEN)
        weights[p + "mlp.gate.e_score_correction_bias"] = torch.zeros(EXPERTS)
        for owner in [f"experts.{e}" for e in range(EXPERTS)] + ["shared_experts"]:
            for proj, shape in (("gate_proj", (moe_inter, HIDDEN)), ("up_proj", (moe_inter, HIDDEN)),
                                ("down_proj", (HIDDEN, moe_inter))):
                w = _w(gen, *shape)
                if owner == "experts.1" and proj == "up_proj":
                    w[3, 17] = 0.5  # an outlier the group scale has to absorb
                weights[p + f"mlp.{owner}.{proj}.weight"] = w
    stored: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        fp8 = kind == "kimi-fp8" and w.ndim == 2 and "layers." in name and not name.endswith("mlp.gate.weight")
        if fp8:
            q, s = _fp8_block(w)
            stored[name], stored[name + "_scale_inv"] = q, s
            full = s.repeat_interleave(128, 0)[: w.shape[0]].repeat_interleave(128, 1)[:, : w.shape[1]]
            weights[name] = q.float() * full
        elif name.endswith("e_score_correction_bias"):
            stored[name] = w  # fp32, as shipped
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
    (root / "config.json").write_text(json.dumps(config("glm" if kind == "glm" else "kimi", moe_inter)))
    (root / "tokenizer.json").write_text('{"model": "tiny"}')
    (root / "generation_config.json").write_text('{"temperature": 0.6}')
    return weights


def code_hash(*extra: Path) -> str:
    """What decides what a cached checkpoint holds: this module, the converter, torch's and SGLang's versions."""
    from importlib.metadata import version

    files = [Path(__file__), *sorted((Path(__file__).parents[2] / "engine_patches" / "int4_moe").glob("*.py")),
             *extra]
    versions = " ".join(version(p) for p in ("torch", "safetensors", "sglang")).encode()
    return hashlib.sha256(b"".join(f.read_bytes() for f in files) + versions).hexdigest()[:16]


def cached_checkpoint(kind: str, chain: tuple[str, ...] = (), moe_inter: int = MOE_INTER, group_size: int = 32,
                      tp: int = 8) -> Path:
    """make_checkpoint(kind, moe_inter=moe_inter), then `convert` through each format of chain in turn, built once
    per test run and shared by every file and xdist worker of it (a tiny model's conversion is seconds of a loaded
    host's CPU, and several files load the same ones). Kept in the run's folder (tests/engine_patches/conftest.py
    sets CAPBENCH_TEST_CHECKPOINTS), named by everything that goes into it; a worker that finds another building it
    waits on its lock; built in a temporary folder and renamed into place, so a folder that exists is whole. Read
    only: a test that changes a checkpoint makes its own."""
    made_for = [group_size, tp] if chain else []  # the unconverted checkpoint is the same for any deployment
    key = hashlib.sha256(json.dumps([kind, list(chain), moe_inter, *made_for, code_hash()]).encode()).hexdigest()
    cache = Path(os.environ["CAPBENCH_TEST_CHECKPOINTS"])  # unset: a file outside tests/engine_patches
    done = cache / f"{'-'.join([kind, str(moe_inter), *chain])}-{key[:16]}"

    def build(work: Path) -> None:
        if chain:
            from engine_patches.int4_moe.convert import convert

            src = cached_checkpoint(kind, chain[:-1], moe_inter, group_size, tp)
            convert(src, work / done.name, group_size=group_size, tp=tp, workers=1, show_progress=False,
                    fmt=chain[-1])
        else:
            make_checkpoint(work / done.name, kind, moe_inter=moe_inter)

    return built_once(done, build)


def built_once(done: Path, build: Callable[[Path], None]) -> Path:
    """`done` (a file or a folder) made once per test run: build(work) leaves it as work / done.name in a temporary
    folder beside it, then it is renamed into place, so a `done` that exists is whole; under a lock, so an xdist
    worker that finds another building it waits for it."""
    done.parent.mkdir(parents=True, exist_ok=True)
    with open(done.parent / f".{done.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            work = Path(tempfile.mkdtemp(dir=done.parent, prefix=f".{done.name}."))
            try:
                build(work)
                os.replace(work / done.name, done)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    return done
