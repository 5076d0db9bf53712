"""Calibrated FP8 KV scales on each MLA attention backend SGLang 0.5.23 runs for Kimi K2 (data/attention_backends.yaml):
one decode step through the backend's own forward_decode (and, where the backend has one, its absorbed extend),
on SGLang's real MLATokenToKVPool, with the fused CUDA kernel replaced at its call by a float32 reference. The
context was written as SGLang's MHA prefill writes it (set_mla_kv_buffer through attn_mha); the new token is
written by the backend itself. Each output is compared with attention on the unquantised KV:

- before capbench's backend patch (main's code: the pool divides, the backend reads as it does),
- after it (must be at the FP8 round trip's level: the error of the same attention over KV quantised at the
  calibrated scale and read back exactly),
- and at SGLang's scale 1.0 (no scales file: values past 448 saturate).

Run with -s to see the table. GQA backends (GLM) are in test_fp8_backends_gqa.py."""

from __future__ import annotations

import json

import pytest
import torch
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.runtime_context import get_parallel

from engine_patches.fp8_scales import backends, loading
from engine_patches.gpu_check import backends as gpu_backends
from tests.engine_patches.attention_harness import (
    E4M3,
    SPIKE,
    Layout,
    fake_cuda_packages,
    mla_reference,
    outliers,
    rel_err,
    round_trip,
)

HEADS, LORA, ROPE = 4, 512, 64  # Kimi K2's latent and rope: head_dim 576 > 256 decides fa3's path
SCALING = (128 + ROPE) ** -0.5  # DeepSeek's softmax scale: 1/sqrt(qk_nope + rope), kept by the absorbed query
SEQ_LENS = [37, 70]
REPORT: dict[str, dict] = {}

fake_cuda_packages()


@pytest.fixture
def patched(monkeypatch):
    """The pool patch of loading.py (main's code), with the originals put back after the test."""
    for name in ("set_kv_buffer", "set_mla_kv_buffer", "get_mla_kv_buffer"):
        monkeypatch.setattr(MLATokenToKVPool, name, getattr(MLATokenToKVPool, name))
    monkeypatch.setattr(loading, "MLA_SCALES", {})
    loading.install_mla_pool_scaling()
    with get_parallel().override(dcp_enabled=False, attn_dcp_size=1, attn_dcp_rank=0):
        yield


class Case:
    """One request batch of MLA KV in an FP8 pool: the context written by the MHA prefill path, the decode token's
    latent and rope, its query, and the reference output over the unquantised KV."""

    def __init__(self, page_size: int, scaled: bool = True, seed: int = 0, seq_lens: list[int] = SEQ_LENS,
                 query_scale: float | str | None = None):
        gen = torch.Generator().manual_seed(seed)
        self.layout = Layout(seq_lens, page_size)
        self.bs = len(seq_lens)
        n = self.layout.pool_size()
        self.latent = torch.zeros(n, 1, LORA, dtype=torch.bfloat16)
        self.rope = torch.zeros(n, 1, ROPE, dtype=torch.bfloat16)
        for r in range(self.bs):
            idx = self.layout.slots(r)
            self.latent[idx] = outliers((len(idx), 1, LORA), gen)
            self.rope[idx] = outliers((len(idx), 1, ROPE), gen, spike=SPIKE / 3)
        self.q_nope = outliers((self.bs, HEADS, LORA), gen, scale=0.05, spike=0.5)
        self.q_rope = outliers((self.bs, HEADS, ROPE), gen, scale=0.05, spike=0.5)
        amax = max(float(self.latent.abs().max()), float(self.rope.abs().max()))
        self.scale = amax / 448.0 if scaled else 1.0
        self.mqa = RadixAttention(HEADS, LORA + ROPE, SCALING, 1, layer_id=0, v_head_dim=LORA)
        self.mha = RadixAttention(HEADS, 128 + ROPE, SCALING, HEADS, layer_id=0, v_head_dim=128)
        if scaled:  # what loading.deepseek_v2_load_kv_cache_scales does for layer 0
            loading.set_attention_scales(self.mqa, self.scale, self.scale, torch.device("cpu"))
            setattr(self.mqa, backends.SCALE_ATTR, self.scale)
            loading.MLA_SCALES[0] = self.scale
        self.pool = MLATokenToKVPool(n, page_size, E4M3, LORA, ROPE, 1, "cpu", False)
        prefix = self.layout.prefix_slots()
        self.pool.set_mla_kv_buffer(self.mha, prefix, self.latent[prefix], self.rope[prefix])
        self.ref = mla_reference(self.q_nope, self.q_rope, self.latent, self.rope, self.layout, SCALING)
        # the floor: KV through e4m3 at the scale, and the query too for a kernel that casts it to e4m3 (at the KV
        # scale: "kv", or at a fixed one)
        qs = self.scale if query_scale == "kv" else query_scale
        q_nope, q_rope = ((round_trip(self.q_nope, qs), round_trip(self.q_rope, qs)) if qs
                          else (self.q_nope, self.q_rope))
        rt = mla_reference(q_nope, q_rope, round_trip(self.latent, self.scale), round_trip(self.rope, self.scale),
                           self.layout, SCALING)
        self.floor = rel_err(rt, self.ref)

    @property
    def new_latent(self) -> torch.Tensor:
        return self.latent[self.layout.last_slots()]

    @property
    def new_rope(self) -> torch.Tensor:
        return self.rope[self.layout.last_slots()]

    def batch(self, mode=ForwardMode.DECODE):
        return gpu_backends.decode_batch(self.layout, mode=mode)

    def error(self, out: torch.Tensor) -> float:
        return rel_err(out.view(self.bs, HEADS, LORA), self.ref)


