"""Calibrated FP8 KV scales on each GQA attention backend SGLang 0.5.23 runs for GLM-4.x (data/attention_backends.yaml):
one decode step through the backend's own forward_decode on SGLang's real MHATokenToKVPool, the context written
as SGLang writes it (set_kv_buffer with the layer's scales), the fused CUDA kernel replaced at its call by a float32
reference. All four keep the scales by themselves (capbench adds no wrapper for GQA): the output must be at the FP8
round trip's level with calibrated per-layer K and V scales, and far off at SGLang's scale 1.0. Run with -s to see
the table."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

from engine_patches.fp8_scales import loading
from engine_patches.gpu_check import backends as gpu_backends
from tests.engine_patches.attention_harness import (
    E4M3,
    Layout,
    fake_cuda_packages,
    gqa_reference,
    outliers,
    rel_err,
    round_trip,
)
from tests.engine_patches.test_fp8_backends import fa3_kernel

Q_HEADS, KV_HEADS, D = 4, 1, 128  # GLM-4.6 at tp8 holds 12 query heads and 1 KV head a rank, head_dim 128
SCALING = D**-0.5
SEQ_LENS = [37, 70]
REPORT: dict[str, dict] = {}

fake_cuda_packages()


class Case:
    def __init__(self, page_size: int, scaled: bool = True, seed: int = 0, query_scale: float | None = None):
        gen = torch.Generator().manual_seed(seed)
        self.layout = Layout(SEQ_LENS, page_size)
        n = self.layout.pool_size()
        self.k = torch.zeros(n, KV_HEADS, D, dtype=torch.bfloat16)
        self.v = torch.zeros(n, KV_HEADS, D, dtype=torch.bfloat16)
        for r in range(len(SEQ_LENS)):
            idx = self.layout.slots(r)
            self.k[idx] = outliers((len(idx), KV_HEADS, D), gen)
            self.v[idx] = outliers((len(idx), KV_HEADS, D), gen, scale=2.0, spike=600.0)
        self.q = outliers((len(SEQ_LENS), Q_HEADS, D), gen, scale=0.05, spike=0.5)
        self.k_scale = float(self.k.abs().max()) / 448 if scaled else 1.0
        self.v_scale = float(self.v.abs().max()) / 448 if scaled else 1.0
        self.layer = RadixAttention(Q_HEADS, D, SCALING, KV_HEADS, layer_id=0)
        if scaled:  # what loading.glm4_moe_load_kv_cache_scales does for layer 0
            loading.set_attention_scales(self.layer, self.k_scale, self.v_scale, torch.device("cpu"))
        self.pool = MHATokenToKVPool(n, page_size, E4M3, KV_HEADS, D, 1, "cpu", False)
        prefix = self.layout.prefix_slots()
        self.pool.set_kv_buffer(self.layer, prefix, self.k[prefix], self.v[prefix], self.layer.k_scale,
                                self.layer.v_scale)
        self.ref = gqa_reference(self.q, self.k, self.v, self.layout, SCALING)
        q = round_trip(self.q, query_scale) if query_scale else self.q
        rt = gqa_reference(q, round_trip(self.k, self.k_scale), round_trip(self.v, self.v_scale), self.layout,
                           SCALING)
        self.floor = rel_err(rt, self.ref)

    def new(self, x: torch.Tensor) -> torch.Tensor:
        return x[self.layout.last_slots()]

    def batch(self):
        return gpu_backends.decode_batch(self.layout)

    def error(self, out: torch.Tensor) -> float:
        return rel_err(out.view(len(SEQ_LENS), Q_HEADS, D), self.ref)


def check(backend: str, run, page_size: int = 1, query_scale: float | None = None) -> None:
    case = Case(page_size, query_scale=query_scale)
    after = case.error(run(case))
    one = Case(page_size, scaled=False)
    at_one = one.error(run(one))
    REPORT[backend] = {"calibrated": round(after, 4), "round_trip_floor": round(case.floor, 4),
                       "scale_one": round(at_one, 4)}
    print("\nGQA decode, relative error against attention on unquantised KV:\n" + json.dumps(REPORT, indent=1))
    assert after <= 1.5 * case.floor + 1e-3, (backend, after, case.floor)
    assert at_one > 5 * max(after, 1e-3), (backend, at_one, after)


def test_fa3_gqa(monkeypatch):
    """SGLang's default for GLM on Hopper: the query cast to e4m3 as is, K and V descaled by the kernel."""
    from sglang.srt.layers.attention import flashattention_backend as fa

    from tests.engine_patches.test_fp8_backends import fa3_backend

    monkeypatch.setattr(fa, "flash_attn_with_kvcache", fa3_kernel)
    check("fa3", lambda c: fa.FlashAttentionBackend.forward_decode(
        fa3_backend(c, mla=False), c.q, c.new(c.k), c.new(c.v), c.layer, c.batch()), query_scale=1.0)


