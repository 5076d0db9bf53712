"""Decode attention as SGLang 0.5.23 runs it: one layer's `forward_decode` of each backend's own class (built around
SGLang's real KV pool by gpu_check/backends.py), with capbench's FP8-scale patches installed as
`capbench sglang-launch --kv-scales` installs them, and the real kernels. The timed call is what SGLang runs for a
layer of a decode step: the new token's KV write, then the backend's read path. So it includes what the backend does
around its kernel: fa3's and flashinfer's MLA cast of the whole layer's FP8 buffer to BF16 (`get_key_buffer(...)
.to(q.dtype)`, every layer of every step: the pool is sized as a server's), FlashMLA's query quantisation, TRT-LLM's
fused write, Triton's split-KV schedule.

The pool holds `pool_tokens` (a server's KV pool on this GPU, from capbench's capacity model; at least the batch's
tokens), one layer, filled with random KV; each case's requests take pages at random from it. Per model (TP8, one
GPU): Kimi K2 MLA (8 query heads, latent 512 + rope 64) on fa3, flashmla, triton, trtllm_mla; GLM-4.6 GQA (12 query
heads, 1 KV head x 128) on fa3, flashinfer, triton, trtllm_mha; each where data/attention_backends.yaml says it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine_patches.gpu_check import backends as build
from engine_patches.gpu_check.kernels import load


@dataclass(frozen=True)
class Attn:
    """One layer's attention on one GPU at TP8."""

    kind: str  # mla | gqa
    heads: int
    kv_heads: int
    head_dim: int  # MLA: latent + rope, the absorbed query's width
    v_dim: int  # MLA: the latent
    scaling: float
    layers: int
    max_context: int
    nope: int = 0  # MLA's qk_nope_head_dim (TRT-LLM's call takes it)


SHAPES = {"kimi-k2": Attn("mla", 8, 1, 576, 512, (128 + 64) ** -0.5, 61, 262144, 128),
          "glm-4.6": Attn("gqa", 12, 1, 128, 128, 128 ** -0.5, 92, 202752)}
TINY = {"kimi-k2": Attn("mla", 2, 1, 288, 256, (64 + 32) ** -0.5, 61, 64, 64),
        "glm-4.6": Attn("gqa", 4, 1, 64, 64, 64 ** -0.5, 92, 64)}
BACKENDS = {"mla": ("fa3", "flashmla", "triton", "trtllm_mla"), "gqa": ("fa3", "flashinfer", "triton", "trtllm_mha")}
CLASS = {"fa3": "FlashAttentionBackend", "flashmla": "FlashMLABackend", "triton": "TritonAttnBackend",
         "trtllm_mla": "TRTLLMMLABackend", "flashinfer": "FlashInferAttnBackend", "trtllm_mha": "TRTLLMHAAttnBackend"}
KERNEL = {"fa3": "sgl_kernel FA3 flash_attn_with_kvcache", "flashmla": "flash_mla_with_kvcache",
          "triton": "decode_attention_fwd (Triton)", "flashinfer": "FlashInfer BatchDecodeWithPagedKVCacheWrapper",
          "trtllm_mla": "trtllm_batch_decode_with_kv_cache_mla", "trtllm_mha": "trtllm_batch_decode_with_kv_cache"}
KEY = {"fa3": "fa3", "flashmla": "flashmla", "triton": "triton_decode", "trtllm_mla": "trtllm_mla",
       "flashinfer": "flashinfer_decode", "trtllm_mha": "trtllm_mha"}  # kernels.KERNELS names
BACKENDS_YAML = Path(__file__).resolve().parents[2] / "data" / "attention_backends.yaml"
E4M3 = torch.float8_e4m3fn


def arch(capability: tuple[int, int] | None) -> str | None:
    """data/attention_backends.yaml's arch of a CUDA capability (None: no GPU)."""
    return {8: "sm80", 9: "sm90", 10: "sm100"}.get(capability[0]) if capability else None


def facts() -> dict[str, dict]:
    """name -> {archs, page_size} from data/attention_backends.yaml (the file the launcher and the planner read)."""
    import yaml

    return yaml.safe_load(BACKENDS_YAML.read_text())["backends"]


def runnable(kind: str, gpu_arch: str | None) -> list[str]:
    """The backends of BACKENDS[kind] SGLang runs on this arch; off CUDA only triton (the others are CUDA-only)."""
    if gpu_arch is None:
        return ["triton"]
    f = facts()
    return [b for b in BACKENDS[kind] if gpu_arch in f[b]["archs"]]


def page_size(backend: str, default: int) -> int:
    return facts()[backend].get("page_size") or default


def label(model: str, shape: Attn, backend: str, bs: int, ctx: int, kv: str) -> str:
    width = f"{shape.v_dim}+{shape.head_dim - shape.v_dim}" if shape.kind == "mla" else f"{shape.head_dim}"
    return f"{model} {backend} {shape.heads}q/{shape.kv_heads}kv x {width}, bs {bs}, ctx {ctx}, {kv} KV"