def record(backend: str, path: str, **errors) -> None:
    REPORT.setdefault(f"{backend} ({path})", {}).update({k: round(v, 4) for k, v in errors.items()})


def check(backend: str, path: str, run, page_size: int, native: bool = False, **shape) -> None:
    """Run one backend path three ways and assert: patched at the round trip's level, unpatched (unless SGLang's
    code is right by itself) and scale 1.0 far off, so the test can fail and the patch is what makes it right."""
    case = Case(page_size, **shape)
    after = case.error(run(case, patched=True))
    before = case.error(run(Case(page_size, **shape), patched=False))
    loading.MLA_SCALES.clear()
    one = Case(page_size, scaled=False, **shape)
    at_one = one.error(run(one, patched=False))
    record(backend, path, before=before, after=after, round_trip_floor=case.floor, scale_one=at_one)
    print("\nMLA decode, relative error against attention on unquantised KV:\n" + json.dumps(REPORT, indent=1))
    assert after <= 1.5 * case.floor + 1e-3, (backend, path, after, case.floor)
    if native:
        assert before == after
    else:
        assert before > 5 * max(after, 1e-3), (backend, path, before, after)
    assert at_one > 5 * max(after, 1e-3), (backend, path, at_one, after)


# ---- fa3: the absorbed MLA decode as flashattention_backend.py runs it ----

def fa3_kernel(q, k_cache, v_cache, qv=None, page_table=None, cache_seqlens=None, softmax_scale=None,
               k_descale=None, v_descale=None, return_softmax_lse=False, **_):
    """flash_attn_with_kvcache in float32 for one query token a request: scores = scale * (q.k (+ qv.v)),
    k/v read through the page table and multiplied by their descales ([batch, kv heads]) when given."""
    page = k_cache.shape[1]
    out = []
    for b in range(page_table.shape[0]):
        n = int(cache_seqlens[b])
        slots = (page_table[b].long()[:, None] * page + torch.arange(page)).flatten()[:n]
        k = k_cache.flatten(0, 1)[slots].float()  # [n, kv_heads, d]
        v = v_cache.flatten(0, 1)[slots].float()
        if k_descale is not None:
            k, v = k * k_descale[b][None, :, None], v * v_descale[b][None, :, None]
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k)
        if qv is not None:
            scores = scores + torch.einsum("hd,nhd->hn", qv[b].float(), v)
        out.append(torch.einsum("hn,nhd->hd", torch.softmax(softmax_scale * scores, -1), v))
    o = torch.stack(out).to(torch.bfloat16)
    return (o, None) if return_softmax_lse else o


def fa3_backend(case: Case, mla: bool = True):
    return gpu_backends.fa3(case.pool, case.layout, mla=mla)


