"""Calibrated FP8 KV scales on the MLA attention backends of SGLang 0.5.23 that do not apply a per-layer scale
themselves (data/attention_backends.yaml says which; tests/engine_patches/test_fp8_backends.py drives each on CPU).

An MLA cache row is the latent and its rope part, one scale s per layer (loading.py). Every write must store x / s
and every read must give back s times what it stores. SGLang's own code does both only on triton. The others:

- fa3 (absorbed decode and extend) and flashinfer (decode and paged extend) upcast the FP8 buffer with no descale.
  Scores and outputs are linear in the stored rows, so the query is multiplied by s and the output by s:
  softmax(s q . K/s) (V/s) s = softmax(q . K) V. The write goes through set_mla_kv_buffer, divided in loading.py.
- flashmla reads with descale_k = layer.k_scale (right), but writes decode rows through the plain
  MLATokenToKVPool.set_kv_buffer: the row is written here, divided, and the backend is told not to write it.
  Its prefill runs flashinfer's forward_extend, so the flashinfer rule covers it.
- trtllm_mla quantises K and the rope part itself with no scale before writing, and reads with
  bmm1_scale = k_scale * softmax_scale but no bmm2 scale: K and the rope part are divided before it quantises them,
  and the output is multiplied by s.

Only calls on a layer that carries a scale (`attn_mqa`, tagged by loading.py) of an FP8 pool are touched: the MHA
prefill attention (`attn_mha`) reads K and V the model passes in, never the cache. The multiplications run inside
captured CUDA graphs like the rest of the call, with s fixed at load time.
"""

from __future__ import annotations

import functools
import sys

import torch

SCALE_ATTR = "capbench_mla_scale"  # set on each attn_mqa by loading.py


def mla_scale(backend, layer) -> float | None:
    """The layer's calibrated scale when the call reads or writes a scaled FP8 MLA cache, else None."""
    s = getattr(layer, SCALE_ATTR, None)
    if s is None or s == 1.0 or backend.token_to_kv_pool.dtype != torch.float8_e4m3fn:
        return None
    return s


def _times(out, s: float):
    """The attention output (or the output of an (output, lse) pair) multiplied by s in place."""
    if isinstance(out, tuple):
        return (out[0].mul_(s), *out[1:])
    return out.mul_(s)


def _folded(orig, self, q, k, v, layer, forward_batch, save_kv_cache, kw, s):
    """Run a read that does not descale with the query times s, and the output times s."""
    if kw.get("q_rope") is not None:
        kw = {**kw, "q_rope": kw["q_rope"] * s}
    return _times(orig(self, q * s, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kw), s)