class Pool:
    """One layer of SGLang's KV pool (MLATokenToKVPool / MHATokenToKVPool) of `tokens` slots, random KV in it, and
    the calibrated scale a patched server would load for it (FP8) or none (BF16)."""

    def __init__(self, shape: Attn, kv: str, tokens: int, device: torch.device, half=torch.bfloat16):
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

        self.tokens = -(-tokens // 64) * 64  # flashmla and trtllm view it in pages of 64
        dtype = E4M3 if kv == "fp8" else half
        self.half = half
        if shape.kind == "mla":
            self.pool = MLATokenToKVPool(self.tokens, 64, dtype, shape.v_dim, shape.head_dim - shape.v_dim, 1,
                                         str(device), False)
            buffers = [self.pool.kv_buffer[0]]
        else:
            self.pool = MHATokenToKVPool(self.tokens, 64, dtype, shape.kv_heads, shape.head_dim, 1, str(device), False)
            buffers = [self.pool.k_buffer[0], self.pool.v_buffer[0]]
        amax = 8.0  # random normal KV at sigma 2 stays inside it
        self.scale = amax / 448.0 if kv == "fp8" else None
        gen = torch.Generator(device=device).manual_seed(3)
        for buf in buffers:
            view = buf.view(dtype)
            for start in range(0, view.shape[0], 1 << 20):
                part = view[start:start + (1 << 20)]
                x = (torch.randn(part.shape, generator=gen, device=device) * 2.0).clamp(-amax, amax)
                part.copy_((x / self.scale).to(dtype) if self.scale else x.to(dtype))


def layer(shape: Attn, pool: Pool, device: torch.device):
    """The RadixAttention of layer 0 with the scales capbench's loader gives it (loading.py), for an FP8 pool."""
    from sglang.srt.layers.radix_attention import RadixAttention

    from engine_patches.fp8_scales import backends as scaled
    from engine_patches.fp8_scales import loading

    attn = RadixAttention(shape.heads, shape.head_dim, shape.scaling, shape.kv_heads, layer_id=0,
                          v_head_dim=shape.v_dim)
    if pool.scale is not None:
        loading.set_attention_scales(attn, pool.scale, pool.scale, device)
        if shape.kind == "mla":
            setattr(attn, scaled.SCALE_ATTR, pool.scale)
            loading.MLA_SCALES[0] = pool.scale
    return attn


def inputs(shape: Attn, backend: str, bs: int, device: torch.device, half=torch.bfloat16) -> tuple[tuple, dict]:
    """(q, k, v) and keywords as DeepSeek's and GLM's attention pass them to this backend's forward_decode."""
    gen = torch.Generator(device=device).manual_seed(bs)

    def rand(*s):
        return torch.randn(*s, generator=gen, device=device).to(half)

    if shape.kind == "gqa":
        return (rand(bs, shape.heads, shape.head_dim), rand(bs, shape.kv_heads, shape.head_dim),
                rand(bs, shape.kv_heads, shape.head_dim)), {}
    rope = shape.head_dim - shape.v_dim
    q_nope, q_rope = rand(bs, shape.heads, shape.v_dim), rand(bs, shape.heads, rope)
    k_nope, k_rope = rand(bs, 1, shape.v_dim), rand(bs, 1, rope)
    if backend in ("flashmla", "triton"):  # the query and K concatenated
        return (torch.cat([q_nope, q_rope], -1), torch.cat([k_nope, k_rope], -1), k_nope), {}
    return (q_nope, k_nope, k_nope), {"q_rope": q_rope, "k_rope": k_rope}


def backend_object(name: str, shape: Attn, pool: Pool, layout: build.Layout, device: torch.device):
    """The backend's object, and what its init_forward_metadata would have made for this batch, with the real
    kernels' planning (FlashInfer's plan, FlashMLA's schedule, TRT-LLM's workspace)."""
    load(KEY[name])  # the module and the kernel it imports: a missing one is this case's error, by name
    p, mla = pool.pool, shape.kind == "mla"
    if name == "fa3":
        return build.fa3(p, layout, mla=mla, device=device)
    if name == "triton":
        return _triton(shape, pool, layout, device)
    if name == "flashmla":
        from sglang.kernels.ops.attention.flash_mla_interface import get_mla_metadata

        seq = torch.tensor(layout.seq_lens, dtype=torch.int32, device=device)
        schedule, splits = get_mla_metadata(seq, shape.heads, 1, is_fp8_kvcache=pool.scale is not None)
        return build.flashmla(p, layout, kv_lora_rank=shape.v_dim, schedule=schedule, num_splits=splits,
                              device=device)
    if name == "flashinfer":
        return build.flashinfer_gqa(p, _flashinfer_decode_wrapper(shape, p, layout, device, pool.half))
    return _trtllm(name, shape, p, layout, device, pool.half)


def _triton(shape: Attn, pool: Pool, layout: build.Layout, device: torch.device):
    """TritonAttnBackend as its __init__ sets it for the model (split count, Lean attention on auto)."""
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.srt.layers.attention import triton_backend as tb
    from sglang.srt.utils.common import get_device_core_count

    cores = get_device_core_count(device.index or 0) if device.type == "cuda" else 0
    splits = 8  # --triton-attention-num-kv-splits' default (arg_groups/fields/exec_.py)
    if shape.kind == "mla":
        splits = tb._mla_decode_kv_splits_cap(splits, cores, shape.max_context)
    return build.triton(pool.pool, layout, mla=shape.kind == "mla",
                        decode_attention_fwd=torch.compiler.disable(decode_attention_fwd), q_heads=shape.heads,
                        kv_heads=shape.kv_heads, v_dim=shape.v_dim, max_kv_splits=splits, core_count=cores,
                        deterministic=False, use_pdl=device.type == "cuda" and tb.is_arch_support_pdl(), device=device)


def _flashinfer_decode_wrapper(shape: Attn, pool, layout: build.Layout, device: torch.device, half):
    """BatchDecodeWithPagedKVCacheWrapper as FlashInferAttnBackend makes and plans it for a decode batch."""
    from flashinfer import BatchDecodeWithPagedKVCacheWrapper
    from sglang.srt.environ import envs
    from sglang.srt.layers.attention.flashinfer_backend import should_use_tensor_core

    workspace = torch.empty(envs.SGLANG_FLASHINFER_WORKSPACE_SIZE.get(), dtype=torch.uint8, device=device)
    wrapper = BatchDecodeWithPagedKVCacheWrapper(
        workspace, "NHD", backend="fa2",
        use_tensor_cores=should_use_tensor_core(kv_cache_dtype=pool.dtype, num_attention_heads=shape.heads,
                                                num_kv_heads=shape.kv_heads))
    bs = len(layout.seq_lens)
    wrapper.begin_forward(layout.kv_indptr().to(device), layout.all_slots().to(torch.int32).to(device),
                          torch.ones(bs, dtype=torch.int32, device=device), shape.heads, shape.kv_heads,
                          shape.head_dim, 1, data_type=pool.dtype, q_data_type=half, non_blocking=True)
    return wrapper


def _trtllm(name: str, shape: Attn, pool, layout: build.Layout, device: torch.device, half):
    """TRT-LLM's MLA / MHA decode (Blackwell) with the workspace, counter buffer and padded block table its
    backend makes."""
    if name == "trtllm_mla":
        from sglang.srt.layers.attention import trtllm_mla_backend as tm

        fp8 = pool.dtype == E4M3
        b = build.trtllm_mla(
            pool, layout, kv_lora_rank=shape.v_dim, rope=shape.head_dim - shape.v_dim, nope=shape.nope, q_dtype=half,
            fused=fp8 and tm.can_use_set_mla_kv_concat_q_fp8(),
            fused_bf16=not fp8 and tm.can_use_set_mla_kv_concat_q(shape.v_dim * 2, (shape.head_dim - shape.v_dim) * 2),
            workspace=torch.zeros(tm.DEFAULT_WORKSPACE_SIZE_MB * 2**20, dtype=torch.int8, device=device),
            counter=tm.make_persistent_multi_ctas_kv_counter_buffer(device, shape.heads,
                                                                    max_batch_size=len(layout.seq_lens)),
            device=device)
        table = b.forward_decode_metadata.block_kv_indices
        width = b._calc_padded_blocks(max(layout.seq_lens))
        padded = torch.full((table.shape[0], width), -1, dtype=torch.int32, device=device)
        padded[:, :table.shape[1]] = table
        b.forward_decode_metadata.block_kv_indices = padded
        return b
    from sglang.srt.layers.attention import trtllm_mha_backend as th

    return build.trtllm_mha(
        pool, layout, q_dtype=half, workspace=torch.zeros(th.DEFAULT_WORKSPACE_SIZE_MB * 2**20, dtype=torch.uint8,
                                            device=device),
        counter=th.make_persistent_multi_ctas_kv_counter_buffer(device, num_q_heads=shape.heads,
                                                                max_batch_size=len(layout.seq_lens) + 1),
        device=device)


def prepare(name: str, model: str, shape: Attn, pool: Pool, bs: int, ctx: int, device: torch.device,
            patches, default_page: int):
    """(call, kernel) for one case: bs requests of ctx cached tokens each plus the decode token, pages drawn from
    the pool; the call is one layer's forward_decode of the backend (through capbench's wrapper where it has one)."""
    gen = torch.Generator().manual_seed(bs * 7919 + ctx)
    layout = build.Layout.scattered([ctx + 1] * bs, page_size(name, default_page), pool.tokens, gen)
    attn = layer(shape, pool, device)
    b = backend_object(name, shape, pool, layout, device)
    forward = patches.method(type(b), "forward_decode")
    fb = build.decode_batch(layout, device)
    args, kw = inputs(shape, name, bs, device, pool.half)

    def call():
        return forward(b, *args, attn, fb, **kw)

    call.layout, call.inputs = layout, (args, kw)  # what the call read, for a test to check its output against
    return call, f"{CLASS[name]}.forward_decode -> {KERNEL[name]}"