def run_fa3(method: str):
    from sglang.srt.layers.attention import flashattention_backend as fa

    def run(case: Case, patched: bool):
        orig = fa.FlashAttentionBackend.__dict__[method]
        fn = (backends.fa3_decode if method == "forward_decode" else backends.fa3_extend)(orig) if patched else orig
        mode = ForwardMode.DECODE if method == "forward_decode" else ForwardMode.EXTEND
        return fn(fa3_backend(case), case.q_nope, case.new_latent, case.new_latent, case.mqa, case.batch(mode),
                  q_rope=case.q_rope, k_rope=case.new_rope)

    return run


@pytest.mark.parametrize("method", ["forward_decode", "forward_extend"])
def test_fa3_absorbed_mla(method, patched, monkeypatch):
    """fa3 (SGLang's default for MLA on Hopper) upcasts the FP8 buffer with no descale; the extend case is the
    absorbed path a prefill with a short cached prefix takes (one new token a request here)."""
    from sglang.srt.layers.attention import flashattention_backend as fa

    monkeypatch.setattr(fa, "flash_attn_with_kvcache", fa3_kernel)
    check("fa3", method, run_fa3(method), page_size=1)


# ---- flashinfer: FlashInferMLAAttnBackend's decode and paged extend ----

class MLAWrapper:
    """flashinfer's BatchMLAPagedAttentionWrapper, planned (page size 1, sm_scale fixed at plan time), its run()
    in float32: the latent (ckv) is both K's first part and V, kpe K's rope part, read as given (no descale)."""

    def __init__(self, layout: Layout, sm_scale: float):
        self.layout, self.sm_scale = layout, sm_scale

    def run(self, q_nope, q_rope, ckv_cache, kpe_cache, out=None, return_lse=False):
        o = mla_reference(q_nope.view(-1, HEADS, LORA), q_rope.view(-1, HEADS, ROPE), ckv_cache, kpe_cache,
                          self.layout, self.sm_scale).to(q_nope.dtype)
        if out is not None:
            out.copy_(o.view(out.shape))
            o = out
        return (o, None) if return_lse else o


def flashinfer_backend(case: Case, decode: bool = True):
    # SGLang plans sm_scale = the model's scaling (one for all layers)
    return gpu_backends.flashinfer_mla(case.pool, MLAWrapper(case.layout, SCALING), decode=decode)


def run_flashinfer(method: str, k_rope: bool = True):
    """k_rope False: the call as flashmla's prefill makes it (q and K concatenated, no separate rope part)."""
    from sglang.srt.layers.attention.flashinfer_mla_backend import FlashInferMLAAttnBackend

    def run(case: Case, patched: bool):
        orig = FlashInferMLAAttnBackend.__dict__[method]
        wrap = backends.flashinfer_decode if method == "forward_decode" else backends.flashinfer_extend
        fn = wrap(orig) if patched else orig
        decode = method == "forward_decode"
        b = flashinfer_backend(case, decode=decode)
        fb = case.batch(ForwardMode.DECODE if decode else ForwardMode.EXTEND)
        if k_rope:
            return fn(b, case.q_nope, case.new_latent, case.new_latent, case.mqa, fb, q_rope=case.q_rope,
                      k_rope=case.new_rope)
        q = torch.cat([case.q_nope, case.q_rope], -1)
        k = torch.cat([case.new_latent, case.new_rope], -1)
        return fn(b, q, k, case.new_latent, case.mqa, fb)

    return run


@pytest.mark.parametrize(("method", "k_rope"), [("forward_decode", True), ("forward_extend", True),
                                                ("forward_extend", False)])
def test_flashinfer_mla(method, k_rope, patched):
    """flashinfer (SGLang's MLA default on Blackwell for non-DeepSeek architectures) upcasts with no descale."""
    check("flashinfer", method + ("" if k_rope else ", q and K concatenated"), run_flashinfer(method, k_rope),
          page_size=1)


# ---- flashmla: its FP8 decode kernel descales; its decode write is the plain set_kv_buffer ----