def _write_divided(self, layer, forward_batch, k, v) -> None:
    """The plain MLA write the backend would make (set_kv_buffer at the batch's locations), of k / s."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    s = getattr(layer, SCALE_ATTR)
    self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc.for_batch(forward_batch), k / s, v)


# ---- fa3 ----

def fa3_decode(orig):
    @functools.wraps(orig)
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kw):
        s = mla_scale(self, layer) if self.use_mla else None
        if s is None:
            return orig(self, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kw)
        return _folded(orig, self, q, k, v, layer, forward_batch, save_kv_cache, kw, s)

    return forward_decode


def fa3_extend(orig):
    @functools.wraps(orig)
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kw):
        s = mla_scale(self, layer) if self.use_mla else None
        mode = forward_batch.forward_mode
        mha = (forward_batch.attn_attend_prefix_cache is not None and not mode.is_target_verify()
               and not mode.is_draft_extend_v2())  # flashattention_backend.py: the branch that reads no cache
        if s is None or mha:
            return orig(self, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kw)
        return _folded(orig, self, q, k, v, layer, forward_batch, save_kv_cache, kw, s)

    return forward_extend


# ---- flashinfer (FlashInferMLAAttnBackend; flashmla's prefill and trtllm_mla's fallback run it too) ----

def flashinfer_decode(orig):
    @functools.wraps(orig)
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kw):
        s = mla_scale(self, layer)
        if s is None:
            return orig(self, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kw)
        if save_kv_cache and k is not None and kw.get("k_rope") is None:
            _write_divided(self, layer, forward_batch, k, v)
            save_kv_cache = False
        return _folded(orig, self, q, k, v, layer, forward_batch, save_kv_cache, kw, s)

    return forward_decode


def flashinfer_extend(orig):
    @functools.wraps(orig)
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kw):
        s = mla_scale(self, layer)
        chunk = forward_batch.attn_attend_prefix_cache is not None and any(forward_batch.extend_prefix_lens_cpu)
        if s is None or chunk:
            return orig(self, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kw)
        if save_kv_cache and k is not None and kw.get("k_rope") is None:
            _write_divided(self, layer, forward_batch, k, v)
            save_kv_cache = False
        if self.forward_metadata.use_ragged:  # attends over the K and V passed in, not the cache
            return orig(self, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kw)
        return _folded(orig, self, q, k, v, layer, forward_batch, save_kv_cache, kw, s)

    return forward_extend


# ---- flashmla ----

def flashmla_decode(orig):
    @functools.wraps(orig)
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kw):
        if mla_scale(self, layer) is not None and save_kv_cache and k is not None:
            _write_divided(self, layer, forward_batch, k, v)
            save_kv_cache = False
        return orig(self, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kw)

    return forward_decode


def flashmla_extend(orig):
    @functools.wraps(orig)
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kw):
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        verify = forward_batch.forward_mode != ForwardMode.EXTEND  # target_verify / draft_extend_v2
        if verify and mla_scale(self, layer) is not None and save_kv_cache and k is not None:
            _write_divided(self, layer, forward_batch, k, v)
            save_kv_cache = False
        return orig(self, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kw)

    return forward_extend


# ---- trtllm_mla ----

def _divided_inputs(k, kw, s):
    kw = dict(kw)
    if kw.get("k_rope") is not None:
        kw["k_rope"] = kw["k_rope"] / s
    return (k / s if k is not None else None), kw


def trtllm_decode(orig):
    @functools.wraps(orig)
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kw):
        s = mla_scale(self, layer)
        if s is None:
            return orig(self, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kw)
        k, kw = _divided_inputs(k, kw, s)  # quantised with no scale by the backend: divided first
        return _times(orig(self, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kw), s)

    return forward_decode


def trtllm_extend(orig):
    @functools.wraps(orig)
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kw):
        s = mla_scale(self, layer)
        mode = forward_batch.forward_mode
        if s is None or not (mode.is_target_verify() or mode.is_draft_extend_v2()):
            return orig(self, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kw)
        if mode.is_target_verify():  # the FP8 verify quantises K itself; the draft extend writes BF16 (divided)
            k, kw = _divided_inputs(k, kw, s)
        return _times(orig(self, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kw), s)

    return forward_extend


# module, class, {method: wrapper}
PATCHES = (
    ("sglang.srt.layers.attention.flashattention_backend", "FlashAttentionBackend",
     {"forward_decode": fa3_decode, "forward_extend": fa3_extend}),
    ("sglang.srt.layers.attention.flashinfer_mla_backend", "FlashInferMLAAttnBackend",
     {"forward_decode": flashinfer_decode, "forward_extend": flashinfer_extend}),
    ("sglang.srt.layers.attention.flashmla_backend", "FlashMLABackend",
     {"forward_decode": flashmla_decode, "forward_extend": flashmla_extend}),
    ("sglang.srt.layers.attention.trtllm_mla_backend", "TRTLLMMLABackend",
     {"forward_decode": trtllm_decode, "forward_extend": trtllm_extend}),
)


def install_class(cls, wrappers: dict) -> None:
    """Wrap the class's own methods once (a subclass that inherits one is covered through its parent)."""
    for name, wrap in wrappers.items():
        current = cls.__dict__.get(name)
        if current is None or getattr(current, "_capbench_scales", False):
            continue
        wrapped = wrap(current)
        wrapped._capbench_scales = True
        setattr(cls, name, wrapped)


def install() -> None:
    """Wrap each backend class when SGLang imports its module (a backend whose kernels are missing never is)."""
    from engine_patches.launch import after_import

    for module, name, wrappers in PATCHES:
        after_import(module, lambda module=module, name=name, wrappers=wrappers:
                     install_class(getattr(sys.modules[module], name), wrappers))
