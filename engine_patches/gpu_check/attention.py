"""One layer's decode attention on the KV pool layout SGLang uses (page size 1 token rows, requests' tokens
scattered over the pool), with each backend's own kernel: Triton (`decode_attention_fwd`, what
`--attention-backend triton` runs), FA3 (`sgl_kernel.flash_attn.flash_attn_with_kvcache`, 0.5.23's Hopper default)
and FlashInfer (its paged decode / MLA wrappers). The FA3 and FlashInfer calls follow SGLang's
flashattention_backend / flashinfer backends; neither package exists on the machines this was written on, so those
two calls have not run yet: on a card without them they fail by name (kernels.KernelUnavailable)."""

from __future__ import annotations

import torch

from engine_patches.gpu_check.kernels import KernelUnavailable, load
from engine_patches.quant_gpu_check import decode_inputs

KERNEL_NAMES = {"triton": "triton_decode", "fa3": "fa3_decode", "flashinfer": "flashinfer_decode",
                "flashinfer_mla": "flashinfer_mla_decode"}


def shape_label(model: str, shape: dict, bs: int, ctx: int, kv: str) -> str:
    width = f"{shape['k_dim']}" if not shape["mla"] else f"{shape['v_dim']}+{shape['k_dim'] - shape['v_dim']}"
    return f"{model} {shape['q_heads']}q/{shape['kv_heads']}kv x {width}, bs {bs}, ctx {ctx}, {kv} KV"


def prepare(backend: str, shape: dict, ctx: int, bs: int, kv: str, dtype, device, splits: int):
    """(call, kernel label) for one case; the inputs are made once, outside the timed call."""
    inp = decode_inputs(shape, ctx, bs, kv, dtype, device, splits)
    if backend == "triton":
        fwd = load("triton_decode")

        def call():
            fwd(inp["q"], inp["k_buffer"], inp["v_buffer"], inp["o"], inp["kv_indptr"], inp["kv_indices"],
                inp["attn_logits"], inp["attn_lse"], inp["num_kv_splits"], inp["splits"], inp["q"].shape[-1] ** -0.5,
                inp["scale"], inp["scale"], has_mla=inp["mla"])
            return inp["o"]

        return call, "sglang triton decode_attention_fwd"
    if backend == "fa3":
        return _fa3(inp, shape, ctx, bs), "sgl_kernel flash_attn_with_kvcache (FA3)"
    if backend == "flashinfer":
        if shape["mla"]:
            return _flashinfer_mla(inp, shape, ctx, bs), "flashinfer BatchMLAPagedAttentionWrapper"
        return _flashinfer_gqa(inp, shape, ctx, bs), "flashinfer BatchDecodeWithPagedKVCacheWrapper"
    raise KernelUnavailable("triton_decode", f"the check has no call for the {backend!r} backend")


def _fa3(inp: dict, shape: dict, ctx: int, bs: int):
    fwd = load("fa3_decode")
    dev = inp["q"].device
    page_table = inp["kv_indices"].view(bs, ctx)
    seqlens = torch.full((bs,), ctx, dtype=torch.int32, device=dev)
    cu_q = torch.arange(bs + 1, dtype=torch.int32, device=dev)
    fp8 = inp["k_buffer"].dtype == torch.float8_e4m3fn
    q = inp["q"].to(inp["k_buffer"].dtype) if fp8 else inp["q"]
    descale = torch.full((bs, shape["kv_heads"]), inp["scale"], dtype=torch.float32, device=dev) if fp8 else None
    scale = shape["k_dim"] ** -0.5
    if shape["mla"]:
        lora = shape["v_dim"]
        kv = inp["k_buffer"].unsqueeze(1)  # [tokens, page 1, 1 head, lora + rope]
        return lambda: fwd(q=q[..., lora:], k_cache=kv[..., lora:], v_cache=kv[..., :lora], qv=q[..., :lora],
                           page_table=page_table, cache_seqlens=seqlens, cu_seqlens_q=cu_q, max_seqlen_q=1,
                           softmax_scale=scale, causal=True, q_descale=descale, k_descale=descale,
                           v_descale=descale)
    k, v = inp["k_buffer"].unsqueeze(1), inp["v_buffer"].unsqueeze(1)
    return lambda: fwd(q=q, k_cache=k, v_cache=v, page_table=page_table, cache_seqlens=seqlens, cu_seqlens_q=cu_q,
                       max_seqlen_q=1, softmax_scale=scale, causal=True, q_descale=descale, k_descale=descale,
                       v_descale=descale)


def _workspace(dev) -> torch.Tensor:
    return torch.empty(512 * 2**20, dtype=torch.uint8, device=dev)


def _flashinfer_gqa(inp: dict, shape: dict, ctx: int, bs: int):
    wrapper_cls = load("flashinfer_decode")
    dev = inp["q"].device
    wrapper = wrapper_cls(_workspace(dev), "NHD", use_tensor_cores=True)
    indptr = inp["kv_indptr"]
    wrapper.plan(indptr, inp["kv_indices"], torch.ones(bs, dtype=torch.int32, device=dev), shape["q_heads"],
                 shape["kv_heads"], shape["k_dim"], 1, q_data_type=inp["q"].dtype,
                 kv_data_type=inp["k_buffer"].dtype)
    k, v = inp["k_buffer"].unsqueeze(1), inp["v_buffer"].unsqueeze(1)
    return lambda: wrapper.run(inp["q"], (k, v), k_scale=inp["scale"], v_scale=inp["scale"])


def _flashinfer_mla(inp: dict, shape: dict, ctx: int, bs: int):
    wrapper_cls = load("flashinfer_mla_decode")
    dev = inp["q"].device
    lora = shape["v_dim"]
    wrapper = wrapper_cls(_workspace(dev), backend="auto")
    wrapper.plan(torch.arange(bs + 1, dtype=torch.int32, device=dev), inp["kv_indptr"], inp["kv_indices"],
                 torch.full((bs,), ctx, dtype=torch.int32, device=dev), shape["q_heads"], lora,
                 shape["k_dim"] - lora, 1, False, shape["k_dim"] ** -0.5, inp["q"].dtype, inp["k_buffer"].dtype)
    kv = inp["k_buffer"].unsqueeze(1)
    q = inp["q"]
    return lambda: wrapper.run(q[..., :lora], q[..., lora:], kv[..., :lora], kv[..., lora:])