def flashmla_kernel(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, descale_q=None,
                    descale_k=None, **_):
    """flash_mla_with_kvcache in float32: q [bs, 1, heads, 576] and the paged cache read through the block table,
    each multiplied by its descale; V is the first head_dim_v columns of the (descaled) cache."""
    page = k_cache.shape[1]
    out = []
    for b in range(block_table.shape[0]):
        n = int(cache_seqlens[b])
        slots = (block_table[b].long()[:, None] * page + torch.arange(page)).flatten()[:n]
        kv = k_cache.flatten(0, 1)[slots, 0].float() * (float(descale_k) if descale_k is not None else 1.0)
        qq = q[b, 0].float() * (float(descale_q) if descale_q is not None else 1.0)
        p = torch.softmax(softmax_scale * qq @ kv.T, -1)
        out.append(p @ kv[:, :head_dim_v])
    return torch.stack(out)[:, None].to(torch.bfloat16), None


def scaled_fp8_quant(x, scale):
    """SGLang's static per-tensor FP8 quantisation: x / scale, saturated to e4m3."""
    return (x.float() / scale).clamp(-448, 448).to(E4M3), scale


def run_flashmla(mode):
    from sglang.srt.layers.attention import flashmla_backend as fm

    def run(case: Case, patched: bool):
        method = "forward_decode" if mode == ForwardMode.DECODE else "forward_extend"
        orig = fm.FlashMLABackend.__dict__[method]
        wrap = backends.flashmla_decode if method == "forward_decode" else backends.flashmla_extend
        fn = wrap(orig) if patched else orig
        b = gpu_backends.flashmla(case.pool, case.layout, kv_lora_rank=LORA)
        fb = case.batch(mode)
        if mode == ForwardMode.TARGET_VERIFY:  # the verify window of one token: seq_lens excludes it
            fb.seq_lens = fb.seq_lens - 1
        q = torch.cat([case.q_nope, case.q_rope], -1)
        k = torch.cat([case.new_latent, case.new_rope], -1)
        return fn(b, q, k, case.new_latent, case.mqa, fb)

    return run


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY])
def test_flashmla(mode, patched, monkeypatch):
    from sglang.srt.layers.attention import flashmla_backend as fm

    monkeypatch.setattr(fm, "flash_mla_with_kvcache", flashmla_kernel)
    monkeypatch.setattr(fm, "scaled_fp8_quant", scaled_fp8_quant)
    # FlashMLA quantises the query at the K scale too (its floor counts that); a short prompt, so that the rows the
    # decode step writes weigh in the output as they do after many decode steps
    check("flashmla", mode.name.lower(), run_flashmla(mode), page_size=64, seq_lens=[3, 5], query_scale="kv")


# ---- trtllm_mla: SGLang's MLA default on Blackwell for Kimi and DeepSeek ----

def trtllm_kernel(query, kv_cache, block_tables, seq_lens, bmm1_scale, bmm2_scale=1.0, kv_lora_rank=LORA,
                  return_lse=False, **_):
    """flashinfer's trtllm_batch_decode_with_kv_cache_mla in float32: scores = bmm1_scale * q . kv, output =
    bmm2_scale * p . kv[:, :kv_lora_rank], kv [pages, 1, page, 576] read through the block table."""
    page = kv_cache.shape[2]
    rows = kv_cache.flatten(0, 2)
    out = []
    for b in range(block_tables.shape[0]):
        n = int(seq_lens[b])
        slots = (block_tables[b].long()[:, None] * page + torch.arange(page)).flatten()[:n]
        kv = rows[slots].float()
        p = torch.softmax(float(bmm1_scale) * query[b, 0].float() @ kv.T, -1)
        out.append(float(bmm2_scale) * p @ kv[:, :kv_lora_rank])
    o = torch.stack(out)[:, None].to(torch.bfloat16)
    return (o, None) if return_lse else o


def fused_write_and_query(kv_buffer, loc, cache_k_nope, cache_k_rope, q_nope, q_rope, **_):
    """set_mla_kv_concat_q_fp8: the K rows cast to e4m3 (no scale) written at loc, the query concatenated in e4m3."""
    rows = torch.cat([cache_k_nope, cache_k_rope], -1).to(E4M3)
    kv_buffer.view(E4M3)[loc.long()] = rows.view(kv_buffer.view(E4M3)[loc.long()].shape)
    return torch.cat([q_nope, q_rope], -1).to(E4M3)


