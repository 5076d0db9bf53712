"""What the FP8-KV backend tests share: a paged request layout over SGLang 0.5.23's real KV pools, KV with
outliers past e4m3's 448 (as Kimi's latent and GLM's K have), a float32 reference attention on the unquantised KV,
and stand-ins for the CUDA-only packages the backend modules import (`sgl_kernel`, `flash_mla`): the tests replace
the fused kernel each backend calls, at its call, by a float32 reference, and run everything else of SGLang.

The request layout and the backend objects come from engine_patches/gpu_check/backends.py, the construction
`capbench gpu-check` times on a GPU with the real kernels. Not a test module: tests/engine_patches/test_fp8_backends*.py
import it."""

from __future__ import annotations

import sys
import types

import torch

from engine_patches.gpu_check.backends import Layout

E4M3 = torch.float8_e4m3fn
SPIKE = 1500.0  # the outlier magnitude: past 448, so scale 1.0 saturates there


def fake_cuda_packages() -> None:
    """Module objects for the CUDA-only imports of flashattention_backend.py and flashmla_backend.py. Every function
    in them raises if called: the tests put references in the backend modules' own names before anything runs."""

    def unreachable(*a, **k):
        raise AssertionError("a CUDA kernel was reached: the test must replace it at its call")

    if "sgl_kernel" not in sys.modules:
        sgl = types.ModuleType("sgl_kernel")
        sgl.merge_state_v2 = unreachable
        flash_attn = types.ModuleType("sgl_kernel.flash_attn")
        flash_attn.flash_attn_with_kvcache = flash_attn.flash_attn_varlen_func = unreachable
        sgl.flash_attn = flash_attn
        sys.modules["sgl_kernel"], sys.modules["sgl_kernel.flash_attn"] = sgl, flash_attn
    if "flash_mla" not in sys.modules:
        fm = types.ModuleType("flash_mla")
        fm.fused_norm_rope_attn_rope_cast = unreachable
        iface = types.ModuleType("flash_mla.flash_mla_interface")
        iface.FlashMLASchedMeta = type("FlashMLASchedMeta", (), {})
        fm.flash_mla_interface = iface
        sys.modules["flash_mla"], sys.modules["flash_mla.flash_mla_interface"] = fm, iface


def outliers(shape, gen: torch.Generator, scale: float = 6.0, spike: float = SPIKE, n: int = 8) -> torch.Tensor:
    x = torch.randn(*shape, generator=gen) * scale
    idx = torch.randint(0, x.numel(), (n,), generator=gen)
    x.view(-1)[idx] = spike * torch.sign(torch.randn(n, generator=gen))
    return x.to(torch.bfloat16)


__all__ = ["E4M3", "SPIKE", "Layout", "fake_cuda_packages", "gqa_reference", "mla_reference", "outliers",
           "rel_err", "round_trip"]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).norm() / ref.float().norm())


def round_trip(x: torch.Tensor, s: float) -> torch.Tensor:
    """x through an e4m3 cache at scale s, read back exactly: the error no backend can beat."""
    return ((x.float() / s).clamp(-448, 448).to(E4M3).float() * s).to(x.dtype)


def mla_reference(q_nope, q_rope, latent, rope, layout: Layout, scaling: float) -> torch.Tensor:
    """Absorbed MLA decode in float32: per request, softmax(scaling * (q_nope . c + q_rope . k_pe)) c.
    q_*: [bs, heads, dim]; latent/rope: [slots, 1, dim] indexed by the layout. Returns [bs, heads, lora]."""
    out = []
    for r in range(len(layout.seq_lens)):
        idx = layout.slots(r)
        c, kpe = latent[idx, 0].float(), rope[idx, 0].float()
        scores = scaling * (q_nope[r].float() @ c.T + q_rope[r].float() @ kpe.T)
        out.append(torch.softmax(scores, dim=-1) @ c)
    return torch.stack(out)


def gqa_reference(q, k, v, layout: Layout, scaling: float) -> torch.Tensor:
    """GQA decode in float32: q [bs, q_heads, d], k/v [slots, kv_heads, d]. Returns [bs, q_heads, d]."""
    out = []
    group = q.shape[1] // k.shape[1]
    for r in range(len(layout.seq_lens)):
        idx = layout.slots(r)
        kk = k[idx].float().repeat_interleave(group, dim=1)  # [n, q_heads, d]
        vv = v[idx].float().repeat_interleave(group, dim=1)
        scores = scaling * torch.einsum("hd,nhd->hn", q[r].float(), kk)
        out.append(torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), vv))
    return torch.stack(out)
