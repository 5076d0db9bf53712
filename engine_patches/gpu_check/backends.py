"""SGLang 0.5.23's attention backend objects built around a KV pool, the way their forward code reads them: the
class made with `object.__new__`, the attributes its forward_decode reads set as its `__init__` sets them for the
model, and the per-batch metadata its `init_forward_metadata` would build, made here from a request layout.

One construction for two users: the FP8-scale tests (tests/engine_patches/test_fp8_backends*.py) pass references
of the fused kernels (a float32 attention for FlashInfer's planned wrapper, no FlashMLA schedule), and the GPU check
(gpu_check/attention.py) passes the real ones (a planned FlashInfer wrapper, FlashMLA's schedule, TRT-LLM's
workspace), so both drive the same SGLang forward_decode. No model runner, server or CUDA graph runner is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch


@dataclass
class Layout:
    """Requests' tokens page by page in a pool, as SGLang's paged allocator lays them out: slot = page * page_size
    + offset; page 0 is SGLang's padding page and never used. `pages` [requests, pages each] gives each request's
    pages; None: request r's pages follow each other from page 1 + r * pages each (the tests' layout)."""

    seq_lens: list[int]  # tokens per request, the decode token (the last) included
    page_size: int
    pages: torch.Tensor | None = None

    @classmethod
    def scattered(cls, seq_lens: list[int], page_size: int, pool_tokens: int, gen: torch.Generator) -> Layout:
        """Each request's pages drawn at random from a pool of pool_tokens (as a long-running server's free list
        hands them out); the pool must hold them all."""
        per_req = -(-max(seq_lens) // page_size)
        pool_pages = pool_tokens // page_size
        need = len(seq_lens) * per_req
        if need > pool_pages - 1:
            raise ValueError(f"{need} pages do not fit a pool of {pool_pages - 1} usable pages")
        pick = torch.randperm(pool_pages - 1, generator=gen)[:need] + 1
        return cls(seq_lens, page_size, pick.view(len(seq_lens), per_req).to(torch.int32))

    @property
    def pages_per_req(self) -> int:
        return -(-max(self.seq_lens) // self.page_size)

    def page_table(self) -> torch.Tensor:
        """[bs, pages per request] page ids (FA3's, FlashMLA's and TRT-LLM's block table at their page size)."""
        if self.pages is not None:
            return self.pages
        return torch.stack([1 + r * self.pages_per_req + torch.arange(self.pages_per_req)
                            for r in range(len(self.seq_lens))]).to(torch.int32)

    def slots(self, r: int) -> torch.Tensor:
        pages = self.page_table()[r].long()
        return (pages[:, None] * self.page_size + torch.arange(self.page_size)).flatten()[:self.seq_lens[r]]

    def all_slots(self) -> torch.Tensor:
        """Every request's slots, request after request (SGLang's kv_indices at page size 1)."""
        table = self.page_table().long()
        rows = (table[:, :, None] * self.page_size + torch.arange(self.page_size)).flatten(1)
        keep = torch.arange(rows.shape[1])[None, :] < torch.tensor(self.seq_lens)[:, None]
        return rows[keep]

    def kv_indptr(self) -> torch.Tensor:
        return torch.tensor([0, *torch.tensor(self.seq_lens).cumsum(0).tolist()], dtype=torch.int32)

    def token_table(self) -> torch.Tensor:
        """[bs, max tokens] slot ids (the table at page size 1), padded with slot 0."""
        out = torch.zeros(len(self.seq_lens), max(self.seq_lens), dtype=torch.int32)
        for r, n in enumerate(self.seq_lens):
            out[r, :n] = self.slots(r)
        return out

    def pool_size(self) -> int:
        """The smallest pool that holds the layout."""
        if self.pages is not None:
            return (int(self.pages.max()) + 1) * self.page_size
        return (1 + len(self.seq_lens) * self.pages_per_req) * self.page_size

    def last_slots(self) -> torch.Tensor:
        return torch.stack([self.slots(r)[-1] for r in range(len(self.seq_lens))])

    def prefix_slots(self) -> torch.Tensor:
        return torch.cat([self.slots(r)[:-1] for r in range(len(self.seq_lens))])


def decode_batch(layout: Layout, device="cpu", mode=None) -> SimpleNamespace:
    """The ForwardBatch fields the backends' forward_decode (and the absorbed extend) read for one decode token a
    request, written at each request's last slot."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    lens = layout.seq_lens
    return SimpleNamespace(
        forward_mode=mode or ForwardMode.DECODE, batch_size=len(lens),
        out_cache_loc=layout.last_slots().to(device), out_cache_loc_is_physical=False, spec_info=None,
        attn_attend_prefix_cache=None, seq_lens=torch.tensor(lens, device=device), seq_lens_cpu=torch.tensor(lens),
        seq_lens_sum=sum(lens), extend_prefix_lens_cpu=[n - 1 for n in lens], encoder_out_cache_loc=None,
        attn_dcp_metadata=None)


def _new(cls, **attrs):
    b = object.__new__(cls)
    b.__dict__.update(attrs)
    return b


def fa3(pool, layout: Layout, *, mla: bool, device="cpu"):
    """FlashAttentionBackend (fa3): its decode metadata is the batch's lengths and page table."""
    from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend, FlashAttentionMetadata

    lens = torch.tensor(layout.seq_lens, dtype=torch.int32)
    fp8 = pool.dtype == torch.float8_e4m3fn
    return _new(
        FlashAttentionBackend, use_mla=mla, kv_cache_dtype=pool.dtype, kv_cache_dtype_str="fp8_e4m3" if fp8 else "auto",
        kv_cache_is_mxfp8=False, fa_impl_ver=3, token_to_kv_pool=pool, page_size=layout.page_size, num_splits=0,
        decode_num_splits=0, topk=0, local_attn_builder=None, fa_skip_kv_cache=False, _kv_shard_pool=None,
        is_prefill_aware_swa=False, has_swa=False, use_sliding_window_kv_pool=False,
        _decode_uses_static_max_seqlen_k=False,
        forward_metadata=FlashAttentionMetadata(
            cache_seqlens_int32=lens.to(device), max_seq_len_q=1, max_seq_len_k=max(layout.seq_lens),
            cu_seqlens_q=torch.arange(len(lens) + 1, dtype=torch.int32, device=device),
            cu_seqlens_k=layout.kv_indptr().to(device), page_table=layout.page_table().to(device)))


def flashinfer_mla(pool, wrapper, decode: bool = True):
    """FlashInferMLAAttnBackend around a BatchMLAPagedAttentionWrapper planned for the batch (or a reference)."""
    from sglang.srt.layers.attention.flashinfer_mla_backend import (
        DecodeMetadata,
        FlashInferMLAAttnBackend,
        PrefillMetadata,
    )

    return _new(FlashInferMLAAttnBackend, token_to_kv_pool=pool, enable_chunk_kv=True,
                forward_metadata=DecodeMetadata(wrapper) if decode else PrefillMetadata(wrapper, False))


def flashinfer_gqa(pool, wrapper):
    """FlashInferAttnBackend around a BatchDecodeWithPagedKVCacheWrapper planned for the batch (or a reference)."""
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    return _new(FlashInferAttnBackend, token_to_kv_pool=pool, num_wrappers=1, decode_uses_dequant_workspace=False,
                kv_cache_quant_method=SimpleNamespace(needs_global_scale=lambda: False),
                forward_metadata=SimpleNamespace(decode_wrappers=[wrapper], swa_out_cache_loc=None))


def flashmla(pool, layout: Layout, *, kv_lora_rank: int, schedule=None, num_splits=None, device="cpu"):
    """FlashMLABackend: the block table at its page size 64, and FlashMLA's split schedule (get_mla_metadata)."""
    from sglang.srt.layers.attention.flashmla_backend import FlashMLABackend, FlashMLADecodeMetadata

    fp8 = pool.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    return _new(FlashMLABackend, token_to_kv_pool=pool, is_fp8_kvcache=fp8, dcp_world_size=1,
                kv_lora_rank=kv_lora_rank, num_draft_tokens=1,
                forward_metadata=FlashMLADecodeMetadata(schedule, num_splits, layout.page_table().to(device)))


def trtllm_mla(pool, layout: Layout, *, kv_lora_rank: int, rope: int, nope: int, q_dtype=torch.bfloat16,
               fused: bool = False, fused_bf16: bool = False, workspace=None, counter=None, device="cpu"):
    """TRTLLMMLABackend (Blackwell): fused = its FP8 write-and-concat kernel (SGLang uses it where it can)."""
    from sglang.srt.layers.attention.trtllm_mla_backend import TRTLLMMLABackend

    return _new(
        TRTLLMMLABackend, token_to_kv_pool=pool, data_type=pool.dtype, q_data_type=q_dtype,
        page_size=layout.page_size, _fused_set_kv_concat_q_fp8=fused, _fused_set_kv_concat_q=fused_bf16,
        qk_nope_head_dim=nope, kv_lora_rank=kv_lora_rank, qk_rope_head_dim=rope, workspace_buffer=workspace,
        backend="trtllm-gen", _multi_ctas_kv_counter_buffer=counter,
        kv_index_translator=SimpleNamespace(is_translating=False),
        forward_decode_metadata=SimpleNamespace(block_kv_indices=layout.page_table().to(device), seq_lens_k=None,
                                                max_seq_len_k=max(layout.seq_lens), batch_size=len(layout.seq_lens)))


def trtllm_mha(pool, layout: Layout, *, q_dtype=torch.bfloat16, workspace=None, counter=None, device="cpu"):
    """TRTLLMHAAttnBackend (Blackwell GQA)."""
    from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend

    return _new(
        TRTLLMHAAttnBackend, token_to_kv_pool=pool, data_type=pool.dtype, q_data_type=q_dtype, is_xqa_impl=False,
        decode_uses_native_fp4=False, is_nvfp4_kvcache=False, page_size=layout.page_size, workspace_buffer=workspace,
        max_context_len=max(layout.seq_lens), _default_kv_scale=torch.ones(1, device=device), _swa_kv_pool=None,
        decode_seq_len_splits=1, _multi_ctas_kv_counter_buffer=counter,
        forward_metadata=SimpleNamespace(page_table=layout.page_table().to(device), swa_page_table=None,
                                         cache_seqlens_int32=torch.tensor(layout.seq_lens, dtype=torch.int32,
                                                                          device=device),
                                         swa_out_cache_loc=None))


def triton(pool, layout: Layout, *, mla: bool, decode_attention_fwd, q_heads: int = 1, kv_heads: int = 1,
           v_dim: int = 0, max_kv_splits: int = 1, core_count: int = 0, deterministic: bool = True,
           use_pdl: bool = False, device="cpu"):
    """TritonAttnBackend over the layout's slots (its kv_indptr / kv_indices at page size 1). deterministic: the
    tests' fixed one-split call; otherwise the split count and Lean (work-centric) buffers are made as SGLang's
    eager decode metadata makes them (triton_backend.py init_forward_metadata, the decode branch)."""
    from sglang.kernels.ops.attention import decode_attention as da
    from sglang.srt.layers.attention import triton_backend as tb

    bs = len(layout.seq_lens)
    b = _new(tb.TritonAttnBackend, use_mla=mla, token_to_kv_pool=pool, is_draft_runner=False,
             enable_deterministic=deterministic, dcp_size=1, max_kv_splits=max_kv_splits, swa_v_head_dim=None,
             decode_attention_fwd=decode_attention_fwd, use_pdl=use_pdl, page_size=layout.page_size, device=device,
             num_head=q_heads, num_kv_head=kv_heads, v_head_dim=v_dim, static_kv_splits=False,
             device_core_count=core_count, split_tile_size=None, enable_lean_attention=None)
    meta = dict(swa_out_cache_loc=None, kv_indptr=layout.kv_indptr().to(device),
                kv_indices=layout.all_slots().to(device), attn_logits=None, swa_attn_logits=None, attn_lse=None,
                num_kv_splits=None, lean_Mp=None, lean_Lp=None, lean_Op=None, lean_locks=None, uneven_batch=False)
    if not deterministic:
        programs, _, _ = da._lean_decode_launch_params(kv_heads, q_heads // kv_heads)
        b.__dict__.update(lean_total_programs=programs, lean_block_m=da._LEAN_BLOCK_M,
                          _lean_decode_seqlen_gate=da.lean_decode_seqlen_gate,
                          _lean_capture_policy=da.lean_capture_policy)
        splits = torch.empty(bs, dtype=torch.int32, device=device)
        uneven = torch.zeros(1, dtype=torch.int32, device=device)
        b.get_num_kv_splits(splits, torch.tensor(layout.seq_lens, device=device), uneven)
        f32 = {"dtype": torch.float32, "device": device}
        meta.update(attn_logits=torch.empty(bs, q_heads, max_kv_splits, v_dim, **f32),
                    attn_lse=torch.empty(bs, q_heads, max_kv_splits, **f32), num_kv_splits=splits,
                    uneven_batch=uneven, lean_Mp=torch.empty(programs, da._LEAN_BLOCK_M, **f32),
                    lean_Lp=torch.empty(programs, da._LEAN_BLOCK_M, **f32),
                    lean_Op=torch.empty(programs, da._LEAN_BLOCK_M, v_dim, **f32),
                    lean_locks=torch.zeros(programs, dtype=torch.int32, device=device))
    b.forward_metadata = SimpleNamespace(**meta)
    return b