def run_trtllm(fused: bool):
    from sglang.srt.layers.attention import trtllm_mla_backend as tm

    def run(case: Case, patched: bool):
        orig = tm.TRTLLMMLABackend.__dict__["forward_decode"]
        fn = backends.trtllm_decode(orig) if patched else orig
        b = gpu_backends.trtllm_mla(case.pool, case.layout, kv_lora_rank=LORA, rope=ROPE, nope=128, fused=fused)
        return fn(b, case.q_nope, case.new_latent, case.new_latent, case.mqa, case.batch(ForwardMode.DECODE),
                  q_rope=case.q_rope, k_rope=case.new_rope)

    return run


@pytest.mark.parametrize("fused", [False, True])
def test_trtllm_mla_decode(fused, patched, monkeypatch):
    """Quantises the new K with no scale (aten casts, or the fused write-and-concat kernel) and reads with
    bmm1_scale = k_scale * softmax_scale, no bmm2 scale. Its query is cast to e4m3 as is (the floor counts it)."""
    from types import SimpleNamespace

    from sglang.srt.layers.attention import trtllm_mla_backend as tm

    monkeypatch.setattr(tm, "flashinfer", SimpleNamespace(decode=SimpleNamespace(
        trtllm_batch_decode_with_kv_cache_mla=trtllm_kernel)), raising=False)
    monkeypatch.setattr(tm, "set_mla_kv_concat_q_fp8", fused_write_and_query)
    monkeypatch.setattr(tm, "set_mla_kv_concat_q_fp8_covered", lambda **_: True)
    check("trtllm_mla", "decode, fused write" if fused else "decode", run_trtllm(fused), page_size=64,
          seq_lens=[3, 5], query_scale=1.0)


# ---- triton: divides K before its write and descales its reads by itself ----

def triton_decode_kernel(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits,
                         max_kv_splits, sm_scale, k_descale=1.0, v_descale=1.0, **_):
    """decode_attention_fwd in float32: per request the slots kv_indices[kv_indptr[r]:kv_indptr[r+1]], K and V
    multiplied by k_descale / v_descale; the output written into o."""
    for r in range(kv_indptr.numel() - 1):
        idx = kv_indices[int(kv_indptr[r]):int(kv_indptr[r + 1])].long()
        k, v = k_buffer[idx].float() * k_descale, v_buffer[idx].float() * v_descale  # [n, kv_heads, d]
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        p = torch.softmax(sm_scale * torch.einsum("hd,nhd->hn", q[r].float(), k), -1)
        o[r] = torch.einsum("hn,nhd->hd", p, v).to(o.dtype)


def triton_backend(case, mla: bool = True):
    return gpu_backends.triton(case.pool, case.layout, mla=mla, decode_attention_fwd=triton_decode_kernel)


def run_triton(case: Case, patched: bool):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    q = torch.cat([case.q_nope, case.q_rope], -1)
    k = torch.cat([case.new_latent, case.new_rope], -1)
    fb = case.batch(ForwardMode.DECODE)
    return TritonAttnBackend.forward_decode(triton_backend(case), q, k, case.new_latent, case.mqa, fb)


def test_triton_mla_decode(patched):
    """The one backend whose own code keeps the scales (no capbench wrapper: before and after are the same)."""
    check("triton", "forward_decode", run_triton, page_size=1, native=True)


def test_the_wrappers_are_installed_on_sglangs_classes(monkeypatch):
    """backends.install() wraps each class's own method once, when its module is imported, and keeps triton's."""
    import sys

    from sglang.srt.layers.attention import flashinfer_mla_backend, flashmla_backend, trtllm_mla_backend
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    classes = [flashinfer_mla_backend.FlashInferMLAAttnBackend, flashmla_backend.FlashMLABackend,
               trtllm_mla_backend.TRTLLMMLABackend]
    for cls in classes:
        for name in ("forward_decode", "forward_extend"):
            monkeypatch.setattr(cls, name, cls.__dict__[name])
    assert all(m in sys.modules for m, _, _ in backends.PATCHES[1:])
    backends.install()
    backends.install()  # idempotent
    for cls in classes:
        for name in ("forward_decode", "forward_extend"):
            method = cls.__dict__[name]
            assert method._capbench_scales and not getattr(method.__wrapped__, "_capbench_scales", False)
    assert not hasattr(TritonAttnBackend.forward_decode, "_capbench_scales")