class DecodeWrapper:
    """flashinfer's BatchDecodeWithPagedKVCacheWrapper planned at page size 1, forward() in float32 with its
    k_scale / v_scale applied to the cache it reads."""

    def __init__(self, layout: Layout):
        self.layout = layout

    def forward(self, q, kv_cache, sm_scale, logits_soft_cap=0.0, k_scale=None, v_scale=None):
        k, v = kv_cache
        k = k.float() * (k_scale or 1.0)
        v = v.float() * (v_scale or 1.0)
        return gqa_reference(q, k, v, self.layout, sm_scale).to(torch.bfloat16)


def test_flashinfer_gqa():
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    def run(c: Case):
        b = gpu_backends.flashinfer_gqa(c.pool, DecodeWrapper(c.layout))
        return FlashInferAttnBackend.forward_decode(b, c.q, c.new(c.k), c.new(c.v), c.layer, c.batch())

    check("flashinfer", run)


def test_triton_gqa():
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    from tests.engine_patches.test_fp8_backends import triton_backend

    check("triton", lambda c: TritonAttnBackend.forward_decode(
        triton_backend(c, mla=False), c.q, c.new(c.k), c.new(c.v), c.layer, c.batch()))


def trtllm_decode(query, kv_cache, block_tables, seq_lens, bmm1_scale, bmm2_scale, out_dtype=None, **_):
    """flashinfer's trtllm_batch_decode_with_kv_cache in float32: kv_cache (K, V) as [pages, kv heads, page, d],
    scores = bmm1_scale * q . k, output = bmm2_scale * p . v."""
    k, v = (x.permute(0, 2, 1, 3).flatten(0, 1) for x in kv_cache)  # [slots, kv heads, d]
    page = kv_cache[0].shape[2]
    out = []
    for b in range(block_tables.shape[0]):
        n = int(seq_lens[b])
        slots = (block_tables[b].long()[:, None] * page + torch.arange(page)).flatten()[:n]
        kk = k[slots].float().repeat_interleave(Q_HEADS // KV_HEADS, 1)
        vv = v[slots].float().repeat_interleave(Q_HEADS // KV_HEADS, 1)
        p = torch.softmax(float(bmm1_scale) * torch.einsum("hd,nhd->hn", query[b].float(), kk), -1)
        out.append(float(bmm2_scale) * torch.einsum("hn,nhd->hd", p, vv))
    return torch.stack(out).to(out_dtype or torch.bfloat16)


def fused_fp8_qkv_kv_cache(q, k, v, k_cache, v_cache, cache_loc, k_scale, v_scale):
    """The fused FP8 write: K / k_scale and V / v_scale cast to e4m3 at cache_loc; the query cast as is."""
    k_cache.view(E4M3)[cache_loc.long()] = (k.float() / k_scale).clamp(-448, 448).to(E4M3).view(-1, KV_HEADS, D)
    v_cache.view(E4M3)[cache_loc.long()] = (v.float() / v_scale).clamp(-448, 448).to(E4M3).view(-1, KV_HEADS, D)
    return q.to(E4M3) if q is not None else None


@pytest.mark.parametrize("page_size", [16, 64])
def test_trtllm_mha(page_size, monkeypatch):
    """SGLang's default for GLM on Blackwell: the fused FP8 QKV write with the layer's scales, then bmm1_scale =
    k_scale * softmax_scale and bmm2_scale = v_scale on the query cast to e4m3 as is."""
    from sglang.kernels.ops.kvcache import fused_fp8_qkv_kv_cache as fused_module
    from sglang.srt.layers.attention import trtllm_mha_backend as tm

    monkeypatch.setattr(fused_module, "fused_fp8_qkv_kv_cache", fused_fp8_qkv_kv_cache)
    monkeypatch.setattr(tm, "flashinfer", SimpleNamespace(decode=SimpleNamespace(
        trtllm_batch_decode_with_kv_cache=trtllm_decode)), raising=False)

    def run(c: Case):
        b = gpu_backends.trtllm_mha(c.pool, c.layout)
        return tm.TRTLLMHAAttnBackend.forward_decode(b, c.q, c.new(c.k), c.new(c.v), c.layer, c.batch())

    check(f"trtllm_mha (page {page_size})", run, page_size=page_size, query_scale=1.0)
